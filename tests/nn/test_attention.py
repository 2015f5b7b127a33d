"""AttentionEncoder: shapes, validation, agreement with torch's pre-LN encoder layer, position
sensitivity, gradients, no host sync, determinism."""
import copy

import pytest
import torch
from torch import nn

from foxdqn.nn.attention import AttentionEncoder

from support import forbid_syncs

W, F, WIDTH, HEADS = 5, 3, 16, 4
OBS_DIM = W * F + 2


def make(pooling="mean", layers=2, dropout=0.0, generator=None, activation="relu", seed=0):
    torch.manual_seed(seed)
    return AttentionEncoder(OBS_DIM, W, F, WIDTH, HEADS, layers, dropout=dropout, pooling=pooling,
                            activation=activation, generator=generator)


def obs_batch(B=7, seed=1):
    return torch.randn(B, OBS_DIM, generator=torch.Generator().manual_seed(seed))


def swap_bars(obs, i, j):
    bars = obs[:, : W * F].reshape(-1, W, F).clone()
    bars[:, [i, j]] = bars[:, [j, i]]
    return torch.cat([bars.reshape(-1, W * F), obs[:, W * F:]], dim=1)


@pytest.mark.parametrize("pooling", ["mean", "last"])
@pytest.mark.parametrize("B", [1, 7])
def test_shapes(pooling, B):
    enc = make(pooling)
    out = enc(obs_batch(B))
    assert enc.out_dim == WIDTH
    assert out.shape == (B, WIDTH) and out.dtype == torch.float32


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(width=18, heads=4), r"\bwidth=18 must be a multiple of heads=4"),
    (dict(obs_dim=OBS_DIM + 1), rf"\bobs_dim must be window \* num_features \+ 2 .* got obs_dim={OBS_DIM + 1}"),
    (dict(window=4), r"\bobs_dim must be window \* num_features \+ 2 = 4 \*"),
    (dict(pooling="max"), r"\bpooling must be 'mean' or 'last', got 'max'"),
    (dict(dropout=1.0), r"\bdropout must be a number in \[0, 1\), got 1\.0"),
    (dict(heads=0), r"\bheads must be an int >= 1, got 0"),
    (dict(layers=0), r"\blayers must be an int >= 1, got 0"),
    (dict(activation="elu"), r"\bactivation must be one of .*, got 'elu'"),
])
def test_invalid_settings_name_the_parameter(kwargs, pattern):
    args = dict(obs_dim=OBS_DIM, window=W, num_features=F, width=WIDTH, heads=HEADS, layers=1)
    args.update(kwargs)
    with pytest.raises(ValueError, match=pattern):
        AttentionEncoder(**args)


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_matches_torch_pre_ln_encoder_layer(pooling):
    """Same weights in torch.nn.TransformerEncoderLayer(norm_first=True): same output. This also
    checks the window reshape (bar t = obs[t*F:(t+1)*F], oldest first) and the account concat."""
    enc = make(pooling).eval()
    refs = []
    for blk in enc.blocks:
        ref = nn.TransformerEncoderLayer(WIDTH, HEADS, dim_feedforward=4 * WIDTH, dropout=0.0, activation="gelu",
                                         batch_first=True, norm_first=True)
        with torch.no_grad():
            ref.self_attn.in_proj_weight.copy_(blk.qkv.weight)
            ref.self_attn.in_proj_bias.copy_(blk.qkv.bias)
            ref.self_attn.out_proj.weight.copy_(blk.proj.weight)
            ref.self_attn.out_proj.bias.copy_(blk.proj.bias)
            for a, b in ((ref.linear1, blk.fc1), (ref.linear2, blk.fc2), (ref.norm1, blk.ln1), (ref.norm2, blk.ln2)):
                a.weight.copy_(b.weight)
                a.bias.copy_(b.bias)
        refs.append(ref.train())  # train mode: no fast path, plain math
    obs = obs_batch(6)
    x = torch.stack([enc.embed(obs[:, t * F:(t + 1) * F]) for t in range(W)], dim=1) + enc.pos
    for ref in refs:
        x = ref(x)
    x = enc.ln_f(x)
    h = x.mean(1) if pooling == "mean" else x[:, W - 1]
    expected = torch.relu(enc.out(torch.cat([h, obs[:, -2:]], dim=1)))
    torch.testing.assert_close(enc(obs), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_bar_order_matters_through_positions(pooling):
    enc = make(pooling).eval()
    obs = obs_batch()
    swapped = swap_bars(obs, 0, 3)
    with torch.no_grad():
        assert (enc(obs) - enc(swapped)).abs().max() > 1e-4
        # Without positional embeddings self-attention is permutation-equivariant: mean pooling,
        # and the last token when the newest bar stays in place, cannot see the swap.
        enc.pos.zero_()
        torch.testing.assert_close(enc(obs), enc(swapped), atol=1e-5, rtol=1e-5)


def test_account_features_reach_the_output():
    enc = make().eval()
    obs = obs_batch()
    other = obs.clone()
    other[:, -2:] += 1.0
    with torch.no_grad():
        assert (enc(obs) - enc(other)).abs().max() > 1e-4


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_gradient_reaches_every_parameter(pooling):
    enc = make(pooling, dropout=0.1, generator=torch.Generator().manual_seed(0)).train()
    out = enc(obs_batch(8))
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(2))).sum().backward()
    for name, p in enc.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    assert (enc.pos.grad.abs().sum(dim=1) > 0).all()  # every position gets a gradient


@pytest.mark.parametrize("train", [False, True])
def test_forward_backward_never_syncs(monkeypatch, train):
    enc = make("last", dropout=0.2 if train else 0.0, generator=torch.Generator().manual_seed(0)).train(train)
    obs = obs_batch()
    with monkeypatch.context() as m:
        forbid_syncs(m)
        with pytest.raises(AssertionError, match="host sync"):
            bool(torch.ones(()))  # the patch is live
        out = enc(obs)
        out.square().mean().backward()
    assert enc.pos.grad is not None


def test_deterministic_in_eval_and_dropout_only_in_train():
    gen = torch.Generator().manual_seed(0)
    enc = make(dropout=0.5, generator=gen)
    obs = obs_batch()
    enc.eval()
    with torch.no_grad():
        a, b = enc(obs), enc(obs)
    assert torch.equal(a, b)
    enc.train()
    gen.manual_seed(3)
    with torch.no_grad():
        t1 = enc(obs)
    gen.manual_seed(3)
    with torch.no_grad():
        t2, t3 = enc(obs), enc(obs)
    assert torch.equal(t1, t2)  # dropout masks come from the generator only
    assert not torch.equal(t2, t3) and not torch.equal(t1, a)


def test_dropout_without_generator_raises_in_train_only():
    enc = make(dropout=0.1)
    enc.eval()
    enc(obs_batch())
    with pytest.raises(RuntimeError, match="generator"):
        enc.train()(obs_batch())


def test_deepcopy_shares_the_generator():
    gen = torch.Generator().manual_seed(0)
    enc = make(dropout=0.1, generator=gen)
    tgt = copy.deepcopy(enc)
    assert tgt.generator is gen
    assert all(p is not q for p, q in zip(enc.parameters(), tgt.parameters()))
    enc.eval(), tgt.eval()
    with torch.no_grad():
        assert torch.equal(enc(obs_batch()), tgt(obs_batch()))
