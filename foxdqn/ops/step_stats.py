r"""One collect step's monitoring sums (:meth:`foxdqn.population.stats.MemberStats.add_step`), fused into one kernel.

For the N envs of one step (``done`` the envs whose episode ended on it), in float64::

    acc[0] += Σ_i episode_return[i] · done[i]        (returns of the finished episodes)
    acc[1] += Σ_i done[i]                            (finished episodes)
    acc[2] += Σ_i episode_length[i] · done[i]        (their lengths, in env steps)
    acc[3] += Σ_i reward[i]                          (reward, log-equity units for trading)
    acc[4] += N                                      (transitions)
    acc[5] += Σ_i traded[i]                          (steps with a fill; 0 without ``traded``)
    actions[action[i]] += 1                          (histogram of the executed actions)
    env_steps += N                                   (optional: the run's env-step counter)

(docs/design/hot_loop.md#log-snapshot). The reference (:func:`step_stats_reference`, torch's
``sum`` and ``index_add_``) is the definition.

With ``members=P`` (a population, :class:`foxdqn.population.stats.MemberStats`) the N envs are P
members' envs, member-major (member p's are ``p·N/P .. (p+1)·N/P − 1``), and member p's sums go
to row p of ``acc`` ``[P, NUM_FIELDS]`` (a row stride of its own: a view of wider rows serves) and
of ``actions`` ``[P, A]`` (or no histogram: ``actions`` None); ``env_steps`` (the population's
counter of env steps per member) advances by N/P. Members never mix: member p's sums are those
of a call with its envs alone, bit for bit, whatever P.

The kernel is one launch of ``P = max(1, ceil(N / block))`` programs, ``block`` envs each
(:class:`StepStatsScratch`'s ``block``, by default ``BLOCK`` = 256; with members, a second grid axis
of one row of P programs per member over its N/P envs, each member with its own rows and ticket,
its last program alone advancing no counter but member 0's). Program ``p`` sums its envs
``[p·block, (p+1)·block)`` field by field (``tl.sum``: a fixed reduction tree) into row ``p`` of
the float64 scratch ``partials [P, NUM_FIELDS]``, and adds its envs' action counts into
``actions`` with float64 atomics (a per-program count of each action, integer-valued and below
2**53, so exact in any order; ``tl.sum`` of 0/1 in int32 first). The last program to finish
sums the ``P`` rows in a fixed order, rows ``p ≡ r (mod ROWS)`` in increasing ``p`` into slot
``r``, then the ``ROWS`` = 64 slots with ``tl.sum``, adds the totals to ``acc`` and advances
``env_steps``. The rows are indexed by program, not by finishing order, so the sums are the same
bit for bit from run to run (for one ``block`` and one compiled kernel). This summation order,
blocked and then across blocks, is not torch's ``sum``: the two non-integer sums (returns,
rewards) may differ from the reference in the last bits of float64 (rounding only: every term is
added exactly once); the counts are exact in both. An action outside ``[0, A)`` is not counted
by the kernel (the reference's ``index_add_`` raises on CPU).

The last program is found with a ticket (as :mod:`foxdqn.ops.replay_add`): every program, after
storing its row, does ``atomic_add(ticket, 1)``; the one that draws ``P − 1`` sums the rows and
zeroes the ticket for the next launch. On the GPU the atomic is acq_rel at GPU scope, done by one
thread of the program after a barrier of its warps (``tl.debug_barrier``), so its release orders
every warp's store of the row before the increment; the last program's acquire on the same
address (the increments form one release sequence) orders every other program's increment, hence
its row, before the last program's loads of the rows. The next launch, in stream order, sees
``acc`` and the zeroed ticket and rewrites the rows only after this launch's last program has read
them. The histogram's atomics need no ordering: nothing in the launch reads ``actions``. The
interpreter runs the programs one after the other, so there the last program is simply the last.
The scratch is allocated once (:class:`StepStatsScratch`, kept by
:class:`~foxdqn.population.stats.MemberStats`, not checkpointed), never per call.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.library import device_op, wrap_triton

BLOCK = 256  # envs per program (the default of StepStatsScratch's block)
ROWS = 64  # partial rows per iteration of the last program's loop
NUM_FIELDS = 6  # acc's fields, in the order of the module docstring
_FIELDS_PAD = 8  # NUM_FIELDS rounded up to a power of two (a tile's width)
_MAX_A_BLOCK = 32  # action bins per iteration of a program's histogram loop


class StepStatsScratch:
    """The kernel's scratch for up to ``num_envs`` envs per call (per member with ``members``), not
    checkpointed.

    Attributes:
        block: envs per program (a power of two).
        programs: ``max(1, ceil(num_envs / block))``, the most programs of a call (of a member).
        members: None (one run), or P.
        partials: float64 ``[programs, NUM_FIELDS]`` (``[P · programs, NUM_FIELDS]``), each
            program's sums (overwritten every call).
        ticket: int32 0-d (``[P]``: one per member), zero between calls.

    Raises:
        ValueError: ``num_envs`` < 0, ``block`` not a power of two >= 1, or ``members`` not None or
            an int >= 1.
    """

    checkpointed = False  # foxdqn.run.checkpoint skips it

    def __init__(self, num_envs: int, device: torch.device | str, block: int = BLOCK, members: int | None = None):
        if not isinstance(num_envs, int) or num_envs < 0:
            raise ValueError(f"StepStatsScratch: num_envs must be an int >= 0, got {num_envs!r}")
        if not isinstance(block, int) or block < 1 or block & (block - 1):
            raise ValueError(f"StepStatsScratch: block must be a power of two >= 1, got {block!r}")
        if members is not None and (isinstance(members, bool) or not isinstance(members, int) or members < 1):
            raise ValueError(f"StepStatsScratch: members must be None or an int >= 1, got {members!r}")
        self.block, self.members = block, members
        self.programs = max(1, triton.cdiv(num_envs, block))
        self.partials = torch.zeros((members or 1) * self.programs, NUM_FIELDS, dtype=torch.float64, device=device)
        self.ticket = torch.zeros(() if members is None else (members,), dtype=torch.int32, device=device)


# ---------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def _step_stats_kernel(action_ptr, reward_ptr, done_ptr, ret_ptr, len_ptr, traded_ptr, acc_ptr, hist_ptr,
                       env_steps_ptr, part_ptr, ticket_ptr, N, A, acc_stride,
                       HAS_TRADED: tl.constexpr, STEPS: tl.constexpr, HIST: tl.constexpr, BLOCK: tl.constexpr,
                       A_BLOCK: tl.constexpr, ROWS: tl.constexpr, F: tl.constexpr, FP: tl.constexpr):
    """Grid (programs, members): program (pid, mem) sums envs ``[pid·BLOCK, (pid+1)·BLOCK)`` of
    member mem's N (one run: one member, N all the envs)."""
    pid = tl.program_id(0)
    mem = tl.program_id(1)
    P = tl.num_programs(0)
    i = pid * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    e = mem.to(tl.int64) * N + i  # the member's envs

    # ---- this program's envs: one partial row
    done = (tl.load(done_ptr + e, mask=m, other=0) != 0).to(tl.float64)
    s_ret = tl.sum(tl.load(ret_ptr + e, mask=m, other=0.0).to(tl.float64) * done, axis=0)
    s_done = tl.sum(done, axis=0)
    s_len = tl.sum(tl.load(len_ptr + e, mask=m, other=0).to(tl.float64) * done, axis=0)
    s_rew = tl.sum(tl.load(reward_ptr + e, mask=m, other=0.0).to(tl.float64), axis=0)
    s_n = tl.sum(m.to(tl.float64), axis=0)
    if HAS_TRADED:
        s_trd = tl.sum((tl.load(traded_ptr + e, mask=m, other=0) != 0).to(tl.float64), axis=0)
    else:
        s_trd = tl.sum(tl.zeros([BLOCK], tl.float64), axis=0)
    f = tl.arange(0, FP)
    row = tl.where(f == 0, s_ret, tl.where(f == 1, s_done, tl.where(f == 2, s_len, tl.where(
        f == 3, s_rew, tl.where(f == 4, s_n, s_trd)))))
    rows = part_ptr + mem.to(tl.int64) * P * F  # the member's partial rows
    tl.store(rows + pid * F + f, row, mask=f < F)

    # ---- the action histogram: a count per action, then one atomic per action seen
    if HIST:
        a = tl.load(action_ptr + e, mask=m, other=-1)  # -1 (masked) and actions outside [0, A) match no bin
        for b0 in range(0, A, A_BLOCK):
            bins = b0 + tl.arange(0, A_BLOCK)
            count = tl.sum((a[:, None] == bins[None, :]).to(tl.int32), axis=0)
            tl.atomic_add(hist_ptr + mem * A + bins, count.to(tl.float64), mask=(bins < A) & (count > 0),
                          sem="relaxed")

    # ---- the member's last program sums its rows (ordering: module docstring)
    tl.debug_barrier()  # every warp has stored its part of the row before the (one-thread) ticket increment
    ticket = tl.atomic_add(ticket_ptr + mem, 1, sem="acq_rel", scope="gpu")
    if ticket == P - 1:
        r = tl.arange(0, ROWS)
        slots = tl.zeros([ROWS, FP], tl.float64)
        for r0 in range(0, P, ROWS):
            rr = r0 + r
            slots += tl.load(rows + rr[:, None] * F + f[None, :], mask=(rr < P)[:, None] & (f < F)[None, :],
                             other=0.0)
        total = tl.sum(slots, axis=0)
        fm = f < F
        acc = acc_ptr + mem * acc_stride + f
        tl.store(acc, tl.load(acc, mask=fm, other=0.0) + total, mask=fm)
        if STEPS:
            if mem == 0:
                tl.store(env_steps_ptr, tl.load(env_steps_ptr) + N)
        tl.store(ticket_ptr + mem, 0)


@device_op("foxdqn::step_stats", mutates_args={"acc", "actions", "env_steps", "partials", "ticket"})
def _step_stats_op(action: Tensor, reward: Tensor, done: Tensor, episode_return: Tensor, episode_length: Tensor,
                   traded: Tensor, acc: Tensor, actions: Tensor, env_steps: Tensor, partials: Tensor, ticket: Tensor,
                   block: int, has_traded: bool, advance_steps: bool, members: int, histogram: bool) -> None:
    n, a = action.shape[0] // members, actions.shape[-1]
    wrap_triton(_step_stats_kernel)[(max(1, triton.cdiv(n, block)), members)](
        action, reward, done, episode_return, episode_length, traded, acc, actions, env_steps, partials, ticket,
        n, a, acc.stride(0) if acc.dim() == 2 else 0, HAS_TRADED=has_traded, STEPS=advance_steps, HIST=histogram,
        BLOCK=block, A_BLOCK=min(max(triton.next_power_of_2(a), 2), _MAX_A_BLOCK), ROWS=ROWS, F=NUM_FIELDS,
        FP=_FIELDS_PAD, num_warps=4 if block <= 256 else 8)


# ---------------------------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------------------------
def step_stats_reference(action: Tensor, reward: Tensor, done: Tensor, episode_return: Tensor,
                         episode_length: Tensor, traded: Tensor | None, acc: Tensor, actions: Tensor | None,
                         env_steps: Tensor | None = None, *, members: int | None = None) -> None:
    """Plain-torch reference of :func:`step_stats` (same arguments but ``scratch``; device ops only): the former
    single-run ``DeviceStats.add_step`` plus the counter's ``add_``; with ``members`` the same per member (row p
    of ``acc`` and ``actions`` from member p's envs)."""
    if members is not None:
        _member_reference(action, reward, done, episode_return, episode_length, traded, acc, actions, env_steps,
                          members)
        return
    n = action.shape[0]
    d = done.to(torch.float64)
    zero = torch.zeros((), dtype=torch.float64, device=acc.device)
    upd = torch.stack([
        (episode_return.to(torch.float64) * d).sum(),
        d.sum(),
        (episode_length.to(torch.float64) * d).sum(),
        reward.to(torch.float64).sum(),
        torch.full((), float(n), dtype=torch.float64, device=acc.device),
        zero if traded is None else traded.to(torch.float64).sum(),
    ])
    acc.add_(upd)
    actions.index_add_(0, action, torch.ones(n, dtype=torch.float64, device=acc.device))
    if env_steps is not None:
        env_steps.add_(n)


def _member_reference(action, reward, done, episode_return, episode_length, traded, acc, actions, env_steps,
                      members: int) -> None:
    """:func:`step_stats_reference` with ``members``: the sums over each member's row of ``[P, N/P]``."""
    p, n = members, action.shape[0] // members
    f64 = torch.float64
    d = done.view(p, n).to(f64)
    upd = torch.stack([
        (episode_return.view(p, n).to(f64) * d).sum(1),
        d.sum(1),
        (episode_length.view(p, n).to(f64) * d).sum(1),
        reward.view(p, n).to(f64).sum(1),
        torch.full((p,), float(n), dtype=f64, device=acc.device),
        torch.zeros(p, dtype=f64, device=acc.device) if traded is None else traded.view(p, n).to(f64).sum(1),
    ], dim=1)
    acc.add_(upd)
    if actions is not None:  # scatter_add_ raises on an action outside [0, A) rather than count it for another member
        actions.scatter_add_(1, action.view(p, n), torch.ones(p, n, dtype=f64, device=acc.device))
    if env_steps is not None:
        env_steps.add_(n)


# ---------------------------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------------------------
def _check_args(action, reward, done, episode_return, episode_length, traded, acc, actions, env_steps,
                members=None) -> None:
    if not isinstance(action, Tensor) or action.dim() != 1 or action.dtype != torch.int64:
        raise ValueError(f"step_stats: action must be an int64 tensor [N], got {describe(action)}")
    n, dev = action.shape[0], action.device
    if members is not None and (isinstance(members, bool) or not isinstance(members, int) or members < 1
                                or n % members):
        raise ValueError(f"step_stats: members must be None or an int >= 1 that divides N = {n}, got {members!r}")
    floats = (torch.float32, torch.float64)
    for name, t, dtypes in (("action", action, (torch.int64,)), ("reward", reward, floats),
                            ("done", done, (torch.bool,)), ("episode_return", episode_return, floats),
                            ("episode_length", episode_length, (torch.int64,)),
                            ("traded", traded, (torch.bool,))):
        if name == "traded" and t is None:
            continue
        if not isinstance(t, Tensor) or t.shape != (n,) or t.dtype not in dtypes or not t.is_contiguous() \
                or t.device != dev:
            raise ValueError(f"step_stats: {name} must be a contiguous {[str(x) for x in dtypes]} tensor [N] = [{n}] "
                             f"on {dev}, got {describe(t)}")
    if members is not None:
        _check_member_accumulators(acc, actions, members, dev)
    for name, t, shape, dtype in (("acc", acc, (NUM_FIELDS,), torch.float64),
                                  ("actions", actions, None, torch.float64),
                                  ("env_steps", env_steps, (), torch.int64)):
        if (name == "env_steps" and t is None) or (members is not None and name != "env_steps"):
            continue
        if (not isinstance(t, Tensor) or t.dtype != dtype or not t.is_contiguous() or t.device != dev
                or (shape is not None and t.shape != shape) or (shape is None and (t.dim() != 1 or t.numel() < 1))):
            want = "[A], A >= 1" if shape is None else list(shape)
            raise ValueError(f"step_stats: {name} must be a contiguous {dtype} tensor {want} on {dev}, got {describe(t)}")


def _check_member_accumulators(acc, actions, members: int, dev) -> None:
    """``acc`` float64 ``[P, NUM_FIELDS]`` with unit column stride; ``actions`` None or a contiguous
    float64 ``[P, A]``."""
    if (not isinstance(acc, Tensor) or acc.dtype != torch.float64 or acc.shape != (members, NUM_FIELDS)
            or acc.stride(1) != 1 or acc.device != dev):
        raise ValueError(f"step_stats: with members acc must be a float64 tensor [P, {NUM_FIELDS}] = "
                         f"[{members}, {NUM_FIELDS}] on {dev} with unit column stride, got {describe(acc)}")
    if actions is not None and (not isinstance(actions, Tensor) or actions.dtype != torch.float64
                                or actions.dim() != 2 or actions.shape[0] != members or actions.shape[1] < 1
                                or not actions.is_contiguous() or actions.device != dev):
        raise ValueError(f"step_stats: with members actions must be None or a contiguous float64 tensor "
                         f"[P, A] = [{members}, A >= 1] on {dev}, got {describe(actions)}")


def _check_scratch(scratch, n: int, dev: torch.device, members: int | None = None) -> None:
    if not isinstance(scratch, StepStatsScratch):
        raise ValueError(f"step_stats: the Triton kernel needs scratch=StepStatsScratch(N, device) (made once, e.g. "
                         f"by MemberStats), got {type(scratch).__name__}")
    if scratch.members != members:
        raise ValueError(f"step_stats: scratch made for members={scratch.members}, the call has members={members}")
    per = n // (members or 1)
    need = max(1, triton.cdiv(per, scratch.block)) * (members or 1)
    p, t = scratch.partials, scratch.ticket
    if (p.dtype != torch.float64 or p.dim() != 2 or p.shape[0] < need or p.shape[1] != NUM_FIELDS
            or not p.is_contiguous() or p.device != dev):
        raise ValueError(f"step_stats: scratch.partials must be a contiguous float64 tensor [>= {need}, {NUM_FIELDS}] "
                         f"on {dev} (N = {per} envs in blocks of {scratch.block}), got {describe(p)} on {p.device}")
    shape = () if members is None else (members,)
    if t.dtype != torch.int32 or t.shape != shape or t.device != dev:
        raise ValueError(f"step_stats: scratch.ticket must be an int32 tensor {list(shape)} on {dev}, got {describe(t)}")


def step_stats(action: Tensor, reward: Tensor, done: Tensor, episode_return: Tensor, episode_length: Tensor,
               traded: Tensor | None, acc: Tensor, actions: Tensor | None, env_steps: Tensor | None = None, *,
               members: int | None = None, scratch: StepStatsScratch | None = None, backend: str = "auto") -> None:
    """Add one env step of N envs to the monitoring accumulators (fields in the module docstring).

    Device ops only (no host reads): capturable in a CUDA graph. One kernel launch on CUDA, of
    ``ceil(N / scratch.block)`` programs (``ceil(N / P / scratch.block)`` per member with
    ``members``; summation order and determinism: module docstring).

    Args:
        action: int64 ``[N]``, the executed (env) actions, in ``[0, A)``.
        reward: float32 or float64 ``[N]``, unscaled.
        done: bool ``[N]``, the episode ended on this step.
        episode_return: float32 or float64 ``[N]``, the finished episode's return where done.
        episode_length: int64 ``[N]``, its length in env steps where done.
        traded: bool ``[N]``, the step filled an order; None for an env that does not trade (0 trades).
        acc: float64 ``[6]``, accumulated in place (with ``members``: ``[P, 6]``, unit column stride,
            any row stride).  actions: float64 ``[A]``, counts, in place (with ``members``:
            ``[P, A]`` contiguous, or None: no histogram).
        env_steps: int64 0-d or None: advanced by N (N/P with ``members``) in place.
        members: None (one run), or P: the envs are P members' N/P each, member-major (module
            docstring); P divides N.
        scratch: the kernel's :class:`StepStatsScratch` for at least N envs (N/P, made with the
            same ``members``), on the same device (its tickets zero between calls); required by the
            Triton backend, unused by the torch one.
        backend: "auto" (Triton for CUDA tensors, torch for CPU), "triton", "torch".

    Raises:
        ValueError: wrong dtype, shape or device of an argument, ``members`` not dividing N, an
            unknown backend, or the Triton backend without a scratch (or with one too small for N,
            made for other members, or on another device).
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check_args(action, reward, done, episode_return, episode_length, traded, acc, actions, env_steps, members)
    if resolve_backend("step_stats", backend, action) == "torch":
        step_stats_reference(action, reward, done, episode_return, episode_length, traded, acc, actions, env_steps,
                             members=members)
        return
    dev = action.device
    _check_scratch(scratch, action.shape[0], dev, members)
    empty = torch.empty(0, dtype=torch.float64, device=dev)
    _step_stats_op(action, reward, done.view(torch.uint8), episode_return, episode_length,
                   torch.empty(0, dtype=torch.uint8, device=dev) if traded is None else traded.view(torch.uint8),
                   acc, empty.view(1, 0) if actions is None else actions,
                   torch.empty(0, dtype=torch.int64, device=dev) if env_steps is None else env_steps,
                   scratch.partials, scratch.ticket, scratch.block, traded is not None, env_steps is not None,
                   members or 1, actions is not None)
