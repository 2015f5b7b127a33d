"""foxdqn.ops.dueling_combine: the kernels (TRITON_INTERPRET=1 on CPU) against the torch reference
(Q, and dV, dA against autograd of the reference), today's expression and a hand-computed case; odd
row counts, A = 1, leading axes [P, B, A], V given as [..., 1] or [...], non-contiguous inputs,
NaN rows, bad arguments. GPU (`gpu` marker): kernel = reference on CUDA, CUDA-graph capture."""
from __future__ import annotations

import pytest
import torch

from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.dueling_combine import dueling_combine, dueling_combine_reference

from support import capture_graph, no_host_sync, require_compiled_kernels

_need_compiled = require_compiled_kernels(INTERPRET)


def _case(lead, a, seed=0, device="cpu", squeeze=False):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(*lead, 1, generator=g) * 3
    adv = torch.randn(*lead, a, generator=g) * 2 + 0.5
    up = torch.randn(*lead, a, generator=g)  # upstream gradient dL/dQ
    if squeeze:
        v = v.squeeze(-1)
    return [x.to(device) for x in (v, adv, up)]


def _run(fn, v, adv, up, **kw):
    """Q, dL/dV, dL/dA for L = Σ Q · up."""
    v, adv = v.detach().clone().requires_grad_(True), adv.detach().clone().requires_grad_(True)
    q = fn(v, adv, **kw)
    gv, ga = torch.autograd.grad((q * up).sum(), (v, adv))
    return q.detach(), gv, ga


def _kernel(v, adv):
    return dueling_combine(v, adv, backend="triton")


@pytest.mark.parametrize("b", [1, 37, 130])
@pytest.mark.parametrize("a", [1, 3, 45])
def test_kernel_equals_reference_with_gradients(b, a):
    v, adv, up = _case((b,), a, seed=b * 100 + a)
    got = _run(_kernel, v, adv, up)
    want = _run(dueling_combine_reference, v, adv, up)
    for x, y, name in zip(got, want, ("q", "dv", "da")):
        assert x.shape == y.shape, name
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6, msg=name)  # the row sums' order


@pytest.mark.parametrize("lead,squeeze", [((3, 37), False), ((2, 5, 7), False), ((4, 9), True)])
def test_leading_axes_and_squeezed_value(lead, squeeze):
    v, adv, up = _case(lead, 3, seed=len(lead), squeeze=squeeze)
    got = _run(_kernel, v, adv, up)
    want = _run(dueling_combine_reference, v, adv, up)
    assert got[0].shape == (*lead, 3) and got[1].shape == v.shape
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)


def test_today_expression_and_population_rows():
    """The reference is the dueling head's old code; the population's [P, B, A] rows are each
    member's own [B, A] combine."""
    v, adv, up = _case((3, 37), 5, seed=9)
    old = v + adv - adv.mean(dim=2, keepdim=True)
    for backend in ("torch", "triton"):
        torch.testing.assert_close(dueling_combine(v, adv, backend=backend), old, rtol=1e-6, atol=1e-6)
    got = _run(_kernel, v, adv, up)
    for p in range(3):
        one = _run(_kernel, v[p], adv[p], up[p])
        for x, y in zip(got, one):
            torch.testing.assert_close(x[p], y, rtol=0, atol=0)


def test_non_contiguous_inputs():
    g = torch.Generator().manual_seed(3)
    big_a = torch.randn(7, 40, generator=g)
    adv = big_a[:, ::8]  # [7, 5], column stride 8
    v = torch.randn(7, 2, generator=g)[:, 1:]  # [7, 1], row stride 2
    up = torch.randn(5, 7, generator=g).t()  # non-contiguous upstream gradient
    assert not adv.is_contiguous() and not v.is_contiguous() and not up.is_contiguous()
    got = _run(_kernel, v, adv, up)
    want = _run(dueling_combine_reference, v, adv, up)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)


def test_hand_computed():
    # V = 1, A = [1, 2, 6]: mean 3, Q = [-1, 0, 4]; dQ = [1, 0, 2]: dV = 3, dA = dQ − 1 = [0, −1, 1]
    v, adv = torch.tensor([[1.0]]), torch.tensor([[1.0, 2.0, 6.0]])
    q, gv, ga = _run(_kernel, v, adv, torch.tensor([[1.0, 0.0, 2.0]]))
    assert q.tolist() == [[-1.0, 0.0, 4.0]] and gv.tolist() == [[3.0]] and ga.tolist() == [[0.0, -1.0, 1.0]]


def test_nan_stays_in_its_row():
    v, adv, up = _case((6,), 4, seed=5)
    adv[1, 2] = float("nan")
    v[3, 0] = float("inf")
    got = _run(_kernel, v, adv, up)
    want = _run(dueling_combine_reference, v, adv, up)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6, equal_nan=True)
    assert torch.isnan(got[0][1]).all() and torch.isfinite(got[0][[0, 2, 4, 5]]).all()


def test_empty_rows():
    v, adv = torch.zeros(0, 1, requires_grad=True), torch.zeros(0, 3, requires_grad=True)
    q = _kernel(v, adv)
    q.sum().backward()
    assert q.shape == (0, 3) and v.grad.shape == (0, 1) and adv.grad.shape == (0, 3)


@pytest.mark.parametrize("v,adv,backend,match", [
    (torch.zeros(4, 2), torch.zeros(4, 3), "auto", r"value must be \[4, 1\] or \[4\]"),
    (torch.zeros(4, 1), torch.zeros(4, 0), "auto", "A >= 1 actions"),
    (torch.zeros(4, 1, dtype=torch.float64), torch.zeros(4, 3), "auto", "share dtype and device"),
    (torch.zeros(4, 1, dtype=torch.float64), torch.zeros(4, 3, dtype=torch.float64), "triton", "float32"),
    (torch.zeros(4, 1), torch.zeros(4, 3), "cuda", "backend must be"),
])
def test_bad_arguments(v, adv, backend, match):
    with pytest.raises(ValueError, match=match):
        dueling_combine(v, adv, backend=backend)


def test_float64_auto_uses_the_reference():
    v, adv, up = _case((5,), 3, seed=1)
    q = dueling_combine(v.double(), adv.double())
    assert q.dtype == torch.float64
    torch.testing.assert_close(q, dueling_combine_reference(v.double(), adv.double()), rtol=0, atol=0)


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("lead,a", [((4096,), 3), ((8192,), 45), ((8, 512), 3)])
def test_gpu_kernel_equals_reference(lead, a):
    v, adv, up = _case(lead, a, seed=2, device="cuda")
    got = _run(dueling_combine, v, adv, up)
    want = _run(dueling_combine_reference, v, adv, up)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)  # sum order, mean as ·(1/A) in torch


@pytest.mark.gpu
def test_gpu_capture_forward_backward_two_kernels():
    from support import cuda_kernels

    v, adv, up = _case((4096,), 3, seed=4, device="cuda")
    v.requires_grad_(True)
    adv.requires_grad_(True)

    def step():
        v.grad = adv.grad = None
        q = dueling_combine(v, adv)
        q.backward(up)
        return q, v.grad, adv.grad

    graph, (q, gv, ga) = capture_graph(step)
    with no_host_sync():
        graph.replay()
    want = _run(dueling_combine_reference, v, adv, up)
    for x, y in zip((q, gv, ga), want):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        n, names = cuda_kernels(lambda: dueling_combine(v, adv))
    assert n == 1, names
