"""foxdqn.ops.member_linear_grads: the kernel (TRITON_INTERPRET=1 on CPU) against autograd's rule
(its torch reference) on odd P, M, K and N: one row, padded tiles, several dx and dW tiles, several
row slices summed by the last program (small slices patched in), the ReLU mask (NaN included),
strided inputs; only the gradients asked for; members never mix and a member's bits are its run
alone; the same bits on a second call; no rows; bad arguments. member_linear with FUSED_BACKWARD
(cpu_kernels): its gradients through the op equal the layer's usual backward. GPU (`gpu` marker):
kernel = reference on CUDA in one launch."""
from __future__ import annotations

import pytest
import torch

import foxdqn.ops.member_linear_grads as mod
from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.member_linear_grads import member_linear_grads, member_linear_grads_reference

from support import cuda_kernels, require_compiled_kernels

_need_compiled = require_compiled_kernels(INTERPRET)


def _case(p, m, k, n, seed=0, device="cpu", relu=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(p, m, k, generator=g)
    w = torch.randn(p, k, n, generator=g) / k ** 0.5
    dy = torch.randn(p, m, n, generator=g)
    y = torch.relu(torch.randn(p, m, n, generator=g)) if relu else None
    return [t.to(device) if t is not None else None for t in (x, w, dy, y)]


def _close(got, want, k_or_m):
    """float32 sums of up to k_or_m products: a tolerance that grows with the sum's length."""
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6 * max(1, k_or_m) ** 0.5 * max(1.0, want.abs().max()))


# (P, M, K, N, relu): one row; padded tiles; two dx row tiles and two of K; two dW tiles of N and three
# of K (a narrow 1-column layer too); the ReLU mask
SHAPES = [(1, 1, 1, 1, False), (3, 17, 7, 5, True), (2, 130, 70, 45, False), (1, 40, 130, 70, True),
          (2, 33, 9, 1, True)]


@pytest.mark.parametrize("p,m,k,n,relu", SHAPES, ids=[f"P{p}-M{m}-K{k}-N{n}-{'relu' if r else 'linear'}"
                                                       for p, m, k, n, r in SHAPES])
def test_kernel_equals_reference(p, m, k, n, relu):
    x, w, dy, y = _case(p, m, k, n, seed=m + k + n, relu=relu)
    got = member_linear_grads(x, w, dy, y, backend="triton")
    want = member_linear_grads_reference(x, w, dy, y)
    for a, e, length, name in zip(got, want, (n, m, m), ("dx", "dw", "db")):
        assert a.shape == e.shape and a.is_contiguous(), name
        _close(a, e, length)
    again = member_linear_grads(x, w, dy, y, backend="triton")
    assert all(torch.equal(a, b) for a, b in zip(got, again))


@pytest.mark.parametrize("rows,slices", [(71, 2), (160, 5)])  # a short last slice; five whole slices
def test_row_slices_summed_by_the_last_program(monkeypatch, rows, slices):
    """Rows in several slices (SLICE_ROWS patched small): each slice's part of dW and db summed in
    order by the tile's last program; the reference's values, the same bits twice (every ticket back
    at zero), and a member's bits are its run alone."""
    monkeypatch.setattr(mod, "SLICE_ROWS", 32)
    x, w, dy, y = _case(3, rows, 20, 70, seed=slices, relu=True)
    assert mod.plan(x.shape[1], 20, 70)["S"] == slices
    got = member_linear_grads(x, w, dy, y, backend="triton")
    want = member_linear_grads_reference(x, w, dy, y)
    for a, e, length in zip(got, want, (70, x.shape[1], x.shape[1])):
        _close(a, e, length)
    assert all(torch.equal(a, b) for a, b in zip(got, member_linear_grads(x, w, dy, y, backend="triton")))
    for p in range(3):
        alone = member_linear_grads(x[p:p + 1], w[p:p + 1], dy[p:p + 1], y[p:p + 1], backend="triton")
        assert all(torch.equal(a[p:p + 1], b) for a, b in zip(got, alone)), p


def test_only_what_is_asked_strided_inputs_and_members_never_mix():
    x, w, dy, y = _case(3, 21, 12, 10, seed=4, relu=True)
    full = member_linear_grads(x, w, dy, y, backend="triton")
    for need in ((True, False, False), (False, True, False), (False, False, True), (False, True, True)):
        part = member_linear_grads(x, w, dy, y, need_x=need[0], need_w=need[1], need_b=need[2], backend="triton")
        for a, b, wanted in zip(part, full, need):
            assert (a is None) != wanted and (a is None or torch.equal(a, b))
    wide_x = torch.cat([x, x], dim=-1)[..., :12]  # rows at a stride of 24
    w_t = w.transpose(1, 2).contiguous().transpose(1, 2)  # column-major W
    strided = member_linear_grads(wide_x, w_t, dy, y, backend="triton")
    assert all(torch.equal(a, b) for a, b in zip(strided, full))
    x2, dy2 = x.clone(), dy.clone()
    x2[1] = float("nan")
    dy2[1, 3] = float("inf")
    mixed = member_linear_grads(x2, w, dy2, y, backend="triton")
    for a, b in zip(mixed, full):
        assert torch.equal(a[[0, 2]], b[[0, 2]])


def test_relu_mask_passes_nan_and_no_rows():
    x, w, dy, y = _case(1, 5, 4, 3, seed=8, relu=True)
    y[0, 2, 1] = float("nan")  # threshold_backward: a NaN y passes its gradient
    got = member_linear_grads(x, w, dy, y, backend="triton")
    _close(got[2], member_linear_grads_reference(x, w, dy, y)[2], 5)
    empty = member_linear_grads(x[:, :0], w, dy[:, :0], y[:, :0], backend="triton")
    assert empty[0].shape == (1, 0, 4) and not empty[1].any() and not empty[2].any()


def test_bad_arguments():
    x, w, dy, _ = _case(2, 5, 4, 3)
    for args, match in (((x[0], w, dy), "x must be"), ((x, w[:1], dy), "w must be \\[2, 4, N\\]"),
                        ((x, w, dy[:, :4]), "dy must be \\[2, 5, 3\\]"), ((x, w, dy, dy[:1]), "y must be None")):
        with pytest.raises(ValueError, match=match):
            member_linear_grads(*args, backend="triton")


def test_member_linear_backward_through_the_op(monkeypatch):
    """member_linear (relu, and with a residual) with FUSED_BACKWARD inside cpu_kernels: its x, W and
    b gradients through the op equal the layer's usual backward (the ReLU mask with the bias sum,
    two batched products) to float rounding."""
    from foxdqn.ops import member_linear as ml
    from foxdqn.ops.backend import cpu_kernels

    x, w, dy, _ = _case(3, 19, 9, 6, seed=11)
    b = torch.randn(3, 1, 6, generator=torch.Generator().manual_seed(12))
    r = torch.randn(3, 19, 6, generator=torch.Generator().manual_seed(13))

    def grads(relu, residual):
        leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
        with cpu_kernels():
            out = ml.member_linear(*leaves, relu=relu, residual=residual, backend="triton")
            return torch.autograd.grad(out, leaves, dy)

    for relu, residual in ((True, None), (False, r)):
        want = grads(relu, residual)
        calls = []
        real = ml.member_linear_grads
        monkeypatch.setattr(ml, "FUSED_BACKWARD", True)
        monkeypatch.setattr(ml, "member_linear_grads", lambda *a, **k: calls.append(1) or real(*a, **k))
        got = grads(relu, residual)
        monkeypatch.undo()
        assert calls == [1]
        for a, e in zip(got, want):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("p,m,k,n,relu", [(1, 8192, 64, 256, False), (64, 256, 256, 64, True),
                                          (3, 1001, 162, 45, True)])
def test_gpu_kernel_equals_reference_in_one_launch(p, m, k, n, relu):
    x, w, dy, y = _case(p, m, k, n, device="cuda", relu=relu)
    got = member_linear_grads(x, w, dy, y)
    want = member_linear_grads_reference(x.double(), w.double(), dy.double(), None if y is None else y.double())
    for a, e, name in zip(got, want, ("dx", "dw", "db")):
        torch.testing.assert_close(a, e.float(), rtol=2e-3, atol=2e-3 * max(1.0, e.abs().max().item()), msg=name)
    n_launch, names = cuda_kernels(lambda: member_linear_grads(x, w, dy, y))
    assert names == ["_member_linear_grads_kernel"], names
