r"""P members' narrow linear heads on one input: D Linear layers in one kernel, the backward in two.

    y_{p,d} = x_p W_{p,d} + b_{p,d}          (p = 0 .. P − 1, d = 0 .. D − 1)

x float32 ``[P, M, K]`` (the encoder's last hidden layer), W_d ``[P, K, N_d]``, b_d ``[P, 1, N_d]``
(each member's ``nn.Linear.weight`` transposed, the population's layout:
:class:`foxdqn.population.network.MemberQNetwork`), y_d float32 ``[P, M, N_d]``, 1 <= D <= 4 heads
of 1 to 32 columns each. The BDQ head (Tavakoli et al. 2018) of the trading experiments reads
three branches (exposure 5, order type 3, urgency 3) and the state value (1) from one hidden layer:
through its layers that is a ``torch.baddbmm`` per branch (a bias copy and a GEMM: widths that are
not a multiple of 4 are not widths :mod:`foxdqn.ops.member_linear` is fast at) and the value's
``member_linear``, 7 kernels forward on CUDA, and in backward a GEMM for dW, one for dx and a
bias sum per head, then the dx sums: 15. Here: 1 forward, 2 backward (issue 33: kernels per
update; :mod:`foxdqn.population.branching` takes it where its switch is on).

Kernels (Triton). Each weight tile is a plain load that feeds ``tl.dot`` (no tile built in
registers from several loads: docs/bench.md#kernels, the dueling head's first version).

* forward, a grid of (blocks of ``BLOCK_M`` rows, P): a program loops over K in chunks of ``BLOCK_K``, x's
  chunk loaded once and one ``tl.dot`` per head into that head's float32 accumulator
  (``[BLOCK_M, BLOCK_N]``, ``BLOCK_N = max(16, next_pow2(max N_d))``), in increasing order; then
  each head's bias is added in float32 after the products (as ``F.linear``).
* dx, a grid of (blocks of rows, blocks of K, P): dx = Σ_d dy_d W_dᵀ, one ``tl.dot`` per head
  (W_d's ``[BLOCK_DX, BLOCK_N]`` tile transposed), summed in head order; no loop (N_d <= 32).
* dW and db, a grid of (blocks of K, P): a program loops over all M rows in chunks of ``BLOCK_R``
  in increasing order, dW_d += xᵀ dy_d one ``tl.dot`` per head a chunk; the first K block's
  programs also sum each dy_d's columns over the rows for db_d. The tiles and chunks are fixed
  (not chosen from P or the grid), so member p of P equals a population of one bit for bit.

A program reads member p's rows and weights only: members never mix. Any strides of x, the
weights, the biases and the outputs' gradients (no copies: the BDQ loss's are column slices of one
buffer). NaN or ±inf in a row of x reach that row's outputs only (and the gradients it touches),
as in the reference: padding columns are zeros that reach no stored sum.

Precision: :mod:`foxdqn.ops.mlp_chain`'s rule. Where torch runs float32 CUDA matmuls in TF32 (the
run's default), each ``tl.dot`` operand is rounded to TF32 (to nearest) first; else IEEE float32.
The sums run in another order than cuBLAS's, so the outputs and the gradients equal
:func:`member_heads_reference` to float rounding (about 1e-6 relative in IEEE float32, 1e-3 in TF32).

Capture: device ops only; outputs ``torch.empty`` (from a graph's pool inside a capture).

Source: the Linear layer as ``torch.nn`` defines it; Tavakoli, Pardo & Kormushev (2018), "Action
Branching Architectures for Deep Reinforcement Learning" (the branches and the shared state value
on one representation); the tiled GEMM of Triton's matrix-multiplication tutorial, with a member axis.
"""
from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, float32_problem, resolve_backend
from foxdqn.ops.library import wrap_triton
from foxdqn.ops.member_linear import _tile
from foxdqn.ops.mlp_chain import _fill, _prec, _tf32

__all__ = ["member_heads", "member_heads_reference", "member_heads_supported"]

#: Rows per forward and dx program, at any P (so a member of P equals a population of one bit for
#: bit). Not 64: at 64 rows Triton 3.6 takes Hopper's wgmma for the forward, whose B operand (a
#: weight tile rounded to TF32 in registers) goes back to shared memory, staged in an unswizzled
#: column-major layout for rows of 5 or 3 floats (bank conflicts; the TTGIR compiled for sm_90 on
#: the CPU). At 32 rows the tiles load from a swizzled layout straight into mma.sync's operands.
BLOCK_M = 32
BLOCK_K = 32  # K per step of the forward's loop
BLOCK_DX = 64  # dx columns (of K) per program
BLOCK_DW = 32  # dW rows (of K) per program
BLOCK_R = 32  # rows per step of the dW loop: fixed, so the sums' order does not depend on P
STAGES_FORWARD, WARPS_FORWARD = 3, 4  # the forward's software-pipeline stages (its K loop) and warps
WARPS_DX = 4
STAGES_DW, WARPS_DW = 3, 4  # the dW kernel's (its loop over rows)
MAX_HEADS = 4
MAX_WIDTH = 32  # columns per head: one [*, 32] tile
MAX_MEMBERS = 65535  # a grid axis


# ----------------------------------------------------------------------------- kernels
@triton.jit
def _dot_tile(acc, a, ptr, rows, rm, cols, N, s_row, s_col, PREC: tl.constexpr):
    """acc + a · the [len(rows), BLOCK_N] tile at ``ptr`` (rows ``rows`` where ``rm``, columns < N; 0
    elsewhere): a weight's rows of K (forward) or a gradient's rows of M (dW)."""
    t = tl.load(ptr + rows.to(tl.int64)[:, None] * s_row + cols[None, :] * s_col,
                mask=rm[:, None] & (cols[None, :] < N), other=0.0)
    return tl.dot(a, _tf32(t, PREC), acc=acc, input_precision=PREC)


@triton.jit
def _store_head(acc, b_ptr, y_ptr, p, rows, rm, cols, M, N, sbn):
    """y's rows ``rows`` of member p, [P, M, N] contiguous: acc + b (b's base pointer at member p)."""
    cm = cols < N
    y = acc + tl.load(b_ptr + cols * sbn, mask=cm, other=0.0)[None, :]
    tl.store(y_ptr + (p * M + rows.to(tl.int64))[:, None] * N + cols[None, :], y, mask=rm[:, None] & cm[None, :])


@triton.jit
def _member_heads_forward_kernel(x_ptr, w0, w1, w2, w3, b0, b1, b2, b3, y0, y1, y2, y3, M, K, N0, N1, N2, N3,
                                 sxp, sxm, sxk, swp0, swk0, swn0, swp1, swk1, swn1, swp2, swk2, swn2, swp3, swk3,
                                 swn3, sbp0, sbn0, sbp1, sbn1, sbp2, sbn2, sbp3, sbn3, HEADS: tl.constexpr,
                                 PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                 BLOCK_K: tl.constexpr):
    # x's chunk loaded once, one dot per head (heads >= HEADS are compiled out)
    p = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    rm = rows < M
    x_base = x_ptr + p * sxp + rows.to(tl.int64)[:, None] * sxm
    acc0 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        km = k < K
        a = _tf32(tl.load(x_base + k[None, :] * sxk, mask=rm[:, None] & km[None, :], other=0.0), PREC)
        acc0 = _dot_tile(acc0, a, w0 + p * swp0, k, km, cols, N0, swk0, swn0, PREC)
        if HEADS > 1:
            acc1 = _dot_tile(acc1, a, w1 + p * swp1, k, km, cols, N1, swk1, swn1, PREC)
        if HEADS > 2:
            acc2 = _dot_tile(acc2, a, w2 + p * swp2, k, km, cols, N2, swk2, swn2, PREC)
        if HEADS > 3:
            acc3 = _dot_tile(acc3, a, w3 + p * swp3, k, km, cols, N3, swk3, swn3, PREC)
    _store_head(acc0, b0 + p * sbp0, y0, p, rows, rm, cols, M, N0, sbn0)
    if HEADS > 1:
        _store_head(acc1, b1 + p * sbp1, y1, p, rows, rm, cols, M, N1, sbn1)
    if HEADS > 2:
        _store_head(acc2, b2 + p * sbp2, y2, p, rows, rm, cols, M, N2, sbn2)
    if HEADS > 3:
        _store_head(acc3, b3 + p * sbp3, y3, p, rows, rm, cols, M, N3, sbn3)


@triton.jit
def _dx_head(acc, dy_ptr, w_ptr, rows, rm, k, km, cols, N, sgm, sgn, swk, swn, PREC: tl.constexpr):
    """acc + dy's [len(rows), BLOCK_N] tile (member base pointer dy_ptr) · W's [len(k), BLOCK_N] tileᵀ."""
    cm = cols < N
    g = tl.load(dy_ptr + rows.to(tl.int64)[:, None] * sgm + cols[None, :] * sgn, mask=rm[:, None] & cm[None, :],
                other=0.0)
    w = tl.load(w_ptr + k.to(tl.int64)[:, None] * swk + cols[None, :] * swn, mask=km[:, None] & cm[None, :],
                other=0.0)
    return tl.dot(_tf32(g, PREC), tl.trans(_tf32(w, PREC)), acc=acc, input_precision=PREC)


@triton.jit
def _member_heads_dx_kernel(g0, g1, g2, g3, w0, w1, w2, w3, dx_ptr, M, K, N0, N1, N2, N3, sgp0, sgm0, sgn0, sgp1,
                            sgm1, sgn1, sgp2, sgm2, sgn2, sgp3, sgm3, sgn3, swp0, swk0, swn0, swp1,
                            swk1, swn1, swp2, swk2, swn2, swp3, swk3, swn3, HEADS: tl.constexpr, PREC: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DX: tl.constexpr):
    p = tl.program_id(2).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    k = tl.program_id(1) * BLOCK_DX + tl.arange(0, BLOCK_DX)
    cols = tl.arange(0, BLOCK_N)
    rm, km = rows < M, k < K
    acc = tl.zeros([BLOCK_M, BLOCK_DX], dtype=tl.float32)
    acc = _dx_head(acc, g0 + p * sgp0, w0 + p * swp0, rows, rm, k, km, cols, N0, sgm0, sgn0, swk0, swn0, PREC)
    if HEADS > 1:
        acc = _dx_head(acc, g1 + p * sgp1, w1 + p * swp1, rows, rm, k, km, cols, N1, sgm1, sgn1, swk1, swn1, PREC)
    if HEADS > 2:
        acc = _dx_head(acc, g2 + p * sgp2, w2 + p * swp2, rows, rm, k, km, cols, N2, sgm2, sgn2, swk2, swn2, PREC)
    if HEADS > 3:
        acc = _dx_head(acc, g3 + p * sgp3, w3 + p * swp3, rows, rm, k, km, cols, N3, sgm3, sgn3, swk3, swn3, PREC)
    offs = (p * M + rows.to(tl.int64))[:, None] * K + k[None, :]
    tl.store(dx_ptr + offs, acc, mask=rm[:, None] & km[None, :])


@triton.jit
def _db_head(dy_ptr, db_ptr, M, N, sgm, sgn, cols, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    """db = Σ_rows dy (member base pointer dy_ptr), in chunks of BLOCK_R rows in increasing order."""
    c = tl.zeros([BLOCK_N], dtype=tl.float32)
    for r0 in range(0, M, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        g = tl.load(dy_ptr + rows.to(tl.int64)[:, None] * sgm + cols[None, :] * sgn,
                    mask=(rows < M)[:, None] & (cols[None, :] < N), other=0.0)
        c += tl.sum(g, axis=0)
    tl.store(db_ptr + cols, c, mask=cols < N)


@triton.jit
def _member_heads_dw_kernel(g0, g1, g2, g3, x_ptr, dw0, dw1, dw2, dw3, db0, db1, db2, db3, M, K, N0, N1, N2, N3,
                            sgp0, sgm0, sgn0, sgp1, sgm1, sgn1, sgp2, sgm2, sgn2, sgp3, sgm3, sgn3, sxp, sxm, sxk,
                            HEADS: tl.constexpr, PREC: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_DW: tl.constexpr, BLOCK_R: tl.constexpr):
    p = tl.program_id(1).to(tl.int64)
    k = tl.program_id(0) * BLOCK_DW + tl.arange(0, BLOCK_DW)
    cols = tl.arange(0, BLOCK_N)
    km = k < K
    x_base = x_ptr + p * sxp + k.to(tl.int64)[:, None] * sxk
    acc0 = tl.zeros([BLOCK_DW, BLOCK_N], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_DW, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_DW, BLOCK_N], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_DW, BLOCK_N], dtype=tl.float32)
    for r0 in range(0, M, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        rm = rows < M
        xt = _tf32(tl.load(x_base + rows.to(tl.int64)[None, :] * sxm, mask=km[:, None] & rm[None, :], other=0.0),
                   PREC)
        acc0 = _dot_tile(acc0, xt, g0 + p * sgp0, rows, rm, cols, N0, sgm0, sgn0, PREC)
        if HEADS > 1:
            acc1 = _dot_tile(acc1, xt, g1 + p * sgp1, rows, rm, cols, N1, sgm1, sgn1, PREC)
        if HEADS > 2:
            acc2 = _dot_tile(acc2, xt, g2 + p * sgp2, rows, rm, cols, N2, sgm2, sgn2, PREC)
        if HEADS > 3:
            acc3 = _dot_tile(acc3, xt, g3 + p * sgp3, rows, rm, cols, N3, sgm3, sgn3, PREC)
    kk = k.to(tl.int64)[:, None]
    tl.store(dw0 + (p * K + kk) * N0 + cols[None, :], acc0, mask=km[:, None] & (cols[None, :] < N0))
    if HEADS > 1:
        tl.store(dw1 + (p * K + kk) * N1 + cols[None, :], acc1, mask=km[:, None] & (cols[None, :] < N1))
    if HEADS > 2:
        tl.store(dw2 + (p * K + kk) * N2 + cols[None, :], acc2, mask=km[:, None] & (cols[None, :] < N2))
    if HEADS > 3:
        tl.store(dw3 + (p * K + kk) * N3 + cols[None, :], acc3, mask=km[:, None] & (cols[None, :] < N3))
    if tl.program_id(0) == 0:  # the biases
        _db_head(g0 + p * sgp0, db0 + p * N0, M, N0, sgm0, sgn0, cols, BLOCK_N, BLOCK_R)
        if HEADS > 1:
            _db_head(g1 + p * sgp1, db1 + p * N1, M, N1, sgm1, sgn1, cols, BLOCK_N, BLOCK_R)
        if HEADS > 2:
            _db_head(g2 + p * sgp2, db2 + p * N2, M, N2, sgm2, sgn2, cols, BLOCK_N, BLOCK_R)
        if HEADS > 3:
            _db_head(g3 + p * sgp3, db3 + p * N3, M, N3, sgm3, sgn3, cols, BLOCK_N, BLOCK_R)


# ----------------------------------------------------------------------------- launches
def _block_n(weights: Sequence[Tensor]) -> int:
    return max(16, triton.next_power_of_2(max(w.shape[2] for w in weights)))


def _block_m(m: int) -> int:
    return _tile(m, BLOCK_M)


def _widths(weights: Sequence[Tensor]) -> list[int]:
    return _fill([w.shape[2] for w in weights], MAX_HEADS, 0)


def _strides(ts: Sequence[Tensor]) -> list[int]:
    """The three strides of each of ``ts`` [P, *, *], padded to MAX_HEADS heads."""
    return [s for t in _fill(ts, MAX_HEADS, ts[0]) for s in (t.stride(0), t.stride(1), t.stride(2))]


def _forward(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor]) -> list[Tensor]:
    members, m, k = x.shape
    ys = [x.new_empty(members, m, w.shape[2]) for w in weights]
    if m:
        bm = _block_m(m)
        bias_strides = [s for b in _fill(biases, MAX_HEADS, biases[0]) for s in (b.stride(0), b.stride(2))]
        wrap_triton(_member_heads_forward_kernel)[(triton.cdiv(m, bm), members)](
            x, *_fill(weights, MAX_HEADS, x), *_fill(biases, MAX_HEADS, x), *_fill(ys, MAX_HEADS, x), m, k,
            *_widths(weights), x.stride(0), x.stride(1), x.stride(2), *_strides(weights), *bias_strides,
            HEADS=len(weights), PREC=_prec(x),
            BLOCK_M=bm, BLOCK_N=_block_n(weights), BLOCK_K=_tile(k, BLOCK_K), num_warps=WARPS_FORWARD,
            num_stages=STAGES_FORWARD)
    return ys


def _dx(grads: Sequence[Tensor], x: Tensor, weights: Sequence[Tensor]) -> Tensor:
    members, m, k = x.shape
    dx = x.new_empty(members, m, k)
    if m and k:
        bm = _block_m(m)
        grid = (triton.cdiv(m, bm), triton.cdiv(k, BLOCK_DX), members)
        wrap_triton(_member_heads_dx_kernel)[grid](
            *_fill(grads, MAX_HEADS, x), *_fill(weights, MAX_HEADS, x), dx, m, k, *_widths(weights),
            *_strides(grads), *_strides(weights), HEADS=len(weights), PREC=_prec(x), BLOCK_M=bm,
            BLOCK_N=_block_n(weights), BLOCK_DX=BLOCK_DX, num_warps=WARPS_DX)
    return dx


def _dw(grads: Sequence[Tensor], x: Tensor, widths: Sequence[int]) -> tuple[list[Tensor], list[Tensor]]:
    members, m, k = x.shape
    dws = [x.new_empty(members, k, n) for n in widths]
    dbs = [x.new_empty(members, 1, n) for n in widths]
    grid = (max(1, triton.cdiv(k, BLOCK_DW)), members)  # k = 0: one program per member writes db
    wrap_triton(_member_heads_dw_kernel)[grid](
        *_fill(grads, MAX_HEADS, x), x, *_fill(dws, MAX_HEADS, x), *_fill(dbs, MAX_HEADS, x), m, k,
        *_fill(list(widths), MAX_HEADS, 0), *_strides(grads), x.stride(0), x.stride(1), x.stride(2),
        HEADS=len(widths), PREC=_prec(x), BLOCK_N=max(16, triton.next_power_of_2(max(widths))), BLOCK_DW=BLOCK_DW,
        BLOCK_R=BLOCK_R, num_warps=WARPS_DW, num_stages=STAGES_DW)
    return dws, dbs


class _MemberHeads(torch.autograd.Function):
    """The outputs are the forward kernel's; backward: the dx kernel and the dW / db kernel (module docstring)."""

    @staticmethod
    def forward(ctx, x, *params):
        heads = len(params) // 2
        weights, biases = params[:heads], params[heads:]
        ctx.save_for_backward(x, *weights)
        return tuple(_forward(x, weights, biases))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        x, *weights = ctx.saved_tensors
        need_x, *need_params = ctx.needs_input_grad
        dx = _dx(grads, x, weights) if need_x else None
        if any(need_params):
            dws, dbs = _dw(grads, x, [w.shape[2] for w in weights])
        else:
            dws = dbs = [None] * len(weights)
        return (dx, *(g if need else None for g, need in zip([*dws, *dbs], need_params)))


# ----------------------------------------------------------------------------- checks
def _problem(x, weights, biases) -> str | None:
    """Why the arguments are outside :func:`member_heads`'s contract, or None."""
    op = "member_heads"
    problem = float32_problem(op, (("x", x, 3),))
    if problem:
        return problem
    weights, biases = list(weights), list(biases)
    if not 1 <= len(weights) <= MAX_HEADS or len(biases) != len(weights):
        return (f"{op}: needs 1 to {MAX_HEADS} weights and as many biases, got {len(weights)} weights and "
                f"{len(biases)} biases")
    members, _, k = x.shape
    if not 1 <= members <= MAX_MEMBERS:
        return f"{op}: x must hold 1 to {MAX_MEMBERS} members, got {describe(x)}"
    for d, (w, b) in enumerate(zip(weights, biases)):
        problem = float32_problem(op, ((f"weights[{d}]", w, 3), (f"biases[{d}]", b, 3)))
        if problem:
            return problem
        n = w.shape[2]
        if tuple(w.shape[:2]) != (members, k) or not 1 <= n <= MAX_WIDTH:
            return (f"{op}: weights[{d}] must be [{members}, {k}, N] (x's members and width) with 1 <= N <= "
                    f"{MAX_WIDTH}, got {describe(w)}")
        if tuple(b.shape) != (members, 1, n):
            return (f"{op}: biases[{d}] must be [{members}, 1, {n}] (weights[{d}]'s members and columns), "
                    f"got {describe(b)}")
        if w.device != x.device or b.device != x.device:
            return f"{op}: x, weights[{d}] and biases[{d}] must be on one device"
    return None


def member_heads_supported(x, weights, biases) -> bool:
    """Whether :func:`member_heads` takes the arguments: x float32 ``[P, M, K]``, 1 to 4 weights
    ``[P, K, N_d]`` (1 <= N_d <= 32) and biases ``[P, 1, N_d]``, float32, on x's device,
    1 <= P <= 65535. A metadata check only (no device read)."""
    return _problem(x, weights, biases) is None


# ----------------------------------------------------------------------------- reference
def member_heads_reference(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor]) -> list[Tensor]:
    """Plain torch: ``[torch.baddbmm(b_d, x, W_d) for each head]``; differentiable by autograd."""
    return [torch.baddbmm(b, x, w) for w, b in zip(weights, biases)]


# ----------------------------------------------------------------------------- public
def member_heads(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor], *,
                 backend: str = "auto") -> list[Tensor]:
    """Every member's D linear heads of one input, y_d = x W_d + b_d: one kernel forward and two
    backward (module docstring).

    Args:
        x: the last hidden layer, float32 ``[P, M, K]``, any strides, 1 <= P <= 65535, M, K >= 0.
        weights: 1 to 4 float32 ``[P, K, N_d]`` (a member's ``nn.Linear.weight`` transposed),
            1 <= N_d <= 32, any strides, x's device.
        biases: the matching float32 ``[P, 1, N_d]``, any strides.
        backend: ``"auto"`` (the kernels for CUDA tensors, else the reference; the kernels inside
            :func:`foxdqn.ops.backend.cpu_kernels`), ``"triton"`` (CPU tensors need
            TRITON_INTERPRET=1) or ``"torch"`` (:func:`member_heads_reference`).

    Returns:
        D float32 ``[P, M, N_d]`` tensors, contiguous; differentiable w.r.t. every input (first
        order on the kernel path). Equal to the reference to float rounding (module docstring).

    Raises:
        ValueError: outside the contract above (:func:`member_heads_supported` is False), an
            unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    weights, biases = list(weights), list(biases)
    problem = _problem(x, weights, biases)
    if problem is not None:
        raise ValueError(problem)
    if resolve_backend("member_heads", backend, x) == "torch":
        return member_heads_reference(x, weights, biases)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, *weights, *biases)):
        return list(_MemberHeads.apply(x, *weights, *biases))
    return _forward(x, weights, biases)
