r"""The target networks' update θ' ← lerp(θ', θ, w) for a list of tensors, with its weight and the
update counter's advance, in one kernel launch (up to :data:`~foxdqn.ops.tensor_list.MAX_SLOTS`
tensors per launch).

The target update (``target.update``: Polyak averaging, or the hard copy every C updates of
Mnih et al. 2015), whose weight rule every program evaluates itself (a pure function of the
inputs). Per member ``p`` (one network: P = 1), ``u`` = ``updates``
(int64 0-d, the updates done before this one)::

    base[p] = tau[p]                                          (Polyak)
            = 1.0 if (u + 1) mod hard_period[p] == 0 else 0.0  (hard)
    w[p]    = base[p] * (1 - skip[p])                           (float32, torch.mul's rounding)
    θ'      = θ                          where w[p] == 1        (the source, bit for bit)
            = θ'                         where w[p] == 0        (unchanged, bit for bit)
            = fma(w, θ - θ', θ')         where |w| < 0.5        (torch.lerp's two-sided formula)
            = fma(w - 1, θ - θ', θ)      otherwise
    weight[p] = w[p]                     (optional output; TargetUpdate.weight)
    updates   = u + 1                    (with ``advance``, once, after every program's read)

The two lerp branches are ATen's ``lerp`` (``aten/src/ATen/native/Lerp.h``: ``self + w·(end -
self)`` for ``|w| < 0.5``, else ``end - (end - self)·(1 - w)``) with the multiply-add fused, as
torch's CPU vector kernel does (``fmadd``) and nvcc contracts it on CUDA; ``w - 1`` and ``-(1 -
w)`` are the same float. The results equal ``torch.lerp`` bit for bit wherever torch fuses too,
and to one rounding otherwise. The ``w == 1`` and ``w == 0`` rows differ from ``torch.lerp`` only
where it does not return an input exactly: a NaN or Inf in the other tensor (``0 · Inf``) and a
``-0.0`` turned into ``+0.0`` by adding ``±0``; here the hard copy is exact and a skipped update
(guard ``skip`` = 1) leaves the targets as they are.

Kernel count: one launch for up to 16 tensors in place of the weight's torch expressions (two
kernels for Polyak, six for the hard copy, one for the counter) and ``torch._foreach_lerp_`` with a
list of 0-d weights (which falls back to one kernel per tensor, 8 for eurusd_dqn): eleven kernels
or more to one.

The grid is member-major (:mod:`foxdqn.ops.tensor_list`, "Rows"): program ``p · C + c`` reads
member ``p``'s weight once and, where it is not 0, updates the member's rows ``c·G .. c·G + G − 1``
(C and G from :func:`~foxdqn.ops.tensor_list.member_chunks` with :data:`HARD_PROGRAMS` or
:data:`POLYAK_PROGRAMS` and :data:`MAX_ROWS`). A hard copy that is not due then costs a program per
member and chunk: 512 members of 15 rows run 512 programs, 2.8 µs on an H100 where one program per
row (7,680) took 16.1 µs for nothing; the due copy 26.1 against 25.1 µs
(docs/bench.md#launch-constants).

The counter and the ticket. Every program reads ``updates`` before its ticket; the program that
draws the last ticket of the last launch (``atomic_add``, acq_rel at GPU scope after a barrier of
its warps, as :mod:`foxdqn.ops.step_stats` argues: every other program's read precedes its
increment, which the last program's acquire orders before its stores) writes ``weight`` and
``updates + 1`` and zeroes the ticket. Earlier launches (more than 16 tensors) complete before, in
stream order. The interpreter runs the programs one after the other, so there the last program is
the last. Scratch: the ticket of :func:`foxdqn.ops.tensor_list.scratch`, per device, made on the
first (eager) call.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import resolve_backend
from foxdqn.ops.library import device_op, wrap_triton
from foxdqn.ops.tensor_list import (F32, check_list, check_member_vector, check_members, describe, fma,
                                    member_chunks, member_row, pick16, plan, scratch, slots)

class TargetFollow(NamedTuple):
    """The target update of :func:`target_lerp_` run inside :func:`foxdqn.ops.adam_step.adam_step_`'s
    launch (its ``follow``): each of ``targets`` follows its param as the step stored it, with this
    module's weight rule, and ``updates`` advances by 1. The arguments of :func:`target_lerp_` with
    ``sources`` = Adam's params, ``skip`` = Adam's and ``advance`` true."""

    targets: Sequence[Tensor]
    updates: Tensor
    tau: Tensor
    hard_period: Tensor
    hard: bool


BLOCK = 1024  # elements of a row (tensor_list, "Rows")
#: the grid a launch aims for (tensor_list.member_chunks), by mode: a hard copy, rarely due, in few
#: programs that each read their weight once; Polyak averaging, due every update, in many
#: (an H100 sweep: docs/bench.md#launch-constants)
HARD_PROGRAMS = 512
POLYAK_PROGRAMS = 4096
MAX_ROWS = 16  # rows per program at most
_PB = 64  # members per iteration of the last program's loop


# ---------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def target_weight(u, q, qm, skip_ptr, tau_ptr, period_ptr, HARD: tl.constexpr):
    """w of members ``q`` (scalar or block, ``qm`` its mask): the module docstring's rule. Also
    :mod:`foxdqn.ops.adam_step`'s, where the target update runs in Adam's launch."""
    if HARD:
        period = tl.load(period_ptr + q, mask=qm, other=1)
        base = tl.where((u + 1) % period == 0, 1.0, 0.0).to(tl.float32)  # == 0 whatever % rounds toward
    else:
        base = tl.load(tau_ptr + q, mask=qm, other=0.0)
    return base * (1.0 - tl.load(skip_ptr + q, mask=qm, other=0.0))


@triton.jit
def lerp_toward(x, y, wb):
    """θ' of the module docstring from θ' = ``x``, θ = ``y`` and the weight block ``wb`` (w ≠ 0):
    ``y`` where w == 1, else torch.lerp's two-sided formula with the multiply-add fused. Also
    :mod:`foxdqn.ops.adam_step`'s."""
    diff = y - x
    out = tl.where(tl.abs(wb) < 0.5, fma(wb, diff, x), fma(wb - 1.0, diff, y))
    return tl.where(wb == 1.0, y, out)


@triton.jit(do_not_specialize=[*(f"r{i}" for i in range(16)), "rows_in_launch", "per_member", "members"])
def _target_lerp_kernel(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15,
                        s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
                        n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, n11, n12, n13, n14, n15,
                        r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15,
                        updates_ptr, skip_ptr, tau_ptr, period_ptr, weight_ptr, ticket_ptr, rows_in_launch, per_member,
                        members, HARD: tl.constexpr, FINISH: tl.constexpr, ADVANCE: tl.constexpr,
                        HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr, G: tl.constexpr, PB: tl.constexpr):
    pid = tl.program_id(0)
    member = pid // per_member
    first = (pid - member * per_member) * G
    u = tl.load(updates_ptr)  # this program's only read of the counter: before its ticket
    w = target_weight(u, member, member >= 0, skip_ptr, tau_ptr, period_ptr, HARD)
    if w != 0.0:  # w = 0: the target is left as it is (no reads, no writes)
        wb = tl.zeros([BLOCK], tl.float32) + w
        for i in tl.static_range(G):
            slot, col, mask, idx, live = member_row(
                member, first + i, rows_in_launch, n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, n11, n12, n13, n14,
                n15, r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15, BLOCK)
            tp = pick16(slot, t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15) + idx
            sp = pick16(slot, s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15) + idx
            x = tl.load(tp, mask=mask, other=0.0)
            y = tl.load(sp, mask=mask, other=0.0)
            tl.store(tp, lerp_toward(x, y, wb), mask=mask)

    if FINISH:
        tl.debug_barrier()  # every warp has read the counter before the (one-thread) ticket increment
        ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu")
        if ticket == tl.num_programs(0) - 1:
            if HAS_WEIGHT:
                for q0 in range(0, members, PB):
                    q = q0 + tl.arange(0, PB)
                    qm = q < members
                    tl.store(weight_ptr + q, target_weight(u, q, qm, skip_ptr, tau_ptr, period_ptr, HARD), mask=qm)
            if ADVANCE:
                tl.store(updates_ptr, u + 1)
            tl.store(ticket_ptr, 0)


@device_op("foxdqn::target_lerp_", mutates_args={"targets", "updates", "weight", "ticket"})
def _target_lerp_op(targets: list[Tensor], sources: list[Tensor], updates: Tensor, skip: Tensor, tau: Tensor,
                    hard_period: Tensor, weight: Tensor, ticket: Tensor, members: int, hard: bool, advance: bool,
                    has_weight: bool, block: int, programs: int) -> None:
    numels = tuple(t.numel() // members for t in targets)
    launches, _ = plan(numels, block)
    for launch in launches:
        in_launch = launch.row_count
        per_member, per_program = member_chunks(in_launch, members, programs, MAX_ROWS)
        wrap_triton(_target_lerp_kernel)[(members * per_member,)](
            *slots(targets, launch), *slots(sources, launch), *launch.numels, *launch.rows,
            updates, skip, tau, hard_period, weight, ticket, in_launch, per_member, members,
            HARD=hard, FINISH=launch.final and (advance or has_weight), ADVANCE=advance, HAS_WEIGHT=has_weight,
            BLOCK=block, G=per_program, PB=_PB, num_warps=4)


# ---------------------------------------------------------------------------------------------
# Reference (plain torch; the CPU path)
# ---------------------------------------------------------------------------------------------
def target_lerp_reference(targets: Sequence[Tensor], sources: Sequence[Tensor], updates: Tensor, skip: Tensor,
                          tau: Tensor, hard_period: Tensor, *, hard: bool, advance: bool, weight: Tensor | None = None,
                          members: int = 1) -> None:
    """Plain-torch reference of :func:`target_lerp_` (same arguments, same in-place writes):
    the weight rule of the module docstring, ``torch.lerp``, and the
    exact ``w == 1`` / ``w == 0`` rows of the module docstring. Device ops only."""
    base = ((updates + 1) % hard_period == 0).to(F32) if hard else tau
    w = torch.mul(base, 1.0 - skip).reshape(members)
    for t, s in zip(targets, sources):
        wp = w.reshape((members,) + (1,) * (t.dim() - 1)) if members > 1 else w.reshape(())
        out = torch.where(wp == 1.0, s, torch.lerp(t, s, wp))
        t.copy_(torch.where(wp == 0.0, t, out))
    if weight is not None:
        weight.copy_(w.reshape(weight.shape))
    if advance:
        updates.add_(1)


# ---------------------------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------------------------
def check_target_args(op: str, targets, sources, updates, skip, tau, hard_period, members) -> int:
    """:func:`target_lerp_`'s checks of its arguments (messages prefixed ``op``); returns P.

    Raises:
        ValueError: as :func:`target_lerp_`.
    """
    members = check_members(op, members)
    check_list(op, "targets", targets, members)
    device = targets[0].device
    check_list(op, "sources", sources, members, like=targets, device=device)
    if (not isinstance(updates, Tensor) or updates.dtype != torch.int64 or updates.dim() != 0
            or updates.device != device):
        raise ValueError(f"{op}: updates must be an int64 0-d tensor on {device}, got {describe(updates)}")
    check_member_vector(op, "skip", skip, members, device)
    for name, t, dtype in (("tau", tau, F32), ("hard_period", hard_period, torch.int64)):
        check_member_vector(op, name, t, members, device, dtype)
        if t.shape != skip.shape:
            raise ValueError(f"{op}: {name} must have skip's shape {list(skip.shape)}, got {describe(t)}")
    return members


def target_lerp_(targets: Sequence[Tensor], sources: Sequence[Tensor], updates: Tensor, skip: Tensor, tau: Tensor,
                 hard_period: Tensor, *, hard: bool, advance: bool, weight: Tensor | None = None, members: int = 1,
                 backend: str = "auto") -> None:
    """Move every target tensor toward its source by this update's weight, in place.

    Rules, rounding and the launch structure in the module docstring. Device ops only (no host
    reads): capturable in a CUDA graph (after one eager call, which makes the ticket); changing
    ``tau``, ``hard_period`` or ``skip`` in place takes effect at the next replay. One kernel
    launch per 16 tensors on CUDA.

    Args (tensors on one device):
        targets: non-empty list of contiguous float32 tensors (θ'); ``[P, ...]`` with ``members`` = P > 1. Updated.
        sources: what they follow (θ), the same shapes; not modified.
        updates: int64 0-d, the updates done before this one (shared by all members); +1 with ``advance``.
        skip: float32 0-d/``[1]`` (P = 1) or ``[P]``, 1.0 = this update is skipped (w = 0).
        tau: float32, the shape of ``skip``: Polyak τ in [0, 1] (read only when not ``hard``).
        hard_period: int64, the shape of ``skip``: updates between hard copies, >= 1 (read only
            when ``hard``; a device value, not checked).
        hard: the hard copy (``target.update=hard``) instead of Polyak averaging.
        advance: add 1 to ``updates`` (after every read of it).
        weight: None, or float32 of ``skip``'s shape, contiguous: written with this update's w.
        members: P (1: one network).
        backend: "auto" (Triton for CUDA tensors, torch reference for CPU), "triton", "torch".

    Raises:
        ValueError: a list of the wrong length, dtype, shape, layout or device; ``updates`` not
            int64 0-d; ``skip``, ``tau``, ``hard_period`` or ``weight`` of the wrong dtype, shape
            or device; ``members`` not an int >= 1; an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1; the first call
            on a device inside CUDA-graph capture.
    """
    op = "target_lerp_"
    members = check_target_args(op, targets, sources, updates, skip, tau, hard_period, members)
    device = targets[0].device
    if weight is not None:
        check_member_vector(op, "weight", weight, members, device)
    with torch.no_grad():
        if resolve_backend(op, backend, targets[0]) == "torch":
            target_lerp_reference(targets, sources, updates, skip, tau, hard_period, hard=bool(hard),
                                  advance=bool(advance), weight=weight, members=members)
            return
        spare, ticket = scratch(op, device, 1)  # spare: the unused weight argument when weight is None
        _target_lerp_op(list(targets), list(sources), updates, skip, tau, hard_period,
                        spare if weight is None else weight, ticket, members, bool(hard), bool(advance),
                        weight is not None, BLOCK,
                        HARD_PROGRAMS if hard else POLYAK_PROGRAMS)
