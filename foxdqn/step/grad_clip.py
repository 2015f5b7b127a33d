"""Global gradient-norm clipping (``optim.grad_clip``) in three ops, six kernels on CUDA (H200).

The same values as ``torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)`` (to float
rounding of the total norm; :mod:`foxdqn.ops.clip_coefficient`): one ``torch._foreach_norm`` of
the gradients (torch's multi-tensor reduction: two kernels), one kernel for the total norm and the clip
coefficient (:func:`~foxdqn.ops.clip_coefficient.clip_coefficient`), one ``torch._foreach_mul_``
of the gradients by the coefficient; torch's ``clip_grad_norm_`` is ten kernels on the H200
(its middle part: stack, vector_norm, add, reciprocal, mul, clamp). The norms are read in place when
``_foreach_norm`` returns them as one buffer, else stacked (one kernel;
:func:`~foxdqn.ops.clip_coefficient.norm_rows`): measured on the H200 (torch 2.11), six kernels
in all (``_foreach_norm``'s output fill and its two kernels, the stack, the coefficient, the
multiply).
"""
from __future__ import annotations

from typing import Iterable

import torch

from foxdqn.ops.clip_coefficient import clip_coefficient, norm_rows

@torch.no_grad()
def clip_grad_norm_(params: Iterable[torch.Tensor], max_norm: torch.Tensor) -> torch.Tensor:
    """Scale the gradients of ``params`` in place so their global L2 norm is at most ``max_norm``.

    ``torch.nn.utils.clip_grad_norm_``'s rule (norm_type 2, error_if_nonfinite False): every
    gradient is multiplied by ``min(1, max_norm / (total + 1e-6))`` (by 1.0 when within the bound;
    NaN total: NaN; Inf total: 0). Parameters without a gradient are left out, as in torch.
    Device ops only (no host reads).

    Args:
        params: parameters (their ``.grad``: float32, one device).
        max_norm: float32 0-d on that device (:func:`foxdqn.step.scalars.device_scalar`).

    Returns:
        float32 0-d: the total norm BEFORE clipping (0.0 when no parameter has a gradient, as torch).

    Raises:
        ValueError: a gradient that is not float32 or on another device than the others, or
            ``max_norm`` not float32 0-d on the gradients' device (from the op).
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float32, device=max_norm.device)
    total, coef = clip_coefficient(norm_rows(torch._foreach_norm(grads, 2)), max_norm)
    torch._foreach_mul_(grads, coef)
    return total
