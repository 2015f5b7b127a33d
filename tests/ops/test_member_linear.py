"""foxdqn.ops.member_linear: the kernel (TRITON_INTERPRET=1 on CPU) against baddbmm (+ relu), y and
the gradients of x, W and b: P = 1 and 3, M = 1, 17 and 70 (past a row block), K = 1, 5 and 40
(past a K block), N = 1, 9 and 100 (past a column block), with and without the ReLU; strided x, W
and b (a transposed weight, a half of a stacked pair); NaN kept by the ReLU; members never mix
(member 1's inputs changed, NaN included, leave member 0's y and gradients bit for bit); P = 1
equals member 0 of P = 3 bit for bit where their tiles agree; the tile choice; M = 0; the TF32 path against
a float64 emulation; the population layer's use of it; the pair (two sets of rows, one launch, the
second without gradient) against the reference and the kernel on each part, its launches and the
population layer's use of it; bad arguments. GPU (`gpu` marker): kernel =
reference on CUDA at the trading experiments' sizes, one kernel forward, CUDA-graph capture, no
host sync."""
from __future__ import annotations

import pytest
import torch

import foxdqn.ops.member_linear as mod
from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.member_linear import member_linear, member_linear_reference, member_linear_supported

from support import assert_close_ulps, capture_graph, cuda_kernels, no_host_sync, require_compiled_kernels, round_tf32

_need_compiled = require_compiled_kernels(INTERPRET)
NAN = float("nan")


def _case(p, m, k, n, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(p, m, k, generator=g)
    w = torch.randn(p, k, n, generator=g) / max(k, 1) ** 0.5
    b = torch.randn(p, 1, n, generator=g) * 0.2
    up = torch.randn(p, m, n, generator=g)
    return x.to(device), w.to(device), b.to(device), up.to(device)


def _run(fn, x, w, b, up, relu):
    """y and the gradients (x, W, b) of Σ y · up."""
    x, w, b = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
    y = fn(x, w, b, relu)
    return [y.detach(), *torch.autograd.grad(y, (x, w, b), up)]


def _kernel(x, w, b, relu):
    return member_linear(x, w, b, relu, backend="triton")


def _check(got, want, k):
    for name, a, e in zip(("y", "dx", "dW", "db"), got, want):
        assert a.shape == e.shape and a.dtype == torch.float32, name
        assert_close_ulps(a, e, rtol=1e-5, ulps=8 * max(k, 4), name=name)


@pytest.mark.parametrize("p", [1, 3])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (17, 5, 9), (70, 40, 100), (17, 40, 1)])
@pytest.mark.parametrize("relu", [False, True])
def test_kernel_equals_reference(p, m, k, n, relu):
    x, w, b, up = _case(p, m, k, n, seed=p * 100 + m + k + n)
    _check(_run(_kernel, x, w, b, up, relu), _run(member_linear_reference, x, w, b, up, relu), k)


def test_strided_inputs():
    """x a half of a stacked pair, W a transposed view, b a strided view: read through strides."""
    x2, w, b, up = _case(3, 2 * 17, 12, 20, seed=4)
    x, up = x2.view(3, 2, 17, 12)[:, 1], up[:, :17]  # x: member stride 2·17·12, rows contiguous
    wt = w.transpose(1, 2).contiguous().transpose(1, 2)  # [P, K, N] with strides (K·N, 1, K)
    bs = torch.randn(3, 1, 40)[:, :, ::2]
    assert not x.is_contiguous() and not wt.is_contiguous() and not bs.is_contiguous()
    _check(_run(_kernel, x, wt, bs, up, True), _run(member_linear_reference, x, wt, bs, up, True), 12)


def test_relu_keeps_nan_and_zeroes_negatives():
    x = torch.tensor([[[1.0], [NAN], [-1.0]]])
    w, b = torch.ones(1, 1, 2), torch.tensor([[[0.0, -5.0]]])
    y = member_linear(x, w, b, relu=True, backend="triton")
    assert torch.equal(y[0, 0], torch.tensor([1.0, 0.0])) and y[0, 1].isnan().all()
    assert torch.equal(y[0, 2], torch.tensor([0.0, 0.0]))


def test_members_never_mix_and_p1_is_member_0():
    x, w, b, up = _case(3, 33, 20, 18, seed=7)
    base = _run(_kernel, x, w, b, up, True)
    x2, w2, b2 = x.clone(), w.clone(), b.clone()
    x2[1:], w2[1:] = 3.0, -2.0
    x2[2, 0, 0] = NAN
    other = _run(_kernel, x2, w2, b2, up, True)
    assert all(torch.equal(a[0], c[0]) for a, c in zip(base, other))
    alone = _run(_kernel, x[:1], w[:1], b[:1], up[:1], True)  # the same tile here (a small grid)
    assert mod._tiles(1, 33, 18, 20) == mod._tiles(3, 33, 18, 20)
    assert all(torch.equal(a[0], c[0]) for a, c in zip(base, alone))
    again = _run(_kernel, x, w, b, up, True)
    assert all(torch.equal(a, c) for a, c in zip(base, again))  # the same bits on every call


def test_no_rows_and_no_gradient():
    x, w, b, _ = _case(2, 0, 5, 7)
    assert member_linear(x, w, b, True, backend="triton").shape == (2, 0, 7)
    x, w, b, _ = _case(2, 9, 5, 7, seed=2)
    with torch.no_grad():
        y = member_linear(x, w.requires_grad_(True), b, backend="triton")
    assert not y.requires_grad
    assert_close_ulps(y, member_linear_reference(x, w, b).detach(), rtol=1e-5, ulps=40)


def test_tile_choice():
    """128 rows per program where the grid fills the GPU, 32 (4 stages) where it would not or where
    W's rows are not 16-byte aligned (N % 4 != 0)."""
    assert mod._tiles(64, 256, 256, 256) == (128, 64, 32, 3)  # 2 · 4 · 64 = 512 programs
    assert mod._tiles(1, 256, 256, 256) == (32, 64, 32, 4)  # 8 programs at 128 rows
    assert mod._tiles(64, 10, 5, 3) == (16, 16, 16, 4)  # small shapes: the smallest tiles
    assert mod._tiles(64, 256, 45 * 51, 256) == (32, 64, 32, 4)  # rows of W not 16-byte aligned: 32 rows
    assert mod._tiles(512, 256, 1, 256) == (32, 16, 32, 4)


def test_blocks_loop(monkeypatch):
    """Small tiles: every loop and mask of the grid (rows, columns, K) runs several times."""
    monkeypatch.setattr(mod, "BLOCK_M", 16)
    monkeypatch.setattr(mod, "BLOCK_N", 16)
    monkeypatch.setattr(mod, "BLOCK_K", 16)
    x, w, b, up = _case(2, 35, 50, 37, seed=9)
    _check(_run(_kernel, x, w, b, up, True), _run(member_linear_reference, x, w, b, up, True), 50)


def test_tf32_path_against_float64_emulation(monkeypatch):
    """PREC "tf32": the operands rounded to TF32 (to nearest), products and sums in float32."""
    monkeypatch.setattr(mod, "_prec", lambda x: "tf32")
    x, w, b, _ = _case(2, 19, 40, 11, seed=11)
    y = member_linear(x, w, b, True, backend="triton")
    want = torch.relu(torch.baddbmm(b.double(), round_tf32(x).double(), round_tf32(w).double())).float()
    assert_close_ulps(y, want, rtol=1e-5, ulps=8 * 40)


@pytest.mark.parametrize("n,fused", [(8, True), (1, True), (5, False), (45 * 51, False)])
def test_population_layer_takes_the_kernel_where_the_fused_forwards_run(n, fused):
    """foxdqn.population.layers.member_linear: the kernel inside cpu_kernels (as on CUDA), with the
    ReLU in its epilogue, for one output or a multiple of 4 (member_linear_preferred); baddbmm
    (+ relu) for other widths and outside, the same values."""
    from foxdqn.ops.backend import cpu_kernels
    from foxdqn.population.layers import member_linear as layer

    assert mod.member_linear_preferred(n) is fused
    x, w, b, up = _case(3, 10, 6, n, seed=12)
    calls = []
    launch = mod._launch
    try:
        mod._launch = lambda *a, **kw: calls.append(a[3]) or launch(*a, **kw)
        with cpu_kernels():
            got = _run(layer, x, w, b, up, True)
        plain = _run(layer, x, w, b, up, True)
    finally:
        mod._launch = launch
    assert calls == ([True] if fused else [])
    _check(got, plain, 6)


def _run_pair(fn, x_a, x_b, w, b, up, relu):
    """y_a, y_b and the gradients (x_a, W, b) of Σ y_a · up; y_b must carry no gradient."""
    x_a, w, b = (t.detach().clone().requires_grad_(True) for t in (x_a, w, b))
    y_a, y_b = fn(x_a, x_b, w, b, relu)
    assert not y_b.requires_grad and y_a.requires_grad
    return [y_a.detach(), y_b, *torch.autograd.grad(y_a, (x_a, w, b), up)]


def _pair_kernel(x_a, x_b, w, b, relu):
    return mod.member_linear_pair(x_a, x_b, w, b, relu, backend="triton")


@pytest.mark.parametrize("p", [1, 3])
@pytest.mark.parametrize("ma,mb", [(17, 17), (70, 5), (1, 40), (17, 0), (0, 9)])
@pytest.mark.parametrize("relu", [False, True])
def test_pair_equals_the_reference_and_the_kernel_on_each_part(p, ma, mb, relu):
    """The rows of x_a and x_b (two strided parts of one tensor, rows apart) in one launch: y_a and its
    gradients as the reference's of x_a and as the kernel's of x_a alone, y_b as either's of x_b, a
    constant; the backward covers x_a's rows only (the gradients are x_a's)."""
    k, n = 40, 9
    x, w, b, _ = _case(p, ma + mb + 3, k, n, seed=p * 7 + ma + mb)
    x_a, x_b = x[:, :ma], x[:, ma + 3:]
    up = torch.randn(p, ma, n, generator=torch.Generator().manual_seed(ma))
    got = _run_pair(_pair_kernel, x_a, x_b, w, b, up, relu)
    want = _run_pair(mod.member_linear_pair_reference, x_a, x_b, w, b, up, relu)
    alone = _run(_kernel, x_a, w, b, up, relu)
    for name, a, e, e2 in zip(("y_a", "y_b", "dx_a", "dW", "db"), got, want, [alone[0], None, *alone[1:]]):
        assert a.shape == e.shape and a.dtype == torch.float32 and a.is_contiguous(), name
        assert_close_ulps(a, e, rtol=1e-5, ulps=8 * k, name=name)
        if e2 is not None:
            assert_close_ulps(a, e2, rtol=1e-5, ulps=8 * k, name=name)
    assert_close_ulps(got[1], _kernel(x_b, w, b, relu), rtol=1e-5, ulps=8 * k, name="y_b alone")


def test_pair_is_one_launch_forward_and_its_backward_launches_nothing_for_the_constant_rows():
    """One kernel for both parts; the backward as member_linear's of x_a (no zeros for y_b's gradient)."""
    from bench.cpu_kernels import launches

    x, w, b, _ = _case(2, 30, 12, 8, seed=3)
    w.requires_grad_(True)
    b.requires_grad_(True)

    def step():
        y_a, y_b = mod.member_linear_pair(x[:, :20], x[:, 20:], w, b, True, backend="triton")
        torch.autograd.grad(y_a.sum(), (w, b))

    def alone():
        y = member_linear(x[:, :20], w, b, True, backend="triton")
        torch.autograd.grad(y.sum(), (w, b))

    ops, single = launches(step), launches(alone)
    assert ops.count("triton::_member_linear_kernel") == 1 and "aten::zeros" not in ops, ops
    assert [o for o in ops if o != "triton::_member_linear_kernel"] == \
        [o for o in single if o != "triton::_member_linear_kernel"]


@pytest.mark.parametrize("relu", [False, True])
def test_pair_whose_output_gets_no_gradient_adds_none(relu):
    """A downstream op that returns no gradient for y_a (None: autograd does not materialise it): the
    pair's backward adds nothing (it read y_a, saved only with the ReLU, and raised without one)."""

    class NoGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.sum()

        @staticmethod
        def backward(ctx, g):
            return None

    x, w, b, _ = _case(2, 5, 4, 8, seed=5)
    w.requires_grad_(True)
    b.requires_grad_(True)
    y_a, _ = mod.member_linear_pair(x[:, :3], x[:, 3:], w, b, relu, backend="triton")
    (NoGrad.apply(y_a) + w.sum()).backward()
    assert torch.equal(w.grad, torch.ones_like(w)) and b.grad is None


def test_population_pair_takes_one_launch_where_the_kernel_runs():
    """foxdqn.population.layers.member_linear_pair: the op inside cpu_kernels for a preferred width; two
    layer calls (the second without gradient) for another width or outside; the same values."""
    from foxdqn.ops.backend import cpu_kernels
    from foxdqn.population.layers import member_linear_pair as layer_pair

    for n, fused in ((8, True), (5, False)):
        x, w, b, _ = _case(3, 21, 6, n, seed=13)
        up = torch.randn(3, 10, n)
        calls = []
        launch = mod._launch
        try:
            mod._launch = lambda *a: calls.append(len(a)) or launch(*a)
            with cpu_kernels():
                got = _run_pair(layer_pair, x[:, :10], x[:, 10:], w, b, up, True)
            plain = _run_pair(layer_pair, x[:, :10], x[:, 10:], w, b, up, True)
        finally:
            mod._launch = launch
        assert calls == ([5] if fused else []), (n, calls)
        for a, e in zip(got, plain):
            assert_close_ulps(a, e, rtol=1e-5, ulps=64)


def _run_residual(fn, x, w, b, r, up):
    """y and the gradients (x, W, b, r) of Σ y · up for y = fn(x, w, b, r)."""
    x, w, b, r = (t.detach().clone().requires_grad_(True) for t in (x, w, b, r))
    y = fn(x, w, b, r)
    return [y.detach(), *torch.autograd.grad(y, (x, w, b, r), up)]


@pytest.mark.parametrize("p,m,k,n", [(1, 1, 1, 1), (3, 17, 40, 9), (2, 70, 5, 100)])
def test_residual_is_the_sum_torch_would_form(p, m, k, n):
    """With a residual r the kernel stores r + (x W + b): bit for bit the kernel's layer plus r by
    torch's add (one launch instead of two), equal to the reference to float rounding, and r's
    gradient is dy; a strided r (a view) is read in place."""
    x, w, b, up = _case(p, m, k, n, seed=m + n)
    r = torch.randn(p, n, m).transpose(1, 2)  # [P, M, N], not contiguous
    got = _run_residual(lambda *a: member_linear(*a[:3], residual=a[3], backend="triton"), x, w, b, r, up)
    two = _run_residual(lambda *a: a[3] + member_linear(*a[:3], backend="triton"), x, w, b, r, up)
    ref = _run_residual(lambda *a: member_linear_reference(*a[:3], residual=a[3]), x, w, b, r, up)
    for name, a, e, t in zip(("y", "dx", "dW", "db", "dr"), got, two, ref):
        assert torch.equal(a, e), name
        assert_close_ulps(a, t, rtol=1e-5, ulps=8 * max(k, 4), name=name)
    assert torch.equal(got[4], up)
    with torch.no_grad():
        assert torch.equal(member_linear(x, w, b, residual=r, backend="triton"), got[0])



@pytest.mark.parametrize("p,m,k,n,group", [(1, 32, 5, 9, 32), (3, 64, 40, 100, 32), (2, 12, 7, 4, 4), (1, 16, 3, 2, 1)])
def test_group_mean_in_the_epilogue(monkeypatch, p, m, k, n, group):
    """``group_mean``: each G rows' mean of the ReLU layer in the kernel's epilogue, the reference's
    (the layer, then ``Tensor.mean``) to float rounding; every member's row block of 16 rows or
    more holds whole groups (small tiles: several groups per program and several programs); with a
    gradient the layer, then the mean; a G that is not a power of two, the layer, then the mean."""
    monkeypatch.setattr(mod, "BLOCK_M", 16)
    monkeypatch.setattr(mod, "BLOCK_M_SMALL", 16)
    x, w, b, _ = _case(p, m, k, n, seed=m + group)
    with torch.no_grad():
        got = member_linear(x, w, b, True, group_mean=group, backend="triton")
        layer = member_linear(x, w, b, True, backend="triton")
    want = member_linear_reference(x, w, b, True, group_mean=group)
    assert got.shape == (p, m // group, n)
    assert_close_ulps(got, want, rtol=1e-5, ulps=8 * max(k, 4) * group, name="mean")
    torch.testing.assert_close(got, layer.view(p, -1, group, n).mean(dim=2), rtol=1e-6, atol=1e-6)
    up = torch.randn(p, m // group, n)
    xs = [t.clone().requires_grad_(True) for t in (x, w, b)]
    y = member_linear(*xs, True, group_mean=group, backend="triton")
    grads = torch.autograd.grad(y, xs, up)
    xr = [t.clone().requires_grad_(True) for t in (x, w, b)]
    ref = torch.autograd.grad(member_linear_reference(*xr, True, group_mean=group), xr, up)
    for a, e in zip(grads, ref):
        assert_close_ulps(a, e, rtol=1e-5, ulps=8 * max(k, 4), name="grad")
    with torch.no_grad():
        three = member_linear(x[:, :12], w, b, True, group_mean=3, backend="triton")  # not a power of two
    assert_close_ulps(three, member_linear_reference(x[:, :12], w, b, True, group_mean=3), rtol=1e-5,
                      ulps=24 * max(k, 4), name="mean of 3")
    with pytest.raises(ValueError, match="group_mean must be"):
        member_linear(x, w, b, group_mean=m + 1, backend="triton")
    with pytest.raises(ValueError, match="group_mean must be"):
        member_linear(x, w, b, group_mean=2, residual=torch.zeros(p, m, n), backend="triton")


def test_residual_is_one_launch_in_the_population_layer():
    """foxdqn.population.layers.member_linear with a residual: one kernel inside cpu_kernels (no add),
    the add after the product outside; the same bits."""
    from bench.cpu_kernels import launches
    from foxdqn.ops.backend import cpu_kernels
    from foxdqn.population.layers import member_linear as layer

    x, w, b, up = _case(3, 10, 6, 8, seed=4)
    r = torch.randn(3, 10, 8)
    with cpu_kernels():
        ops = launches(lambda: layer(x, w, b, residual=r))
        got = layer(x, w, b, residual=r)
        two = r + layer(x, w, b)
    assert ops == ["triton::_member_linear_kernel"], ops
    assert torch.equal(got, two)
    assert torch.equal(layer(x, w, b, residual=r), r + layer(x, w, b))
    with pytest.raises(ValueError, match="without a ReLU"):  # outside the kernel too
        layer(x, w, b, True, residual=r)


@pytest.mark.parametrize("r, relu, match", [
    (torch.zeros(2, 3, 5), False, r"residual must be a float32 \[2, 3, 4\]"),
    (torch.zeros(2, 3, 4, dtype=torch.float64), False, "residual must be a float32"),
    (torch.zeros(2, 3, 4), True, "without a ReLU"),
])
def test_bad_residual(r, relu, match):
    x, w, b = torch.zeros(2, 3, 5), torch.zeros(2, 5, 4), torch.zeros(2, 1, 4)
    with pytest.raises(ValueError, match=match):
        member_linear(x, w, b, relu, residual=r, backend="triton")


@pytest.mark.parametrize("args, match", [
    ((torch.zeros(2, 3), torch.zeros(2, 3, 4), torch.zeros(2, 1, 4)), "x must be a float32 tensor of 3"),
    ((torch.zeros(2, 3, 5), torch.zeros(2, 4, 4), torch.zeros(2, 1, 4)), r"w must be \[2, 5, N\]"),
    ((torch.zeros(2, 3, 5), torch.zeros(2, 5, 4), torch.zeros(2, 4)), "b must be a float32 tensor of 3"),
    ((torch.zeros(2, 3, 5), torch.zeros(2, 5, 4), torch.zeros(2, 1, 3)), r"b must be \[2, 1, 4\]"),
    ((torch.zeros(2, 3, 5, dtype=torch.float64), torch.zeros(2, 5, 4), torch.zeros(2, 1, 4)), "float32"),
    ((torch.zeros(0, 3, 5), torch.zeros(0, 5, 4), torch.zeros(0, 1, 4)), "1 to 65535 members"),
])
def test_bad_arguments(args, match):
    assert not member_linear_supported(*args)
    with pytest.raises(ValueError, match=match):
        member_linear(*args, backend="triton")


def test_unknown_backend():
    x, w, b, _ = _case(1, 2, 3, 4)
    with pytest.raises(ValueError, match="backend"):
        member_linear(x, w, b, backend="cuda")


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("p,m,k,n", [(1, 256, 162, 256), (64, 256, 256, 256), (64, 256, 256, 2295), (5, 32, 256, 1)])
@pytest.mark.parametrize("relu", [False, True])
def test_gpu_kernel_equals_reference(p, m, k, n, relu):
    """TF32 on both sides, the sums in other orders: y to float rounding. With the ReLU, a
    pre-activation within that rounding of 0 can take the other side of the ReLU in the two paths,
    and its row of dx (and its term of dW, db) then differs by a whole gradient term: the gradients
    are compared with the reference's formula under the kernel's own ReLU decisions (autograd's
    ``threshold_backward``: 1{y > 0}), and the decisions with the reference's, which may differ only
    within rounding of 0 and at a few elements."""
    x, w, b, up = _case(p, m, k, n, seed=p + m + n, device="cuda")
    got, want = _run(_kernel, x, w, b, up, relu), _run(member_linear_reference, x, w, b, up, relu)
    if relu:
        y_ref = torch.baddbmm(b, x, w)
        flipped = (got[0] > 0) != (y_ref > 0)
        assert flipped.sum().item() <= max(1, y_ref.numel() // 100_000), flipped.sum().item()
        assert (y_ref[flipped].abs() <= 1e-4 * y_ref.abs().max()).all(), y_ref[flipped]
        g = up * (got[0] > 0)
        want = [want[0], torch.bmm(g, w.transpose(1, 2)), torch.bmm(x.transpose(1, 2), g), g.sum(1, keepdim=True)]
    for name, a, e in zip(("y", "dx", "dW", "db"), got, want):
        torch.testing.assert_close(a, e, rtol=2e-3, atol=2e-3 * max(1.0, e.abs().max().item()), msg=name)


@pytest.mark.gpu
def test_gpu_residual_is_the_sum_torch_would_form():
    x, w, b, up = _case(64, 256, 64, 64, seed=9, device="cuda")
    r = torch.randn(64, 256, 64, device="cuda")
    got = _run_residual(lambda *a: member_linear(*a[:3], residual=a[3], backend="triton"), x, w, b, r, up)
    two = _run_residual(lambda *a: a[3] + member_linear(*a[:3], backend="triton"), x, w, b, r, up)
    for name, a, e in zip(("y", "dx", "dW", "db", "dr"), got, two):
        assert torch.equal(a, e), name
    n, names = cuda_kernels(lambda: member_linear(x, w, b, residual=r))
    assert n == 1, names


@pytest.mark.gpu
def test_gpu_one_kernel_and_capture():
    x, w, b, _ = _case(64, 256, 256, 256, seed=3, device="cuda")
    n, names = cuda_kernels(lambda: member_linear(x, w, b, True))
    assert n == 1, names
    graph, y = capture_graph(lambda: member_linear(x, w, b, True))
    x.mul_(2.0)  # the replay reads the new values
    with no_host_sync():
        graph.replay()
    assert torch.equal(y, member_linear(x, w, b, True))


@pytest.mark.gpu
@pytest.mark.parametrize("p,ma,mb,k,n", [(1, 256, 256, 162, 256), (64, 256, 256, 256, 256), (5, 32, 32, 256, 1)])
def test_gpu_pair_equals_reference_one_kernel_and_capture(p, ma, mb, k, n):
    x, w, b, _ = _case(p, ma + mb, k, n, seed=p + ma, device="cuda")
    up = torch.randn(p, ma, n, device="cuda")
    x_a, x_b = x[:, :ma], x[:, ma:]
    got = _run_pair(_pair_kernel, x_a, x_b, w, b, up, True)
    want = _run_pair(mod.member_linear_pair_reference, x_a, x_b, w, b, up, True)
    for name, a, e in zip(("y_a", "y_b", "dx_a", "dW", "db"), got, want):  # TF32 on both sides, other sums
        torch.testing.assert_close(a, e, rtol=2e-3, atol=2e-3 * max(1.0, e.abs().max().item()), msg=name)
    n_kernels, names = cuda_kernels(lambda: mod.member_linear_pair(x_a, x_b, w, b, True))
    assert n_kernels == 1, names
    graph, (y_a, y_b) = capture_graph(lambda: mod.member_linear_pair(x_a, x_b, w, b, True))
    x.mul_(2.0)  # the replay reads the new values
    with no_host_sync():
        graph.replay()
    want_a, want_b = mod.member_linear_pair(x_a, x_b, w, b, True)
    assert torch.equal(y_a, want_a) and torch.equal(y_b, want_b)


@pytest.mark.gpu
@pytest.mark.parametrize("p,m", [(1, 256 * 32), (64, 128 * 32)])
def test_gpu_group_mean_one_kernel(p, m):
    """IQN's policy pass: the hidden layer (256 → 256, ReLU) of M·K rows averaged over K = 32
    fractions in one kernel, the reference's to TF32 rounding."""
    x, w, b, _ = _case(p, m, 256, 256, seed=p, device="cuda")
    with torch.no_grad():
        n, names = cuda_kernels(lambda: member_linear(x, w, b, True, group_mean=32))
        got = member_linear(x, w, b, True, group_mean=32)
        layer = member_linear(x, w, b, True)
    assert n == 1, names
    torch.testing.assert_close(got, layer.view(p, -1, 32, 256).mean(dim=2), rtol=1e-5, atol=1e-5)
    want = member_linear_reference(x, w, b, True, group_mean=32)
    torch.testing.assert_close(got, want, rtol=5e-3, atol=5e-3)
