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

Kernel. One program per member and matrix, the matrices of a network in one launch (up to
:data:`~foxdqn.ops.tensor_list.MAX_SLOTS`; eurusd_controls' four were four launches). Not due: one
pass, w ← w · mask. Due: the magnitudes' float32 bit patterns (non-negative, so ordered as integers; NaN, which a stable sort puts last, as the largest
pattern) are searched bit by bit for v*, the k-th smallest (31 counting passes), then one pass in
the classic order writes the mask (v < v*, or v = v* among the first k − #{v < v*} such entries by
position) and the masked weight. The torch reference (:func:`prune_masks_reference`) is the
stable argsort and scatter the population ran before this op (about 19 launches a matrix, and the
schedule's 25). No host synchronisation, fixed shapes, capturable.
"""
from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl

from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.tensor_list import MAX_SLOTS, pick16

__all__ = ["prune_masks_", "prune_masks_reference", "due_row"]

_BLOCK = 1024  #: elements per iteration of the kernel's passes
_NAN_BITS = 0x7FFFFFFF  #: the pattern every NaN magnitude ranks as (above +inf's 0x7F800000)


@triton.jit
def _bits(w, m):
    """The ordered int32 pattern of |w · m| (the reference's ``w.abs() * mask``), NaN largest."""
    v = tl.abs(w) * m
    b = v.to(tl.int32, bitcast=True)
    return tl.where(v != v, 0x7FFFFFFF, b)


@triton.jit(do_not_specialize=[*(f"n{i}" for i in range(16)), *(f"i{i}" for i in range(16)),
                             *(f"o{i}" for i in range(16)), "first_col"])
def _prune_masks_kernel(w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15,
                        m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15,
                        n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, n11, n12, n13, n14, n15,
                        i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12, i13, i14, i15,
                        o0, o1, o2, o3, o4, o5, o6, o7, o8, o9, o10, o11, o12, o13, o14, o15,
                        skip_ptr, t_ptr, table_ptr, t0, t_end, freq, last_row, first_col, n_cols,
                        BLOCK: tl.constexpr):
    """Program (p, k): member p's matrix in slot k (column ``first_col + k``) of this launch; the
    classic position j sits at stored ``(j % IN) * OUT + j // IN`` (IN = OUT = 1: the stored order)."""
    p = tl.program_id(0)
    k = tl.program_id(1)
    N = pick16(k, n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, n11, n12, n13, n14, n15)
    IN = pick16(k, i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12, i13, i14, i15)
    OUT = pick16(k, o0, o1, o2, o3, o4, o5, o6, o7, o8, o9, o10, o11, o12, o13, o14, o15)
    col = first_col + k
    zero = tl.zeros([], dtype=tl.int64)  # an int argument equal to 1 arrives as a constexpr
    t = tl.load(t_ptr)
    rel = t - (t0 + zero)
    inside = (rel >= 0) & (t <= t_end + zero)
    rem = tl.where(inside, rel % (freq + zero), 1)
    due = inside & ((rem == 0) | (t == t_end + zero)) & (tl.load(skip_ptr + p) == 0)
    base = pick16(k, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15) + p.to(tl.int64) * N
    mbase = pick16(k, m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15) + p.to(tl.int64) * N
    offs = tl.arange(0, BLOCK)
    if due:
        row = tl.where(rem == 0, rel // (freq + zero), last_row + zero)
        kk = tl.load(table_ptr + row * n_cols + col).to(tl.int32)
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
            enough = cnt >= kk
            hi = tl.where(enough, mid, hi)
            lo = tl.where(enough, lo, mid + 1)
        less = tl.zeros([], dtype=tl.int32)
        for o in range(0, N, BLOCK):
            j = o + offs
            ok = j < N
            b = _bits(tl.load(base + j, mask=ok, other=0.0), tl.load(mbase + j, mask=ok, other=0.0))
            less += tl.sum((ok & (b < lo)).to(tl.int32), axis=0)
        ties = kk - less  # entries equal to v* that are pruned: the first ones by classic position
        seen = tl.zeros([], dtype=tl.int32)
        for o in range(0, N, BLOCK):
            j = o + offs  # classic position
            ok = j < N
            s = (j % IN) * OUT + j // IN  # classic [out, in], stored [in, out] (IN = OUT = 1: s = j)
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


def prune_masks_(weights: Sequence[torch.Tensor], masks: Sequence[torch.Tensor], t: torch.Tensor,
                 skip: torch.Tensor, k_table: torch.Tensor, t0: int, t_end: int, freq: int,
                 transposed: Sequence[bool], *, first_col: int = 0, backend: str = "auto") -> None:
    """Recompute each member's masks of the weight matrices where due, then mask the weights, in
    place (module docstring): matrix ``i`` reads ``k_table``'s column ``first_col + i``. One kernel
    launch per :data:`~foxdqn.ops.tensor_list.MAX_SLOTS` matrices (a program per member and matrix).

    Args:
        weights: float32 contiguous tensors ``[P, ...]`` (``[P, in, out]`` where ``transposed``),
            each member's matrix; written (w · mask).
        masks: float32 contiguous, each its weight's shape, 1 keep / 0 pruned; written where due.
        t: int64 0-d, the update (the optimizer's counter, read at the launch).
        skip: float32 ``[P]``, 1 where the guard skipped the member's update.
        k_table: int64 ``[R, C]``, k of each due step's row for each matrix's column
            (:func:`due_row`; R = ``due_row(t_end, ...) + 1``; C >= ``first_col + len(weights)``).
        t0, t_end, freq: ints, ``prune.start_update`` <= ``prune.end_update``, ``prune.frequency`` >= 1.
        transposed: per matrix, whether the classic layout is the stored one's last two axes swapped.
        first_col: the first matrix's column of ``k_table``.
        backend: ``"auto"`` (Triton for CUDA tensors, else torch), ``"triton"``, ``"torch"``.

    Raises:
        ValueError: a wrong dtype, shape, layout or device (naming the matrix); a bad schedule or
            column; lists of different lengths; an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    op = "prune_masks_"
    weights, masks, transposed = list(weights), list(masks), [bool(x) for x in transposed]
    if not weights or len(masks) != len(weights) or len(transposed) != len(weights):
        raise ValueError(f"{op}: weights, masks and transposed must be non-empty lists of one length, got "
                         f"{len(weights)}, {len(masks)}, {len(transposed)}")
    p = weights[0].shape[0] if isinstance(weights[0], torch.Tensor) and weights[0].dim() else 0
    for i, (weight, mask, tr) in enumerate(zip(weights, masks, transposed)):
        name = f"weights[{i}]"
        if not isinstance(weight, torch.Tensor) or weight.dtype != torch.float32 or weight.dim() < 2 \
                or not weight.is_contiguous() or (tr and weight.dim() != 3) or weight.shape[0] != p:
            raise ValueError(f"{op}: {name} must be contiguous float32 [P={p}, ...] ([P, in, out] when transposed), "
                             f"got {describe(weight)}")
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.float32 or mask.shape != weight.shape \
                or not mask.is_contiguous():
            raise ValueError(f"{op}: masks[{i}] must be contiguous torch.float32 {list(weight.shape)}, "
                             f"got {describe(mask)}")
        if weight[0].numel() >= 2 ** 31 - 1:
            raise ValueError(f"{op}: {name}: a member's matrix of {weight[0].numel()} entries is too large "
                             "(< 2**31 - 1)")
    for name, x, dtype, shape in (("t", t, torch.int64, ()), ("skip", skip, torch.float32, (p,))):
        if not isinstance(x, torch.Tensor) or x.dtype != dtype or tuple(x.shape) != shape or not x.is_contiguous():
            raise ValueError(f"{op}: {name} must be contiguous {dtype} {list(shape)}, got {describe(x)}")
    if not isinstance(k_table, torch.Tensor) or k_table.dtype != torch.int64 or k_table.dim() != 2 \
            or not k_table.is_contiguous() or k_table.shape[0] < 1:
        raise ValueError(f"{op}: k_table must be contiguous int64 [R >= 1, C], got {describe(k_table)}")
    if isinstance(first_col, bool) or not isinstance(first_col, int) or first_col < 0 \
            or first_col + len(weights) > k_table.shape[1]:
        raise ValueError(f"{op}: columns first_col={first_col!r} .. + {len(weights)} must lie in k_table's "
                         f"{k_table.shape[1]} columns")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (t0, t_end, freq)) \
            or not 0 <= t0 <= t_end or freq < 1:
        raise ValueError(f"{op}: need ints 0 <= t0 <= t_end and freq >= 1, got {t0!r}, {t_end!r}, {freq!r}")
    rows = due_row(t_end, t0, t_end, freq) + 1
    if k_table.shape[0] != rows:
        raise ValueError(f"{op}: k_table must have one row per mask-update step of [{t0}, {t_end}] every {freq} "
                         f"({rows}), got {k_table.shape[0]}")
    device = weights[0].device
    for name, x in [*((f"weights[{i}]", w) for i, w in enumerate(weights)),
                    *((f"masks[{i}]", m) for i, m in enumerate(masks)),
                    ("t", t), ("skip", skip), ("k_table", k_table)]:
        if x.device != device:
            raise ValueError(f"{op}: {name} is on {x.device}, weights[0] on {device}")
    if resolve_backend(op, backend, weights[0]) == "torch":
        for i, (weight, mask, tr) in enumerate(zip(weights, masks, transposed)):
            prune_masks_reference(weight, mask, t, skip, k_table, first_col + i, t0, t_end, freq, tr)
        return
    if p == 0:
        return
    for start in range(0, len(weights), MAX_SLOTS):
        part = range(start, min(start + MAX_SLOTS, len(weights)))
        pad = [part[0]] * (MAX_SLOTS - len(part))  # unused slots: no program reads them
        idx = [*part, *pad]
        _prune_masks_kernel[(p, len(part))](
            *(weights[i] for i in idx), *(masks[i] for i in idx), *(weights[i][0].numel() for i in idx),
            *(weights[i].shape[1] if transposed[i] else 1 for i in idx),
            *(weights[i].shape[2] if transposed[i] else 1 for i in idx),
            skip, t, k_table, t0, t_end, freq, k_table.shape[0] - 1, first_col + start, k_table.shape[1],
            BLOCK=_BLOCK, num_warps=4)
