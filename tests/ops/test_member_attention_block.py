"""foxdqn.ops.member_attention_block: the forward and the two backward kernels (TRITON_INTERPRET=1 on
CPU) against autograd through the reference (float64) on odd shapes: one head and two, a window
that pads the token tile (5, 1 token) and one that fills it (16), one and several sequences, the
rows in several slices of the weight kernel (SLICE_ROWS patched small: each tile's last slice sums
the parts); with the embedding first (the observations' bars read with their strides; W_e, b_e
and the positions' gradients); a member equals its population of one bit for bit and a second call
gives the same bits; bad arguments. MemberAttentionBlock trains through it where the fused forwards run, with the
torch path's gradients. GPU (`gpu` marker): values against the float64 reference at the bench's
size, one kernel forward and two backward, and a captured forward + backward that replays as
eager."""
from __future__ import annotations

import pytest
import torch

from foxdqn.ops import member_linear_grads
from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.member_attention_block import member_attention_block, member_attention_block_reference
from foxdqn.ops.member_attention_encoder import BlockWeights

from support import assert_replays_give, cuda_kernels, require_compiled_kernels

_need_compiled = require_compiled_kernels(INTERPRET)


def _case(p, rows, c, seed=0, device="cpu"):
    """x [P, rows, C] and a block's weights at initialisation-like scales (γ near 1)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0, mean=0.0):
        return (torch.randn(*shape, generator=g) * scale + mean).to(device)

    w = BlockWeights(r(p, 1, c, scale=0.3, mean=1.0), r(p, 1, c, scale=0.1), r(p, c, 3 * c, scale=c ** -0.5),
                     r(p, 1, 3 * c, scale=0.1), r(p, c, c, scale=c ** -0.5), r(p, 1, c, scale=0.1),
                     r(p, 1, c, scale=0.3, mean=1.0), r(p, 1, c, scale=0.1), r(p, c, 4 * c, scale=c ** -0.5),
                     r(p, 1, 4 * c, scale=0.1), r(p, 4 * c, c, scale=(4 * c) ** -0.5), r(p, 1, c, scale=0.1),
                     1e-5, 1e-6)
    return r(p, rows, c), w, r(p, rows, c)


def _embedding(p, m, w_, f, a, c, seed=0):
    """Observations [P, M, W·F + A] as a strided view (every other column of a wider tensor) and the
    embedding (W_e [P, F, C], b_e [P, 1, C], pos [P, W, C])."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(p, m, 2 * (w_ * f + a), generator=g)[..., ::2]
    return obs, (torch.randn(p, f, c, generator=g) * f ** -0.5, torch.randn(p, 1, c, generator=g) * 0.1,
                 torch.randn(p, w_, c, generator=g) * 0.1)


def _run(x, w, dy, sequences, heads, backend="triton", embed=None):
    """y and the gradients of Σ y · dy: x's (None with embed), the weights' in BlockWeights' order,
    then with embed W_e's, b_e's and pos's."""
    leaves = [t.detach().clone().requires_grad_(embed is None) for t in (x,)]
    leaves += [t.detach().clone().requires_grad_(True) for t in (*w[:12], *(embed or ()))]
    weights = BlockWeights(*leaves[1:13], w.eps1, w.eps2)
    y = member_attention_block(leaves[0], weights, sequences, heads, backend=backend,
                               embed=tuple(leaves[13:]) if embed is not None else None)
    asked = [t for t in leaves if t.requires_grad]
    got = iter(torch.autograd.grad(y, asked, dy))
    return y.detach(), [next(got) if t.requires_grad else None for t in leaves]


NAMES = ("dx",) + BlockWeights._fields[:12] + ("embed_w", "embed_b", "pos")
# (P, M, W, C, H): two heads, a padded token tile; one sequence of one token; a full tile of 16;
# three members with a padded window
CASES = [(2, 3, 5, 32, 2), (1, 1, 1, 16, 1), (1, 2, 16, 16, 1), (3, 4, 7, 16, 1)]


def _check(got_y, got, x, w, dy, sequences, heads, rtol=2e-5, embed=None):
    """Against autograd through the reference in float64."""
    leaves = [x.detach().double().requires_grad_(embed is None)]
    leaves += [t.detach().double().requires_grad_(True) for t in (*w[:12], *(embed or ()))]
    y = member_attention_block_reference(leaves[0], BlockWeights(*leaves[1:13], w.eps1, w.eps2), sequences, heads,
                                         tuple(leaves[13:]) if embed is not None else None)
    asked = [t for t in leaves if t.requires_grad]
    want = iter(torch.autograd.grad(y, asked, dy.double()))
    torch.testing.assert_close(got_y.double(), y.detach(), rtol=rtol, atol=rtol)
    for a, t, name in zip(got, leaves, NAMES):
        if not t.requires_grad:
            assert a is None, name
            continue
        e = next(want)
        torch.testing.assert_close(a.double(), e, rtol=rtol, atol=rtol * max(1.0, e.abs().max().item()), msg=name)


@pytest.mark.parametrize("p,m,w_,c,h", CASES, ids=[f"P{p}-M{m}-W{w}-C{c}-H{h}" for p, m, w, c, h in CASES])
def test_forward_and_gradients_equal_autograd_through_the_reference(p, m, w_, c, h):
    x, w, dy = _case(p, m * w_, c, seed=m + w_)
    y, got = _run(x, w, dy, m, h)
    _check(y, got, x, w, dy, m, h)


def test_rows_in_several_slices_a_member_alone_and_a_second_call(monkeypatch):
    """60 rows in slices of 32 (two a tile, the last program summing them); member p of 3 gets its
    run alone's bits, and a second call the same bits (every ticket back at zero)."""
    monkeypatch.setattr(member_linear_grads, "SLICE_ROWS", 32)
    x, w, dy = _case(3, 60, 16, seed=7)
    y, got = _run(x, w, dy, 12, 1)
    _check(y, got, x, w, dy, 12, 1)
    y2, again = _run(x, w, dy, 12, 1)
    assert torch.equal(y, y2) and all(torch.equal(a, b) for a, b in zip(got, again))
    # contiguous, as the parameters: a strided gradient would cost a copy in autograd's accumulation
    assert all(g.is_contiguous() for g in got), [n for g, n in zip(got, NAMES) if not g.is_contiguous()]
    for q in (0, 2):
        alone = BlockWeights(*(t[q:q + 1] for t in w[:12]), w.eps1, w.eps2)
        yq, gq = _run(x[q:q + 1], alone, dy[q:q + 1], 12, 1)
        assert torch.equal(yq, y[q:q + 1])
        for a, b, name in zip(gq, got, NAMES):
            assert torch.equal(a, b[q:q + 1]), name


# (P, M, W, F, A, C, H): a padded window of 3 features, two heads; a full tile of 5 features
EMBED_CASES = [(2, 3, 5, 3, 2, 32, 2), (1, 4, 16, 5, 2, 16, 1)]


@pytest.mark.parametrize("p,m,w_,f,a,c,h", EMBED_CASES, ids=[f"P{c[0]}-M{c[1]}-W{c[2]}-F{c[3]}" for c in EMBED_CASES])
def test_embedded_first_block_equals_autograd_through_the_reference(p, m, w_, f, a, c, h):
    """With embed, the block embeds the observation's bars (read with its strides) first; W_e, b_e
    and the positions get their gradients, the observations none."""
    obs, embed = _embedding(p, m, w_, f, a, c, seed=w_)
    _, w, dy = _case(p, m * w_, c, seed=f)
    y, got = _run(obs, w, dy, m, h, embed=embed)
    _check(y, got, obs, w, dy, m, h, embed=embed)


def test_embedded_rows_in_several_slices_and_a_member_alone(monkeypatch):
    monkeypatch.setattr(member_linear_grads, "SLICE_ROWS", 32)
    obs, embed = _embedding(3, 10, 7, 4, 2, 16, seed=2)
    _, w, dy = _case(3, 70, 16, seed=5)
    y, got = _run(obs, w, dy, 10, 1, embed=embed)
    _check(y, got, obs, w, dy, 10, 1, embed=embed)
    alone = BlockWeights(*(t[1:2] for t in w[:12]), w.eps1, w.eps2)
    yq, gq = _run(obs[1:2], alone, dy[1:2], 10, 1, embed=tuple(t[1:2] for t in embed))
    assert torch.equal(yq, y[1:2])
    for a, b, name in zip(gq[1:], got[1:], NAMES[1:]):
        assert torch.equal(a, b[1:2]), name


def test_bad_arguments():
    x, w, _ = _case(2, 10, 16)
    for args, match in (((x[0], w, 2, 1), "x must be a contiguous float32"),
                        ((x, w, 3, 1), "10 rows must be M sequences"),
                        ((x, w, 2, 3), "C = 16 with 3 heads"),
                        ((x, w._replace(fc1_w=w.fc1_w[:, :, :32]), 2, 1), "weights.fc1_w must be"),
                        ((torch.zeros(2, 10, 24), w, 2, 1), "C a power of two")):
        with pytest.raises(ValueError, match=match):
            member_attention_block(*args, backend="triton")
    obs, embed = _embedding(2, 2, 5, 3, 2, 16)
    for bad, match in (((*embed[:2], torch.zeros(2, 9, 16)), "x must be the float32 observations"),
                       ((embed[0], embed[1][:, :, :8], embed[2]), "b_e must be"),
                       (embed[:2], "embed must be")):
        with pytest.raises(ValueError, match=match):
            member_attention_block(obs, w, 2, 1, embed=bad, backend="triton")
    with pytest.raises(ValueError, match="at least one observation"):
        member_attention_block(obs[:, :0], w, 0, 1, embed=embed, backend="triton")


def test_member_attention_block_module_trains_through_the_op(monkeypatch):
    """Where the fused forwards run (cpu_kernels here), MemberAttentionBlock with a gradient to come
    is the op; its output and gradients equal the module's torch path's."""
    from foxdqn.nn.attention import AttentionEncoder
    from foxdqn.ops.backend import cpu_kernels
    from foxdqn.population import attention

    torch.manual_seed(0)
    encoders = [AttentionEncoder(obs_dim=6 * 3 + 2, window=6, num_features=3, width=32, heads=2, layers=1)
                for _ in range(2)]
    block = attention.MemberAttentionEncoder.stack(encoders).blocks[0]
    x = torch.randn(2, 4 * 6, 32, requires_grad=True)
    dy = torch.randn(2, 4 * 6, 32)
    calls = []
    real = attention.block_op.member_attention_block
    monkeypatch.setattr(attention.block_op, "member_attention_block", lambda *a, **k: calls.append(1) or real(*a, **k))
    params = [x, *block.parameters()]
    with cpu_kernels():
        y = block(x, 4)
        got = torch.autograd.grad(y, params, dy)
    assert calls == [1]
    want_y = block(x, 4)  # the torch path
    want = torch.autograd.grad(want_y, params, dy)
    torch.testing.assert_close(y, want_y, rtol=1e-5, atol=1e-5)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)


def test_member_attention_encoder_trains_through_the_op(monkeypatch):
    """Where the fused forwards run (cpu_kernels here), the encoder with a gradient to come runs its
    first block with the embedding inside and its second as the op: output and every parameter's
    gradient equal the torch path's."""
    from foxdqn.nn.attention import AttentionEncoder
    from foxdqn.ops.backend import cpu_kernels
    from foxdqn.population import attention

    torch.manual_seed(1)
    encoders = [AttentionEncoder(obs_dim=5 * 3 + 2, window=5, num_features=3, width=16, heads=1, layers=2)
                for _ in range(3)]
    encoder = attention.MemberAttentionEncoder.stack(encoders)
    obs = torch.randn(3, 4, 5 * 3 + 2)
    dy = torch.randn(3, 4, 16)
    calls = []
    real = attention.block_op.member_attention_block
    monkeypatch.setattr(attention.block_op, "member_attention_block",
                        lambda *a, **k: calls.append("embed" in k and k["embed"] is not None) or real(*a, **k))
    params = list(encoder.parameters())
    with cpu_kernels():
        y = encoder(obs)
        got = torch.autograd.grad(y, params, dy)
    assert calls == [True, False]
    want_y = encoder(obs)  # the torch path
    want = torch.autograd.grad(want_y, params, dy)
    torch.testing.assert_close(y, want_y, rtol=1e-5, atol=1e-5)
    for a, e, (name, _) in zip(got, want, encoder.named_parameters()):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("p,m,w_,c,h", [(1, 256, 32, 64, 4), (64, 16, 32, 64, 4), (3, 33, 7, 32, 2)])
def test_gpu_equals_reference_in_one_forward_and_two_backward_kernels(p, m, w_, c, h):
    """On CUDA (TF32 where torch allows it): values against the float64 reference; the forward is
    one kernel and the backward two."""
    x, w, dy = _case(p, m * w_, c, seed=m, device="cuda")
    y, got = _run(x, w, dy, m, h)
    tol = 1e-3 if torch.backends.cuda.matmul.allow_tf32 else 2e-5
    _check(y, got, x, w, dy, m, h, rtol=tol)
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, *w[:12])]
    weights = BlockWeights(*leaves[1:], w.eps1, w.eps2)
    _, names = cuda_kernels(lambda: member_attention_block(leaves[0], weights, m, h))
    assert names == ["_attention_block_kernel"], names
    out = member_attention_block(leaves[0], weights, m, h)
    _, names = cuda_kernels(lambda: torch.autograd.grad(out, leaves, dy, retain_graph=True))
    assert sorted(names) == ["_attention_block_backward_kernel", "_attention_block_weights_kernel"], names


@pytest.mark.gpu
def test_gpu_embedded_block_equals_reference():
    obs, embed = _embedding(2, 64, 32, 5, 2, 64, seed=3)
    _, w, dy = _case(2, 64 * 32, 64, seed=4)
    obs, embed, w, dy = obs.cuda(), tuple(t.cuda() for t in embed), BlockWeights(*(t.cuda() for t in w[:12]), 1e-5,
                                                                                  1e-6), dy.cuda()
    y, got = _run(obs, w, dy, 64, 4, embed=embed)
    _check(y, got, obs, w, dy, 64, 4, rtol=1e-3 if torch.backends.cuda.matmul.allow_tf32 else 2e-5, embed=embed)


@pytest.mark.gpu
def test_gpu_capture_of_forward_and_backward_replays_as_eager():
    x, w, dy = _case(2, 64 * 16, 64, seed=1, device="cuda")
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, *w[:12])]
    weights = BlockWeights(*leaves[1:], w.eps1, w.eps2)

    def step():
        y = member_attention_block(leaves[0], weights, 64, 4)
        return [y.detach(), *torch.autograd.grad(y, leaves, dy)]

    eager = step()
    assert_replays_give(step, eager)
