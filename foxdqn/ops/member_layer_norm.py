r"""A population's layer norm with each member's affine: one kernel forward, one backward.

    y[p, m, :] = (x[p, m, :] − μ) / sqrt(σ² + ε) · γ_p + β_p,    μ, σ² the mean and the (biased)
    variance of the row's C values

(Ba, Kiros & Hinton 2016, eq. 4; ``torch.nn.LayerNorm``'s definition) for member p of P and row m of
M. Where :class:`~foxdqn.population.layers.MemberLayerNorm` computed it with ``F.layer_norm`` and
``torch.addcmul`` (two kernels forward; about five backward: the layer norm's, the affine's
products and its two sums over the rows), every forward is this one kernel (the attention
encoder's five layer norms per forward: two per block and the final one) and the backward of one
that needs a gradient is one more.

Kernel (Triton): a grid of row blocks over the ``P·M`` rows (BLOCK_R from M and C only, so that a
row's tile and its sums' order do not depend on P); a program loads ``BLOCK_R`` rows of C
values (padded to a power of two, masked), takes each row's mean, then the mean of the squared
deviations (two passes over registers, as torch's float32 result up to the order of its sums), its
``1 / sqrt(σ² + ε)`` (IEEE ``sqrt_rn`` and ``div_rn``) and the member's γ and β (the member of row
r is ``r // M``). With a gradient to come it also stores each row's μ and 1 / sqrt(σ² + ε).
Members never mix. Precision: float32; the sums run in the tile's order, so y equals
:func:`member_layer_norm_reference` to float rounding. NaN: a NaN in a row makes that row's outputs
NaN.

Backward (Ba et al. 2016; the chain rule through the normalisation, as torch's
``native_layer_norm_backward`` of the normalised x, then the affine's): with x̂ = (x − μ)·rstd
and g = dy ⊙ γ_p, per row ::

    dx = rstd · (g − (Σ_c g + x̂ · Σ_c g x̂) / C),    dγ_p = Σ_rows dy ⊙ x̂,    dβ_p = Σ_rows dy

one kernel on a grid of (row blocks of a member, P members): each program writes its rows' dx and
its block's parts of dγ_p and dβ_p; the last program of member p to finish (a ticket per member,
:func:`foxdqn.ops.tensor_list.last_of_group`) sums the member's parts in block order
(:func:`~foxdqn.ops.tensor_list.sum_of_parts`), so the sums' order depends on M and C only: the same
bits on every call and for member p of any P. dx, dγ and dβ equal autograd's through the reference
to float rounding (torch sums in other orders). First order only (``once_differentiable``).
Capture: device ops only; the parts and tickets (:func:`~foxdqn.ops.tensor_list.group_scratch`)
are made on an eager call before a capture.

Errors: ``ValueError`` (``member_layer_norm: ...``) for arguments outside the contract (shapes,
float32, one device, C above :data:`MAX_WIDTH`, an unknown backend); ``RuntimeError`` for
backend="triton" on CPU tensors without TRITON_INTERPRET=1.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.tensor_list import group_scratch, last_of_group, sum_of_parts

__all__ = ["MAX_WIDTH", "member_layer_norm", "member_layer_norm_reference"]

MAX_WIDTH = 4096  #: C, the features of a row, at most
TILE = 1024  #: elements of a program's [BLOCK_R, BLOCK_C] tile
NUM_WARPS = 4


@triton.jit
def _member_layer_norm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, R, M, C, eps, BLOCK_R: tl.constexpr,
                              BLOCK_C: tl.constexpr, SAVE: tl.constexpr):
    """Rows of block ``program_id(0)`` of x [R = P·M, C] → y; with SAVE each row's μ and rstd [R]."""
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
    if SAVE:
        tl.store(mean_ptr + row, mean, mask=ok)
        tl.store(rstd_ptr + row, rstd, mask=ok)


@triton.jit
def _member_layer_norm_backward_kernel(x_ptr, w_ptr, mean_ptr, rstd_ptr, dy_ptr, dx_ptr, dw_ptr, db_ptr, part_ptr,
                                       ticket_ptr, M, C, NB, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                                       SUM: tl.constexpr, DX: tl.constexpr):
    """Member ``program_id(1)``'s rows of block ``program_id(0)`` (of NB): dx of its rows (with
    DX), its parts of dγ and dβ at part row p·NB + b ([2C]: dγ's then dβ's); member p's last
    program sums them into dw, db [P, C] (module docstring)."""
    p = tl.program_id(1).to(tl.int64)
    blk = tl.program_id(0)
    r = blk.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    col = tl.arange(0, BLOCK_C)
    ok = r < M
    cm = col < C
    m = ok[:, None] & cm[None, :]
    row = p * M + r
    at = row[:, None] * C + col[None, :]
    x = tl.load(x_ptr + at, mask=m, other=0.0)
    dy = tl.load(dy_ptr + at, mask=m, other=0.0)
    mean = tl.load(mean_ptr + row, mask=ok, other=0.0)
    rstd = tl.load(rstd_ptr + row, mask=ok, other=0.0)
    w = tl.load(w_ptr + p * C + col, mask=cm, other=0.0)
    xhat = tl.where(m, (x - mean[:, None]) * rstd[:, None], 0.0)
    if DX:
        g = dy * w[None, :]
        n = tl.zeros([], tl.float32) + C
        sum_g = tl.sum(g, axis=1)
        sum_gx = tl.sum(g * xhat, axis=1)
        dx = (g - tl.div_rn(sum_g[:, None] + xhat * sum_gx[:, None], n)) * rstd[:, None]
        tl.store(dx_ptr + at, dx, mask=m)
    part = part_ptr + (p * NB + blk) * (2 * C)
    tl.store(part + col, tl.sum(dy * xhat, axis=0), mask=cm)
    tl.store(part + C + col, tl.sum(dy, axis=0), mask=cm)
    if last_of_group(ticket_ptr + p, NB):
        first = p * NB
        tl.store(dw_ptr + p * C + col, sum_of_parts(part_ptr, first, NB, 2 * C, col, cm, SUM, BLOCK_C), mask=cm)
        tl.store(db_ptr + p * C + col, sum_of_parts(part_ptr + C, first, NB, 2 * C, col, cm, SUM, BLOCK_C), mask=cm)
        tl.store(ticket_ptr + p, 0)


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
    return None


def member_layer_norm_reference(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """Plain torch, as :class:`~foxdqn.population.layers.MemberLayerNorm` computes it:
    ``addcmul(bias, layer_norm(x), weight)``."""
    return torch.addcmul(bias, F.layer_norm(x, x.shape[-1:], eps=eps), weight)


def _tiles(m: int, c: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_C): from M and C, not P, so that a row's tile, hence its sums' order, and a
    member's blocks are the same in a population of one."""
    block_c = triton.next_power_of_2(c)
    return max(1, min(triton.next_power_of_2(m), TILE // block_c)), block_c


def _forward(x: Tensor, weight: Tensor, bias: Tensor, eps: float, save: bool):
    """Launch the forward kernel on contiguous x: y and, with ``save``, each row's μ and rstd [P·M]."""
    p, m, c = x.shape
    y = torch.empty((p, m, c), dtype=torch.float32, device=x.device)
    stats = [torch.empty(p * m, dtype=torch.float32, device=x.device) for _ in range(2)] if save else [y, y]
    rows = p * m
    if rows:
        block_r, block_c = _tiles(m, c)
        _member_layer_norm_kernel[(triton.cdiv(rows, block_r),)](
            x, weight.contiguous(), bias.contiguous(), y, *stats, rows, m, c, float(eps),
            BLOCK_R=block_r, BLOCK_C=block_c, SAVE=save, num_warps=NUM_WARPS)
    return (y, *stats) if save else (y, None, None)


def _backward(x: Tensor, weight: Tensor, mean: Tensor, rstd: Tensor, dy: Tensor, need_dx: bool):
    """Launch the backward kernel: (dx or None, dγ [P, 1, C], dβ [P, 1, C])."""
    p, m, c = x.shape
    dw, db = (x.new_empty((p, 1, c)) if m else x.new_zeros((p, 1, c)) for _ in range(2))  # no rows: zero sums
    dx = torch.empty_like(x) if need_dx else None
    if m:
        block_r, block_c = _tiles(m, c)
        nb = triton.cdiv(m, block_r)
        parts, tickets = group_scratch("member_layer_norm", x.device, p * nb * 2 * c, p)
        _member_layer_norm_backward_kernel[(nb, p)](
            x, weight.contiguous(), mean, rstd, dy, x if dx is None else dx, dw, db, parts, tickets, m, c, nb,
            BLOCK_R=block_r, BLOCK_C=block_c, SUM=max(1, min(triton.next_power_of_2(nb), TILE // block_c)),
            DX=need_dx, num_warps=NUM_WARPS)
    return dx, dw, db


class _MemberLayerNorm(torch.autograd.Function):
    """y = forward kernel(x, γ, β) saving μ and rstd; backward: one kernel for dx, dγ and dβ."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean, rstd = _forward(x, weight, bias, eps, save=True)
        ctx.save_for_backward(x, weight, mean, rstd)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        dx, dw, db = _backward(x, weight, mean, rstd, dy.contiguous(), need[0])
        return dx, dw.view(weight.shape) if need[1] else None, db.view(weight.shape) if need[2] else None, None


def member_layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float, *, backend: str = "auto") -> Tensor:
    """y float32 ``[P, M, C]`` = each row of x normalised over its C features, times its member's
    γ plus its member's β (module docstring): one kernel, and one more for the backward.

    Args:
        x: float32 ``[P, M, C]`` (non-contiguous inputs are copied); 1 <= C <= MAX_WIDTH.
        weight, bias: float32 ``[P, 1, C]``, each member's γ and β.
        eps: ε added to the variance (the classic layers').
        backend: ``"auto"`` (the kernel for CUDA tensors, else the reference; the kernel inside
            :func:`foxdqn.ops.backend.cpu_kernels`), ``"triton"`` (CPU tensors need
            TRITON_INTERPRET=1) or ``"torch"`` (:func:`member_layer_norm_reference`).

    Returns:
        y float32 ``[P, M, C]`` contiguous, equal to the reference to float rounding;
        differentiable w.r.t. x, weight and bias (first order) where any needs a gradient under
        grad mode.

    Raises:
        ValueError: outside the contract (module docstring), or an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    problem = _problem(x, weight, bias)
    if problem is not None:
        raise ValueError(problem)
    if resolve_backend("member_layer_norm", backend, x) == "torch":
        return member_layer_norm_reference(x, weight, bias, eps)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, weight, bias)):
        return _MemberLayerNorm.apply(x.contiguous(), weight, bias, float(eps))
    return _forward(x.contiguous(), weight, bias, eps, save=False)[0]
