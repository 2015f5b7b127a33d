r"""A population's layer norm with each member's affine, without gradient, in one kernel.

    y[p, m, :] = (x[p, m, :] − μ) / sqrt(σ² + ε) · γ_p + β_p,    μ, σ² the mean and the (biased)
    variance of the row's C values

(Ba, Kiros & Hinton 2016, eq. 4; ``torch.nn.LayerNorm``'s definition) for member p of P and row m of
M. Where :class:`~foxdqn.population.layers.MemberLayerNorm` computed it with ``F.layer_norm`` and
``torch.addcmul`` (two kernels), its forward without gradient (acting, evaluation, the target
network's forward and the online network's no-gradient forwards of an update) is this one kernel:
the attention encoder's five layer norms per forward (two per block and the final one).

Kernel (Triton): a grid of row blocks over the ``P·M`` rows (BLOCK_R from M and C only, so that a
row's tile and its sums' order do not depend on P); a program loads ``BLOCK_R`` rows of C
values (padded to a power of two, masked), takes each row's mean, then the mean of the squared
deviations (two passes over registers, as torch's float32 result up to the order of its sums), its
``1 / sqrt(σ² + ε)`` (IEEE ``sqrt_rn`` and ``div_rn``) and the member's γ and β (the member of row
r is ``r // M``). Members never mix. Precision: float32; the sums run in the tile's order, so y
equals :func:`member_layer_norm_reference` to float rounding. NaN: a NaN in a row makes that row's
outputs NaN. No gradient (the op has no backward); capture: device ops only.

Errors: ``ValueError`` (``member_layer_norm: ...``) for arguments outside the contract (shapes,
float32, one device, C above :data:`MAX_WIDTH`, an input that needs a gradient under grad mode, an
unknown backend); ``RuntimeError`` for backend="triton" on CPU tensors without TRITON_INTERPRET=1.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, resolve_backend

__all__ = ["MAX_WIDTH", "member_layer_norm", "member_layer_norm_reference"]

MAX_WIDTH = 4096  #: C, the features of a row, at most
TILE = 1024  #: elements of a program's [BLOCK_R, BLOCK_C] tile
NUM_WARPS = 4


@triton.jit
def _member_layer_norm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, R, M, C, eps, BLOCK_R: tl.constexpr,
                              BLOCK_C: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    col = tl.arange(0, BLOCK_C)
    ok = row < R
    cm = col < C
    m = ok[:, None] & cm[None, :]
    n = tl.zeros([], tl.float32) + C
    x = tl.load(x_ptr + row[:, None] * C + col[None, :], mask=m, other=0.0)
    mean = tl.div_rn(tl.sum(x, axis=1), n)
    d = tl.where(m, x - mean[:, None], 0.0)
    var = tl.div_rn(tl.sum(d * d, axis=1), n)
    rstd = tl.div_rn(tl.full([BLOCK_R], 1.0, tl.float32), tl.sqrt_rn(var + tl.cast(eps, tl.float32)))
    member = row // M
    w = tl.load(w_ptr + member[:, None] * C + col[None, :], mask=m, other=0.0)
    b = tl.load(b_ptr + member[:, None] * C + col[None, :], mask=m, other=0.0)
    tl.store(y_ptr + row[:, None] * C + col[None, :], d * rstd[:, None] * w + b, mask=m)


def _problem(x, weight, bias) -> str | None:
    """Why the arguments are outside the contract, or None."""
    op = "member_layer_norm"
    if not isinstance(x, Tensor) or x.dim() != 3 or x.dtype != torch.float32:
        return f"{op}: x must be a float32 [P, M, C] tensor, got {describe(x)}"
    p, _, c = x.shape
    if not 1 <= c <= MAX_WIDTH:
        return f"{op}: C = {c} features; 1 to {MAX_WIDTH} are supported"
    for name, t in (("weight", weight), ("bias", bias)):
        if not isinstance(t, Tensor) or t.dtype != torch.float32 or t.numel() != p * c or t.device != x.device \
                or t.shape[0] != p:
            return f"{op}: {name} must be a float32 [{p}, 1, {c}] tensor on {x.device}, got {describe(t)}"
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, weight, bias)):
        return f"{op}: no gradient: call it under torch.no_grad() or with inputs that need none"
    return None


def member_layer_norm_reference(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """Plain torch, as :class:`~foxdqn.population.layers.MemberLayerNorm` computes it:
    ``addcmul(bias, layer_norm(x), weight)``."""
    return torch.addcmul(bias, F.layer_norm(x, x.shape[-1:], eps=eps), weight)


def member_layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float, *, backend: str = "auto") -> Tensor:
    """y float32 ``[P, M, C]`` = each row of x normalised over its C features, times its member's
    γ plus its member's β (module docstring), one kernel, no gradient.

    Args:
        x: float32 ``[P, M, C]`` (non-contiguous inputs are copied); 1 <= C <= MAX_WIDTH.
        weight, bias: float32 ``[P, 1, C]``, each member's γ and β.
        eps: ε added to the variance (the classic layers').
        backend: ``"auto"`` (the kernel for CUDA tensors, else the reference; the kernel inside
            :func:`foxdqn.ops.backend.cpu_kernels`), ``"triton"`` (CPU tensors need
            TRITON_INTERPRET=1) or ``"torch"`` (:func:`member_layer_norm_reference`).

    Returns:
        y float32 ``[P, M, C]`` contiguous, equal to the reference to float rounding.

    Raises:
        ValueError: outside the contract (module docstring), or an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    problem = _problem(x, weight, bias)
    if problem is not None:
        raise ValueError(problem)
    if resolve_backend("member_layer_norm", backend, x) == "torch":
        return member_layer_norm_reference(x, weight, bias, eps)
    p, m, c = x.shape
    y = torch.empty((p, m, c), dtype=torch.float32, device=x.device)
    rows = p * m
    if rows == 0:
        return y
    block_c = triton.next_power_of_2(c)
    # from M and C, not P: a row's tile, hence its sums' order, is the same in a population of one
    block_r = max(1, min(triton.next_power_of_2(m), TILE // block_c))
    _member_layer_norm_kernel[(triton.cdiv(rows, block_r),)](
        x.contiguous(), weight.contiguous(), bias.contiguous(), y, rows, m, c, float(eps),
        BLOCK_R=block_r, BLOCK_C=block_c, num_warps=NUM_WARPS)
    return y
