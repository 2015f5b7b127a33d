r"""The ReLU's backward and the bias gradient of the Linear before it, in one kernel.

For ``y = relu(x Wᵀ + b)`` (:mod:`foxdqn.ops.linear_relu`), given the upstream gradient ``dy``
and the saved output ``y``, both float32 ``[M, H]``::

    dz[m, h] = 0 if y[m, h] <= 0 else dy[m, h]       (aten ``threshold_backward(dy, y, 0)``)
    db[h]    = Σ_m dz[m, h]                           (float32)

or, for P members' layers (:mod:`foxdqn.ops.member_linear`), both ``[P, M, H]`` and
db ``[P, 1, H]``, each member's rows summed apart (a grid axis per member).

What autograd runs for ``relu(linear(x))`` as two or three kernels (``threshold_backward``, then
``sum(0)``, which torch may split into a partial and a final reduction); the dW and dx GEMMs
(``dzᵀ x``, ``dz W``) stay cuBLAS's. The kernel: one program per ``BLOCK_H`` columns, looping over
the rows in blocks of ``BLOCK_M`` in increasing order, each block's column sums added to the
running sums: a fixed order, so every call gives the same bits (no atomics). torch's reduction
order is its own, so ``db`` equals the reference to float32 rounding, ``dz`` bit for bit. NaN:
a NaN in ``dy`` passes where ``y`` is not <= 0 (and reaches ``db``), and so does ``dy`` where ``y``
is NaN (``NaN <= 0`` is false), as in ``threshold_backward``.

Capturable in a CUDA graph (device ops only, outputs allocated per call). Source: the chain rule
of ``nn.Linear`` + ``nn.ReLU`` as autograd applies it (``threshold_backward``,
``tools/autograd/derivatives.yaml``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, resolve_backend

__all__ = ["relu_bias_grad", "relu_bias_grad_reference"]

BLOCK_H = 8  # columns per program (the three from an H200 sweep: docs/bench.md#launch-constants)
BLOCK_M = 128  # rows per step of a program's loop
NUM_WARPS = 4  # warps per program


@triton.jit
def _relu_bias_grad_kernel(dy_ptr, y_ptr, dz_ptr, db_ptr, M, H, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
    p = tl.program_id(1).to(tl.int64)  # the member (0 for [M, H])
    dy_ptr += p * M * H
    y_ptr += p * M * H
    dz_ptr += p * M * H
    db_ptr += p * H
    cm = cols < H
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for m0 in range(0, M, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        mask = (rows < M)[:, None] & cm[None, :]
        offs = rows.to(tl.int64)[:, None] * H + cols[None, :]
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0)
        y = tl.load(y_ptr + offs, mask=mask, other=0.0)
        dz = tl.where(y <= 0, 0.0, dy)  # threshold_backward: a NaN y passes dy
        tl.store(dz_ptr + offs, dz, mask=mask)
        acc += tl.sum(dz, axis=0)
    tl.store(db_ptr + cols, acc, mask=cm)


def relu_bias_grad_reference(grad_y: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Plain torch: ``(threshold_backward(grad_y, y, 0), that summed over the rows)``, autograd's two
    steps (``sum(0)`` for [M, H], ``sum(1, keepdim=True)`` for [P, M, H])."""
    grad_z = torch.ops.aten.threshold_backward(grad_y, y, 0)
    return grad_z, (grad_z.sum(0) if grad_z.dim() == 2 else grad_z.sum(1, keepdim=True))


def relu_bias_grad(grad_y: Tensor, y: Tensor, *, backend: str = "auto") -> tuple[Tensor, Tensor]:
    """dz = dy · 1{not y <= 0} and db = Σ_rows dz in one kernel (module docstring).

    Args:
        grad_y: the upstream gradient dy, float32 ``[M, H]``, or ``[P, M, H]`` for P members' layers.
        y: the ReLU's output, float32, grad_y's shape and device.
        backend: ``"auto"`` (the kernel for float32 CUDA tensors, else the reference),
            ``"triton"`` (CPU tensors need TRITON_INTERPRET=1) or ``"torch"``.

    Returns:
        ``(dz float32 [M, H], db float32 [H])``, or ``(dz [P, M, H], db [P, 1, H])``; contiguous.

    Raises:
        ValueError: not two float32 ``[M, H]`` (or ``[P, M, H]``) tensors of one shape and device (backend
            "triton"; "auto" takes the reference for any other dtype), an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    if (not isinstance(grad_y, Tensor) or not isinstance(y, Tensor) or grad_y.dim() not in (2, 3)
            or grad_y.shape != y.shape or grad_y.device != y.device):
        raise ValueError(f"relu_bias_grad: grad_y and y must be [M, H] or [P, M, H] tensors of one shape and "
                         f"device, got {describe(grad_y)} and {describe(y)}")
    if backend == "auto" and not (grad_y.dtype == y.dtype == torch.float32):
        backend = "torch"
    if resolve_backend("relu_bias_grad", backend, y) == "torch":
        return relu_bias_grad_reference(grad_y, y)
    if not (grad_y.dtype == y.dtype == torch.float32):
        raise ValueError(f"relu_bias_grad: backend='triton' needs float32 tensors, got {describe(grad_y)} and "
                         f"{describe(y)}")
    grad_y, y = grad_y.contiguous(), y.contiguous()
    members, (m, h) = (1 if y.dim() == 2 else y.shape[0]), y.shape[-2:]
    grad_z = torch.empty_like(y)
    grad_b = torch.empty((h,) if y.dim() == 2 else (members, 1, h), device=y.device, dtype=torch.float32)
    if h and members:
        _relu_bias_grad_kernel[(triton.cdiv(h, BLOCK_H), members)](grad_y, y, grad_z, grad_b, m, h, BLOCK_M=BLOCK_M,
                                                                    BLOCK_H=BLOCK_H, num_warps=NUM_WARPS)
    return grad_z, grad_b
