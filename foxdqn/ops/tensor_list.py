r"""A list of tensors in one Triton launch: the program -> (member, rows) map, the launch plan, the
argument checks and the per-device scratch shared by the multi-tensor ops
(:mod:`foxdqn.ops.grad_norm`, :mod:`foxdqn.ops.adam_step`, :mod:`foxdqn.ops.target_lerp`), and
their multiply-add rounded once under any Triton interpreter (:func:`fma`).

Layout. Tensor ``k`` of a list is float32, contiguous, with ``P`` = ``members`` slices of
``n_k`` elements each (``[P, ...]``; P = 1 is one network, any shape). One launch takes up to
:data:`MAX_SLOTS` tensors as separate pointer arguments (slot ``k`` = the launch's ``k``-th
tensor; unused slots repeat the first tensor and own no rows); the slot's pointers are chosen by
a scalar if-chain (:func:`pick16`).

Why pointer arguments and not a device table of addresses: ``.grad`` tensors are reallocated by
every eager backward, optimizer state is replaced by ``load_state_dict``, and a table copied
host -> device cannot be built inside CUDA-graph capture; arguments passed at each launch are
always the current tensors, and a captured launch keeps the capture-time addresses, which the
graph's memory pool keeps fixed.

Rows (member-major launches: :func:`member_row`, :func:`member_chunks`). Member ``p``'s slices
of all tensors, cut into blocks of BLOCK elements, are its ``R`` rows, slot by slot (row ``r_k + b``
is block ``b`` of slot ``k``, ``r_k`` = :attr:`Launch.rows`). A member-major launch runs ``C``
programs per member; program ``p · C + c`` takes member ``p``'s rows ``c · G .. c · G + G − 1``.
So a population of small networks (512 members of 15 rows) runs a few programs per member
instead of one per block, and an op whose work depends on the member (the target update's weight)
reads it once per program. An op that reduces rows stores one value per row, so its result does
not depend on C or G.

More than :data:`MAX_SLOTS` tensors: several launches (:func:`plan`), in stream order. Each op
says which launch finishes (its "last program": found with a ticket as in
:mod:`foxdqn.ops.step_stats`, or the highest program id that waits for the others' signals in
:mod:`foxdqn.ops.adam_step`): the launches before it complete before it starts, so their writes
(partial sums) are visible to it and their reads (step counts, the update counter) precede its
writes.

Scratch (:func:`scratch`): one float32 buffer for partial rows and one int32 ticket per
(op, device) (:func:`group_scratch`: a ticket per group of programs, for the losses' and the IQN
embedding's bias gradients), owned by this module for the life of the process (not checkpointed). The ticket is
zero between launches (the last program resets it), so calls of one op must not run concurrently
on two streams of one device (the hot loop runs on one stream): they would miscount, and
``adam_step_``'s waiting last program could wait forever. The buffers are made on the first
(eager) call; growing them inside CUDA-graph capture raises, since memory allocated there belongs
to the graph's private pool.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import INTERPRET, describe

#: Tensors per launch (pointer arguments per list); more tensors take more launches.
MAX_SLOTS = 16
F32 = torch.float32


# ---------------------------------------------------------------------------------------------
# Device side
# ---------------------------------------------------------------------------------------------
@triton.jit
def pick16(k, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15):
    """``a_k`` for a scalar ``k`` in [0, 16) (any other k gives ``a0``): a scalar if-chain. The ``a``
    are pointers of one type or integers (``+ z`` turns an integer that Triton specialised into a
    constant, e.g. a size of 1, into a scalar of the others' type)."""
    z = k * 0
    r = a0 + z
    if k == 1:
        r = a1 + z
    if k == 2:
        r = a2 + z
    if k == 3:
        r = a3 + z
    if k == 4:
        r = a4 + z
    if k == 5:
        r = a5 + z
    if k == 6:
        r = a6 + z
    if k == 7:
        r = a7 + z
    if k == 8:
        r = a8 + z
    if k == 9:
        r = a9 + z
    if k == 10:
        r = a10 + z
    if k == 11:
        r = a11 + z
    if k == 12:
        r = a12 + z
    if k == 13:
        r = a13 + z
    if k == 14:
        r = a14 + z
    if k == 15:
        r = a15 + z
    return r


if INTERPRET:

    @triton.jit
    def fma(a, b, c):
        """``a · b + c`` of float32 values rounded once, as CUDA's ``fma.rn.f32``. Triton's interpreter
        rounds ``tl.fma`` twice before Triton 3.9 (the product, then the sum), so here it is computed
        in float64: the product is exact there, the sum is rounded to odd (its error from the
        two-sum: where it is inexact, the neighbour on the exact value's side with an odd last bit),
        and the conversion to float32 then rounds as one rounding of the exact value would."""
        x = a.to(tl.float64) * b.to(tl.float64)
        y = c.to(tl.float64)
        s = x + y
        bb = s - x
        err = (x - (s - bb)) + (y - bb)  # s + err == x + y exactly (Knuth's two-sum)
        bits = s.to(tl.int64, bitcast=True)
        away = (err > 0) == (s > 0)  # the exact value lies farther from zero than s
        nudged = tl.where(away, bits + 1, bits - 1)
        inexact = (err != 0) & (err == err)  # a NaN error: an inf or NaN input, left as it is
        odd = tl.where(inexact & ((bits & 1) == 0), nudged, bits).to(tl.float64, bitcast=True)
        return odd.to(tl.float32)

else:

    @triton.jit
    def fma(a, b, c):
        """``a · b + c`` of float32 values rounded once (``tl.fma``: CUDA's ``fma.rn.f32``)."""
        return tl.fma(a, b, c)


@triton.jit
def member_row(member, r, rows_in_launch, n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, n11, n12, n13, n14, n15,
               r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15, BLOCK: tl.constexpr):
    """Row ``r`` of member ``member`` in a member-major launch (module docstring, "Rows"):
    ``(slot, col, mask, idx, live)``.

    ``r`` counts the launch's blocks of one member (``[0, rows_in_launch)``; ``live``: r is one
    of them), ``col`` = ``r0 + r`` its row over the whole list (the partial column of
    :mod:`foxdqn.ops.grad_norm`), ``slot`` its tensor (0 when not live), ``mask`` the block's
    elements inside the member's slice (all False when not live), ``idx`` int64 flat indices into
    the tensor. ``r_k``: the row of slot k's first block (:attr:`Launch.rows`)."""
    col = r0 + r
    slot = ((col >= r1).to(tl.int32) + (col >= r2).to(tl.int32) + (col >= r3).to(tl.int32)
            + (col >= r4).to(tl.int32) + (col >= r5).to(tl.int32) + (col >= r6).to(tl.int32)
            + (col >= r7).to(tl.int32) + (col >= r8).to(tl.int32) + (col >= r9).to(tl.int32)
            + (col >= r10).to(tl.int32) + (col >= r11).to(tl.int32) + (col >= r12).to(tl.int32)
            + (col >= r13).to(tl.int32) + (col >= r14).to(tl.int32) + (col >= r15).to(tl.int32))
    live = r < rows_in_launch
    slot = tl.where(live, slot, 0)
    start = pick16(slot, r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15)
    n = tl.where(live, pick16(slot, n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, n11, n12, n13, n14, n15), 0)
    offs = (col - start) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    idx = member.to(tl.int64) * n + offs
    return slot, col, mask, idx, live


# ---------------------------------------------------------------------------------------------
# Host side: the launch plan
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Launch:
    """One launch of a multi-tensor op.

    Attributes:
        first: index in the list of the launch's first tensor.
        count: its tensors, 1..MAX_SLOTS.
        numels: MAX_SLOTS elements per member of its slots (0 for unused slots).
        rows: MAX_SLOTS row offsets: the index, among all blocks of one member's slices over the
            whole list, of each slot's first block (unused slots: the launch's end; the partial
            column of :mod:`foxdqn.ops.grad_norm`).
        row_count: the launch's rows per member (its slots' blocks), >= 0.
        final: the last launch of the list.
    """

    first: int
    count: int
    numels: tuple[int, ...]
    rows: tuple[int, ...]
    row_count: int
    final: bool


@lru_cache(maxsize=256)
def plan(numels: tuple[int, ...], block: int) -> tuple[tuple[Launch, ...], int]:
    """The launches for tensors of ``numels[k]`` elements per member, and ``R``, the rows per
    member over all tensors (``Σ_k ceil(numels[k] / block)``).

    Raises:
        ValueError: an empty ``numels``, a negative numel or block < 1.
    """
    if not numels or any(n < 0 for n in numels) or block < 1:
        raise ValueError(f"tensor_list.plan: need >= 1 numels >= 0, block >= 1; got {numels}, {block}")
    launches, row = [], 0
    for first in range(0, len(numels), MAX_SLOTS):
        chunk = numels[first:first + MAX_SLOTS]
        start, rows = row, []
        for n in chunk:
            rows.append(row)
            row += triton.cdiv(n, block)
        pad = MAX_SLOTS - len(chunk)
        launches.append(Launch(first, len(chunk), tuple(chunk) + (0,) * pad, tuple(rows) + (row,) * pad,
                               row - start, first + MAX_SLOTS >= len(numels)))
    return tuple(launches), row


@lru_cache(maxsize=256)
def member_chunks(rows: int, members: int, programs: int, max_rows: int) -> tuple[int, int]:
    """``(C, G)`` of a member-major launch (module docstring, "Rows") whose members have ``rows``
    blocks each: C programs per member, each taking G consecutive rows (the last ones of a member
    may run past its rows, masked). C = min(R, max(ceil(programs / P), ceil(R / max_rows))), so
    the grid is about ``programs`` or more and no program takes more than ``max_rows`` rows;
    ``(1, 0)`` when R = 0 (one program per member, no rows).

    Raises:
        ValueError: rows < 0, members < 1, programs < 1 or max_rows < 1.
    """
    if rows < 0 or members < 1 or programs < 1 or max_rows < 1:
        raise ValueError(f"tensor_list.member_chunks: need rows >= 0, members, programs and max_rows >= 1; got "
                         f"{rows}, {members}, {programs}, {max_rows}")
    if rows == 0:
        return 1, 0
    c = min(rows, max(-(-programs // members), -(-rows // max_rows)))
    return c, -(-rows // c)


def slots(tensors: Sequence[Tensor], launch: Launch) -> list[Tensor]:
    """The launch's MAX_SLOTS pointer arguments: its tensors, padded with its first one."""
    own = list(tensors[launch.first:launch.first + launch.count])
    return own + [own[0]] * (MAX_SLOTS - len(own))


# ---------------------------------------------------------------------------------------------
# Host side: argument checks
# ---------------------------------------------------------------------------------------------
def check_members(op: str, members) -> int:
    """``members`` is an int >= 1. Raises ValueError."""
    if isinstance(members, bool) or not isinstance(members, int) or members < 1:
        raise ValueError(f"{op}: members must be an int >= 1, got {members!r}")
    return members


def check_list(op: str, name: str, tensors, members: int, like: Sequence[Tensor] | None = None,
               device: torch.device | None = None) -> tuple[int, ...]:
    """``tensors`` is a non-empty list of contiguous float32 tensors on one device, each ``[P, ...]``
    with P = ``members`` (any shape when members is 1), each of the shape of ``like[k]`` if given.
    Returns the elements per member of each. Raises ValueError naming ``name[k]``."""
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)) or not tensors:
        raise ValueError(f"{op}: {name} must be a non-empty list of float32 tensors, got "
                         f"{describe(tensors) if isinstance(tensors, Tensor) else repr(tensors)[:80]}")
    if like is not None and len(tensors) != len(like):
        raise ValueError(f"{op}: {name} has {len(tensors)} tensors, the first list {len(like)}")
    device = device if device is not None else getattr(tensors[0], "device", None)
    numels = []
    for k, t in enumerate(tensors):
        want = (f"the shape {list(like[k].shape)} of the first list's [{k}]" if like is not None
                else (f"[P, ...] with P = members = {members}" if members > 1 else "any shape"))
        if (not isinstance(t, Tensor) or t.dtype != F32 or not t.is_contiguous() or t.device != device
                or (like is not None and t.shape != like[k].shape)
                or (members > 1 and (t.dim() < 1 or t.shape[0] != members))):
            raise ValueError(f"{op}: {name}[{k}] must be a contiguous float32 tensor on {device}, {want}; "
                             f"got {describe(t)}")
        if t.numel() >= 2**31:
            raise ValueError(f"{op}: {name}[{k}] has {t.numel()} elements; at most 2**31 - 1 are supported")
        numels.append(t.numel() // members)
    return tuple(numels)


def check_member_vector(op: str, name: str, t, members: int, device: torch.device,
                        dtype: torch.dtype = F32) -> None:
    """``t`` is a contiguous ``dtype`` tensor on ``device``: ``[P]``, or 0-d / ``[1]`` when P = 1."""
    ok_shapes = ((), (1,)) if members == 1 else ((members,),)
    if (not isinstance(t, Tensor) or t.dtype != dtype or tuple(t.shape) not in ok_shapes or t.device != device
            or not t.is_contiguous()):
        want = "0-d or [1]" if members == 1 else f"[P] = [{members}]"
        raise ValueError(f"{op}: {name} must be a contiguous {dtype} tensor {want} on {device} "
                         f"(one value per member), got {describe(t)}")


# ---------------------------------------------------------------------------------------------
# Host side: scratch
# ---------------------------------------------------------------------------------------------
_SCRATCH: dict[tuple[str, str], tuple[Tensor, Tensor]] = {}
#: buffers replaced by a larger one: kept alive, since a CUDA graph captured earlier may still point at them
_RETIRED: list[Tensor] = []


def scratch(op: str, device: torch.device, floats: int) -> tuple[Tensor, Tensor]:
    """``(partials, ticket)`` of ``op`` on ``device``: float32 ``[>= max(floats, 1)]`` and an
    int32 0-d ticket (zero between launches), made once and kept by this module (docstring).

    Raises:
        RuntimeError: the buffer must be made or grown while a CUDA graph is being captured.
    """
    return _kept(op, device, floats, 0)


def group_scratch(op: str, device: torch.device, floats: int, groups: int) -> tuple[Tensor, Tensor]:
    """``(partials, tickets)`` of ``op`` on ``device``: float32 ``[>= max(floats, 1)]`` and int32
    ``[>= groups]`` tickets, one per group of programs whose last program sums the group's partials
    (each zero between launches: that program resets its group's), made once and kept as
    :func:`scratch`'s.

    Raises:
        RuntimeError: the buffers must be made or grown while a CUDA graph is being captured.
    """
    return _kept(op, device, floats, max(int(groups), 1))


@triton.jit
def last_of_group(ticket_ptr, programs):
    """Whether this program is the last of its group's ``programs`` to arrive (a :func:`group_scratch`
    ticket at ``ticket_ptr``): after a barrier of its warps (every warp has stored its part), one
    acq_rel GPU-scope increment; the last program reads the group's parts after it and must reset
    the ticket to zero (``tl.store(ticket_ptr, 0)``) for the next launch."""
    tl.debug_barrier()  # every warp has stored its part before the (one-thread) ticket increment
    return tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu") == programs - 1


@triton.jit
def sum_of_parts(part_ptr, first, count, stride, cols, col_ok, SUM: tl.constexpr, WIDTH: tl.constexpr):
    """Σ_k part[first + k, cols] over k < ``count`` (rows of ``stride`` floats): SUM rows a step
    into a [SUM, WIDTH] tile of running sums, in row order, then the tile's sum over its rows;
    float32 [WIDTH], 0 where not ``col_ok``. The order depends on ``count`` and SUM only."""
    kk = tl.arange(0, SUM)
    slots = tl.zeros([SUM, WIDTH], dtype=tl.float32)
    for k0 in range(0, count, SUM):
        k = k0 + kk
        slots += tl.load(part_ptr + (first + k).to(tl.int64)[:, None] * stride + cols[None, :],
                         mask=(k < count)[:, None] & col_ok[None, :], other=0.0)
    return tl.sum(slots, axis=0)


def _kept(op: str, device: torch.device, floats: int, tickets: int) -> tuple[Tensor, Tensor]:
    """:func:`scratch` (``tickets`` 0: a 0-d ticket) or :func:`group_scratch` (``tickets`` of them)."""
    key = (op if not tickets else f"{op}/groups", str(device))
    have = _SCRATCH.get(key)
    if have is not None and have[0].numel() >= floats and have[1].numel() >= tickets:
        return have
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{op}: its scratch ({floats} floats on {device}) must be made by an eager call before "
                           "CUDA-graph capture (run the captured function once eagerly, as the warm-up does)")
    old_partials, old_ticket = have if have is not None else (None, None)
    partials, ticket = old_partials, old_ticket
    if partials is None or partials.numel() < floats:
        partials = torch.empty(max(floats, 1, 2 * (0 if old_partials is None else old_partials.numel())), dtype=F32,
                               device=device)
    if ticket is None or ticket.numel() < tickets:  # zero between launches: a new one starts at zero
        grown = max(tickets, 2 * (0 if old_ticket is None else old_ticket.numel()))
        ticket = torch.zeros((grown,) if tickets else (), dtype=torch.int32, device=device)
    _RETIRED.extend(t for t, new in ((old_partials, partials), (old_ticket, ticket)) if t is not None and t is not new)
    _SCRATCH[key] = (partials, ticket)
    return partials, ticket
