r"""The gradients of P Linear layers (one per member), dx, dW and db, in one kernel launch.

For member p of P, with y_p = x_p W_p + b_p or y_p = relu(x_p W_p + b_p) (:mod:`foxdqn.ops.member_linear`)
and the gradient dy_p of y_p::

    dz_p = dy_p ⊙ 1{y_p > 0}  (relu: autograd's threshold_backward, a NaN y passes dy)   or   dz_p = dy_p
    dx_p = dz_p W_pᵀ     [M, K],      dW_p = x_pᵀ dz_p     [K, N],      db_p = Σ_rows dz_p     [1, N]

x float32 ``[P, M, K]`` (any strides), W ``[P, K, N]`` (any strides), dy (and y) ``[P, M, N]``.
Where :class:`foxdqn.ops.member_linear._MemberLinear`'s backward runs the ReLU mask with the bias
sum (one kernel), then torch's two batched GEMMs (cuBLAS; at few members and many rows a split-K
GEMM and its reduction each), this op is one launch.

Kernel (Triton): a grid of (programs, P members). The first ``TX`` programs compute tiles of dx:
``BLOCK_M`` rows × ``BLOCK_K`` columns, looping over N in chunks of ``BLOCK_N`` (dz's chunk, the
ReLU mask applied, times Wᵀ's). The others compute tiles of dW: ``WK`` × ``WN`` of it over one of
``S`` slices of the rows (``BLOCK_R`` rows a step, in increasing order), with that slice's part of
db in the tiles of the first ``WK`` rows of W. With one slice a program stores its tile; with S
slices each stores its part, and the last of the tile's S programs to finish (a ticket per tile,
:func:`foxdqn.ops.tensor_list.last_of_group`) sums the parts in slice order
(:func:`~foxdqn.ops.tensor_list.sum_of_parts`). S and every tile depend on M, K and N only, never
on P: member p of P gets the bits of a population of one. The same bits on every call.

Precision: :mod:`foxdqn.ops.mlp_chain`'s rule (TF32-rounded operands where torch runs float32 CUDA
matmuls in TF32, else IEEE float32); the sums run in the tiles' order, so dx, dW and db equal
:func:`member_linear_grads_reference` (autograd's) to float rounding.

Status: off. On an H200 it was slower than the layers' backward at 4 of 6 sizes of
``bench_member_linear_grads`` (up to 3× at 64 members of a 256-wide hidden layer; docs/bench.md,
"member_linear_grads measured"); :data:`foxdqn.ops.member_linear.FUSED_BACKWARD` (off) makes
``member_linear``'s backward take it.

Capture: device ops only; the parts and tickets (:func:`~foxdqn.ops.tensor_list.group_scratch`)
are made on an eager call before a capture.

Errors: ``ValueError`` (``member_linear_grads: ...``) for arguments outside the contract;
``RuntimeError`` for backend="triton" on CPU tensors without TRITON_INTERPRET=1.

Source: the chain rule of the Linear layer and the ReLU, as autograd applies it to ``baddbmm`` and
``relu``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, float32_problem, resolve_backend
from foxdqn.ops.mlp_chain import _prec, _tf32
from foxdqn.ops.tensor_list import group_scratch, last_of_group, sum_of_parts

__all__ = ["member_linear_grads", "member_linear_grads_reference"]

BLOCK_M = 64  # dx: rows per program
BLOCK_K = 64  # dx: columns of K per program
BLOCK_N = 32  # dx: N per step of the loop
WK, WN = 64, 64  # dW: a program's tile (at most; smaller for narrow layers)
BLOCK_R = 32  # dW: rows per step of the loop
#: dW: rows of a slice, at least (S = M // SLICE_ROWS slices, 1 to MAX_SLICES), so that a dW program
#: loops over about as many row steps as a dx program over N (8,192 rows: 16 slices of 16 steps)
SLICE_ROWS = 512
MAX_SLICES = 16
NUM_WARPS = 4
MAX_MEMBERS = 65535


@triton.jit
def _dz(dy_ptr, y_ptr, at, mask, RELU: tl.constexpr):
    """dy at ``at`` (0 outside ``mask``), 0 where y <= 0 with RELU (threshold_backward: a NaN y passes)."""
    dz = tl.load(dy_ptr + at, mask=mask, other=0.0)
    if RELU:
        dz = tl.where(tl.load(y_ptr + at, mask=mask, other=0.0) <= 0, 0.0, dz)
    return dz


@triton.jit
def _dx_tile(pid, p, w_ptr, dy_ptr, y_ptr, dx_ptr, M, K, N, swp, swk, swn, TKX, RELU: tl.constexpr,
             PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """dx's tile ``pid``: rows (pid // TKX)·BLOCK_M .., columns (pid % TKX)·BLOCK_K .. of member p."""
    rows = (pid // TKX).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    ks = (pid % TKX) * BLOCK_K + tl.arange(0, BLOCK_K)
    rm, km = rows < M, ks < K
    acc = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        ns = n0 + tl.arange(0, BLOCK_N)
        nm = ns < N
        dz = _dz(dy_ptr, y_ptr, (p * M + rows)[:, None] * N + ns[None, :], rm[:, None] & nm[None, :], RELU)
        wt = tl.load(w_ptr + p * swp + ks[None, :] * swk + ns[:, None] * swn, mask=nm[:, None] & km[None, :],
                     other=0.0)  # Wᵀ's [BLOCK_N, BLOCK_K] tile
        acc = tl.dot(_tf32(dz, PREC), _tf32(wt, PREC), acc=acc, input_precision=PREC)
    tl.store(dx_ptr + (p * M + rows)[:, None] * K + ks[None, :], acc, mask=rm[:, None] & km[None, :])


@triton.jit
def _dw_tile(q, p, x_ptr, dy_ptr, y_ptr, dw_ptr, db_ptr, part_ptr, ticket_ptr, M, K, N, sxp, sxm, sxk, TWN, TW, S,
             SLICE, RELU: tl.constexpr, PREC: tl.constexpr, NEED_W: tl.constexpr, NEED_B: tl.constexpr,
             WK: tl.constexpr, WN: tl.constexpr, BLOCK_R: tl.constexpr):
    """Slice q % S of dW's tile t = q // S (rows of W tk = t // TWN, columns t % TWN) of member p, and
    of db with tk = 0; the tile's last slice program sums the parts (module docstring)."""
    s = q % S
    t = q // S
    tk = t // TWN
    kk = tk * WK + tl.arange(0, WK)
    ns = (t % TWN) * WN + tl.arange(0, WN)
    km, nm = kk < K, ns < N
    acc = tl.zeros([WK, WN], dtype=tl.float32)
    dbacc = tl.zeros([WN], dtype=tl.float32)
    for r0 in range(0, SLICE, BLOCK_R):
        step = r0 + tl.arange(0, BLOCK_R)
        r = (s * SLICE + step).to(tl.int64)
        rm = (r < M) & (step < SLICE)
        dz = _dz(dy_ptr, y_ptr, (p * M + r)[:, None] * N + ns[None, :], rm[:, None] & nm[None, :], RELU)
        if NEED_W:
            xt = tl.load(x_ptr + p * sxp + r[None, :] * sxm + kk[:, None] * sxk, mask=km[:, None] & rm[None, :],
                         other=0.0)  # xᵀ's [WK, BLOCK_R] tile
            acc = tl.dot(_tf32(xt, PREC), _tf32(dz, PREC), acc=acc, input_precision=PREC)
        if NEED_B:
            dbacc += tl.sum(dz, axis=0)
    if S == 1:
        if NEED_W:
            tl.store(dw_ptr + p * K * N + kk[:, None] * N + ns[None, :], acc, mask=km[:, None] & nm[None, :])
        if NEED_B:
            if tk == 0:
                tl.store(db_ptr + p * N + ns, dbacc, mask=nm)
    else:
        group = p * TW + t
        i = tl.arange(0, WK)
        j = tl.arange(0, WN)
        part = part_ptr + (group * S + s) * (WK * WN + WN)
        tl.store(part + i[:, None] * WN + j[None, :], acc)
        tl.store(part + WK * WN + j, dbacc)
        if last_of_group(ticket_ptr + group, S):
            flat = tl.arange(0, WK * WN)
            fk = tk * WK + flat // WN
            fn = (t % TWN) * WN + flat % WN
            if NEED_W:
                dw = sum_of_parts(part_ptr, group * S, S, WK * WN + WN, flat, flat < WK * WN, 1, WK * WN)
                tl.store(dw_ptr + p * K * N + fk * N + fn, dw, mask=(fk < K) & (fn < N))
            if NEED_B:
                if tk == 0:
                    db = sum_of_parts(part_ptr + WK * WN, group * S, S, WK * WN + WN, j, j < WN, 1, WN)
                    tl.store(db_ptr + p * N + ns, db, mask=nm)
            tl.store(ticket_ptr + group, 0)


@triton.jit
def _member_linear_grads_kernel(x_ptr, w_ptr, dy_ptr, y_ptr, dx_ptr, dw_ptr, db_ptr, part_ptr, ticket_ptr, M, K, N,
                                sxp, sxm, sxk, swp, swk, swn, TX, TKX, TWN, TW, S, SLICE,
                                RELU: tl.constexpr, PREC: tl.constexpr, NEED_W: tl.constexpr,
                                NEED_B: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                                BLOCK_N: tl.constexpr, WK: tl.constexpr, WN: tl.constexpr, BLOCK_R: tl.constexpr):
    """Program ``program_id(0)`` of member ``program_id(1)``: a dx tile (the first TX programs) or
    a dW tile's slice (module docstring). dy, y [P, M, N] and dx [P, M, K] contiguous; dw [P, K, N],
    db [P, N] contiguous; parts [P·TW·S, WK·WN + WN]."""
    p = tl.program_id(1).to(tl.int64)
    pid = tl.program_id(0)
    if pid < TX:
        _dx_tile(pid, p, w_ptr, dy_ptr, y_ptr, dx_ptr, M, K, N, swp, swk, swn, TKX, RELU, PREC, BLOCK_M, BLOCK_K,
                 BLOCK_N)
    else:
        _dw_tile(pid - TX, p, x_ptr, dy_ptr, y_ptr, dw_ptr, db_ptr, part_ptr, ticket_ptr, M, K, N, sxp, sxm, sxk, TWN,
                 TW, S, SLICE, RELU, PREC, NEED_W, NEED_B, WK, WN, BLOCK_R)


def _pow2(d: int, most: int) -> int:
    return min(most, max(16, triton.next_power_of_2(d)))


def plan(m: int, k: int, n: int) -> dict:
    """The launch's tiles and slices for M rows, K inputs and N outputs (never P): dx tiles
    (BLOCK_M, BLOCK_K, BLOCK_N), dW tiles (WK, WN), the slices S of ``SLICE`` rows (a multiple of
    BLOCK_R) over which each dW tile is summed."""
    slices = max(1, min(MAX_SLICES, m // SLICE_ROWS))
    rows = triton.cdiv(triton.cdiv(max(m, 1), slices), BLOCK_R) * BLOCK_R
    return dict(BLOCK_M=_pow2(m, BLOCK_M), BLOCK_K=_pow2(k, BLOCK_K), BLOCK_N=_pow2(n, BLOCK_N), WK=_pow2(k, WK),
                WN=_pow2(n, WN), S=triton.cdiv(max(m, 1), rows), SLICE=rows)


def _problem(x, w, dy, y) -> str | None:
    op = "member_linear_grads"
    problem = float32_problem(op, (("x", x, 3), ("w", w, 3), ("dy", dy, 3)))
    if problem:
        return problem
    p, m, k = x.shape
    n = w.shape[2] if w.dim() == 3 else -1
    if not 1 <= p <= MAX_MEMBERS:
        return f"{op}: x must hold 1 to {MAX_MEMBERS} members, got {describe(x)}"
    if tuple(w.shape[:2]) != (p, k):
        return f"{op}: w must be [{p}, {k}, N] (x's members and width), got {describe(w)}"
    if tuple(dy.shape) != (p, m, n):
        return f"{op}: dy must be [{p}, {m}, {n}], got {describe(dy)}"
    if y is not None and (not isinstance(y, Tensor) or y.shape != dy.shape or y.dtype != torch.float32):
        return f"{op}: y must be None or a float32 [{p}, {m}, {n}] tensor, got {describe(y)}"
    if len({t.device for t in (x, w, dy, *(() if y is None else (y,)))}) != 1:
        return f"{op}: x, w, dy and y must be on one device"
    return None


def member_linear_grads_reference(x: Tensor, w: Tensor, dy: Tensor, y: Tensor | None = None) -> tuple[Tensor, ...]:
    """Plain torch: (dx, dW, db) of :func:`member_linear_grads` (db ``[P, 1, N]``), autograd's rule."""
    dz = dy if y is None else torch.where(y <= 0, torch.zeros_like(dy), dy)
    return torch.bmm(dz, w.transpose(1, 2)), torch.bmm(x.transpose(1, 2), dz), dz.sum(1, keepdim=True)


def member_linear_grads(x: Tensor, w: Tensor, dy: Tensor, y: Tensor | None = None, *, need_x: bool = True,
                        need_w: bool = True, need_b: bool = True,
                        backend: str = "auto") -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(dx, dW, db) of P Linear layers, one kernel launch (module docstring).

    Args:
        x: the layer's input, float32 ``[P, M, K]``, any strides, 1 <= P <= 65535.
        w: its weights, float32 ``[P, K, N]`` (``member_linear``'s layout), any strides.
        dy: the gradient of its output, float32 ``[P, M, N]`` (copied if not contiguous).
        y: its output after the ReLU (float32 ``[P, M, N]``) for a layer with a ReLU, else None.
        need_x, need_w, need_b: which gradients to compute (the others are None).
        backend: ``"auto"`` (the kernel for CUDA tensors, else the reference; the kernel inside
            :func:`foxdqn.ops.backend.cpu_kernels`), ``"triton"`` (CPU tensors need
            TRITON_INTERPRET=1) or ``"torch"`` (:func:`member_linear_grads_reference`).

    Returns:
        dx float32 ``[P, M, K]``, dW ``[P, K, N]``, db ``[P, 1, N]`` (contiguous), or None where not
        needed; equal to the reference to float rounding.

    Raises:
        ValueError: outside the contract above, or an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    problem = _problem(x, w, dy, y)
    if problem is not None:
        raise ValueError(problem)
    if resolve_backend("member_linear_grads", backend, x) == "torch":
        dx, dw, db = member_linear_grads_reference(x, w, dy, y)
        return dx if need_x else None, dw if need_w else None, db if need_b else None
    p, m, k = x.shape
    n = w.shape[2]
    dy = dy.contiguous()
    y = None if y is None else y.contiguous()
    dx = x.new_empty(p, m, k) if need_x else None
    dw = (x.new_empty(p, k, n) if m else x.new_zeros(p, k, n)) if need_w else None
    db = (x.new_empty(p, 1, n) if m else x.new_zeros(p, 1, n)) if need_b else None
    if not m or not (need_x or need_w or need_b):
        return dx, dw, db
    t = plan(m, k, n)
    tx = triton.cdiv(m, t["BLOCK_M"]) * triton.cdiv(k, t["BLOCK_K"]) if need_x else 0
    twn = triton.cdiv(n, t["WN"])
    tw = triton.cdiv(k, t["WK"]) * twn if (need_w or need_b) else 0
    if not need_w and need_b:
        tw = twn  # db alone: the tiles of W's first rows
    parts, tickets = group_scratch("member_linear_grads", x.device, p * tw * t["S"] * (t["WK"] * t["WN"] + t["WN"]),
                                   p * tw) if tw and t["S"] > 1 else (dy, dy)
    _member_linear_grads_kernel[(tx + tw * t["S"], p)](
        x, w, dy, dy if y is None else y, dx if dx is not None else dy, dw if dw is not None else dy,
        db if db is not None else dy, parts, tickets, m, k, n, x.stride(0), x.stride(1), x.stride(2), w.stride(0),
        w.stride(1), w.stride(2), tx, triton.cdiv(k, t["BLOCK_K"]), twn, tw, t["S"], t["SLICE"],
        RELU=y is not None, PREC=_prec(x), NEED_W=need_w, NEED_B=need_b, BLOCK_M=t["BLOCK_M"],
        BLOCK_K=t["BLOCK_K"], BLOCK_N=t["BLOCK_N"], WK=t["WK"], WN=t["WN"], BLOCK_R=BLOCK_R, num_warps=NUM_WARPS)
    return dx, dw, db
