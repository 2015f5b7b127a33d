"""foxdqn.ops.member_heads: the kernels (TRITON_INTERPRET=1 on CPU) against one baddbmm per head,
the outputs and the gradients of x, every W_d and b_d: P = 1 and 3, 1 to 4 heads of 1 to 32
columns, M = 1, 17 and 70 (past a row block), K = 1, 5, 40 and 256; strided inputs and strided
gradients (the BDQ loss's column slices); the loops of every block; NaN and ±inf confined to
their row; members never mix and P = 1 equals member 0 of P = 3 bit for bit; M = 0 and K = 0; no
gradient asked, some gradients asked; the TF32 path against a float64 emulation; the branching
population's use of it (one launch forward, two backward, only where the fused forwards run); bad
arguments. GPU (`gpu` marker): kernels = reference on CUDA at the trading sizes, kernel counts,
CUDA-graph capture, no host sync."""
from __future__ import annotations

import pytest
import torch

import foxdqn.ops.member_heads as mod
from foxdqn.ops.member_heads import member_heads, member_heads_reference, member_heads_supported

from support import assert_close_ulps, capture_graph, cuda_kernels, no_host_sync, round_tf32

NAN = float("nan")


def _case(p, m, k, widths, seed=0, device="cpu"):
    """(x, weights, biases), and an upstream gradient per head."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(p, m, k, generator=g)
    ws = [torch.randn(p, k, n, generator=g) / max(k, 1) ** 0.5 for n in widths]
    bs = [torch.randn(p, 1, n, generator=g) * 0.2 for n in widths]
    ups = [torch.randn(p, m, n, generator=g) for n in widths]
    return (x.to(device), [w.to(device) for w in ws], [b.to(device) for b in bs]), [u.to(device) for u in ups]


def _run(fn, args, ups):
    """The outputs and the gradients of x, the weights and the biases of Σ_d y_d · up_d."""
    x, ws, bs = args
    x = x.detach().clone().requires_grad_(True)
    ws = [w.detach().clone().requires_grad_(True) for w in ws]
    bs = [b.detach().clone().requires_grad_(True) for b in bs]
    ys = fn(x, ws, bs)
    return [y.detach() for y in ys] + list(torch.autograd.grad(ys, [x, *ws, *bs], ups))


def _kernel(x, ws, bs):
    return member_heads(x, ws, bs, backend="triton")


def _check(got, want, k):
    assert len(got) == len(want)
    for i, (g, e) in enumerate(zip(got, want)):
        assert g.shape == e.shape and g.dtype == torch.float32, i
        assert_close_ulps(g, e, rtol=1e-5, ulps=8 * max(k, 16), name=str(i))


@pytest.mark.parametrize("p", [1, 3])
@pytest.mark.parametrize("m,k,widths", [(1, 1, (1,)), (17, 5, (5, 3, 3, 1)), (70, 40, (5, 3, 3)),
                                        (17, 40, (32, 1)), (9, 3, (7, 16, 2, 31))])
def test_kernel_equals_reference(p, m, k, widths):
    args, ups = _case(p, m, k, widths, seed=p * 100 + m + k + len(widths))
    _check(_run(_kernel, args, ups), _run(member_heads_reference, args, ups), k)


def test_trading_width():
    """eurusd_branching's head: 256 hidden units, branches 5, 3, 3 and the value, the pair's 256 rows."""
    args, ups = _case(2, 256, 256, (5, 3, 3, 1), seed=5)
    _check(_run(_kernel, args, ups), _run(member_heads_reference, args, ups), 256)


def test_strided_inputs_and_gradients():
    """x a half of a stacked pair, a weight a transposed view, a bias strided; the upstream gradients
    column slices of one [P, M, Σ N_d] buffer (as the BDQ loss's backward gives them)."""
    (x2, ws, bs), _ = _case(3, 2 * 17, 12, (5, 3, 3, 1), seed=4)
    x = x2.view(3, 2, 17, 12)[:, 1]
    ws[1] = ws[1].transpose(1, 2).contiguous().transpose(1, 2)
    bs[0] = torch.randn(3, 1, 10)[:, :, ::2]
    buf = torch.randn(3, 17, 12)
    ups = [buf[:, :, 0:5], buf[:, :, 5:8], buf[:, :, 8:11], buf[:, :, 11:12]]
    assert not any(t.is_contiguous() for t in (x, ws[1], bs[0], *ups))
    _check(_run(_kernel, (x, ws, bs), ups), _run(member_heads_reference, (x, ws, bs), ups), 12)


def test_blocks_loop(monkeypatch):
    """Small tiles: every loop and mask of the three grids (rows, K, dx columns, dW rows) runs several times."""
    for name, value in (("BLOCK_M", 16), ("BLOCK_K", 16), ("BLOCK_DX", 16),
                        ("BLOCK_DW", 16), ("BLOCK_R", 16)):
        monkeypatch.setattr(mod, name, value)
    args, ups = _case(2, 35, 50, (5, 3, 3, 1), seed=9)
    _check(_run(_kernel, args, ups), _run(member_heads_reference, args, ups), 50)


def test_nan_and_inf_stay_in_their_row():
    """A NaN or +inf in x's row r reaches row r of every head only; the gradients are non-finite
    exactly where the reference's are."""
    for bad in (NAN, float("inf")):
        args, ups = _case(1, 6, 4, (5, 3, 1), seed=3)
        args[0][0, 2, 1] = bad
        ys = _kernel(*args)
        for y in ys:
            assert not y[0, 2].isfinite().any() and y[0, [0, 1, 3, 4, 5]].isfinite().all()
        got, want = _run(_kernel, args, ups), _run(member_heads_reference, args, ups)
        for i, (g, e) in enumerate(zip(got, want)):
            assert torch.equal(g.isfinite(), e.isfinite()), (bad, i)
            assert_close_ulps(g[g.isfinite()], e[e.isfinite()], rtol=1e-5, ulps=64, name=str(i))


def test_members_never_mix_and_p1_is_member_0():
    args, ups = _case(3, 33, 20, (5, 3, 3, 1), seed=7)
    base = _run(_kernel, args, ups)
    x, ws, bs = (args[0].clone(), [w.clone() for w in args[1]], [b.clone() for b in args[2]])
    for t in (x, *ws, *bs):
        t[1:] = -2.0
    x[2, 0, 0] = NAN
    other = _run(_kernel, (x, ws, bs), ups)
    assert all(torch.equal(a[0], c[0]) for a, c in zip(base, other))
    alone = _run(_kernel, (args[0][:1], [w[:1] for w in args[1]], [b[:1] for b in args[2]]), [u[:1] for u in ups])
    assert all(torch.equal(a[0], c[0]) for a, c in zip(base, alone))
    again = _run(_kernel, args, ups)
    assert all(torch.equal(a, c) for a, c in zip(base, again))  # the same bits on every call


def test_no_rows_no_width_and_no_gradient():
    args, ups = _case(2, 0, 5, (5, 3))
    got = _run(_kernel, args, ups)
    assert got[0].shape == (2, 0, 5) and all(torch.equal(g, torch.zeros_like(g)) for g in got[2:])
    args, ups = _case(2, 4, 0, (3, 1))  # K = 0: y = b, the bias gradients only
    _check(_run(_kernel, args, ups), _run(member_heads_reference, args, ups), 1)
    (x, ws, bs), _ = _case(2, 9, 5, (7, 2), seed=2)
    with torch.no_grad():
        ys = member_heads(x.requires_grad_(True), ws, bs, backend="triton")
    assert not any(y.requires_grad for y in ys)
    for y, e in zip(ys, member_heads_reference(x, ws, bs)):
        assert_close_ulps(y, e.detach(), rtol=1e-5, ulps=40)


def test_only_the_asked_gradients():
    """x without gradient (a frozen encoder's output): no dx launched; one weight asked: the others None."""
    from bench.cpu_kernels import launches

    args, ups = _case(2, 9, 5, (5, 3, 1), seed=6)
    x, ws, bs = args
    ws[1].requires_grad_(True)
    ys = member_heads(x, ws, bs, backend="triton")
    (g,) = torch.autograd.grad(ys, (ws[1],), ups)
    want = _run(member_heads_reference, args, ups)[3 + 1 + 1]
    assert_close_ulps(g, want, rtol=1e-5, ulps=40)

    def step():
        torch.autograd.grad(member_heads(x, ws, bs, backend="triton"), (ws[1],), ups)

    assert launches(step) == ["triton::_member_heads_forward_kernel", "triton::_member_heads_dw_kernel"]


def test_tf32_path_against_float64_emulation(monkeypatch):
    """PREC "tf32": the dot operands rounded to TF32 (to nearest), products and sums in float32."""
    monkeypatch.setattr(mod, "_prec", lambda x: "tf32")
    (x, ws, bs), _ = _case(2, 19, 40, (5, 3, 11), seed=11)
    ys = _kernel(x, ws, bs)
    xd = round_tf32(x).double()
    want = member_heads_reference(xd, [round_tf32(w).double() for w in ws], [b.double() for b in bs])
    for y, e in zip(ys, want):
        assert_close_ulps(y, e.float(), rtol=1e-5, ulps=8 * 40)


def test_branching_population_takes_the_kernels_where_the_fused_forwards_run(monkeypatch):
    """MemberBranchingNetwork (dueling BDQ head): inside cpu_kernels (as on CUDA) the heads' forward
    is one launch and their backward two; outside, the layers; the same values. With the switch off,
    the layers inside cpu_kernels too."""
    from bench.cpu_kernels import launches
    from foxdqn.nn.branching import BranchingHead, BranchingNetwork
    from foxdqn.nn.mlp import MLPEncoder
    from foxdqn.ops.backend import cpu_kernels
    from foxdqn.population import branching
    from foxdqn.population.branching import MemberBranchingNetwork

    torch.manual_seed(0)
    nets = [BranchingNetwork(MLPEncoder(6, [8]), BranchingHead(8, (5, 3, 3))) for _ in range(3)]
    member = MemberBranchingNetwork.from_networks(nets, "relu")
    obs = torch.randn(3, 11, 6)
    params = list(member.parameters())

    def outputs():
        adv, v = member.head_outputs(obs)
        return [*adv, v]

    ups = [torch.randn(3, 11, n) for n in (5, 3, 3, 1)]

    def step():
        return [y.detach() for y in outputs()] + list(torch.autograd.grad(outputs(), params, ups))

    with cpu_kernels():
        ops = launches(lambda: torch.autograd.grad(outputs(), params, ups))
        got = step()
        monkeypatch.setattr(branching, "BRANCH_HEAD_KERNELS", False)
        off = launches(lambda: torch.autograd.grad(outputs(), params, ups))
    plain = step()
    assert not [o for o in off if "member_heads" in o], off
    assert ops.count("triton::_member_heads_forward_kernel") == 1 and ops.count("triton::_member_heads_dx_kernel") == 1
    assert ops.count("triton::_member_heads_dw_kernel") == 1 and "aten::baddbmm" not in ops, ops
    assert len(off) - len(ops) >= 10, (off, ops)
    for g, e in zip(got, plain):
        assert_close_ulps(g, e, rtol=1e-5, ulps=64)


def _zeros(*shape):
    return torch.zeros(*shape)


@pytest.mark.parametrize("args, match", [
    ((_zeros(2, 3), [_zeros(2, 3, 1)], [_zeros(2, 1, 1)]), "x must be a float32 tensor of 3"),
    ((_zeros(2, 3, 5), [], []), "1 to 4 weights"),
    ((_zeros(2, 3, 5), [_zeros(2, 5, 1)] * 5, [_zeros(2, 1, 1)] * 5), "1 to 4 weights"),
    ((_zeros(2, 3, 5), [_zeros(2, 5, 1)], []), "as many biases"),
    ((_zeros(2, 3, 5), [_zeros(2, 4, 3)], [_zeros(2, 1, 3)]), r"weights\[0\] must be \[2, 5, N\]"),
    ((_zeros(2, 3, 5), [_zeros(2, 5, 3), _zeros(2, 5, 33)], [_zeros(2, 1, 3), _zeros(2, 1, 33)]),
     r"weights\[1\] must be .* 1 <= N <= 32"),
    ((_zeros(2, 3, 5), [_zeros(2, 5, 3)], [_zeros(2, 1, 2)]), r"biases\[0\] must be \[2, 1, 3\]"),
    ((_zeros(2, 3, 5).double(), [_zeros(2, 5, 3)], [_zeros(2, 1, 3)]), "float32"),
    ((_zeros(2, 3, 5), [_zeros(2, 5, 3).double()], [_zeros(2, 1, 3)]), r"weights\[0\] must be a float32"),
    ((_zeros(0, 3, 5), [_zeros(0, 5, 3)], [_zeros(0, 1, 3)]), "1 to 65535 members"),
])
def test_bad_arguments(args, match):
    assert not member_heads_supported(*args)
    with pytest.raises(ValueError, match=match):
        member_heads(*args, backend="triton")


def test_unknown_backend():
    args, _ = _case(1, 2, 3, (4,))
    with pytest.raises(ValueError, match="backend"):
        member_heads(*args, backend="cuda")


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("p,m,k,widths", [(1, 256, 256, (5, 3, 3, 1)), (64, 256, 256, (5, 3, 3, 1)),
                                          (64, 128, 256, (5, 3, 3)), (5, 40, 64, (32, 7))])
def test_gpu_kernels_equal_reference(p, m, k, widths):
    args, ups = _case(p, m, k, widths, seed=p + m + len(widths), device="cuda")
    got, want = _run(_kernel, args, ups), _run(member_heads_reference, args, ups)
    for i, (g, e) in enumerate(zip(got, want)):  # TF32 on both sides, other sums
        torch.testing.assert_close(g, e, rtol=2e-3, atol=2e-3 * max(1.0, e.abs().max().item()), msg=str(i))


@pytest.mark.gpu
def test_gpu_kernel_counts_and_capture():
    (x, ws, bs), ups = _case(64, 256, 256, (5, 3, 3, 1), seed=3, device="cuda")
    n, names = cuda_kernels(lambda: member_heads(x, ws, bs))
    assert n == 1, names
    params = [x, *ws, *bs]
    for t in params:
        t.requires_grad_(True)
    n, names = cuda_kernels(lambda: torch.autograd.grad(member_heads(x, ws, bs), params, ups))
    assert n == 3, names
    with torch.no_grad():
        graph, ys = capture_graph(lambda: member_heads(x, ws, bs))
        x.mul_(2.0)  # the replay reads the new values
        with no_host_sync():
            graph.replay()
        assert all(torch.equal(a, b) for a, b in zip(ys, member_heads(x, ws, bs)))
