"""foxdqn.ops.member_dueling_head: the kernels (TRITON_INTERPRET=1 on CPU) against two baddbmm and
eq. 9, Q and the gradients of x, W^V, b^V, W^A and b^A: P = 1 and 3, M = 1, 17 and 70 (past a row
block), K = 1, 5, 40 and 256 (past K blocks), A = 1, 2, 9, 45 and 127 (the widest tile); strided
inputs; the loops of every block; NaN confined to its row and to V's column; ±inf non-finite where
the reference's are; members never mix and P = 1 equals member 0 of P = 3 bit for bit; M = 0 and
K = 0; no gradient asked; the TF32 path
against a float64 emulation; the population network's use of it (one launch forward, two backward,
only where the fused forwards run); bad arguments. GPU (`gpu` marker): kernels = reference on CUDA
at the trading experiments' sizes, kernel counts, CUDA-graph capture, no host sync."""
from __future__ import annotations

import pytest
import torch

import foxdqn.ops.member_dueling_head as mod
from foxdqn.ops.member_dueling_head import (member_dueling_head, member_dueling_head_reference,
                                            member_dueling_head_supported)

from support import assert_close_ulps, capture_graph, cuda_kernels, no_host_sync, round_tf32

NAN = float("nan")
NAMES = ("Q", "dx", "dW_v", "db_v", "dW_a", "db_a")


def _case(p, m, k, a, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(p, m, k, generator=g)
    w_v = torch.randn(p, k, 1, generator=g) / max(k, 1) ** 0.5
    b_v = torch.randn(p, 1, 1, generator=g) * 0.2
    w_a = torch.randn(p, k, a, generator=g) / max(k, 1) ** 0.5
    b_a = torch.randn(p, 1, a, generator=g) * 0.2
    up = torch.randn(p, m, a, generator=g)
    return [t.to(device) for t in (x, w_v, b_v, w_a, b_a)], up.to(device)


def _run(fn, ts, up):
    """Q and the gradients of every input of Σ Q · up."""
    ts = [t.detach().clone().requires_grad_(True) for t in ts]
    q = fn(*ts)
    return [q.detach(), *torch.autograd.grad(q, ts, up)]


def _kernel(*ts):
    return member_dueling_head(*ts, backend="triton")


def _check(got, want, k, a):
    for name, g, e in zip(NAMES, got, want):
        assert g.shape == e.shape and g.dtype == torch.float32, name
        assert_close_ulps(g, e, rtol=1e-5, ulps=8 * max(k, a, 4), name=name)


@pytest.mark.parametrize("p", [1, 3])
@pytest.mark.parametrize("m,k,a", [(1, 1, 1), (17, 5, 9), (70, 40, 45), (17, 40, 2), (9, 3, 127)])
def test_kernel_equals_reference(p, m, k, a):
    ts, up = _case(p, m, k, a, seed=p * 100 + m + k + a)
    _check(_run(_kernel, ts, up), _run(member_dueling_head_reference, ts, up), k, a)


def test_trading_width():
    """eurusd's head: 256 hidden units, 45 actions, the update's 128 rows."""
    ts, up = _case(2, 128, 256, 45, seed=5)
    _check(_run(_kernel, ts, up), _run(member_dueling_head_reference, ts, up), 256, 45)


def test_strided_inputs():
    """x a half of a stacked pair, W^A a transposed view, the biases and W^V strided views."""
    (x2, w_v, b_v, w_a, b_a), up = _case(3, 2 * 17, 12, 20, seed=4)
    x, up = x2.view(3, 2, 17, 12)[:, 1], up[:, :17]
    wt = w_a.transpose(1, 2).contiguous().transpose(1, 2)
    bas = torch.randn(3, 1, 40)[:, :, ::2]
    wvs = torch.randn(3, 12, 3)[:, :, 1:2]
    bvs = torch.randn(3, 2, 2)[:, :1, 1:]
    assert not any(t.is_contiguous() for t in (x, wt, bas, wvs, bvs))
    ts = [x, wvs, bvs, wt, bas]
    _check(_run(_kernel, ts, up), _run(member_dueling_head_reference, ts, up), 12, 20)


def test_blocks_loop(monkeypatch):
    """Small tiles: every loop and mask of the three grids (rows, K, dx columns, dW rows) runs several times."""
    for name, value in (("BLOCK_M", 16), ("BLOCK_M_SMALL", 16), ("BLOCK_K", 16), ("BLOCK_DX", 16),
                        ("BLOCK_DW", 16), ("BLOCK_R", 16)):
        monkeypatch.setattr(mod, name, value)
    ts, up = _case(2, 35, 50, 37, seed=9)
    _check(_run(_kernel, ts, up), _run(member_dueling_head_reference, ts, up), 50, 37)


def test_nan_stays_in_its_row_and_in_vs_column():
    """A NaN in x's row r makes Q's row r NaN only; a NaN in W^V reaches V (every row's Q) but not
    W^A's gradient columns through anything other than the rows' values, as in the reference."""
    ts, up = _case(1, 6, 4, 5, seed=3)
    ts[0][0, 2, 1] = NAN
    q = _kernel(*ts)
    assert q[0, 2].isnan().all() and not q[0, [0, 1, 3, 4, 5]].isnan().any()
    ts, up = _case(1, 6, 4, 5, seed=3)
    ts[1][0, 1, 0] = NAN  # W^V
    got, want = _run(_kernel, ts, up), _run(member_dueling_head_reference, ts, up)
    for name, g, e in zip(NAMES, got, want):
        assert torch.equal(g.isnan(), e.isnan()), name



def test_inf_in_a_row_stays_where_the_reference_has_it():
    """+inf in x's row r, in dQ's row r, or both: Q and every gradient non-finite exactly where the
    reference's are (the kernels' padding columns, 0 · inf, reach no sum). Where the reference has
    ±inf the regrouped dW (G − u / A) may hold NaN (inf − inf); finite entries agree."""
    for in_x, in_dq in ((True, False), (False, True), (True, True)):
        ts, up = _case(1, 6, 4, 5, seed=8)
        if in_x:
            ts[0][0, 3, 2] = float("inf")
        if in_dq:
            up[0, 1, 4] = float("inf")
        got, want = _run(_kernel, ts, up), _run(member_dueling_head_reference, ts, up)
        for name, g, e in zip(NAMES, got, want):
            assert torch.equal(g.isfinite(), e.isfinite()), (name, in_x, in_dq)
            assert_close_ulps(g[g.isfinite()], e[e.isfinite()], rtol=1e-5, ulps=64, name=name)

def test_members_never_mix_and_p1_is_member_0():
    ts, up = _case(3, 33, 20, 18, seed=7)
    base = _run(_kernel, ts, up)
    other_ts = [t.clone() for t in ts]
    for t in other_ts:
        t[1:] = -2.0
    other_ts[0][2, 0, 0] = NAN
    other = _run(_kernel, other_ts, up)
    assert all(torch.equal(a[0], c[0]) for a, c in zip(base, other))
    assert mod._block_m(1, 33) == mod._block_m(3, 33)  # the same tiles here (a small grid)
    alone = _run(_kernel, [t[:1] for t in ts], up[:1])
    assert all(torch.equal(a[0], c[0]) for a, c in zip(base, alone))
    again = _run(_kernel, ts, up)
    assert all(torch.equal(a, c) for a, c in zip(base, again))  # the same bits on every call


def test_no_rows_no_width_and_no_gradient():
    ts, up = _case(2, 0, 5, 7)
    got = _run(_kernel, ts, up)
    assert got[0].shape == (2, 0, 7) and all(torch.equal(g, torch.zeros_like(g)) for g in got[1:])
    ts, up = _case(2, 4, 0, 3)  # K = 0: Q = b^V + b^A − mean b^A, the bias gradients only
    _check(_run(_kernel, ts, up), _run(member_dueling_head_reference, ts, up), 1, 3)
    ts, _ = _case(2, 9, 5, 7, seed=2)
    with torch.no_grad():
        q = member_dueling_head(*[t.requires_grad_(True) for t in ts], backend="triton")
    assert not q.requires_grad
    assert_close_ulps(q, member_dueling_head_reference(*ts).detach(), rtol=1e-5, ulps=40)


def test_only_the_asked_gradients():
    """x without gradient (a frozen encoder's output): no dx launched; W^A alone asked: the others None."""
    from bench.cpu_kernels import launches

    ts, up = _case(2, 9, 5, 7, seed=6)
    x, w_v, b_v, w_a, b_a = ts
    w_a.requires_grad_(True)
    q = member_dueling_head(x, w_v, b_v, w_a, b_a, backend="triton")
    (g,) = torch.autograd.grad(q, (w_a,), up)
    want = _run(member_dueling_head_reference, ts, up)[4]
    assert_close_ulps(g, want, rtol=1e-5, ulps=40)

    def step():
        torch.autograd.grad(member_dueling_head(x, w_v, b_v, w_a, b_a, backend="triton"), (w_a,), up)

    assert launches(step) == ["triton::_dueling_head_forward_kernel", "triton::_dueling_head_dw_kernel"]


def test_tf32_path_against_float64_emulation(monkeypatch):
    """PREC "tf32": the dot operands rounded to TF32 (to nearest), products and sums in float32."""
    monkeypatch.setattr(mod, "_prec", lambda x: "tf32")
    ts, _ = _case(2, 19, 40, 11, seed=11)
    q = _kernel(*ts)
    x, w_v, b_v, w_a, b_a = (t.double() for t in ts)
    x, w_v, w_a = (round_tf32(t.float()).double() for t in (x, w_v, w_a))
    want = member_dueling_head_reference(x, w_v, b_v, w_a, b_a).float()
    assert_close_ulps(q, want, rtol=1e-5, ulps=8 * 40)


def test_population_network_takes_the_kernels_where_the_fused_forwards_run(monkeypatch):
    """MemberQNetwork with a dueling head and DUELING_HEAD_KERNELS on (the default): inside cpu_kernels
    (as on CUDA) the update's forward with gradient runs the head as one launch and its backward as
    two; outside, the layers; the same values. With the switch off, the layers inside cpu_kernels too."""
    from bench.cpu_kernels import launches
    from foxdqn.nn.heads import DuelingHead
    from foxdqn.nn.mlp import MLPEncoder
    from foxdqn.nn.qnet import QNetwork
    from foxdqn.ops.backend import cpu_kernels
    from foxdqn.population import network
    from foxdqn.population.network import MemberQNetwork

    torch.manual_seed(0)
    nets = [QNetwork(MLPEncoder(6, [8]), DuelingHead(8, 5)) for _ in range(3)]
    member = MemberQNetwork.from_networks(nets, "relu")
    obs = torch.randn(3, 11, 6)
    up = torch.randn(3, 11, 5)
    params = list(member.parameters())

    def step():
        return [member(obs).detach(), *torch.autograd.grad(member(obs), params, up)]

    with cpu_kernels():
        got = step()
        ops = launches(lambda: torch.autograd.grad(member(obs), params, up))
        monkeypatch.setattr(network, "DUELING_HEAD_KERNELS", False)
        off = launches(lambda: torch.autograd.grad(member(obs), params, up))
    plain = step()
    assert not [o for o in off if "dueling_head" in o] and "triton::_dueling_forward_kernel" in off, off
    assert len(off) - len(ops) == 8, (off, ops)  # 3 launches forward and 8 backward -> 1 and 2
    for g, e in zip(got, plain):
        assert_close_ulps(g, e, rtol=1e-5, ulps=64)
    assert ops.count("triton::_dueling_head_forward_kernel") == 1 and ops.count("triton::_dueling_head_dx_kernel") == 1
    assert ops.count("triton::_dueling_head_dw_kernel") == 1 and "triton::_dueling_forward_kernel" not in ops, ops


@pytest.mark.parametrize("args, match", [
    ((torch.zeros(2, 3), torch.zeros(2, 3, 1), torch.zeros(2, 1, 1), torch.zeros(2, 3, 4), torch.zeros(2, 1, 4)),
     "x must be a float32 tensor of 3"),
    ((torch.zeros(2, 3, 5), torch.zeros(2, 5, 2), torch.zeros(2, 1, 1), torch.zeros(2, 5, 4), torch.zeros(2, 1, 4)),
     r"w_v must be \[2, 5, 1\]"),
    ((torch.zeros(2, 3, 5), torch.zeros(2, 5, 1), torch.zeros(2, 1, 1), torch.zeros(2, 4, 4), torch.zeros(2, 1, 4)),
     r"w_a must be \[2, 5, 4\]"),
    ((torch.zeros(2, 3, 5), torch.zeros(2, 5, 1), torch.zeros(2, 1, 1), torch.zeros(2, 5, 4), torch.zeros(2, 1, 3)),
     r"b_a must be \[2, 1, 4\]"),
    ((torch.zeros(2, 3, 5), torch.zeros(2, 5, 1), torch.zeros(2, 1, 1), torch.zeros(2, 5, 128),
      torch.zeros(2, 1, 128)), "1 to 127 actions"),
    ((torch.zeros(2, 3, 5, dtype=torch.float64), torch.zeros(2, 5, 1), torch.zeros(2, 1, 1), torch.zeros(2, 5, 4),
      torch.zeros(2, 1, 4)), "float32"),
    ((torch.zeros(0, 3, 5), torch.zeros(0, 5, 1), torch.zeros(0, 1, 1), torch.zeros(0, 5, 4), torch.zeros(0, 1, 4)),
     "1 to 65535 members"),
])
def test_bad_arguments(args, match):
    assert not member_dueling_head_supported(*args)
    with pytest.raises(ValueError, match=match):
        member_dueling_head(*args, backend="triton")


def test_unknown_backend():
    ts, _ = _case(1, 2, 3, 4)
    with pytest.raises(ValueError, match="backend"):
        member_dueling_head(*ts, backend="cuda")


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("p,m,k,a", [(1, 128, 256, 45), (64, 128, 256, 45), (64, 256, 256, 3), (5, 40, 64, 127)])
def test_gpu_kernels_equal_reference(p, m, k, a):
    ts, up = _case(p, m, k, a, seed=p + m + a, device="cuda")
    got, want = _run(_kernel, ts, up), _run(member_dueling_head_reference, ts, up)
    for name, g, e in zip(NAMES, got, want):  # TF32 on both sides, other sums
        torch.testing.assert_close(g, e, rtol=2e-3, atol=2e-3 * max(1.0, e.abs().max().item()), msg=name)


@pytest.mark.gpu
def test_gpu_kernel_counts_and_capture():
    ts, up = _case(64, 128, 256, 45, seed=3, device="cuda")
    n, names = cuda_kernels(lambda: member_dueling_head(*ts))
    assert n == 1, names
    params = [t.requires_grad_(True) for t in ts]
    n, names = cuda_kernels(lambda: torch.autograd.grad(member_dueling_head(*params), params, up))
    assert n == 3, names
    with torch.no_grad():
        graph, q = capture_graph(lambda: member_dueling_head(*ts))
        ts[0].mul_(2.0)  # the replay reads the new values
        with no_host_sync():
            graph.replay()
        assert torch.equal(q, member_dueling_head(*ts))
