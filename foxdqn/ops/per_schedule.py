"""Prioritized replay's two per-draw inputs in one kernel: the slots that hold data and the
annealed importance-sampling exponent β.

Source: Schaul et al. (2016), "Prioritized Experience Replay", §3.4: β anneals linearly from β₀ to 1
over training (:func:`foxdqn.device.schedules.linear_value`, the rule of every schedule here). Per
draw (:meth:`foxdqn.replay.prioritized.Priorities.draw`):

    size  = min(written, rows) · envs                  (int64 0-d: :meth:`ReplayBuffer.filled` · N)
    β_g   = β₀_g + (β_end − β₀_g) · min(float32(updates) / duration, 1)     (float32, one per group)

``written`` and ``updates`` are the replay's and the optimizer's int64 device counters, read at the
launch (so a CUDA graph captured once reads their current values at each replay). The same
arithmetic as the torch reference in float32, the division IEEE-rounded (``tl.div_rn``, torch's
``/``): the same bits. These were eight small launches (clamp, multiply; to, divide, clamp,
subtract, multiply, add) before each draw; this op is one, writing into the caller's buffers.
No host synchronisation, fixed shapes, capturable.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from foxdqn.device.schedules import linear_value
from foxdqn.ops.backend import describe, resolve_backend

__all__ = ["per_schedule", "per_schedule_reference"]

_BLOCK_G = 64  #: groups per iteration of the kernel's loop


@triton.jit
def _per_schedule_kernel(written_ptr, updates_ptr, start_ptr, end_ptr, duration_ptr, size_ptr, beta_ptr, rows, envs,
                         G, BLOCK_G: tl.constexpr):
    zero = tl.zeros([], dtype=tl.int64)  # an int argument equal to 1 arrives as a constexpr
    w = tl.load(written_ptr)
    tl.store(size_ptr, tl.minimum(w, rows + zero) * (envs + zero))
    u = tl.load(updates_ptr).to(tl.float32)
    frac = tl.minimum(tl.div_rn(u, tl.load(duration_ptr)), 1.0)
    end32 = tl.load(end_ptr)
    for g0 in range(0, G, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        m = g < G
        start = tl.load(start_ptr + g, mask=m, other=0.0)
        tl.store(beta_ptr + g, start + (end32 - start) * frac, mask=m)


def per_schedule_reference(written: torch.Tensor, rows: int, envs: int, updates: torch.Tensor,
                           beta_start: torch.Tensor, beta_end: torch.Tensor, duration: torch.Tensor,
                           size_out: torch.Tensor, beta_out: torch.Tensor) -> None:
    """Plain-torch :func:`per_schedule` (same arguments, same writes): the ops it replaces."""
    size_out.copy_(torch.clamp(written, max=rows) * envs)
    beta_out.copy_(linear_value(updates, beta_start, beta_end, duration).view(beta_out.shape))


def per_schedule(written: torch.Tensor, rows: int, envs: int, updates: torch.Tensor, beta_start: torch.Tensor,
                 beta_end: torch.Tensor, duration: torch.Tensor, size_out: torch.Tensor, beta_out: torch.Tensor, *,
                 backend: str = "auto") -> None:
    """Write ``size_out`` = min(written, rows) · envs and ``beta_out`` = each group's annealed β
    (module docstring) in one launch.

    Args:
        written: int64 0-d, time rows written so far (the replay's counter).
        rows: int >= 1, the replay's time rows; envs: int >= 1, slots per time row (envs of all
            members of a group share a row).
        updates: int64 0-d, gradient updates so far (the schedule's step).
        beta_start: float32 0-d or ``[G]``, β₀ (one per member of a population).
        beta_end: float32 0-d, β at ``duration`` and after (1.0); duration: float32 0-d > 0 (not
            checked: device values), in updates.
        size_out: int64 0-d, written; beta_out: float32 of ``beta_start``'s shape, written.
        backend: ``"auto"`` (Triton for CUDA tensors, else torch), ``"triton"``, ``"torch"``.

    Raises:
        ValueError: a wrong dtype, shape or device; rows or envs < 1; an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    op = "per_schedule"
    for name, t, dtype, shape in (("written", written, torch.int64, ()), ("updates", updates, torch.int64, ()),
                                  ("beta_end", beta_end, torch.float32, ()), ("duration", duration, torch.float32, ()),
                                  ("size_out", size_out, torch.int64, ())):
        if not isinstance(t, torch.Tensor) or t.dtype != dtype or tuple(t.shape) != shape:
            raise ValueError(f"{op}: {name} must be {dtype} 0-d, got {describe(t)}")
    if not isinstance(beta_start, torch.Tensor) or beta_start.dtype != torch.float32 or beta_start.dim() > 1:
        raise ValueError(f"{op}: beta_start must be float32 0-d or [G], got {describe(beta_start)}")
    if not isinstance(beta_out, torch.Tensor) or beta_out.dtype != torch.float32 or beta_out.shape != beta_start.shape \
            or not beta_out.is_contiguous():
        raise ValueError(f"{op}: beta_out must be contiguous float32 of beta_start's shape "
                         f"{list(beta_start.shape)}, got {describe(beta_out)}")
    for name, n in (("rows", rows), ("envs", envs)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{op}: {name} must be an int >= 1, got {n!r}")
    for name, t in (("updates", updates), ("beta_start", beta_start), ("beta_end", beta_end),
                    ("duration", duration), ("size_out", size_out), ("beta_out", beta_out)):
        if t.device != written.device:
            raise ValueError(f"{op}: {name} is on {t.device}, written on {written.device}")
    if resolve_backend(op, backend, written) == "torch":
        per_schedule_reference(written, rows, envs, updates, beta_start, beta_end, duration, size_out, beta_out)
        return
    _per_schedule_kernel[(1,)](written, updates, beta_start.contiguous(), beta_end, duration, size_out, beta_out, rows,
                               envs, beta_start.numel(), BLOCK_G=_BLOCK_G, num_warps=1)
