"""foxdqn.ops.member_attention_encoder: the kernels (TRITON_INTERPRET=1 on CPU) against the torch
reference on odd P, M, W, F, C, H, blocks, pooling and activation; strided observations; members
never mix and a member's features do not depend on P; NaN stays in its member; bad arguments; the
population's encoder takes the op without gradient and equals its torch path. GPU (`gpu` marker):
kernels = reference on CUDA in TF32, a capture replays as eager, blocks + 1 kernels."""
from __future__ import annotations

import pytest
import torch

from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.member_attention_encoder import (BlockWeights, member_attention_encoder,
                                                 member_attention_encoder_reference, member_attention_encoder_supported)

from support import (assert_module_takes_op_without_gradient, assert_replays_give, cuda_kernels,
                     require_compiled_kernels)

_need_compiled = require_compiled_kernels(INTERPRET)


def _case(p, m, w, f, c, blocks, a=2, seed=0, device="cpu"):
    """(obs, embed_w, embed_b, pos, blocks, ln_f, out_w, out_b), random, affine near 1."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=0.3):
        return (torch.randn(*shape, generator=g) * scale).to(device)

    def block():
        return BlockWeights(1 + r(p, 1, c), r(p, 1, c), r(p, c, 3 * c), r(p, 1, 3 * c), r(p, c, c), r(p, 1, c),
                            1 + r(p, 1, c), r(p, 1, c), r(p, c, 4 * c), r(p, 1, 4 * c), r(p, 4 * c, c), r(p, 1, c),
                            1e-5, 1e-6)

    return (r(p, m, w * f + a, scale=1.0), r(p, f, c), r(p, 1, c), r(p, w, c), [block() for _ in range(blocks)],
            (1 + r(p, 1, c), r(p, 1, c), 1e-5), r(p, c + a, c), r(p, 1, c))


@pytest.mark.parametrize("p,m,w,f,c,heads,blocks,pooling,act", [
    (1, 1, 1, 1, 16, 1, 1, "mean", "relu"),  # one token, one feature, one head
    (2, 3, 5, 3, 32, 2, 2, "last", "gelu"),
    (3, 2, 17, 5, 64, 4, 1, "mean", "tanh"),  # W above a power of two: padded tokens masked
    (1, 2, 32, 4, 64, 4, 2, "mean", "silu"),  # the shipped sizes
    (2, 1, 3, 16, 32, 1, 1, "last", "relu"),  # F = 16, one head of 32
])
def test_kernels_equal_reference(p, m, w, f, c, heads, blocks, pooling, act):
    args = _case(p, m, w, f, c, blocks)
    got = member_attention_encoder(*args, heads, pooling, act, backend="triton")
    torch.testing.assert_close(got, member_attention_encoder_reference(*args, heads, pooling, act),
                               rtol=1e-5, atol=2e-5)


def test_strided_observations_and_one_account_feature():
    obs, *rest = _case(2, 3, 4, 2, 16, 1, a=1)
    wide = torch.cat([obs, obs], dim=-1)[..., : obs.shape[-1]]  # not contiguous
    assert not wide.is_contiguous()
    got = member_attention_encoder(wide, *rest, 1, "mean", "relu", backend="triton")
    torch.testing.assert_close(got, member_attention_encoder_reference(obs, *rest, 1, "mean", "relu"),
                               rtol=1e-5, atol=2e-5)
    assert torch.equal(got, member_attention_encoder(obs, *rest, 1, "mean", "relu", backend="triton"))


def _member(args, p):
    obs, ew, eb, pos, blocks, ln_f, ow, ob = args
    one = [t[p:p + 1] for t in (obs, ew, eb, pos, ln_f[0], ln_f[1], ow, ob)]
    blocks = [BlockWeights(*[t[p:p + 1] for t in b[:12]], b.eps1, b.eps2) for b in blocks]
    return (*one[:4], blocks, (one[4], one[5], ln_f[2]), one[6], one[7])


def test_members_never_mix_and_a_member_does_not_depend_on_p():
    args = _case(3, 4, 6, 2, 32, 2, seed=1)
    together = member_attention_encoder(*args, 2, "mean", "gelu", backend="triton")
    for p in range(3):
        alone = member_attention_encoder(*_member(args, p), 2, "mean", "gelu", backend="triton")
        assert torch.equal(together[p:p + 1], alone)
    args[0][1, 2, 5] = float("nan")  # member 1's observation 2: NaN there, nowhere else
    got = member_attention_encoder(*args, 2, "mean", "gelu", backend="triton")
    assert torch.isnan(got[1, 2]).all()
    rest = torch.ones(3, 4, dtype=torch.bool)
    rest[1, 2] = False
    assert torch.equal(got[rest], together[rest])


def test_bad_arguments_and_no_rows():
    args = _case(2, 3, 4, 2, 32, 1)
    obs, ew, eb, pos, blocks, ln_f, ow, ob = args
    cases = [((obs[0], *args[1:]), 2, "mean", "relu", "obs must be a float32"),
             (args, 4, "mean", "relu", "C / heads a power of two >= 16"),
             (args, 2, "max", "relu", "pooling must be"),
             (args, 2, "mean", "elu", "activation must be"),
             ((obs, ew, eb, pos, [], ln_f, ow, ob), 2, "mean", "relu", "at least one block"),
             ((obs, ew, eb, pos, blocks, ln_f, ow[:, :-1], ob), 2, "mean", "relu", "out_w must be"),
             ((obs, ew, eb, pos, [blocks[0]._replace(fc1_w=blocks[0].fc1_w.transpose(1, 2).contiguous())], ln_f, ow,
               ob), 2, "mean", "relu", r"blocks\[0\].fc1_w must be"),
             ((obs[..., :8], ew, eb, pos, blocks, ln_f, ow, ob), 2, "mean", "relu", "A >= 1 account features")]
    for a, heads, pooling, act, match in cases:
        assert not member_attention_encoder_supported(*a, heads, pooling, act)
        with pytest.raises(ValueError, match=match):
            member_attention_encoder(*a, heads, pooling, act, backend="triton")
    with pytest.raises(ValueError, match="no gradient"):
        member_attention_encoder(obs, ew.requires_grad_(True), *args[2:], 2, "mean", "relu", backend="triton")
    ew.requires_grad_(False)
    assert member_attention_encoder(obs[:, :0], *args[1:], 2, "mean", "relu", backend="triton").shape == (2, 0, 32)


def test_population_encoder_takes_the_op_without_gradient_and_equals_its_torch_path(monkeypatch):
    """MemberAttentionEncoder: inside cpu_kernels without gradient the op's kernels (one call), equal
    to the module's torch path (layers, SDPA) to float rounding; with gradient the torch path."""
    from foxdqn.nn.attention import AttentionEncoder
    from foxdqn.ops import backend as B
    from foxdqn.population import attention

    encoders = [AttentionEncoder(6 * 3 + 2, window=6, num_features=3, width=32, heads=2, layers=2,
                                 pooling="last", activation="gelu", generator=torch.Generator().manual_seed(seed))
                for seed in (0, 1)]
    module = attention.MemberAttentionEncoder.stack(encoders)
    assert_module_takes_op_without_gradient(monkeypatch, module, (torch.randn(2, 5, 6 * 3 + 2),), attention.encoder_op,
                                            "member_attention_encoder", rtol=1e-5, atol=2e-5)
    seen = []  # a forward hook in one of its modules: the torch path, which runs it
    module.blocks[1].fc1.register_forward_hook(lambda *_: seen.append(1))
    with torch.no_grad(), B.cpu_kernels():
        module(torch.randn(2, 5, 6 * 3 + 2))
    assert seen == [1]


@pytest.mark.gpu
@pytest.mark.parametrize("p,m,blocks,pooling", [(1, 4096, 2, "mean"), (64, 32, 2, "mean"), (3, 257, 1, "last")])
def test_gpu_kernels_equal_reference(p, m, blocks, pooling):
    args = _case(p, m, 32, 4, 64, blocks, device="cuda")
    torch.testing.assert_close(member_attention_encoder(*args, 4, pooling, "relu"),
                               member_attention_encoder_reference(*args, 4, pooling, "relu"), rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
def test_gpu_capture_equals_eager_and_is_blocks_plus_one_kernels():
    args = _case(8, 64, 32, 4, 64, 2, device="cuda")

    def step():
        return [member_attention_encoder(*args, 4, "mean", "relu")]

    assert_replays_give(step, [t.clone() for t in step()])
    _, names = cuda_kernels(step)
    assert names == ["_attention_block_kernel", "_attention_pool_kernel"], names
