"""Global gradient-norm clipping (``optim.grad_clip``): the total norm and the clip coefficient in
one kernel; the gradients are scaled inside Adam's kernel, not here.

The values of ``torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)`` (to float
rounding of the total norm; :mod:`foxdqn.ops.grad_norm`): ``total`` = the L2 norm of all the
gradients, ``coef = min(1, max_norm / (total + 1e-6))``. torch's ``clip_grad_norm_`` then
multiplies every gradient by ``coef`` (ten kernels on the H200); here
:func:`foxdqn.ops.adam_step.adam_step_` multiplies each gradient by ``coef`` as it reads it
(``grad_scale``), which gives the same product, so clipping costs one kernel per 8 tensors
(:func:`foxdqn.ops.grad_norm.grad_norm_coefficient`) and leaves ``.grad`` as backward wrote it.
"""
from __future__ import annotations

from typing import Iterable

import torch

from foxdqn.ops.grad_norm import grad_norm_coefficient
from foxdqn.device.scalars import device_scalar


@torch.no_grad()
def grad_norm_and_coefficient(params: Iterable[torch.Tensor], max_norm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The global L2 norm of the gradients of ``params`` and the factor that clips them to ``max_norm``.

    ``torch.nn.utils.clip_grad_norm_``'s rule (norm_type 2, error_if_nonfinite False): the factor
    is ``min(1, max_norm / (total + 1e-6))`` (1.0 within the bound; NaN total: NaN; Inf total:
    0). Parameters without a gradient are left out, as in torch. Device ops only (no host reads).

    Args:
        params: parameters (their ``.grad``: contiguous float32, one device).
        max_norm: float32 0-d on that device (:func:`foxdqn.device.scalars.device_scalar`).

    Returns:
        ``(total, coef)``, float32 0-d: the total norm BEFORE clipping (0.0 when no parameter has
        a gradient, as torch) and the clip coefficient (1.0 then).

    Raises:
        ValueError: a gradient that is not contiguous float32 or on another device than the
            others, or ``max_norm`` not float32 0-d on the gradients' device (from the op).
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return device_scalar(max_norm.device, 0.0), device_scalar(max_norm.device, 1.0)  # read only, never written
    return grad_norm_coefficient(grads, max_norm)
