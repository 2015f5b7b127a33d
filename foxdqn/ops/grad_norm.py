r"""Global gradient norm and ``clip_grad_norm_``'s clip coefficient of a list of gradients, in one
kernel launch (up to :data:`~foxdqn.ops.tensor_list.MAX_SLOTS` tensors per launch).

Source: ``torch.nn.utils.clip_grad_norm_`` (``torch/nn/utils/clip_grad.py``: ``_get_total_norm``
then ``_clip_grads_with_norm_``, ``norm_type=2``, ``error_if_nonfinite=False``): ``total =
vector_norm(stack(norms))`` and ``coef = clamp(max_norm / (total + 1e-6), max=1)``, where
``float / tensor`` is ``reciprocal(tensor) * float`` and 1e-6 and max_norm are rounded to float32
where they meet the float32 tensor. Per member ``p`` (one network: P = 1), over the member's
slices ``g_k[p]`` of all tensors, in float32::

    total[p] = sqrt_rn(Σ_k Σ_i g_k[p, i]**2)
    coef[p]  = c if not (c > 1) else 1,   c = div_rn(1, total[p] + CLIP_EPS) * max_norm[p]

Every gradient of member ``p`` is then to be multiplied by ``coef[p]`` (by the caller, or by
:func:`foxdqn.ops.adam_step.adam_step_`'s ``grad_scale``); this op does not modify the gradients.
Non-finite values as torch: a NaN gives total and coef NaN; an Inf, or a sum of squares past
float32's range, gives total Inf and coef 0 (NaN if max_norm is Inf); a zero total gives coef 1.

Kernel count: one launch for up to 16 tensors (a network's list is usually one launch), in place of
``torch._foreach_norm`` (its output fill and two kernels) and ``clip_grad_norm_``'s tail (stack,
norm, add, reciprocal, mul, clamp): nine kernels to one, for the single run and the population
alike (P members are more programs of the same launch).

Order of the sum and the tickets. The launch is member-major (:mod:`foxdqn.ops.tensor_list`,
"Rows"): program ``p · C + c`` takes member ``p``'s rows ``c·G .. c·G + G − 1`` (row ``R_k + b``:
block ``b`` of tensor ``k``, ``R_k`` the blocks of the tensors before ``k``). For each row it
squares the block (each square rounded to float32), sums it with ``tl.sum`` (a fixed tree) and
stores the float32 partial at row ``p``, column ``R_k + b`` of the ``[P, R]`` partials. Then it
takes a ticket of its member (``atomic_add`` on member ``p``'s int32 counter, acq_rel at GPU scope,
after a barrier of its warps, as :mod:`foxdqn.ops.step_stats` argues: the release orders the
partials' stores before the increment, the last program's acquire orders every other program's
increment, hence its partials, before its loads). The program that draws member ``p``'s last
ticket (of C) sums member ``p``'s ``R`` partials in a fixed order (columns ``c ≡ j mod RB`` in
increasing ``c`` into lane ``j``, then the ``RB`` lanes with ``tl.sum``), writes ``total[p]`` and
``coef[p]`` and zeroes member ``p``'s counter. So the members finish in parallel, and members never
mix. C and G (:func:`~foxdqn.ops.tensor_list.member_chunks` with :data:`PROGRAMS` and
:data:`MAX_ROWS`) shape the grid: 512 members of 15 rows run 8 programs of 2 rows each, 12.5 µs on
an H100 where one program per row (7,680) took 21.2 (docs/bench.md#launch-constants). The columns
are indexed by row, not by program or finishing order, so the result is the same bit for bit from
run to run and for any C and G (for one BLOCK), and member p's equals a call for member p alone. With more than 16 tensors, the
launches before the last only store partials; the last launch's programs take the tickets and sum
them all (they completed before it started, in stream order); when the last launch's tensors are
all empty (no rows), its grid is one program per member, which sums without a ticket. The
interpreter runs the programs one after the other, so there the last program is the last.

Rounding vs torch: torch sums each tensor's squares in its own order, takes the square root per
tensor, then squares and sums those norms; this op sums all squares of a member once. Both round
each square and each addition to float32, so ``total`` agrees with torch to a few float32 ulps (not
bit for bit); ``coef`` is correctly rounded from ``total`` in both (the reference is torch's own
expressions: :func:`grad_norm_coefficient_reference`).

Scratch: the partials are :func:`foxdqn.ops.tensor_list.scratch`'s, the member counters
(int32, zero between launches) this module's (:func:`_tickets`), per device, made on the first
(eager) call and grown only outside CUDA-graph capture.
"""
from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import resolve_backend
from foxdqn.ops.library import device_op, wrap_triton
from foxdqn.ops.tensor_list import (check_list, check_member_vector, check_members, member_chunks, member_row, pick16,
                                    plan, scratch, slots)

CLIP_EPS = 1e-6  # clip_grad_norm_'s eps: max_norm / (total + 1e-6)
BLOCK = 1024  # elements of a row: one partial sum (module docstring)
PROGRAMS = 1024  # the grid a launch aims for (tensor_list.member_chunks; an H100 sweep: docs/bench.md#launch-constants)
MAX_ROWS = 2  # rows per program at most
FINISH_LANES = 64  #: partial columns per iteration of the last program's inner loop (finish_member's RB)


# ---------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def finish_member(member, part_ptr, R, max_norm_ptr, total_ptr, coef_ptr, EPS: tl.constexpr, RB: tl.constexpr):
    """Member ``member``'s total and coef (float32, stored at ``total_ptr`` / ``coef_ptr`` + member)
    from its ``R`` float32 partial sums of squares at ``part_ptr + member·R``, summed in a fixed order
    (module docstring); ``max_norm_ptr + member`` its bound. Also the finish of
    :mod:`foxdqn.ops.member_mlp_chain`'s weight-gradient kernel with a ``norm``."""
    j = tl.arange(0, RB)
    row = part_ptr + member.to(tl.int64) * R
    lanes = tl.zeros([RB], tl.float32)
    for c0 in range(0, R, RB):
        col = c0 + j
        lanes += tl.load(row + col, mask=col < R, other=0.0)
    total = tl.sqrt_rn(tl.sum(lanes, axis=0))
    bound = tl.load(max_norm_ptr + member)
    q = tl.div_rn(tl.full([], 1.0, tl.float32), total + EPS) * bound
    tl.store(total_ptr + member, total)
    tl.store(coef_ptr + member, tl.where(q > 1.0, 1.0, q))  # clamp(max=1) that keeps NaN


@triton.jit(do_not_specialize=[*(f"r{i}" for i in range(16)), "rows_in_launch", "per_member", "R"])
def _grad_norm_kernel(g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10, g11, g12, g13, g14, g15,
                      n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, n11, n12, n13, n14, n15,
                      r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15,
                      max_norm_ptr, total_ptr, coef_ptr, part_ptr, tickets_ptr, rows_in_launch, per_member, R,
                      FINAL: tl.constexpr, EMPTY: tl.constexpr, EPS: tl.constexpr, BLOCK: tl.constexpr,
                      G: tl.constexpr, RB: tl.constexpr):
    """Partials of the launch's rows (program ``p · C + c``: member p's rows ``c·G ..``, C =
    ``per_member``); with FINAL each member's last program (its C-th ticket) finishes that member;
    with EMPTY (FINAL, no rows) program p finishes member p."""
    pid = tl.program_id(0)
    member = pid // per_member
    first = (pid - member * per_member) * G
    for i in tl.static_range(G):
        slot, col, mask, idx, live = member_row(
            member, first + i, rows_in_launch, n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, n11, n12, n13, n14, n15,
            r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15, BLOCK)
        g = pick16(slot, g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10, g11, g12, g13, g14, g15)
        x = tl.load(g + idx, mask=mask, other=0.0)
        tl.store(part_ptr + member.to(tl.int64) * R + col, tl.sum(x * x, axis=0), mask=live)

    if FINAL:
        if EMPTY:
            finish_member(pid, part_ptr, R, max_norm_ptr, total_ptr, coef_ptr, EPS, RB)
        else:
            tl.debug_barrier()  # every warp's part is done before the (one-thread) ticket increment
            ticket = tl.atomic_add(tickets_ptr + member, 1, sem="acq_rel", scope="gpu")
            if ticket == per_member - 1:
                finish_member(member, part_ptr, R, max_norm_ptr, total_ptr, coef_ptr, EPS, RB)
                tl.store(tickets_ptr + member, 0)


@device_op("foxdqn::grad_norm_coefficient", mutates_args={"total", "coef", "partials", "tickets"})
def _grad_norm_op(grads: list[Tensor], max_norm: Tensor, total: Tensor, coef: Tensor, partials: Tensor,
                  tickets: Tensor, members: int, block: int, programs: int) -> None:
    numels = tuple(g.numel() // members for g in grads)
    launches, rows = plan(numels, block)
    for launch in launches:
        in_launch = launch.row_count
        per_member, per_program = member_chunks(in_launch, members, programs, MAX_ROWS)
        wrap_triton(_grad_norm_kernel)[(members * per_member,)](
            *slots(grads, launch), *launch.numels, *launch.rows,
            max_norm, total, coef, partials, tickets, in_launch, per_member, rows,
            FINAL=launch.final, EMPTY=launch.final and in_launch == 0, EPS=CLIP_EPS, BLOCK=block, G=per_program,
            RB=FINISH_LANES, num_warps=4,
            enable_fp_fusion=False)  # each square rounded to float32, as torch's vector_norm (docstring)


_TICKETS: dict[str, Tensor] = {}
#: counters replaced by a larger one: kept alive, since a CUDA graph captured earlier may still point at them
_RETIRED: list[Tensor] = []


def _tickets(device: torch.device, members: int) -> Tensor:
    """The member counters on ``device``: int32 ``[>= members]``, zero between launches (docstring).

    Raises:
        RuntimeError: they must be made or grown while a CUDA graph is being captured.
    """
    key = str(device)
    have = _TICKETS.get(key)
    if have is not None and have.numel() >= members:
        return have
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"grad_norm_coefficient: its {members} member counters on {device} must be made by an "
                           "eager call before CUDA-graph capture (run the captured function once eagerly)")
    if have is not None:
        _RETIRED.append(have)
    _TICKETS[key] = torch.zeros(max(members, 2 * (have.numel() if have is not None else 0)), dtype=torch.int32,
                                device=device)
    return _TICKETS[key]


# ---------------------------------------------------------------------------------------------
# Reference (torch's clip_grad_norm_ expressions)
# ---------------------------------------------------------------------------------------------
def grad_norm_coefficient_reference(grads: Sequence[Tensor], max_norm: Tensor, total: Tensor, coef: Tensor,
                                    members: int = 1) -> None:
    """Plain-torch reference of :func:`grad_norm_coefficient` (``max_norm``, ``total``, ``coef``
    as ``[P]``; writes ``total`` and ``coef``): per member, the per-tensor norms of
    ``torch.linalg.vector_norm``, their norm, then ``clamp(reciprocal(total + 1e-6) * max_norm,
    max=1)`` as ``torch.nn.utils.clip_grad_norm_``. Device ops only."""
    norms = torch.stack([torch.linalg.vector_norm(g.reshape(members, g.numel() // members), 2, dim=1) for g in grads], dim=1)
    t = torch.linalg.vector_norm(norms, 2, dim=1)
    total.copy_(t)
    coef.copy_(torch.clamp((t + CLIP_EPS).reciprocal() * max_norm, max=1.0))


# ---------------------------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------------------------
def grad_norm_coefficient(grads: Sequence[Tensor], max_norm: Tensor, *, members: int = 1,
                          backend: str = "auto") -> tuple[Tensor, Tensor]:
    """The global L2 norm of ``grads`` and ``clip_grad_norm_``'s clip coefficient, per member.

    Rules, rounding and the launch structure in the module docstring. Device ops only (no host
    reads): capturable in a CUDA graph (after one eager call, which makes the scratch). One kernel
    launch per 16 tensors on CUDA.

    Args:
        grads: non-empty list of contiguous float32 tensors on one device; with ``members`` = P > 1
            each is ``[P, ...]`` (member ``p``'s gradient is ``g[p]``). Empty tensors count 0.
            Not modified.
        max_norm: float32 on the grads' device, the bound on the total norm (> 0 as a rule; a
            device value, not checked): 0-d or ``[1]`` for P = 1, ``[P]`` for P > 1.
        members: P, the population's members (1: one network).
        backend: "auto" (Triton for CUDA tensors, torch reference for CPU), "triton", "torch".

    Returns:
        ``(total, coef)``: new float32 tensors of ``max_norm``'s shape (0-d for a 0-d bound): the
        norm before clipping (what the
        guard reads) and the factor for the gradients.

    Raises:
        ValueError: ``grads`` not such a list; ``max_norm`` of another dtype, shape or device;
            ``members`` not an int >= 1; an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1; the first call
            on a device inside CUDA-graph capture.
    """
    op = "grad_norm_coefficient"
    members = check_members(op, members)
    numels = check_list(op, "grads", grads, members)
    device = grads[0].device
    check_member_vector(op, "max_norm", max_norm, members, device)
    total = torch.empty_like(max_norm)
    coef = torch.empty_like(max_norm)
    if resolve_backend(op, backend, grads[0]) == "torch":
        grad_norm_coefficient_reference(grads, max_norm.view(-1), total.view(-1), coef.view(-1), members)
    else:
        _, rows = plan(numels, BLOCK)
        partials, _ = scratch(op, device, members * rows)
        _grad_norm_op(list(grads), max_norm, total, coef, partials, _tickets(device, members), members, BLOCK,
                      PROGRAMS)
    return total, coef
