"""foxdqn.ops.linear_relu: the fused path (torch._addmm_activation + its hand-written backward; on
CPU torch runs addmm then relu_) against relu(F.linear) and autograd of it: outputs and the three
gradients, leading axes, an input without gradient, ReLU's zero region, bad arguments. GPU (`gpu`
marker): fused = reference on CUDA, one GEMM kernel per layer, CUDA-graph capture."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from foxdqn.ops.linear_relu import linear_relu, linear_relu_reference


def _case(lead, d, h, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, d, generator=g)
    w = torch.randn(h, d, generator=g) / d ** 0.5
    b = torch.randn(h, generator=g) * 0.3
    up = torch.randn(*lead, h, generator=g)
    return [t.to(device) for t in (x, w, b, up)]


def _run(fn, x, w, b, up, x_grad=True, **kw):
    x = x.detach().clone().requires_grad_(x_grad)
    w, b = w.detach().clone().requires_grad_(True), b.detach().clone().requires_grad_(True)
    y = fn(x, w, b, **kw)
    grads = torch.autograd.grad((y * up).sum(), (x, w, b) if x_grad else (w, b))
    return (y.detach(), *grads)


def _fused(x, w, b):
    return linear_relu(x, w, b, backend="fused")


@pytest.mark.parametrize("lead,d,h", [((1,), 5, 7), ((37,), 13, 16), ((130,), 1, 1), ((3, 11), 6, 9)])
def test_fused_equals_linear_relu_with_gradients(lead, d, h):
    x, w, b, up = _case(lead, d, h, seed=d + h)
    got = _run(_fused, x, w, b, up)
    want = _run(linear_relu_reference, x, w, b, up)
    assert got[0].shape == (*lead, h)
    assert (got[0] == 0).any() and (got[0] > 0).any()  # both sides of the ReLU are exercised
    for gx, wx in zip(got, want):
        torch.testing.assert_close(gx, wx, rtol=1e-6, atol=1e-6)


def test_reference_is_nn_linear_then_relu_and_input_without_grad():
    x, w, b, up = _case((29,), 8, 6, seed=3)
    lin = torch.nn.Linear(8, 6)
    with torch.no_grad():
        lin.weight.copy_(w)
        lin.bias.copy_(b)
    torch.testing.assert_close(linear_relu_reference(x, w, b), torch.nn.ReLU()(lin(x)), rtol=0, atol=0)
    got = _run(_fused, x, w, b, up, x_grad=False)  # the first layer: obs needs no gradient
    want = _run(linear_relu_reference, x, w, b, up, x_grad=False)
    for gx, wx in zip(got, want):
        torch.testing.assert_close(gx, wx, rtol=1e-6, atol=1e-6)


def test_non_contiguous_input():
    x, w, b, up = _case((10,), 24, 5, seed=4)
    xs = x[:, ::2]  # [10, 12], column stride 2
    got = _run(_fused, xs, w[:, :12], b, up)
    want = _run(linear_relu_reference, xs, w[:, :12], b, up)
    for gx, wx in zip(got, want):
        torch.testing.assert_close(gx, wx, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kw,match", [
    (dict(b=torch.zeros(3)), r"bias \[H\]"),
    (dict(b=None), r"bias \[H\]"),
    (dict(x=torch.zeros(4, 5)), r"x must be \[\.\.\., D=6\]"),
    (dict(x=torch.zeros(4, 6, dtype=torch.float64)), "share dtype and device"),
    (dict(backend="cublas"), "backend must be"),
])
def test_bad_arguments(kw, match):
    args = dict(x=torch.zeros(4, 6), w=torch.zeros(2, 6), b=torch.zeros(2), backend="auto")
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        linear_relu(args["x"], args["w"], args["b"], backend=args["backend"])


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("lead,d,h", [((4096,), 62, 256), ((8192,), 256, 256), ((1,), 62, 256)])
def test_gpu_fused_equals_reference(lead, d, h):
    x, w, b, up = _case(lead, d, h, seed=1, device="cuda")
    got = _run(linear_relu, x, w, b, up)
    want = _run(linear_relu_reference, x, w, b, up)
    for gx, wx in zip(got, want):
        torch.testing.assert_close(gx, wx, rtol=1e-4, atol=1e-5)  # GEMM algorithm (sum order)


@pytest.mark.gpu
def test_gpu_one_kernel_forward_and_capture():
    from support import capture_graph, cuda_kernels, no_host_sync

    x, w, b, up = _case((4096,), 62, 256, seed=2, device="cuda")
    with torch.no_grad():
        fused, names = cuda_kernels(lambda: linear_relu(x, w, b))
        plain, _ = cuda_kernels(lambda: torch.relu(F.linear(x, w, b)))
    assert fused == 1 and plain == 2, names  # cuBLASLt's bias + ReLU epilogue
    wp, bp = w.clone().requires_grad_(True), b.clone().requires_grad_(True)

    def step():
        wp.grad = bp.grad = None
        linear_relu(x, wp, bp).backward(up)
        return wp.grad, bp.grad

    graph, (gw, gb) = capture_graph(step)
    with no_host_sync():
        graph.replay()
    want = _run(linear_relu_reference, x, w, b, up, x_grad=False)
    torch.testing.assert_close(gw, want[1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gb, want[2], rtol=1e-4, atol=1e-5)
