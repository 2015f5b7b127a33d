r"""ε-greedy action selection with the linear ε schedule, fused into one kernel.

Per env ``i`` of ``N`` (group ``g = i // (N // G)``, column ``j = i - g * (N // G)``), from the
Q-values ``q [N, A]``, the env-step counter ``step`` and pre-drawn uniforms ``u [G, 2, N // G]``::

    frac      = min(float32(step) / duration[g], 1)                     (float32, IEEE division)
    eps       = start[g] + (end[g] - start[g]) * frac                   (LinearSchedule, foxdqn/device/schedules.py)
    explore   = u[g, 0, j] < eps
    random_a  = (int64(u[g, 1, j] * 2**24) * A) >> 24                   (in [0, A), never A)
    action[i] = random_a if explore else argmax_a q[i, a]               (ties and NaN: as torch.argmax)

Watkins & Dayan's ε-greedy exploration with the linear ε decay of Mnih et al. 2015 (Methods,
"Training details"); docs/design/hot_loop.md#device-resident-values.

The random action is the integer map of :func:`foxdqn.ops.member_uniform.member_randint`: exact
in integers for uniforms on the 2**-24 grid (torch.rand's float32 values and
:class:`foxdqn.population.random.MemberRandom`'s), each action drawn by ``floor(2**24 / A)`` or
``ceil(2**24 / A)`` of the 2**24 values. So a population that passes its members' next 2·n
uniforms draws exactly what ``MemberRandom.uniform(n)`` then ``MemberRandom.randint(A, n)`` drew.
A single run draws ``torch.rand(1, 2, N)`` from its generator: one launch, where the former code
drew ``torch.rand(N)`` then ``torch.randint(0, A, (N,))`` (a different random stream; the
reference, :func:`epsilon_greedy_reference`, defines the semantics both backends follow).

The greedy action is the first index of the row's maximum, NaN counting as larger than any
number (torch.argmax's rule): the kernel reads the row in tiles of ``BLOCK_A`` columns and reduces
each tile in one pass of (value, column) pairs whose combine keeps the first NaN, else the larger
value, ties to the smaller column, then the running pick with the tile's (one tile for
A <= ``MAX_BLOCK_A``). The schedule is evaluated with the reference's float32
roundings (IEEE ``div_rn``, launched with ``enable_fp_fusion=False``: no multiply-add
contraction), so kernel and reference give the same actions bit for bit. The kernel issues every
load (schedule, uniforms, Q) before it evaluates the schedule, and is compiled per shape: A, Q's
strides and, for G > 1, N // G are constexpr (one group compiles once for any N); N a multiple of
BLOCK drops the row mask, and when a program's envs lie in one group (N // G a multiple of BLOCK)
its schedule is one scalar load and division.

Population: ``start``, ``end``, ``duration`` have one row per group (``G = P`` members of
``N // P`` envs each, ``G = 1`` for one run); one launch serves both.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.argmax import argmax_combine, tile_argmax
from foxdqn.ops.backend import resolve_backend
from foxdqn.ops.library import device_op, wrap_triton
from foxdqn.ops.member_uniform import randint_from_uniform
from foxdqn.device.schedules import linear_value

BLOCK = 8  # envs per program (with NUM_WARPS, from in-graph sweeps on the H200: docs/bench.md#launch-constants;
#           128 envs of 45 actions in one tile spill)
NUM_WARPS = 4  # warps per program
MAX_BLOCK_A = 64  # Q-value columns per tile of the argmax
RANDOM_BITS = 24  # bits of a uniform used by the random action (torch.rand float32 and MemberRandom)


# ---------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def _linear_epsilon(step, start, end, duration):
    """ε of the linear schedule (float32, shapes broadcast): the reference's roundings when the
    kernel is launched with ``enable_fp_fusion=False`` (IEEE ``div_rn``, no multiply-add)."""
    frac = tl.minimum(tl.math.div_rn(step, duration), 1.0)
    return start + (end - start) * frac


@triton.jit
def _explore_or_greedy(eps, u_explore, u_action, greedy, A, RANDOM_BITS: tl.constexpr):
    """The action: the random one (``u_action`` mapped to [0, A)) where ``u_explore < eps``, else ``greedy``."""
    random_a = ((u_action * (1 << RANDOM_BITS)).to(tl.int64) * A) >> RANDOM_BITS
    return tl.where(u_explore < eps, random_a, greedy)


@triton.jit
def _schedule_row(step_ptr, start_ptr, end_ptr, duration_ptr, g):
    """The step counter as float32 and group ``g``'s (start, end, duration): scalar loads."""
    return tl.load(step_ptr).to(tl.float32), tl.load(start_ptr + g), tl.load(end_ptr + g), tl.load(duration_ptr + g)


@triton.jit
def _act(greedy, step, start, end, duration, u_explore, u_action, A, RANDOM_BITS: tl.constexpr):
    """The ε-greedy action (int64) from the greedy one and the loaded schedule and uniforms: ε is
    evaluated here, after the caller's loads (evaluated before them, its IEEE division holds the
    loads back: docs/bench.md#launch-constants), then the explore test picks the random action or
    ``greedy``."""
    eps = _linear_epsilon(step, start, end, duration)
    return _explore_or_greedy(eps, u_explore, u_action, greedy.to(tl.int64), A, RANDOM_BITS)


@triton.jit
def store_member_actions(q, cols, cols_ok, A, out_ptr, rows, ok, p, M, step_ptr, start_ptr, end_ptr, duration_ptr,
                         u_ptr, RANDOM_BITS: tl.constexpr):
    """Store the ε-greedy actions (int64, at ``out_ptr + p·M + rows`` where ``ok``) of a register
    tile of Q rows ``q [R, C]`` (columns ``cols``, valid where ``cols_ok [C]``) of member ``p``:
    its schedule row, its uniforms ``u[p, 0 | 1, rows]`` (u ``[P, 2, M]``), torch.argmax's greedy
    pick (:func:`foxdqn.ops.argmax.tile_argmax`) and :func:`_act`. The epilogue of the population
    heads' fused ops (:mod:`foxdqn.ops.c51_epsilon_greedy`, :mod:`~foxdqn.ops.iqn_epsilon_greedy`,
    :mod:`~foxdqn.ops.branching_epsilon_greedy`)."""
    step, start, end, duration = _schedule_row(step_ptr, start_ptr, end_ptr, duration_ptr, p)
    u_row = u_ptr + p * (2 * M) + rows
    u_explore = tl.load(u_row, mask=ok, other=1.0)
    u_action = tl.load(u_row + M, mask=ok, other=0.0)
    _, greedy = tile_argmax(q, cols, cols_ok[None, :], A)
    tl.store(out_ptr + p * M + rows, _act(greedy, step, start, end, duration, u_explore, u_action, A, RANDOM_BITS),
             mask=ok)


@triton.jit
def _epsilon_greedy_kernel(q_ptr, step_ptr, start_ptr, end_ptr, duration_ptr, u_ptr, out_ptr, N,
                           A: tl.constexpr, ENVS_PER_GROUP: tl.constexpr, Q_STRIDE0: tl.constexpr,
                           Q_STRIDE1: tl.constexpr, ONE_GROUP: tl.constexpr, ONE_GROUP_PER_PROGRAM: tl.constexpr,
                           EVEN: tl.constexpr, BLOCK: tl.constexpr, BLOCK_A: tl.constexpr,
                           RANDOM_BITS: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:  # N a multiple of BLOCK: no row mask
        m = tl.full([BLOCK], True, tl.int1)
    else:
        m = i < N
    i64 = i.to(tl.int64)
    # ---- every load first: the schedule, the pre-drawn uniforms (explore test, random action), Q
    if ONE_GROUP:
        step, start, end, duration = _schedule_row(step_ptr, start_ptr, end_ptr, duration_ptr, 0)
        u_base = u_ptr + i64
        u_next = N  # u [1, 2, N]: the random actions' uniforms follow the N explore tests
    else:
        if ONE_GROUP_PER_PROGRAM:  # the program's envs all in group g: scalar loads and one division
            g = (tl.program_id(0) * BLOCK) // ENVS_PER_GROUP
            step, start, end, duration = _schedule_row(step_ptr, start_ptr, end_ptr, duration_ptr, g)
        else:
            g = i // ENVS_PER_GROUP  # int32 division, as i
            step = tl.load(step_ptr).to(tl.float32)
            start = tl.load(start_ptr + g, mask=m, other=0.0)
            end = tl.load(end_ptr + g, mask=m, other=0.0)
            duration = tl.load(duration_ptr + g, mask=m, other=1.0)
        u_base = u_ptr + g.to(tl.int64) * (2 * ENVS_PER_GROUP) + (i - g * ENVS_PER_GROUP)
        u_next = ENVS_PER_GROUP
    u_explore = tl.load(u_base, mask=m, other=1.0)
    u_action = tl.load(u_base + u_next, mask=m, other=0.0)
    # ---- argmax over the row, first maximum, NaN largest (torch.argmax), BLOCK_A columns per tile
    row = q_ptr + i64 * Q_STRIDE0
    best = tl.full([BLOCK], float("-inf"), q_ptr.dtype.element_ty)
    best_a = tl.full([BLOCK], A, tl.int32)
    for a0 in range(0, A, BLOCK_A):
        cols = a0 + tl.arange(0, BLOCK_A)
        cm = m[:, None] & (cols < A)[None, :]
        v = tl.load(row[:, None] + cols[None, :].to(tl.int64) * Q_STRIDE1, mask=cm, other=float("-inf"))
        top, pick = tile_argmax(v, cols, cm, A)
        best, best_a = argmax_combine(best, best_a, top, pick)  # an earlier tile's columns are smaller
    tl.store(out_ptr + i64, _act(best_a, step, start, end, duration, u_explore, u_action, A, RANDOM_BITS), mask=m)


@device_op("foxdqn::epsilon_greedy", mutates_args=())
def _epsilon_greedy_op(q: Tensor, step: Tensor, start: Tensor, end: Tensor, duration: Tensor, u: Tensor) -> Tensor:
    n, num_actions = q.shape
    out = torch.empty(n, device=q.device, dtype=torch.int64)
    if n:
        groups = start.shape[0]
        envs_per_group = n // groups if groups > 1 else 0  # constexpr: one group compiles once for any N
        wrap_triton(_epsilon_greedy_kernel)[(triton.cdiv(n, BLOCK),)](
            q, step, start, end, duration, u, out, n, A=num_actions, ENVS_PER_GROUP=envs_per_group,
            Q_STRIDE0=q.stride(0), Q_STRIDE1=q.stride(1), ONE_GROUP=groups == 1,
            ONE_GROUP_PER_PROGRAM=groups > 1 and envs_per_group % BLOCK == 0, EVEN=n % BLOCK == 0, BLOCK=BLOCK,
            BLOCK_A=min(triton.next_power_of_2(num_actions), MAX_BLOCK_A), RANDOM_BITS=RANDOM_BITS,
            num_warps=NUM_WARPS,
            enable_fp_fusion=False,  # no FMA contraction: the schedule's roundings are the reference's
        )
    return out


# ---------------------------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------------------------
#: ε per group, float32 ``[G]``: ``start + (end − start)·min(float32(step) / duration, 1)``, the
#: expression of :class:`~foxdqn.device.schedules.LinearSchedule` (:func:`~foxdqn.device.schedules.linear_value`)
epsilon_schedule_reference = linear_value


def epsilon_greedy_reference(q: Tensor, step: Tensor, start: Tensor, end: Tensor, duration: Tensor,
                             u: Tensor) -> Tensor:
    """Plain-torch reference of :func:`epsilon_greedy` (same arguments and result); device ops only."""
    n, num_actions = q.shape
    eps = epsilon_schedule_reference(step, start, end, duration)  # [G]
    explore = u[:, 0] < eps[:, None]  # [G, N // G]
    random_a = randint_from_uniform(u[:, 1], num_actions)  # the kernel's map, with RANDOM_BITS = 24
    return torch.where(explore.reshape(n), random_a.reshape(n), q.argmax(dim=1))


# ---------------------------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------------------------
def _check_args(q, step, start, end, duration, u) -> None:
    if not isinstance(q, Tensor) or q.dim() != 2 or q.dtype not in (torch.float32, torch.float64) or q.shape[1] < 1:
        raise ValueError(f"epsilon_greedy: q must be a float32 or float64 tensor [N, A] with A >= 1, got "
                         f"{getattr(q, 'dtype', type(q).__name__)} {tuple(getattr(q, 'shape', ()))}")
    check_schedule("epsilon_greedy", q.shape[0], "q", q.device, step, start, end, duration, u)


def check_schedule(op: str, n: int, of: str, device: torch.device, step, start, end, duration, u) -> None:
    """Raise ``ValueError`` (messages prefixed ``op``) unless step, start, end, duration and u are
    :func:`epsilon_greedy`'s arguments for ``n`` envs on ``device`` (the device of ``of``)."""
    if not isinstance(step, Tensor) or step.dim() != 0 or step.dtype != torch.int64:
        raise ValueError(f"{op}: step must be a 0-d int64 tensor, got "
                         f"{getattr(step, 'dtype', type(step).__name__)} {tuple(getattr(step, 'shape', ()))}")
    groups = start.shape[0] if isinstance(start, Tensor) and start.dim() == 1 else None
    for name, t in (("start", start), ("end", end), ("duration", duration)):
        if (not isinstance(t, Tensor) or t.dim() != 1 or t.dtype != torch.float32 or t.shape[0] != groups
                or not t.is_contiguous() or groups < 1):
            raise ValueError(f"{op}: {name} must be a contiguous float32 tensor [G] (G >= 1, the same G "
                             f"for start, end and duration), got {getattr(t, 'dtype', type(t).__name__)} "
                             f"{tuple(getattr(t, 'shape', ()))}")
    if n % groups:
        raise ValueError(f"{op}: N={n} envs do not split into G={groups} equal groups")
    shape = (groups, 2, n // groups)
    if not isinstance(u, Tensor) or tuple(u.shape) != shape or u.dtype != torch.float32 or not u.is_contiguous():
        raise ValueError(f"{op}: u must be a contiguous float32 tensor {list(shape)}, got "
                         f"{getattr(u, 'dtype', type(u).__name__)} {tuple(getattr(u, 'shape', ()))}")
    for name, t in (("step", step), ("start", start), ("end", end), ("duration", duration), ("u", u)):
        if t.device != device:
            raise ValueError(f"{op}: {name} is on {t.device}, {of} on {device}")


def check_member_schedule(op: str, x: Tensor, step, start, end, duration, u) -> None:
    """Raise ``ValueError`` (messages prefixed ``op``) unless step, start, end, duration and u are
    :func:`epsilon_greedy`'s arguments with one group per member of ``x`` ``[P, M, ...]`` (G = P,
    u ``[P, 2, M]``) on x's device: the schedule of the population heads' fused ops."""
    members = x.shape[0]
    if isinstance(start, Tensor) and start.dim() == 1 and start.shape[0] != members:
        raise ValueError(f"{op}: start, end and duration must hold one schedule per member (G = P = {members}), "
                         f"got G = {start.shape[0]}")
    check_schedule(op, members * x.shape[1], "h", x.device, step, start, end, duration, u)


def epsilon_greedy(q: Tensor, step: Tensor, start: Tensor, end: Tensor, duration: Tensor, u: Tensor, *,
                   backend: str = "auto") -> Tensor:
    """ε-greedy actions of N envs under the linear ε schedule (rules in the module docstring).

    Device ops only (no host reads): capturable in a CUDA graph. One kernel launch on CUDA.

    Args:
        q: float32 or float64 ``[N, A]`` Q-values (any strides), ``A >= 1``.
        step: int64 0-d, the schedule's counter (env steps).
        start, end: float32 ``[G]`` contiguous, ε at step 0 and from ``duration`` on, per group.
        duration: float32 ``[G]`` contiguous, steps of the linear part (>= 1 by the callers' clamp).
        u: float32 ``[G, 2, N // G]`` contiguous uniforms in [0, 1): ``u[g, 0]`` the explore tests,
            ``u[g, 1]`` the random actions of group g's envs.
        backend: "auto" (Triton for CUDA tensors, torch for CPU), "triton", "torch".

    Returns:
        int64 ``[N]`` actions in ``[0, A)``.

    Raises:
        ValueError: wrong dtype, shape or device of an argument, N not a multiple of G, or an
            unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check_args(q, step, start, end, duration, u)
    if resolve_backend("epsilon_greedy", backend, q) == "torch":
        return epsilon_greedy_reference(q, step, start, end, duration, u)
    return _epsilon_greedy_op(q, step, start, end, duration, u)
