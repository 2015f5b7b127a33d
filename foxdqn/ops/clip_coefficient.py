r"""Global gradient-norm clipping's scalar tail in one kernel: the total L2 norm from the
per-tensor norms, and the clip coefficient.

Source: ``torch.nn.utils.clip_grad_norm_`` (``torch/nn/utils/clip_grad.py``: ``_get_total_norm``
then ``_clip_grads_with_norm_``, ``norm_type=2``, ``error_if_nonfinite=False``), which computes,
from the per-tensor norms ``n_j`` of one ``torch._foreach_norm``::

    total = linalg.vector_norm(stack(n), 2)          = sqrt(sum_j n_j**2)      (float32)
    coef  = clamp(max_norm / (total + 1e-6), max=1)  = min(1, reciprocal(total + 1e-6) * max_norm)

(``float / tensor`` is ``reciprocal(tensor) * float`` in torch; 1e-6 and max_norm are rounded to
float32 where they meet the float32 tensor), then multiplies every gradient by ``coef``. torch
runs the tail as about six kernels (stack, norm, add, reciprocal, mul, clamp); this op is one.
Per row ``g`` of ``norms`` (``[n]`` is one row; ``[G, n]`` is one row per population member, each
with its own ``max_norm[g]``), in float32, in this order::

    total[g] = sqrt_rn(sum_j norms[g, j]**2)
    coef[g]  = c if not (c > 1) else 1,   c = div_rn(1, total[g] + 1e-6) * max_norm[g]

Non-finite values, as torch: a NaN norm gives total NaN and coef NaN (the gradients become NaN
and the training guard skips the update); an Inf norm (or a sum of squares that overflows
float32, as torch's float32 ``vector_norm`` does) gives total Inf and coef 0 (NaN if max_norm is
Inf); a total of 0 gives coef 1. ``clamp`` keeps NaN, and so does the ``c > 1`` test.

Rounding: each square is rounded to float32 and summed in float32, as torch's ``vector_norm``
does, but the kernel's summation order is a fixed tree and torch's is its own, so ``total``
matches torch to float32 rounding (a few ulps for many tensors), not always bit for bit; the
reciprocal, multiply and clamp are correctly rounded in both, so ``coef`` differs only through
``total``. The kernel is one program per row (one warp), the sum deterministic.

Not in the training loop any more: :func:`foxdqn.ops.grad_norm.grad_norm_coefficient` computes the
norms and this tail in one kernel (it takes :data:`CLIP_EPS` from here). The op is kept with its
tests and bench as the definition of the tail from per-tensor norms.
"""
from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.library import device_op, wrap_triton

#: Added to the total norm before dividing, as ``torch.nn.utils.clip_grad_norm_`` does.
CLIP_EPS = 1e-6
MAX_TENSORS = 16384  # norms per row the single-block kernel reads (a network has far fewer tensors)


# ---------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def _clip_coefficient_kernel(norms_ptr, max_norm_ptr, total_ptr, coef_ptr, n, stride_g,
                             EPS: tl.constexpr, BLOCK: tl.constexpr):
    g = tl.program_id(0)
    j = tl.arange(0, BLOCK)
    x = tl.load(norms_ptr + g * stride_g + j, mask=j < n, other=0.0).to(tl.float32)
    total = tl.sqrt_rn(tl.sum(x * x, axis=0))
    c = tl.div_rn(tl.full([], 1.0, tl.float32), total + EPS) * tl.load(max_norm_ptr + g).to(tl.float32)
    coef = tl.where(c > 1.0, 1.0, c)  # clamp(max=1) that keeps NaN
    tl.store(total_ptr + g, total)
    tl.store(coef_ptr + g, coef)


@device_op("foxdqn::clip_coefficient", mutates_args={"total", "coef"})
def _clip_coefficient_op(norms: Tensor, max_norm: Tensor, total: Tensor, coef: Tensor) -> None:
    rows, n = norms.shape
    wrap_triton(_clip_coefficient_kernel)[(rows,)](
        norms, max_norm, total, coef, n, norms.stride(0),
        EPS=CLIP_EPS, BLOCK=max(triton.next_power_of_2(n), 16), num_warps=1)


# ---------------------------------------------------------------------------------------------
# Reference (torch's own expressions)
# ---------------------------------------------------------------------------------------------
def clip_coefficient_reference(norms: Tensor, max_norm: Tensor, total: Tensor, coef: Tensor) -> None:
    """Plain-torch reference of :func:`clip_coefficient` (same arguments, ``norms`` as ``[G, n]``,
    ``max_norm``/``total``/``coef`` as ``[G]``; writes ``total`` and ``coef``): torch's
    ``clip_grad_norm_`` expressions, row by row."""
    t = torch.linalg.vector_norm(norms.to(torch.float32), 2, dim=1)
    total.copy_(t)
    coef.copy_(torch.clamp((t + CLIP_EPS).reciprocal() * max_norm.to(torch.float32), max=1.0))


# ---------------------------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------------------------
def norm_rows(norms: Sequence[Tensor]) -> Tensor:
    """The 0-d per-tensor norms of one ``torch._foreach_norm`` as one float32 ``[n]`` tensor.

    On CUDA ``_foreach_norm`` returns its n results as consecutive elements of one buffer; those
    are viewed as ``[n]`` in place (host metadata only, no kernel). Any other list (the CPU
    fallback's separate tensors, a list built by hand) is stacked (one kernel).

    Raises:
        ValueError: an empty list, or an entry that is not a float32 0-d tensor on the first one's device.
    """
    if isinstance(norms, Tensor) or not norms:
        raise ValueError(f"norm_rows: norms must be a non-empty list of float32 0-d tensors, got {describe(norms)}")
    first = norms[0]
    for i, t in enumerate(norms):
        if not isinstance(t, Tensor) or t.dim() != 0 or t.dtype != torch.float32 or t.device != first.device:
            raise ValueError(f"norm_rows: norms[{i}] must be a float32 0-d tensor on {first.device}, got {describe(t)}")
    storage, offset = first.untyped_storage(), first.storage_offset()
    if all(t.untyped_storage().data_ptr() == storage.data_ptr() and t.storage_offset() == offset + i
           for i, t in enumerate(norms)):
        return torch.as_strided(first, (len(norms),), (1,), offset)
    return torch.stack(list(norms))


def clip_coefficient(norms: Tensor, max_norm: Tensor, *, backend: str = "auto") -> tuple[Tensor, Tensor]:
    """Total L2 norm and clip coefficient of ``torch.nn.utils.clip_grad_norm_`` from per-tensor norms.

    Rules and rounding in the module docstring. Device ops only (no host reads): capturable in a
    CUDA graph. One kernel launch on CUDA (one program per row).

    Args:
        norms: float32 ``[n]`` (one network: the per-tensor L2 norms of its gradients, e.g.
            :func:`norm_rows` of ``torch._foreach_norm(grads)``) or ``[G, n]`` (G groups, e.g.
            population members, each its own row); n >= 1; unit stride along the last axis.
        max_norm: float32, the bound on the total norm: 0-d for ``[n]`` norms, ``[G]`` for
            ``[G, n]`` (per-member bounds). > 0 as a rule (a device value, not checked).
        backend: "auto" (Triton for CUDA tensors, torch reference for CPU), "triton", "torch".

    Returns:
        ``(total, coef)``: float32, 0-d for ``[n]`` norms, ``[G]`` for ``[G, n]``; new tensors on
        the norms' device. ``total`` is the norm before clipping (what the guard reads);
        ``coef`` is what every gradient of the row is multiplied by.

    Raises:
        ValueError: norms not float32 ``[n]``/``[G, n]`` with n in [1, 16384] and unit last
            stride; max_norm not float32 of the matching shape on the norms' device; an unknown
            backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    if (not isinstance(norms, Tensor) or norms.dtype != torch.float32 or norms.dim() not in (1, 2)
            or norms.shape[-1] < 1 or norms.shape[-1] > MAX_TENSORS or (norms.dim() == 2 and norms.shape[0] < 1)
            or (norms.shape[-1] > 1 and norms.stride(-1) != 1)):
        raise ValueError(f"clip_coefficient: norms must be a float32 tensor [n] or [G, n] with 1 <= n <= "
                         f"{MAX_TENSORS} and unit last stride, got {describe(norms)}")
    shape = tuple(norms.shape[:-1])
    if (not isinstance(max_norm, Tensor) or max_norm.dtype != torch.float32 or tuple(max_norm.shape) != shape
            or max_norm.device != norms.device):
        raise ValueError(f"clip_coefficient: max_norm must be a float32 tensor {list(shape)} on {norms.device} "
                         f"(0-d for norms [n], [G] for norms [G, n]), got {describe(max_norm)}")
    rows = norms.reshape(-1, norms.shape[-1])
    total = torch.empty(shape, dtype=torch.float32, device=norms.device)
    coef = torch.empty_like(total)
    if resolve_backend("clip_coefficient", backend, norms) == "torch":
        clip_coefficient_reference(rows, max_norm.reshape(-1), total.view(-1), coef.view(-1))
    else:
        _clip_coefficient_op(rows, max_norm.reshape(-1).contiguous(), total.view(-1), coef.view(-1))
    return total, coef
