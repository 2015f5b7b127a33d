r"""Gradual magnitude pruning's mask step of one weight matrix for every member, in one kernel.

Source: Zhu & Gupta 2017, "To prune, or not to prune", §3 (the schedule, eq. 1:
:class:`foxdqn.step.pruning.MagnitudePruner`; docs/design/update.md#pruning). After the Adam step
of update t, member p's mask of a matrix is recomputed when t is a mask-update step and the guard
did not skip p's update:

    due_p  = t0 <= t <= t_end  and  ((t − t0) mod Δt = 0  or  t = t_end)  and  skip_p = 0
    k      = ⌊s_t · n⌋          (entries to zero; read from the caller's table, one row per due step)
    mask_p = 0 for the k entries of smallest |w_p · mask_p| in the matrix's classic layout, ties by
             position (a stable sort), 1 elsewhere

and then, due or not, w_p ← w_p · mask_p. The classic layout is the single run's: ``[out, in]`` of a
linear layer, whose member weight is stored ``[P, in, out]`` (``transposed``), or the stored layout
(a convolution's ``[P, out, in, kh, kw]``).

Table. s_t is a function of t alone, so the caller computes k for every due step once, with the
reference's float64 ops on its device (:meth:`foxdqn.population.pruning.MemberPruner`), and passes
``k_table`` int64 ``[R, C]``: row ``(t − t0) // Δt`` for t − t0 a multiple of Δt, the last row for
t = t_end otherwise; column ``col`` is this matrix's.

Kernel. One program per member. Not due: one pass, w ← w · mask. Due: the magnitudes' float32 bit
patterns (non-negative, so ordered as integers; NaN, which a stable sort puts last, as the largest
pattern) are searched bit by bit for v*, the k-th smallest (31 counting passes), then one pass in
the classic order writes the mask (v < v*, or v = v* among the first k − #{v < v*} such entries by
position) and the masked weight. The torch reference (:func:`prune_masks_reference`) is the
stable argsort and scatter the population ran before this op (about 19 launches a matrix, and the
schedule's 25). No host synchronisation, fixed shapes, capturable.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from foxdqn.ops.backend import describe, resolve_backend

__all__ = ["prune_masks_", "prune_masks_reference", "due_row"]

_BLOCK = 1024  #: elements per iteration of the kernel's passes
_NAN_BITS = 0x7FFFFFFF  #: the pattern every NaN magnitude ranks as (above +inf's 0x7F800000)


@triton.jit
def _bits(w, m):
    """The ordered int32 pattern of |w · m| (the reference's ``w.abs() * mask``), NaN largest."""
    v = tl.abs(w) * m
    b = v.to(tl.int32, bitcast=True)
    return tl.where(v != v, 0x7FFFFFFF, b)


@triton.jit
def _prune_masks_kernel(w_ptr, mask_ptr, skip_ptr, t_ptr, table_ptr, t0, t_end, freq, last_row, col, n_cols,
                        N, IN, OUT, TRANSPOSED: tl.constexpr, BLOCK: tl.constexpr):
    p = tl.program_id(0)
    zero = tl.zeros([], dtype=tl.int64)  # an int argument equal to 1 arrives as a constexpr
    t = tl.load(t_ptr)
    rel = t - (t0 + zero)
    inside = (rel >= 0) & (t <= t_end + zero)
    rem = tl.where(inside, rel % (freq + zero), 1)
    due = inside & ((rem == 0) | (t == t_end + zero)) & (tl.load(skip_ptr + p) == 0)
    base = w_ptr + p.to(tl.int64) * N
    mbase = mask_ptr + p.to(tl.int64) * N
    offs = tl.arange(0, BLOCK)
    if due:
        row = tl.where(rem == 0, rel // (freq + zero), last_row + zero)
        k = tl.load(table_ptr + row * n_cols + col).to(tl.int32)
        lo = tl.zeros([], dtype=tl.int32)
        hi = tl.full([], 0x7FFFFFFF, tl.int32)
        for _ in range(31):  # the smallest pattern v* with #{bits <= v*} >= k
            mid = lo + (hi - lo) // 2
            cnt = tl.zeros([], dtype=tl.int32)
            for o in range(0, N, BLOCK):
                j = o + offs
                ok = j < N
                b = _bits(tl.load(base + j, mask=ok, other=0.0), tl.load(mbase + j, mask=ok, other=0.0))
                cnt += tl.sum((ok & (b <= mid)).to(tl.int32), axis=0)
            enough = cnt >= k
            hi = tl.where(enough, mid, hi)
            lo = tl.where(enough, lo, mid + 1)
        less = tl.zeros([], dtype=tl.int32)
        for o in range(0, N, BLOCK):
            j = o + offs
            ok = j < N
            b = _bits(tl.load(base + j, mask=ok, other=0.0), tl.load(mbase + j, mask=ok, other=0.0))
            less += tl.sum((ok & (b < lo)).to(tl.int32), axis=0)
        ties = k - less  # entries equal to v* that are pruned: the first ones by classic position
        seen = tl.zeros([], dtype=tl.int32)
        for o in range(0, N, BLOCK):
            j = o + offs  # classic position
            ok = j < N
            if TRANSPOSED:  # classic [out, in], stored [in, out]
                s = (j % IN) * OUT + j // IN
            else:
                s = j
            w = tl.load(base + s, mask=ok, other=0.0)
            b = _bits(w, tl.load(mbase + s, mask=ok, other=0.0))
            eq = (ok & (b == lo)).to(tl.int32)
            before = seen + tl.cumsum(eq, axis=0) - eq
            pruned = (b < lo) | ((eq == 1) & (before < ties))
            fresh = tl.where(pruned, 0.0, 1.0)
            tl.store(mbase + s, fresh, mask=ok)
            tl.store(base + s, w * fresh, mask=ok)
            seen += tl.sum(eq, axis=0)
    else:
        for o in range(0, N, BLOCK):
            j = o + offs
            ok = j < N
            w = tl.load(base + j, mask=ok, other=0.0)
            tl.store(base + j, w * tl.load(mbase + j, mask=ok, other=0.0), mask=ok)


def due_row(t: int, t0: int, t_end: int, freq: int) -> int | None:
    """The ``k_table`` row of update ``t`` (host ints), or None when t is not a mask-update step
    (module docstring)."""
    if not t0 <= t <= t_end:
        return None
    if (t - t0) % freq == 0:
        return (t - t0) // freq
    return (t_end - t0) // freq + 1 if t == t_end else None


def prune_masks_reference(weight: torch.Tensor, mask: torch.Tensor, t: torch.Tensor, skip: torch.Tensor,
                          k_table: torch.Tensor, col: int, t0: int, t_end: int, freq: int,
                          transposed: bool) -> None:
    """Plain-torch :func:`prune_masks_` (same arguments, same writes): each member's stable argsort
    of |w · mask| in the classic layout, the k smallest zeroed where due, then w ← w · mask."""
    p = weight.shape[0]
    n = weight[0].numel()
    rel = t - t0
    inside = (rel >= 0) & (t <= t_end)
    rem = torch.where(inside, torch.remainder(rel, freq), torch.ones_like(rel))
    due = inside & ((rem == 0) | (t == t_end)) & (skip == 0)  # [P]
    last = k_table.shape[0] - 1
    row = torch.where(rem == 0, torch.div(rel, freq, rounding_mode="floor"), torch.full_like(rel, last))
    k = k_table[row.clamp(0, last), col]
    magnitude = weight.detach().abs() * mask
    classic = magnitude.transpose(1, 2) if transposed else magnitude
    order = classic.reshape(p, -1).argsort(dim=1, stable=True)
    keep = (torch.arange(n, device=weight.device) >= k).to(mask.dtype).expand(p, -1)
    fresh = torch.empty(p, n, dtype=mask.dtype, device=mask.device).scatter_(1, order, keep).view(classic.shape)
    fresh = fresh.transpose(1, 2) if transposed else fresh
    mask.copy_(torch.where(due.view(p, *[1] * (weight.dim() - 1)), fresh, mask))
    weight.mul_(mask)


def prune_masks_(weight: torch.Tensor, mask: torch.Tensor, t: torch.Tensor, skip: torch.Tensor,
                 k_table: torch.Tensor, col: int, t0: int, t_end: int, freq: int, transposed: bool, *,
                 backend: str = "auto") -> None:
    """Recompute each member's mask of one weight matrix where due, then mask the weight, in place
    (module docstring).

    Args:
        weight: float32 contiguous ``[P, ...]`` (``[P, in, out]`` when ``transposed``), each
            member's matrix; written (w · mask).
        mask: float32 contiguous, ``weight``'s shape, 1 keep / 0 pruned; written where due.
        t: int64 0-d, the update (the optimizer's counter, read at the launch).
        skip: float32 ``[P]``, 1 where the guard skipped the member's update.
        k_table: int64 ``[R, C]``, k of each due step's row for each matrix's column
            (:func:`due_row`; R = ``due_row(t_end, ...) + 1``); col: this matrix's column.
        t0, t_end, freq: ints, ``prune.start_update`` <= ``prune.end_update``, ``prune.frequency`` >= 1.
        transposed: whether the classic layout is the stored one's last two axes swapped.
        backend: ``"auto"`` (Triton for CUDA tensors, else torch), ``"triton"``, ``"torch"``.

    Raises:
        ValueError: a wrong dtype, shape, layout or device; a bad schedule or column; an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    op = "prune_masks_"
    if not isinstance(weight, torch.Tensor) or weight.dtype != torch.float32 or weight.dim() < 2 \
            or not weight.is_contiguous() or (transposed and weight.dim() != 3):
        raise ValueError(f"{op}: weight must be contiguous float32 [P, ...] ([P, in, out] when transposed), "
                         f"got {describe(weight)}")
    p = weight.shape[0]
    for name, x, dtype, shape in (("mask", mask, torch.float32, tuple(weight.shape)),
                                  ("t", t, torch.int64, ()), ("skip", skip, torch.float32, (p,))):
        if not isinstance(x, torch.Tensor) or x.dtype != dtype or tuple(x.shape) != shape or not x.is_contiguous():
            raise ValueError(f"{op}: {name} must be contiguous {dtype} {list(shape)}, got {describe(x)}")
    if not isinstance(k_table, torch.Tensor) or k_table.dtype != torch.int64 or k_table.dim() != 2 \
            or not k_table.is_contiguous() or k_table.shape[0] < 1:
        raise ValueError(f"{op}: k_table must be contiguous int64 [R >= 1, C], got {describe(k_table)}")
    if isinstance(col, bool) or not isinstance(col, int) or not 0 <= col < k_table.shape[1]:
        raise ValueError(f"{op}: col must be an int in [0, {k_table.shape[1]}), got {col!r}")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (t0, t_end, freq)) \
            or not 0 <= t0 <= t_end or freq < 1:
        raise ValueError(f"{op}: need ints 0 <= t0 <= t_end and freq >= 1, got {t0!r}, {t_end!r}, {freq!r}")
    rows = due_row(t_end, t0, t_end, freq) + 1
    if k_table.shape[0] != rows:
        raise ValueError(f"{op}: k_table must have one row per mask-update step of [{t0}, {t_end}] every {freq} "
                         f"({rows}), got {k_table.shape[0]}")
    for name, x in (("mask", mask), ("t", t), ("skip", skip), ("k_table", k_table)):
        if x.device != weight.device:
            raise ValueError(f"{op}: {name} is on {x.device}, weight on {weight.device}")
    n = weight[0].numel()
    if n >= 2 ** 31 - 1:
        raise ValueError(f"{op}: a member's matrix of {n} entries is too large (< 2**31 - 1)")
    if resolve_backend(op, backend, weight) == "torch":
        prune_masks_reference(weight, mask, t, skip, k_table, col, t0, t_end, freq, transposed)
        return
    if p == 0 or n == 0:
        return
    _prune_masks_kernel[(p,)](weight, mask, skip, t, k_table, t0, t_end, freq, k_table.shape[0] - 1, col,
                              k_table.shape[1], n, weight.shape[1] if transposed else 1,
                              weight.shape[2] if transposed else 1, TRANSPOSED=bool(transposed), BLOCK=_BLOCK,
                              num_warps=4)
