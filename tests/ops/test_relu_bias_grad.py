"""foxdqn.ops.relu_bias_grad: the kernel (TRITON_INTERPRET=1 on CPU) against threshold_backward and
sum(0): odd shapes (M = 0, 1, 7, 130; H = 1, 5, 16, 17, 300), y exactly 0 and negative, NaN in dy
and in y (threshold_backward's rule), the same bits on every call, non-contiguous inputs, bad arguments; linear_relu's backward
through it. GPU (`gpu` marker): kernel = reference on CUDA at the update's sizes, one kernel,
CUDA-graph capture, no host sync."""
from __future__ import annotations

import pytest
import torch

import foxdqn.ops.relu_bias_grad as rbg_mod
from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.relu_bias_grad import relu_bias_grad, relu_bias_grad_reference

from support import capture_graph, cuda_kernels, no_host_sync, require_compiled_kernels

_need_compiled = require_compiled_kernels(INTERPRET)
NAN = float("nan")


def _case(m, h, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    dy = torch.randn(m, h, generator=g)
    y = torch.relu(torch.randn(m, h, generator=g))  # about half exactly 0
    if m * h:
        y.view(-1)[:: 7] = -1.0  # a negative output (never a ReLU's, still masked as y <= 0)
    return dy.to(device), y.to(device)


def _check(dy, y, backend="triton"):
    dz, db = relu_bias_grad(dy, y, backend=backend)
    rz, rb = relu_bias_grad_reference(dy, y)
    assert dz.shape == dy.shape and db.shape == (dy.shape[1],) and dz.dtype == db.dtype == torch.float32
    assert torch.equal(dz.nan_to_num(7.5), rz.nan_to_num(7.5)) and torch.equal(dz.isnan(), rz.isnan())  # a select
    torch.testing.assert_close(db, rb, rtol=1e-6, atol=1e-5 * max(1, dy.shape[0]) ** 0.5, equal_nan=True)
    return dz, db


@pytest.mark.parametrize("m", [0, 1, 7, 130])
@pytest.mark.parametrize("h", [1, 5, 16, 17, 300])
def test_kernel_equals_reference(m, h):
    dy, y = _case(m, h, seed=m * 13 + h)
    dz, db = _check(dy, y)
    if m == 0:
        assert torch.equal(db, torch.zeros(h))


def test_row_blocks_loop_and_same_bits(monkeypatch):
    monkeypatch.setattr(rbg_mod, "BLOCK_M", 4)  # 130 rows: 33 steps of the row loop, a ragged last one
    monkeypatch.setattr(rbg_mod, "BLOCK_H", 2)
    dy, y = _case(130, 9, seed=5)
    first = _check(dy, y)
    again = relu_bias_grad(dy, y, backend="triton")
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_nan_passes_where_y_positive_only():
    dy = torch.tensor([[NAN, 1.0, 2.0], [3.0, NAN, 4.0], [5.0, 6.0, 7.0]])
    y = torch.tensor([[1.0, 0.0, NAN], [2.0, 0.5, -1.0], [0.0, 1.0, 1.0]])
    dz, db = _check(dy, y)
    assert torch.equal(dz[:, 2], torch.tensor([2.0, 0.0, 7.0]))  # NaN y passes dy, as threshold_backward
    assert torch.equal(dz[:, 0].isnan(), torch.tensor([True, False, False]))
    assert db[0].isnan() and db[1].isnan() and float(db[2]) == 9.0


def test_non_contiguous_inputs():
    dy, y = _case(40, 12, seed=3)
    _check(dy.t().contiguous().t(), y[:, :].t().contiguous().t())


@pytest.mark.parametrize("args, match", [
    ((torch.zeros(3, 4), torch.zeros(3, 5)), "one shape"),
    ((torch.zeros(12), torch.zeros(12)), r"\[M, H\]"),
    ((torch.zeros(3, 4, dtype=torch.float64), torch.zeros(3, 4, dtype=torch.float64)), "float32"),
])
def test_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        relu_bias_grad(*args, backend="triton")


def test_linear_relu_backward_through_the_kernel(monkeypatch):
    """linear_relu's backward (fused path) with relu_bias_grad's kernel (the interpreter; on CUDA
    "auto" picks it) gives autograd's gradients of relu(F.linear) for x, W and b."""
    import functools

    import foxdqn.ops.linear_relu as lr_mod

    calls = []

    def kernel(grad_y, y):
        calls.append(grad_y.shape)
        return relu_bias_grad(grad_y, y, backend="triton")

    monkeypatch.setattr(lr_mod, "relu_bias_grad", kernel)
    g = torch.Generator().manual_seed(4)
    x, w, b = torch.randn(37, 6, generator=g), torch.randn(9, 6, generator=g), torch.randn(9, generator=g)
    up = torch.randn(37, 9, generator=g)
    grads = []
    for fn in (functools.partial(lr_mod.linear_relu, backend="fused"), lr_mod.linear_relu_reference):
        xs, ws, bs = (t.clone().requires_grad_(True) for t in (x, w, b))
        grads.append(torch.autograd.grad((fn(xs, ws, bs) * up).sum(), (xs, ws, bs)))
    assert calls == [torch.Size([37, 9])]
    for a, e in zip(*grads):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_gpu_auto_takes_the_reference_for_float64():
    dy, y = (t.double() for t in _case(9, 4, seed=1, device="cuda"))
    n, names = cuda_kernels(lambda: relu_bias_grad(dy, y))
    assert not any("relu_bias_grad" in name for name in names), names
    dz, db = relu_bias_grad(dy, y)
    assert dz.dtype == db.dtype == torch.float64
    assert torch.equal(db, relu_bias_grad_reference(dy, y)[1])


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("m,h", [(512, 256), (256, 120), (4096, 256), (3, 17)])
def test_gpu_kernel_equals_reference(m, h):
    dy, y = _case(m, h, seed=m + h, device="cuda")
    _check(dy, y)


@pytest.mark.gpu
def test_gpu_one_kernel_and_capture():
    dy, y = _case(512, 256, seed=9, device="cuda")
    n, names = cuda_kernels(lambda: relu_bias_grad(dy, y))
    assert n == 1, names
    graph, (dz, db) = capture_graph(lambda: relu_bias_grad(dy, y))
    dy.mul_(2.0)  # the replay reads the new values
    with no_host_sync():
        graph.replay()
    rz, rb = relu_bias_grad_reference(dy, y)
    assert torch.equal(dz, rz)
    torch.testing.assert_close(db, rb, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("p,m,h", [(1, 7, 5), (3, 130, 17), (2, 0, 4)])
def test_members_summed_apart(p, m, h):
    """[P, M, H] (foxdqn.ops.member_linear's layers): dz as threshold_backward, db [P, 1, H] each
    member's own rows; member 1's rows changed leave member 0's db bit for bit."""
    g = torch.Generator().manual_seed(p * 31 + m + h)
    dy, y = torch.randn(p, m, h, generator=g), torch.relu(torch.randn(p, m, h, generator=g))
    dz, db = relu_bias_grad(dy, y, backend="triton")
    rz, rb = relu_bias_grad_reference(dy, y)
    assert dz.shape == (p, m, h) and db.shape == (p, 1, h)
    assert torch.equal(dz, rz)
    torch.testing.assert_close(db, rb, rtol=1e-6, atol=1e-5 * max(1, m) ** 0.5)
    if p > 1:
        dy2 = dy.clone()
        dy2[1:] = 100.0
        assert torch.equal(relu_bias_grad(dy2, y, backend="triton")[1][0], db[0])
