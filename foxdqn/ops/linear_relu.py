"""Linear layer + ReLU in one GEMM: cuBLASLt's bias + ReLU epilogue (``torch._addmm_activation``).

    y = relu(x Wᵀ + b)                      x [..., D], W [H, D], b [H] → y [..., H]

Forward on CUDA: ``torch._addmm_activation(b, x, Wᵀ)``, which torch runs as one cuBLASLt matmul
with the ``RELU_BIAS`` epilogue when its inputs qualify (aten/src/ATen/native/cuda/Blas.cpp,
``isInputCompliesAddmmCudaLt``: float32/16/bf16, a contiguous 1-D bias, beta = 1, every matrix
dimension > 1, ``DISABLE_ADDMM_CUDA_LT`` unset). Otherwise (one row, D = 1 or H = 1, Lt disabled)
torch falls back to bias copy + GEMM + ``relu_``: the same result in three kernels. Today's
``nn.Linear`` + ``nn.ReLU`` is the same GEMM with the bias epilogue, then a separate ReLU kernel.

``torch._addmm_activation`` has no derivative in torch (2.11 to 2.13: "derivative for
aten::_addmm_activation is not implemented"), so the op is a ``torch.autograd.Function`` whose
backward is what autograd runs for ``relu(linear(x))``: dz = dy · 1{y > 0}
(``threshold_backward``), dx = dz W, dW = dzᵀ x, db = Σ_rows dz, each only when needed; dz and db
are one kernel on CUDA (:func:`foxdqn.ops.relu_bias_grad.relu_bias_grad`), where autograd runs two
or three.

Equal to ``relu(F.linear(x, W, b))`` to float rounding: cuBLASLt may pick another GEMM algorithm
for the epilogue variant (another summation order). NaN: ``torch.relu`` keeps a NaN; whether the
cuBLASLt epilogue (a max with 0) keeps it is cuBLASLt's choice, so a NaN pre-activation may come
out as 0 on the fused path, where its gradient is then 0; where y is NaN, dy passes in both
(``threshold_backward`` zeroes only where y <= 0). The training guard
checks the loss and the gradient norm, which a finite network with finite inputs cannot turn NaN
here; NaN observations are caught by the data pipeline's checks.

Capturable in a CUDA graph (device ops only).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from foxdqn.ops.backend import fused_forward
from foxdqn.ops.relu_bias_grad import relu_bias_grad

__all__ = ["linear_relu", "linear_relu_reference"]

_BACKENDS = ("auto", "fused", "torch")


class _LinearReLU(torch.autograd.Function):
    """y = _addmm_activation(b, x, Wᵀ); backward as autograd's for relu(linear(x))."""

    @staticmethod
    def forward(ctx, x2, weight, bias):
        y = torch._addmm_activation(bias, x2, weight.t())
        ctx.save_for_backward(x2, weight, y)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_y):
        x2, weight, y = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        if need_b:  # dz = 0 where y <= 0, else dy, and db = Σ_rows dz: one kernel on CUDA
            grad_z, grad_b = relu_bias_grad(grad_y, y)
        else:
            grad_z, grad_b = torch.ops.aten.threshold_backward(grad_y, y, 0), None
        grad_x = grad_z.mm(weight) if need_x else None
        grad_w = grad_z.t().mm(x2) if need_w else None
        return grad_x, grad_w, grad_b


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> None:
    op = "linear_relu"
    if weight.dim() != 2 or bias is None or bias.shape != (weight.shape[0],):
        raise ValueError(f"{op}: weight must be [H, D] and bias [H], got weight {list(weight.shape)} and bias "
                         f"{None if bias is None else list(bias.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"{op}: x must be [..., D={weight.shape[1]}], got {list(x.shape)}")
    if not (x.dtype == weight.dtype == bias.dtype) or not (x.device == weight.device == bias.device):
        raise ValueError(f"{op}: x, weight and bias must share dtype and device, got {x.dtype}/{weight.dtype}/"
                         f"{bias.dtype} on {x.device}/{weight.device}/{bias.device}")


def linear_relu_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``relu(F.linear(x, weight, bias))``: ``nn.Linear`` followed by ``nn.ReLU``."""
    _check(x, weight, bias)
    return torch.relu(F.linear(x, weight, bias))


def linear_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """relu(x Wᵀ + b), on CUDA one cuBLASLt GEMM with the bias + ReLU epilogue.

    Args:
        x: input ``[..., D]`` (any leading axes; non-contiguous input is copied).
        weight: ``[H, D]`` (``nn.Linear.weight``), same dtype and device.
        bias: ``[H]`` (``nn.Linear.bias``).
        backend: ``"auto"`` (``"fused"`` for CUDA tensors, and CPU ones inside
            :func:`foxdqn.ops.backend.cpu_kernels`, else ``"torch"``), ``"fused"``
            (``torch._addmm_activation``; on CPU torch runs addmm then relu_) or ``"torch"``
            (:func:`linear_relu_reference`).

    Returns:
        y ``[..., H]``, differentiable w.r.t. all three inputs (the fused path: first order only).

    Raises:
        ValueError: mismatched shapes, dtypes or devices; no bias; an unknown backend.
    """
    if backend not in _BACKENDS:
        raise ValueError(f"linear_relu: backend must be 'auto', 'fused' or 'torch', got {backend!r}")
    _check(x, weight, bias)
    if backend == "torch" or (backend == "auto" and not fused_forward(x)):
        return torch.relu(F.linear(x, weight, bias))
    lead = x.shape[:-1]
    y = _LinearReLU.apply(x.reshape(-1, x.shape[-1]), weight, bias)
    return y.view(*lead, weight.shape[0])
