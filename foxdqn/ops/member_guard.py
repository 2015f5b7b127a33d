r"""A population's training guard and its update monitor in one kernel launch, every member at once.

The guard of :class:`foxdqn.population.member_guard.MemberGuard` (docs/design/guard.md: a single
run's NaN/Inf and loss-clip halts, per member) and the update's sums of
:class:`foxdqn.population.stats.MemberStats`. Per member p, with ``u`` = ``updates`` and ``e`` =
``env_steps`` (int64 0-d)::

    non_finite = not (isfinite(loss[p]) and isfinite(grad_norm[p]))
    bad        = non_finite or loss[p] > loss_clip[p]            (IEEE: a NaN loss never trips the clip)
    first      = bad and halted[p] == 0
    code[p], at_update[p], at_env_steps[p] = (1 if non_finite else 2), u, e     where first
    halted[p]  = max(halted[p], bad)                             (a latch; the update's skip flag)

and, with ``stats`` (float64 ``[P, 5]``), in float64::

    stats[p] += [nan_to_num(loss[p]), nan_to_num(grad_norm[p]), 1, halted[p], nan_to_num(max_q[p])]
    max_q[p]  = mean_b max_a q[p, b, a]                          (float32; NaN if any q[p] is NaN)

where ``nan_to_num`` maps NaN and ±Inf to 0; with ``q_threshold`` (float32 ``[P]``, each member's
``guard.q_divergence``) also the Q monitor's divergence flag, not latched::

    q_diverged[p] = any_b,a (not isfinite(q[p, b, a]) or |q[p, b, a]| > q_threshold[p])   (float32 0 or 1)

(a NaN threshold never trips the magnitude test, the rule of the single-run loop's Q monitor that
foxdqn had before its populations). The reference (:func:`member_guard_reference`, the
torch expressions the population ran before this op) is the definition. The kernel's max-Q mean
sums the rows in another order than torch's ``mean`` (in float32 both): it may differ in the last
bits; everything else is exact. Kernel: one program per member (reads only member p's values and
rows: members never mix), looping over its B rows in tiles of ``[BLOCK_B, A]``. Device ops only:
capturable in a CUDA graph. Source: the guard's rules, docs/design/guard.md.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.library import device_op, wrap_triton

#: halt codes: non-finite loss or gradient norm, loss above the clip
NON_FINITE, LOSS_CLIP = 1, 2
#: columns of ``stats``
STATS_FIELDS = 5


@triton.jit
def _member_guard_kernel(loss_ptr, gn_ptr, clip_ptr, halted_ptr, code_ptr, at_update_ptr, at_env_ptr, updates_ptr,
                         env_steps_ptr, stats_ptr, q_ptr, q_thr_ptr, q_div_ptr, B, A, stats_stride, q_stride_p,
                         q_stride_b, STATS: tl.constexpr, QDIV: tl.constexpr, BLOCK_B: tl.constexpr,
                         BLOCK_A: tl.constexpr):
    INF = float("inf")
    p = tl.program_id(0)
    loss = tl.load(loss_ptr + p)
    gn = tl.load(gn_ptr + p)
    loss_ok = (loss == loss) & (tl.abs(loss) != INF)
    gn_ok = (gn == gn) & (tl.abs(gn) != INF)
    non_finite = ~(loss_ok & gn_ok)
    bad = non_finite | (loss > tl.load(clip_ptr + p))
    halted = tl.load(halted_ptr + p)
    if bad & (halted == 0.0):
        tl.store(code_ptr + p, tl.where(non_finite, 1, 2).to(tl.int64))
        tl.store(at_update_ptr + p, tl.load(updates_ptr))
        tl.store(at_env_ptr + p, tl.load(env_steps_ptr))
    skip = tl.maximum(halted, tl.where(bad, 1.0, 0.0))
    tl.store(halted_ptr + p, skip)
    if STATS:
        rows = tl.arange(0, BLOCK_B)
        cols = tl.arange(0, BLOCK_A)
        cmask = cols < A
        total = tl.zeros([BLOCK_B], tl.float32)
        n_nan = tl.zeros([BLOCK_B], tl.int32)
        n_div = tl.zeros([BLOCK_B], tl.int32)
        thr = tl.load(q_thr_ptr + p) if QDIV else 0.0
        for b0 in range(0, B, BLOCK_B):
            r = b0 + rows
            rmask = r < B
            m = rmask[:, None] & cmask[None, :]
            x = tl.load(q_ptr + p.to(tl.int64) * q_stride_p + r[:, None].to(tl.int64) * q_stride_b + cols[None, :],
                        mask=m, other=-INF)
            n_nan += tl.sum(((x != x) & m).to(tl.int32), axis=1)
            total += tl.where(rmask, tl.max(tl.where(x == x, x, -INF), axis=1), 0.0)
            if QDIV:
                n_div += tl.sum((((x != x) | (tl.abs(x) == INF) | (tl.abs(x) > thr)) & m).to(tl.int32), axis=1)
        max_q = tl.sum(total, axis=0) / B
        max_q = tl.where(tl.sum(n_nan, axis=0) > 0, float("nan"), max_q)
        row = stats_ptr + p * stats_stride
        loss64 = tl.where(loss_ok, loss, 0.0).to(tl.float64)
        gn64 = tl.where(gn_ok, gn, 0.0).to(tl.float64)
        mq64 = tl.where((max_q == max_q) & (tl.abs(max_q) != INF), max_q, 0.0).to(tl.float64)
        tl.store(row + 0, tl.load(row + 0) + loss64)
        tl.store(row + 1, tl.load(row + 1) + gn64)
        tl.store(row + 2, tl.load(row + 2) + 1.0)
        tl.store(row + 3, tl.load(row + 3) + skip.to(tl.float64))
        tl.store(row + 4, tl.load(row + 4) + mq64)
        if QDIV:
            tl.store(q_div_ptr + p, tl.where(tl.sum(n_div, axis=0) > 0, 1.0, 0.0))


def _blocks(A: int) -> tuple[int, int]:
    block_a = max(triton.next_power_of_2(A), 2)
    return max(1, min(4096 // block_a, 128)), block_a


@device_op("foxdqn::member_guard", mutates_args={"halted", "code", "at_update", "at_env_steps", "stats",
                                                 "q_diverged"})
def _member_guard_op(loss: Tensor, grad_norm: Tensor, loss_clip: Tensor, halted: Tensor, code: Tensor,
                     at_update: Tensor, at_env_steps: Tensor, updates: Tensor, env_steps: Tensor, stats: Tensor,
                     q: Tensor, q_threshold: Tensor, q_diverged: Tensor, with_stats: bool, with_qdiv: bool) -> None:
    p = loss.shape[0]
    b, a = (q.shape[1], q.shape[2]) if with_stats else (1, 1)
    block_b, block_a = _blocks(a)
    wrap_triton(_member_guard_kernel)[(p,)](
        loss, grad_norm, loss_clip, halted, code, at_update, at_env_steps, updates, env_steps, stats, q, q_threshold,
        q_diverged, b, a, stats.stride(0) if with_stats else 0, q.stride(0) if with_stats else 0,
        q.stride(1) if with_stats else 0, STATS=with_stats, QDIV=with_qdiv, BLOCK_B=block_b, BLOCK_A=block_a,
        num_warps=4)


def member_guard_reference(loss: Tensor, grad_norm: Tensor, loss_clip: Tensor, halted: Tensor, code: Tensor,
                           at_update: Tensor, at_env_steps: Tensor, updates: Tensor, env_steps: Tensor,
                           stats: Tensor | None = None, q: Tensor | None = None, q_threshold: Tensor | None = None,
                           q_diverged: Tensor | None = None) -> Tensor:
    """Plain-torch reference of :func:`member_guard` (same arguments and writes). Device ops only."""
    if q_threshold is not None:  # the Q monitor's flag (before the latch below: it reads only q)
        p = q.shape[0]
        diverged = ~torch.isfinite(q) | (q.abs() > q_threshold.view(p, 1, 1))
        q_diverged.copy_(diverged.view(p, -1).any(dim=1))
    non_finite = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
    too_big = loss > loss_clip
    bad = non_finite | too_big
    first = bad & (halted == 0)
    reason = torch.where(non_finite, NON_FINITE, LOSS_CLIP)
    code.copy_(torch.where(first, reason, code))
    at_update.copy_(torch.where(first, updates, at_update))
    at_env_steps.copy_(torch.where(first, env_steps, at_env_steps))
    halted.copy_(torch.maximum(halted, bad.to(torch.float32)))
    if stats is not None:
        max_q = q.max(dim=2).values.mean(dim=1)
        cols = torch.stack([loss, grad_norm, torch.ones_like(loss), halted, max_q], dim=1).to(torch.float64)
        stats += torch.nan_to_num(cols, nan=0.0, posinf=0.0, neginf=0.0)
    return halted


def _check(loss, grad_norm, loss_clip, halted, code, at_update, at_env_steps, updates, env_steps, stats, q) -> None:
    if not isinstance(loss, Tensor) or loss.dim() != 1 or loss.dtype != torch.float32:
        raise ValueError(f"member_guard: loss must be a float32 tensor [P], got {describe(loss)}")
    p, dev = loss.shape[0], loss.device
    for name, t, dtype, shape in (("loss", loss, torch.float32, (p,)), ("grad_norm", grad_norm, torch.float32, (p,)),
                                  ("loss_clip", loss_clip, torch.float32, (p,)),
                                  ("halted", halted, torch.float32, (p,)), ("code", code, torch.int64, (p,)),
                                  ("at_update", at_update, torch.int64, (p,)),
                                  ("at_env_steps", at_env_steps, torch.int64, (p,)),
                                  ("updates", updates, torch.int64, ()), ("env_steps", env_steps, torch.int64, ())):
        if (not isinstance(t, Tensor) or t.dtype != dtype or tuple(t.shape) != shape or not t.is_contiguous()
                or t.device != dev):
            raise ValueError(f"member_guard: {name} must be a contiguous {dtype} tensor {list(shape)} on {dev}, "
                             f"got {describe(t)}")
    if (stats is None) != (q is None):
        raise ValueError("member_guard: stats and q go together (both or neither)")
    if stats is None:
        return
    if (not isinstance(stats, Tensor) or stats.dtype != torch.float64 or tuple(stats.shape) != (p, STATS_FIELDS)
            or stats.stride(1) != 1 or stats.device != dev):
        raise ValueError(f"member_guard: stats must be a float64 tensor [P, {STATS_FIELDS}] = [{p}, {STATS_FIELDS}] "
                         f"on {dev} with unit column stride, got {describe(stats)}")
    if (not isinstance(q, Tensor) or q.dtype != torch.float32 or q.dim() != 3 or q.shape[0] != p
            or q.shape[1] < 1 or q.shape[2] < 1 or q.device != dev):
        raise ValueError(f"member_guard: q must be a float32 tensor [P, B, A] = [{p}, >= 1, >= 1] on {dev}, "
                         f"got {describe(q)}")


def member_guard(loss: Tensor, grad_norm: Tensor, loss_clip: Tensor, halted: Tensor, code: Tensor,
                 at_update: Tensor, at_env_steps: Tensor, updates: Tensor, env_steps: Tensor, *,
                 stats: Tensor | None = None, q: Tensor | None = None, q_threshold: Tensor | None = None,
                 q_diverged: Tensor | None = None, backend: str = "auto") -> Tensor:
    """One update's guard check of P members, and with ``stats`` the update's monitor sums (the
    rules in the module docstring); one kernel launch on CUDA. Device ops only.

    Args:
        loss, grad_norm: float32 ``[P]``, this update's losses and gradient norms.
        loss_clip: float32 ``[P]``, each member's ``guard.loss_clip``.
        halted: float32 ``[P]``, the latch (0 or 1), updated in place.
        code, at_update, at_env_steps: int64 ``[P]``, the first halt's code, update and env steps,
            written where a member halts now.
        updates, env_steps: int64 0-d, this update's number and the env steps per member so far.
        stats: None, or float64 ``[P, 5]`` (unit column stride; e.g. columns of wider rows):
            ``+= [loss, grad_norm, 1, skip, max-Q]`` (module docstring).
        q: with ``stats``, float32 ``[P, B, A]`` (any strides but a unit last one, else copied):
            the batch's online Q of s.
        q_threshold, q_diverged: with ``q``, None or float32 ``[P]`` each: each member's
            ``guard.q_divergence``, and the Q monitor's divergence flags written (module docstring).
        backend: "auto" (Triton for CUDA tensors, torch for CPU), "triton", "torch".

    Returns:
        ``halted`` (the update's skip flags, float32 ``[P]``: 1.0 skips member p's update).

    Raises:
        ValueError: a wrong dtype, shape or device, ``stats`` without ``q`` or the reverse, an
            unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check(loss, grad_norm, loss_clip, halted, code, at_update, at_env_steps, updates, env_steps, stats, q)
    _check_qdiv(q, q_threshold, q_diverged, loss)
    if resolve_backend("member_guard", backend, loss) == "torch":
        return member_guard_reference(loss, grad_norm, loss_clip, halted, code, at_update, at_env_steps, updates,
                                      env_steps, stats, q, q_threshold, q_diverged)
    if q is not None and q.stride(2) != 1:
        q = q.contiguous()
    qdiv = q_threshold is not None
    _member_guard_op(loss, grad_norm, loss_clip, halted, code, at_update, at_env_steps, updates, env_steps,
                     loss.new_empty((0, 1), dtype=torch.float64) if stats is None else stats,
                     loss.new_empty((0, 1, 1)) if q is None else q, q_threshold if qdiv else loss.new_empty(0),
                     q_diverged if qdiv else loss.new_empty(0), stats is not None, qdiv)
    return halted


def _check_qdiv(q, q_threshold, q_diverged, loss) -> None:
    """Raise ValueError unless ``q_threshold`` and ``q_diverged`` are both None or both float32
    ``[P]`` on ``loss``'s device, contiguous, with ``q`` given."""
    if q_threshold is None and q_diverged is None:
        return
    p, dev = loss.shape[0], loss.device
    for name, t in (("q_threshold", q_threshold), ("q_diverged", q_diverged)):
        if (not isinstance(t, Tensor) or t.dtype != torch.float32 or tuple(t.shape) != (p,) or t.device != dev
                or not t.is_contiguous()):
            raise ValueError(f"member_guard: {name} must be a contiguous float32 tensor [P] = [{p}] on {dev} "
                             f"(with the other and q), got {describe(t) if isinstance(t, Tensor) else t!r}")
    if q is None:
        raise ValueError("member_guard: q_threshold and q_diverged need q (and stats)")
