"""foxdqn.ops.member_iqn_embedding: the kernels (TRITON_INTERPRET=1 on CPU) against the torch ops
(τ·π i, cos, baddbmm + ReLU, the broadcast multiply), x and the gradients of h, W and b: P = 1 and
3, M = 1, 5 and 33, N = 1, 7 and 40 (past a chunk of fractions), n = 1, 9 and 64, H = 1, 40 and 130
(past a column block); strided h and τ, the policy's fractions as an expanded view; NaN confined to
its row; members never mix and P = 1 equals member 0 of P = 3 bit for bit; no rows; no gradient
asked, some gradients asked; the TF32 path against a float64 emulation; the IQN population's use
of it (one launch forward, three backward, only where the fused forwards run); bad arguments.
GPU (`gpu` marker): kernels = reference on CUDA at the trading sizes, kernel counts, CUDA-graph
capture, no host sync."""
from __future__ import annotations

import math

import pytest
import torch

import foxdqn.ops.member_iqn_embedding as mod
from foxdqn.ops.member_iqn_embedding import (member_iqn_embedding, member_iqn_embedding_reference,
                                             member_iqn_embedding_supported)

from support import assert_close_ulps, capture_graph, cuda_kernels, no_host_sync, round_tf32

NAN = float("nan")
NAMES = ("x", "dh", "dW", "db")


def _case(p, m, n, e, hd, seed=0, device="cpu"):
    """(h, taus, pi_i, w, b) and an upstream gradient of x."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(p, m, hd, generator=g)
    taus = torch.rand(p, m, n, generator=g)
    pi_i = torch.arange(e, dtype=torch.float32) * math.pi
    w = torch.randn(p, e, hd, generator=g) / max(e, 1) ** 0.5
    b = torch.randn(p, 1, hd, generator=g) * 0.2
    up = torch.randn(p, m * n, hd, generator=g)
    return [t.to(device) for t in (h, taus, pi_i, w, b)], up.to(device)


def _run(fn, args, up):
    """x and the gradients of h, W and b of Σ x · up."""
    h, taus, pi_i, w, b = args
    h, w, b = (t.detach().clone().requires_grad_(True) for t in (h, w, b))
    x = fn(h, taus, pi_i, w, b)
    return [x.detach(), *torch.autograd.grad(x, (h, w, b), up)]


def _kernel(*args):
    return member_iqn_embedding(*args, backend="triton")


def _check(got, want, e, n):
    for name, g, r in zip(NAMES, got, want):
        assert g.shape == r.shape and g.dtype == torch.float32, name
        assert_close_ulps(g, r, rtol=1e-5, ulps=16 * max(e, n, 4), name=name)


@pytest.mark.parametrize("p", [1, 3])
@pytest.mark.parametrize("m,n,e,hd", [(1, 1, 1, 1), (5, 7, 9, 40), (33, 40, 64, 130), (2, 3, 64, 256)])
def test_kernel_equals_reference(p, m, n, e, hd):
    args, up = _case(p, m, n, e, hd, seed=p * 100 + m + n + e + hd)
    _check(_run(_kernel, args, up), _run(member_iqn_embedding_reference, args, up), e, n)


def test_strided_inputs_and_the_policys_shared_fractions():
    """h a half of a stacked pair, τ a transposed view; the policy's K midpoints as an expanded
    ``[P, M, K]`` view of one ``[K]`` tensor (stride 0 over members and rows)."""
    (h2, taus, pi_i, w, b), up = _case(3, 2 * 6, 5, 9, 24, seed=4)
    h = h2.view(3, 2, 6, 24)[:, 1]
    t = taus[:, :6].transpose(1, 2).contiguous().transpose(1, 2)
    assert not h.is_contiguous() and not t.is_contiguous()
    args = [h, t, pi_i, w, b]
    _check(_run(_kernel, args, up[:, :30]), _run(member_iqn_embedding_reference, args, up[:, :30]), 9, 5)
    k = (torch.arange(8, dtype=torch.float32) + 0.5) / 8
    args = [h, k.expand(3, 6, 8), pi_i, w, b]
    up = torch.randn(3, 48, 24)
    _check(_run(_kernel, args, up), _run(member_iqn_embedding_reference, args, up), 9, 8)



def test_h_next_rows_read_in_place():
    """``h_next``: the rows of h, then h_next's, as the concatenation gives them (the same bits
    without a gradient, read in place, strided h_next included; with one, the concatenation's
    gradient); the policy's shared fractions; bad h_next refused."""
    (h2, taus, pi_i, w, b), up = _case(3, 11, 4, 9, 24, seed=8)
    h, h_next = h2[:, :5], h2.view(3, 11, 24)[:, 5:].transpose(0, 0)
    k = (torch.arange(4, dtype=torch.float32) + 0.5) / 4
    for t in (taus, k.expand(3, 11, 4)):
        with torch.no_grad():
            got = member_iqn_embedding(h, t, pi_i, w, b, h_next=h_next, backend="triton")
            cat = member_iqn_embedding(torch.cat([h, h_next], dim=1), t, pi_i, w, b, backend="triton")
        assert torch.equal(got, cat)
    hs = h.clone().requires_grad_(True)
    x = member_iqn_embedding(hs, taus, pi_i, w, b, h_next=h_next, backend="triton")
    (dh,) = torch.autograd.grad(x, [hs], up)
    xr = member_iqn_embedding_reference(torch.cat([hs, h_next], dim=1), taus, pi_i, w, b)
    (dr,) = torch.autograd.grad(xr, [hs], up)
    assert_close_ulps(dh, dr, rtol=1e-5, ulps=16 * 9, name="dh")
    with pytest.raises(ValueError, match="h_next must be"):
        member_iqn_embedding(h, taus, pi_i, w, b, h_next=h_next[:, :, :5], backend="triton")
    with pytest.raises(ValueError, match="taus must be"):
        member_iqn_embedding(h, taus[:, :5], pi_i, w, b, h_next=h_next, backend="triton")
    assert mod.member_iqn_embedding_supported(h, taus, pi_i, w, b, h_next)
    assert not mod.member_iqn_embedding_supported(h, taus[:, :5], pi_i, w, b, h_next)


def test_blocks_loop(monkeypatch):
    """Small tiles: every block and mask of both grids, the backward's loop over fractions and the
    bias gradient's loop over the rows' parts (the last program of each member and column block)
    run several times; a second call gives the same bits (every ticket back at zero)."""
    for name, value in (("BLOCK_M", 16), ("BLOCK_N", 16), ("BLOCK_J", 16), ("SUM_TILE", 32)):
        monkeypatch.setattr(mod, name, value)
    args, up = _case(2, 5, 37, 20, 50, seed=9)
    got = _run(_kernel, args, up)
    _check(got, _run(member_iqn_embedding_reference, args, up), 20, 37)
    assert all(torch.equal(a, b) for a, b in zip(got, _run(_kernel, args, up)))


def test_nan_stays_in_its_row():
    """A NaN fraction reaches x's row of it only; a NaN in h's row m the rows m·N .. m·N + N − 1
    only; the gradients are NaN where the reference's are."""
    args, up = _case(1, 4, 3, 5, 6, seed=3)
    args[1][0, 2, 1] = NAN
    x = _kernel(*args)
    bad = torch.zeros(12, dtype=torch.bool)
    bad[2 * 3 + 1] = True
    assert x[0, bad].isnan().all() and not x[0, ~bad].isnan().any()
    args, up = _case(1, 4, 3, 5, 6, seed=3)
    args[0][0, 1, 2] = NAN
    got, want = _run(_kernel, args, up), _run(member_iqn_embedding_reference, args, up)
    assert got[0][0, 3:6, 2].isnan().all() and got[0].isnan().sum() == 3
    for name, g, r in zip(NAMES, got, want):
        assert torch.equal(g.isnan(), r.isnan()), name


def test_members_never_mix_and_p1_is_member_0():
    args, up = _case(3, 6, 9, 16, 40, seed=7)
    base = _run(_kernel, args, up)
    other = [t.clone() for t in args]
    for i in (0, 1, 3, 4):
        other[i][1:] = -2.0
    other[0][2, 0, 0] = NAN
    changed = _run(_kernel, other, up)
    assert all(torch.equal(a[0], c[0]) for a, c in zip(base, changed))
    h, taus, pi_i, w, b = args
    alone = _run(_kernel, [h[:1], taus[:1], pi_i, w[:1], b[:1]], up[:1])
    assert all(torch.equal(a[0], c[0]) for a, c in zip(base, alone))
    again = _run(_kernel, args, up)
    assert all(torch.equal(a, c) for a, c in zip(base, again))  # the same bits on every call


def test_no_rows_and_no_gradient():
    args, up = _case(2, 0, 5, 7, 8)
    got = _run(_kernel, args, up)
    assert got[0].shape == (2, 0, 8) and all(torch.equal(g, torch.zeros_like(g)) for g in got[1:])
    args, up = _case(2, 3, 0, 7, 8)  # no fractions: nothing flows back
    got = _run(_kernel, args, up)
    assert got[0].shape == (2, 0, 8) and all(torch.equal(g, torch.zeros_like(g)) for g in got[1:])
    args, _ = _case(2, 9, 5, 7, 8, seed=2)
    with torch.no_grad():
        x = member_iqn_embedding(*[t.requires_grad_(True) if i in (0, 3, 4) else t for i, t in enumerate(args)],
                                 backend="triton")
    assert not x.requires_grad
    assert_close_ulps(x, member_iqn_embedding_reference(*args).detach(), rtol=1e-5, ulps=64)


def test_only_the_asked_gradients():
    """h without gradient (a frozen encoder): the backward kernel and W's product only; W alone asked."""
    from bench.cpu_kernels import launches

    args, up = _case(2, 4, 5, 7, 8, seed=6)
    h, taus, pi_i, w, b = args
    w.requires_grad_(True)
    (g,) = torch.autograd.grad(_kernel(*args), (w,), up)
    assert_close_ulps(g, _run(member_iqn_embedding_reference, args, up)[2], rtol=1e-5, ulps=64)

    def step():
        torch.autograd.grad(_kernel(*args), (w,), up)

    assert launches(step) == ["triton::_iqn_embedding_forward_kernel", "triton::_iqn_embedding_backward_kernel",
                              "aten::bmm"]


def test_tf32_path_against_float64_emulation(monkeypatch):
    """PREC "tf32": the product's operands (the cosines, W) rounded to TF32 (to nearest), sums in float32."""
    monkeypatch.setattr(mod, "_prec", lambda x: "tf32")
    args, _ = _case(2, 5, 6, 16, 40, seed=11)
    x = _kernel(*args)
    h, taus, pi_i, w, b = args
    cos = round_tf32(torch.cos(taus[..., None] * pi_i)).double().view(2, 30, 16)
    phi = torch.relu(torch.baddbmm(b.double(), cos, round_tf32(w).double()))
    want = (h.double()[:, :, None, :] * phi.view(2, 5, 6, 40)).view(2, 30, 40)
    assert_close_ulps(x, want.float(), rtol=1e-5, ulps=16 * 16)


def test_iqn_population_takes_the_kernel_where_the_fused_forwards_run(monkeypatch):
    """MemberIQNNetwork: inside cpu_kernels (as on CUDA) head() and policy_q() run ψ(s) ⊙ φ(τ) as
    one launch (no cos or multiply), the head's backward three; outside, the torch ops; the same
    values. With the switch off, the torch ops inside cpu_kernels too."""
    from bench.cpu_kernels import launches
    from foxdqn.nn.iqn import IQNHead, IQNNetwork
    from foxdqn.nn.mlp import MLPEncoder
    from foxdqn.ops.backend import cpu_kernels
    from foxdqn.population import distributional
    from foxdqn.population.distributional import MemberIQNNetwork

    torch.manual_seed(0)
    nets = [IQNNetwork(MLPEncoder(6, [8]), IQNHead(8, 5, embedding_dim=16), num_quantiles_policy=4)
            for _ in range(3)]
    member = MemberIQNNetwork.from_networks(nets, "relu")
    obs = torch.randn(3, 7, 6)
    taus = torch.rand(3, 7, 5)
    params = list(member.parameters())
    up = torch.randn(3, 7, 5, 5)

    def head():
        return member.head(member.encoder(obs), taus)

    def step():
        with torch.no_grad():
            q = member(obs)
        return [q, head().detach(), *torch.autograd.grad(head(), params, up)]

    with cpu_kernels():
        ops = launches(lambda: torch.autograd.grad(head(), params, up))
        with torch.no_grad():
            policy = launches(lambda: member(obs))
        got = step()
        monkeypatch.setattr(distributional, "IQN_EMBEDDING_KERNEL", False)
        off = launches(lambda: torch.autograd.grad(head(), params, up))
    plain = step()
    assert ops.count("triton::_iqn_embedding_forward_kernel") == 1
    assert ops.count("triton::_iqn_embedding_backward_kernel") == 1
    assert not {"aten::cos", "aten::mul"} & set(ops), ops
    assert "triton::_iqn_embedding_forward_kernel" in policy and "aten::mul" not in policy, policy
    assert not [o for o in off if "iqn_embedding" in o] and "aten::cos" in off, off
    assert len(off) - len(ops) >= 4, (off, ops)
    for g, e in zip(got, plain):
        assert_close_ulps(g, e, rtol=1e-5, ulps=64)


def _z(*shape):
    return torch.zeros(*shape)


PI = torch.arange(4, dtype=torch.float32)


@pytest.mark.parametrize("args, match", [
    ((_z(2, 3), _z(2, 3, 5), PI, _z(2, 4, 6), _z(2, 1, 6)), "h must be a float32 tensor of 3"),
    ((_z(2, 3, 6), _z(2, 4, 5), PI, _z(2, 4, 6), _z(2, 1, 6)), r"taus must be \[2, 3, N\]"),
    ((_z(2, 3, 6), _z(2, 3, 5), _z(0), _z(2, 0, 6), _z(2, 1, 6)), "pi_i must hold 1 to 128"),
    ((_z(2, 3, 6), _z(2, 3, 5), _z(129), _z(2, 129, 6), _z(2, 1, 6)), "pi_i must hold 1 to 128"),
    ((_z(2, 3, 6), _z(2, 3, 5), PI, _z(2, 5, 6), _z(2, 1, 6)), r"w must be \[2, 4, 6\]"),
    ((_z(2, 3, 6), _z(2, 3, 5), PI, _z(2, 4, 6), _z(2, 1, 5)), r"b must be \[2, 1, 6\]"),
    ((_z(2, 3, 6), _z(2, 3, 5), _z(8)[::2], _z(2, 4, 6), _z(2, 1, 6)), "pi_i must be contiguous"),
    ((_z(2, 3, 6).double(), _z(2, 3, 5), PI, _z(2, 4, 6), _z(2, 1, 6)), "float32"),
    ((_z(0, 3, 6), _z(0, 3, 5), PI, _z(0, 4, 6), _z(0, 1, 6)), "1 to 65535 members"),
])
def test_bad_arguments(args, match):
    assert not member_iqn_embedding_supported(*args)
    with pytest.raises(ValueError, match=match):
        member_iqn_embedding(*args, backend="triton")


def test_unknown_backend():
    args, _ = _case(1, 2, 3, 4, 5)
    with pytest.raises(ValueError, match="backend"):
        member_iqn_embedding(*args, backend="cuda")


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("p,m,n,e,hd", [(1, 128, 32, 64, 256), (64, 128, 32, 64, 256), (5, 33, 7, 9, 40)])
def test_gpu_kernels_equal_reference(p, m, n, e, hd):
    """x and dh against the reference; dW and db against float64 sums with the kernel's ReLU mask
    (x ≠ 0): a pre-activation within rounding of 0 may fall on the other side of the ReLU in the
    kernel and in cuBLAS (at 64 members, millions of values: some do), which moves that row's
    dz by O(1)."""
    args, up = _case(p, m, n, e, hd, seed=p + m + n, device="cuda")
    got, want = _run(_kernel, args, up), _run(member_iqn_embedding_reference, args, up)
    h, taus, pi_i, w, b = (t.double() for t in args)
    cos = torch.cos(taus[..., None] * pi_i).reshape(p, m * n, e)
    dz = up.double() * h.repeat_interleave(n, dim=1) * (got[0] != 0).double()
    want[2:] = [cos.transpose(1, 2) @ dz, dz.sum(dim=1, keepdim=True)]
    for name, g, r in zip(NAMES, got, want):  # TF32 or IEEE on both sides, other sums
        r = r.float()
        torch.testing.assert_close(g, r, rtol=2e-3, atol=2e-3 * max(1.0, r.abs().max().item()), msg=name)


@pytest.mark.gpu
def test_gpu_kernel_counts_and_capture():
    args, up = _case(64, 128, 32, 64, 256, seed=3, device="cuda")
    n, names = cuda_kernels(lambda: member_iqn_embedding(*args))
    assert n == 1, names
    h, taus, pi_i, w, b = args
    params = [h.requires_grad_(True), w.requires_grad_(True), b.requires_grad_(True)]
    n, names = cuda_kernels(lambda: torch.autograd.grad(member_iqn_embedding(*args), params, up))
    assert n <= 4, names  # forward, backward kernel (the bias gradient in it), cuBLAS's bmm (and a memset of its own)
    with torch.no_grad():
        graph, x = capture_graph(lambda: member_iqn_embedding(*args))
        h.mul_(2.0)  # the replay reads the new values
        with no_host_sync():
            graph.replay()
        assert torch.equal(x, member_iqn_embedding(*args))
