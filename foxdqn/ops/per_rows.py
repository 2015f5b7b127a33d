r"""A population's prioritized samples as ring rows: the n-step move-back of the newest slots and the
member's column, in one kernel.

A population's prioritized replay (:class:`foxdqn.population.replay.MemberPrioritizedReplay`,
docs/design/population.md#prioritized-replay) samples member p's slots ``s = t·N + e`` from its own
sum (time row t of R, env e of its N) and gathers the ring's rows ``t·P·N + p·N + e``. A slot in
the n − 1 newest rows has no complete n-step window yet and moves back n − 1 rows, as a single
run's :meth:`foxdqn.replay.prioritized.Priorities.sample` moves it::

    age = (ptr − 1 − t) mod R                     rows written after row t (0: the newest)
    t ← (t − (n − 1)) mod R   where age < n − 1   (n > 1 only)
    slot ← t·N + e;   ring row ← t·P·N + p·N + e

(mod: the non-negative remainder, Python's and torch's ``%``). The reference
(:func:`per_rows_reference`) is those torch ops (up to 18 launches on CUDA); the kernel is one,
integers only, so both agree exactly.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.library import device_op, wrap_triton

BLOCK = 256


@triton.jit
def _per_rows_kernel(slots_ptr, ptr_ptr, rows_out_ptr, slots_out_ptr, total, B, R, N, N_STEP: tl.constexpr,
                     BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < total
    s = tl.load(slots_ptr + i, mask=m, other=0)
    t = s // N
    e = s - t * N
    if N_STEP > 1:
        age = (tl.load(ptr_ptr) - 1 - t) % R
        age = tl.where(age < 0, age + R, age)  # the non-negative remainder
        back = (t - (N_STEP - 1)) % R
        back = tl.where(back < 0, back + R, back)
        t = tl.where(age < N_STEP - 1, back, t)
    member = (i // B).to(tl.int64)
    tl.store(slots_out_ptr + i, t * N + e, mask=m)
    tl.store(rows_out_ptr + i, t * (N * (total // B)) + member * N + e, mask=m)


@device_op("foxdqn::per_rows", mutates_args=())
def _per_rows_op(slots: Tensor, ptr: Tensor, rows: int, envs: int, n_step: int) -> tuple[Tensor, Tensor]:
    total = slots.numel()
    ring = torch.empty_like(slots)
    moved = torch.empty_like(slots)
    wrap_triton(_per_rows_kernel)[(triton.cdiv(total, BLOCK),)](
        slots, ptr, ring, moved, total, slots.shape[1], rows, envs, N_STEP=n_step, BLOCK=BLOCK, num_warps=4)
    return ring, moved


def per_rows_reference(slots: Tensor, ptr: Tensor, rows: int, envs: int, n_step: int) -> tuple[Tensor, Tensor]:
    """Plain-torch :func:`per_rows` (the same arguments and results)."""
    p = slots.shape[0]
    if n_step > 1:
        t, e = slots // envs, slots % envs
        t = torch.where((ptr - 1 - t) % rows < n_step - 1, (t - (n_step - 1)) % rows, t)
        slots = t * envs + e
    first = torch.arange(p, device=slots.device)[:, None] * envs  # member p's first column
    return (slots // envs) * (p * envs) + first + slots % envs, slots


def per_rows(slots: Tensor, ptr: Tensor, rows: int, envs: int, n_step: int,
             backend: str = "auto") -> tuple[Tensor, Tensor]:
    """(ring rows int64 ``[P, B]``, slots int64 ``[P, B]``): member p's sampled slots moved back
    where their n-step window is not complete, and the ring's rows they are (module docstring).

    Args:
        slots: int64 ``[P, B]`` contiguous, member p's slots ``t·N + e`` in ``[0, R·N)``.
        ptr: int64 0-d (or one-element) device tensor, the ring's next time row to write.
        rows: R, time rows of the ring.  envs: N, envs per member.  n_step: n >= 1.
        backend: "auto" (Triton for CUDA tensors, torch for CPU ones), "triton" or "torch".

    Raises:
        ValueError: a wrong shape, dtype, device or size; an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    if not isinstance(slots, Tensor) or slots.dim() != 2 or slots.dtype != torch.int64 or not slots.is_contiguous():
        raise ValueError(f"per_rows: slots must be a contiguous int64 tensor [P, B], got {describe(slots)}")
    if not isinstance(ptr, Tensor) or ptr.numel() != 1 or ptr.dtype != torch.int64 or ptr.device != slots.device:
        raise ValueError(f"per_rows: ptr must be an int64 tensor of one element on {slots.device}, got {describe(ptr)}")
    for name, v in (("rows", rows), ("envs", envs), ("n_step", n_step)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"per_rows: {name} must be an int >= 1, got {v!r}")
    if resolve_backend("per_rows", backend, slots) == "torch":
        return per_rows_reference(slots, ptr, rows, envs, n_step)
    return _per_rows_op(slots, ptr.reshape(1), rows, envs, n_step)
