"""(Double) DQN Huber TD loss in one kernel, with its gradient computed in the same pass.

Sources: Double DQN target, van Hasselt, Guez & Silver (2016), eq. 4; DQN target and Huber "error
clipping", Mnih et al. (2015); the importance-weighted mean of PER, Schaul et al. (2016), §3.4.
Per sample b (R_b the n-step reward sum, discount_b = γ^m or 0, foxdqn/replay/buffer.py):

    a*_b  = argmax_a Q_online(s'_b, a)                  (double; first index of the maximum)
    y_b   = R_b + discount_b · Q_target(s'_b, a*_b)     (double)  or  R_b + discount_b · max_a Q_target(s'_b, a)
    x_b   = Q(s_b, a_b) − y_b
    ℓ_b   = ½ x_b²  if |x_b| < δ  else  δ (|x_b| − ½ δ)           (torch.nn.functional.huber_loss)
    loss_g = Σ_{b in group g} w_b ℓ_b / B_g
    ∂loss_g/∂Q(s_b, a) = 1{a = a_b} · w_b / B_g · clamp(x_b, −δ, δ)

With ``cql_alpha`` (a population's CQL(H) members, Kumar et al. 2020, eq. 4; α_g float32 ``[G]``),
the kernel adds each member's conservative term and its gradient in the same pass (no launch of
its own; :mod:`foxdqn.ops.cql_loss` is the same term as an op for other heads), w_b = 1 without
weights:

    c_b    = logsumexp_a Q(s_b, a) − Q(s_b, a_b)
    loss_g += α_g · Σ_b w_b c_b / B_g
    ∂loss_g/∂Q(s_b, a) += α_g · w_b / B_g · (softmax_a Q(s_b, ·) − 1{a = a_b})

y is a constant (no gradient through the target or the online selection). G = 1 (one run): loss is
0-d, the mean over the batch (foxdqn.objectives.dqn.DQNObjective). G > 1 (a population of G
members, rows g·B_g .. (g+1)·B_g − 1 are member g's): δ is a ``[G]`` tensor and loss is ``[G]``
(foxdqn.population.objective.member_dqn_loss).

Stacked input: ``q`` may hold ``2B`` rows, laid out ``[G, 2, B_g, A]``: per group, the online Q of
its B_g states s, then of its B_g next states s' (one forward of the stacked batch,
foxdqn.ops.replay_gather ``stacked=True``); the s' rows serve the Double DQN selection and get a
zero gradient.

Registration: a ``torch.autograd.Function``. The forward kernel writes the loss, |x| (the PER
priority signal) and ∂loss/∂q; backward is one multiply of that saved gradient by the upstream
gradient, none where the upstream gradient is a population's unit seed
(:func:`foxdqn.device.scalars.is_ones_vector`: the saved gradient itself, the same bits).
Memory: the forward allocates ∂loss/∂q, a float32 tensor of ``q``'s shape ``[Rq, A]`` (``Rq`` = B,
or 2B when stacked), and keeps it until backward runs (or the graph is freed); the reference's
autograd keeps only ``[B]``-sized tensors (the gather index, the Huber inputs).
Capturable in a CUDA graph (device ops only, fixed shapes). Double backward is not supported.
NaN: a NaN in a row's inputs makes its x, hence its group's loss, NaN (an argmax over a row with
NaN picks the first NaN, as torch.argmax does); the other groups' losses stay finite; the guard
skips such an update.

Launch: one kernel of ``G · NB`` programs, ``NB = ceil(B_g / BLOCK_R)`` row blocks per group
(``_blocks``: a tile of at most ``TILE`` = 512 Q values, BLOCK_R halved until the launch has
``MIN_PROGRAMS`` = 64 programs; a training batch of 256..4,096 rows of 45 actions gives 64..512
programs). Program ``p = g·NB + k`` handles rows ``k·BLOCK_R ..`` of group g only (a block never
spans two groups, so [G] δ and P members need no second kernel): it writes their |x| and ∂loss/∂q
and its partial sum Σ w_b ℓ_b (``tl.sum``, a fixed reduction tree) into slot p of a float32
scratch ``partials``. The last program to finish sums, per group, the partials ``p ≡ r (mod
SUM_R)`` in increasing p into slot r, then the SUM_R (≤ 64) slots with ``tl.sum``, and writes
``loss_g`` = that sum · 1/B_g. It is found with a ticket, as in :mod:`foxdqn.ops.step_stats`:
every program, after a barrier of its warps (``tl.debug_barrier``), does one acq_rel GPU-scope
``atomic_add(ticket, 1)``, whose release orders its partial before the increment; the program
that draws ``G·NB − 1`` acquires every other increment (one release sequence), hence every
partial, before it reads them, and zeroes the ticket for the next launch (stream order). The
partials are indexed by program, not by finishing order, so the loss is the same bits from call
to call (for one shape and one compiled kernel). Rounding: this order (a block's tree, then the
blocks in strides of SUM_R) is neither torch's ``mean`` of the reference nor the single-program
loop over row blocks this kernel had before (loss values may differ from both in the last float32
bits; every term is added once); |x| and ∂loss/∂q are per row and unchanged. Triton's interpreter
runs the programs one after the other, so there the last program is simply the last (and the
interpreter uses ``INTERPRET_MIN_PROGRAMS`` = 1: fewer, larger blocks on the CPU).

Scratch: ``partials`` (float32 ``[G·NB]``) and ``ticket`` (int32 0-d, zero between launches) are
made by the first call of each (device, G·NB) and kept in a module-level cache for the life of
the process (a few KiB), never allocated again: a CUDA graph captured after that call keeps
pointing at them. Calls sharing an entry must be ordered (one stream, or graphs replayed in
order): two launches of the same size running concurrently on two streams would race on the
ticket. A call made while a CUDA graph is being captured and that finds no entry (no eager
warm-up of that size) takes a fresh zeroed pair from the graph's pool instead, not cached: the
graph then zeroes it (one more fill) at each replay.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from foxdqn.device.scalars import is_ones_vector
from foxdqn.ops.backend import check_devices, describe, flat_float32, group_count, resolve_backend
from foxdqn.ops.argmax import tile_argmax
from foxdqn.ops.cql_loss import cql_rows
from foxdqn.ops.tensor_list import last_of_group

__all__ = ["dqn_td_loss", "dqn_td_loss_reference", "huber_per_group"]


# ----------------------------------------------------------------------------- kernel
TILE = 512  #: elements of a program's [BLOCK_R, BLOCK_A] tile (an H200 sweep: docs/bench.md#launch-constants)
NUM_WARPS = 4  #: warps per program
MIN_PROGRAMS = 64  #: BLOCK_R is halved (down to 1) until a launch has at least this many programs
INTERPRET_MIN_PROGRAMS = 1  #: MIN_PROGRAMS in Triton's interpreter (each program is slow there: docs/bench.md#other-costs)
SUM_ROWS = 64  #: partials per group and iteration of the last program's loop (a power of two)
SUM_TILE = 1024  #: elements of the last program's [groups, SUM_R] tile


@triton.jit
def _dqn_td_loss_kernel(
    q_ptr,  # f32 [G, 2?, Bg, A] contiguous: online Q (with the s' rows when STACKED)
    qt_ptr,  # f32 [G·Bg, A] target Q of s'
    qo_ptr,  # f32 [G·Bg, A] online Q of s' (DOUBLE and not STACKED)
    action_ptr, reward_ptr, discount_ptr, weight_ptr,  # [G·Bg]
    delta_ptr,  # f32 [G] (DELTA_PER_GROUP)
    delta,  # float δ (not DELTA_PER_GROUP)
    alpha_ptr,  # f32 [G] CQL α (CQL)
    loss_ptr,  # f32 [G] out (written by the last program)
    td_ptr,  # f32 [G·Bg] out |x|
    dq_ptr,  # f32 like q, out ∂loss/∂q
    part_ptr,  # f32 [G·NB] scratch: program p's partial Σ w ℓ (p = g·NB + block)
    ticket_ptr,  # i32 0-d scratch, zero between launches
    G, Bg, A, inv_n,
    STACKED: tl.constexpr, DOUBLE: tl.constexpr, HAS_WEIGHT: tl.constexpr, DELTA_PER_GROUP: tl.constexpr,
    CQL: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_A: tl.constexpr, SUM_G: tl.constexpr, SUM_R: tl.constexpr,
):
    pid = tl.program_id(0)
    zero = tl.zeros([], dtype=tl.int64)  # an int argument equal to 1 arrives as a constexpr
    G, Bg, A = G + zero, Bg + zero, A + zero
    g, b, ok, NB = group_block_rows(Bg, BLOCK_R)  # this program's BLOCK_R rows b of group g
    inv_n = tl.cast(inv_n, tl.float32)
    if DELTA_PER_GROUP:
        d = tl.load(delta_ptr + g)
    else:
        d = tl.cast(delta, tl.float32)
    cols = tl.arange(0, BLOCK_A)
    col_ok = cols < A

    # ---- this program's BLOCK_R rows of group g: |x|, ∂loss/∂q and one partial loss sum
    row = g * Bg + b  # sample row
    if STACKED:
        q_row = g * 2 * Bg + b
        next_row = q_row + Bg
    else:
        q_row = row
    m2 = ok[:, None] & col_ok[None, :]
    a = tl.load(action_ptr + row, mask=ok, other=0)
    hit = cols[None, :] == a[:, None]
    qs = tl.load(q_ptr + q_row[:, None] * A + cols[None, :], mask=m2, other=0.0)
    q_sa = tl.sum(tl.where(hit, qs, 0.0), axis=1)
    qt = tl.load(qt_ptr + row[:, None] * A + cols[None, :], mask=m2, other=float("-inf"))
    if DOUBLE:
        if STACKED:
            qo = tl.load(q_ptr + next_row[:, None] * A + cols[None, :], mask=m2, other=float("-inf"))
        else:
            qo = tl.load(qo_ptr + row[:, None] * A + cols[None, :], mask=m2, other=float("-inf"))
        # argmax as torch.argmax: the first NaN if any, else the first index of the maximum
        _, a_star = tile_argmax(qo, cols, m2, A)
        q_next = tl.sum(tl.where(cols[None, :] == a_star[:, None], qt, 0.0), axis=1)
    else:
        nan = qt != qt
        top = tl.max(tl.where(nan, float("-inf"), qt), axis=1)
        q_next = tl.where(tl.max(nan.to(tl.int32), axis=1) > 0, float("nan"), top)
    q_next = tl.where(ok, q_next, 0.0)  # masked rows: no −inf · 0
    r = tl.load(reward_ptr + row, mask=ok, other=0.0)
    disc = tl.load(discount_ptr + row, mask=ok, other=0.0)
    x = q_sa - (r + disc * q_next)
    z = tl.abs(x)
    loss = tl.where(z < d, 0.5 * z * z, d * (z - 0.5 * d))
    scale = inv_n
    if HAS_WEIGHT:
        w = tl.load(weight_ptr + row, mask=ok, other=0.0)
        loss = loss * w
        scale = inv_n * w
    # huber_loss_backward: −δ where x ≤ −δ, δ where x ≥ δ, else x (NaN stays NaN)
    grad = tl.where(x <= -d, -d, tl.where(x >= d, d, x)) * scale
    dq = tl.where(hit, grad[:, None], 0.0)
    if CQL:  # α_g · w_b (logsumexp_a Q(s_b, a) − Q(s_b, a_b)) and its gradient (module docstring)
        alpha = tl.load(alpha_ptr + g)
        c, dc = cql_rows(qs, hit, ok, col_ok)
        if HAS_WEIGHT:
            loss = loss + alpha * (c * w)
            dq += dc * (alpha * scale)[:, None]
        else:
            loss = loss + alpha * c
            dq += dc * (alpha * scale)
    tl.store(part_ptr + pid, tl.sum(tl.where(ok, loss, 0.0), axis=0))
    tl.store(td_ptr + row, z, mask=ok)
    tl.store(dq_ptr + q_row[:, None] * A + cols[None, :], dq, mask=m2)
    if STACKED:
        tl.store(dq_ptr + next_row[:, None] * A + cols[None, :], tl.zeros([BLOCK_R, BLOCK_A], tl.float32),
                 mask=m2)

    # ---- the last program sums each group's partials in program order (module docstring)
    group_sums_of_last_program(part_ptr, ticket_ptr, loss_ptr, G, NB, inv_n, SUM_G, SUM_R)


@triton.jit
def group_block_rows(Bg, BLOCK_R: tl.constexpr):
    """``(g, b, ok, NB)`` of this program of a launch of ``G · NB`` programs, ``NB = cdiv(Bg,
    BLOCK_R)`` row blocks per group (``Bg`` int64): program ``p = g·NB + k`` takes rows
    ``b = k·BLOCK_R + [0, BLOCK_R)`` of group g, those with ``ok`` (``b < Bg``) real. Also serves
    :mod:`foxdqn.ops.iql_loss`."""
    NB = tl.cdiv(Bg, BLOCK_R)
    pid = tl.program_id(0)
    b = (pid % NB) * BLOCK_R + tl.arange(0, BLOCK_R)
    return pid // NB, b, b < Bg, NB


@triton.jit
def group_sums_of_last_program(part_ptr, ticket_ptr, loss_ptr, G, NB, inv_n, SUM_G: tl.constexpr,
                               SUM_R: tl.constexpr):
    """The end of a launch of ``G · NB`` programs that each stored one partial sum (program
    ``p = g·NB + k`` into ``part_ptr[p]``): every program draws a ticket, and the last one writes
    ``loss_ptr[g]`` = (group g's partials summed in program order, strides of SUM_R) · ``inv_n``
    and zeroes the ticket (module docstring). Also serves :mod:`foxdqn.ops.iql_loss`."""
    if last_of_group(ticket_ptr, tl.num_programs(0)):  # the whole launch is one group of tickets
        sr = tl.arange(0, SUM_R)
        for g0 in range(0, G, SUM_G):
            gg = g0 + tl.arange(0, SUM_G)
            slots = tl.zeros([SUM_G, SUM_R], tl.float32)
            for p0 in range(0, NB, SUM_R):
                pp = p0 + sr
                slots += tl.load(part_ptr + gg[:, None] * NB + pp[None, :],
                                 mask=(gg < G)[:, None] & (pp < NB)[None, :], other=0.0)
            tl.store(loss_ptr + gg, tl.sum(slots, axis=1) * inv_n, mask=gg < G)
        tl.store(ticket_ptr, 0)


def seed_scaled(grad: torch.Tensor, grad_loss: torch.Tensor, groups: int) -> torch.Tensor:
    """A loss backward's saved gradient ``grad`` (``groups`` groups of rows, group-major) times each
    group's upstream gradient ``grad_loss`` (``[groups]``, or 0-d for one group); ``grad`` itself,
    no multiply and the same bits, where ``grad_loss`` is a population's unit seed
    (:func:`foxdqn.device.scalars.is_ones_vector`). Shared by the losses of this module,
    :mod:`~foxdqn.ops.iql_loss`, :mod:`~foxdqn.ops.iqn_loss` and :mod:`~foxdqn.ops.branching_loss`."""
    if is_ones_vector(grad_loss):
        return grad
    return (grad.view(groups, -1) * grad_loss.reshape(-1, 1)).view(grad.shape)


def _blocks(groups: int, rows_per_group: int, num_actions: int, min_programs: int = MIN_PROGRAMS
            ) -> tuple[int, int, int, int]:
    """(BLOCK_R, BLOCK_A, SUM_G, SUM_R) of a launch; its grid is ``groups · cdiv(rows_per_group, BLOCK_R)``
    programs. BLOCK_R: the rows of a ``TILE``-element tile (at most the group's rows, rounded up to
    a power of two), halved while the launch has fewer than ``min_programs`` programs. With
    ``MIN_PROGRAMS``, one group, A = 45 (BLOCK_A = 64): B = 256 gives BLOCK_R = 4 and 64
    programs, B = 4,096 gives BLOCK_R = 8 and 512 programs."""
    block_a = triton.next_power_of_2(num_actions)
    block_r = max(1, min(triton.next_power_of_2(max(rows_per_group, 1)), TILE // block_a))
    while block_r > 1 and groups * triton.cdiv(rows_per_group, block_r) < min_programs:
        block_r //= 2
    return (block_r, block_a, *group_sum_blocks(groups, triton.cdiv(rows_per_group, block_r)))


def group_sum_blocks(groups: int, blocks_per_group: int) -> tuple[int, int]:
    """(SUM_G, SUM_R) of :func:`group_sums_of_last_program` for ``groups`` groups of
    ``blocks_per_group`` programs each: SUM_R partials per group and iteration (a power of two, at
    most :data:`SUM_ROWS`), SUM_G groups per tile of at most :data:`SUM_TILE` elements. Also serves
    :mod:`foxdqn.ops.iqn_loss` and :mod:`foxdqn.ops.c51_loss`."""
    sum_r = min(triton.next_power_of_2(blocks_per_group), SUM_ROWS)
    return max(1, min(triton.next_power_of_2(groups), SUM_TILE // sum_r)), sum_r


_SCRATCH: dict[tuple[torch.device, int], tuple[torch.Tensor, torch.Tensor]] = {}


def _scratch(device: torch.device, programs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's (partials f32 [programs], ticket i32 0-d) for ``device``: made (zeroed) on the
    first call of each (device, programs) and kept for the life of the process (module docstring)."""
    key = (device, programs)
    got = _SCRATCH.get(key)
    if got is None:
        got = (torch.zeros(programs, device=device, dtype=torch.float32),
               torch.zeros((), device=device, dtype=torch.int32))
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return got  # graph-pool memory, zeroed by the graph at each replay: not kept (module docstring)
        _SCRATCH[key] = got
    return got


class _DQNTDLoss(torch.autograd.Function):
    """loss, |x| = kernel(q, ...); backward: saved ∂loss/∂q times the upstream gradient."""

    @staticmethod
    def forward(ctx, q, q_next_target, q_next_online, action, reward, discount, weight, delta_t, delta_f,
                groups, stacked, double, cql_alpha):
        rows = action.shape[0]
        dev = q.device
        loss = torch.empty(groups, device=dev, dtype=torch.float32)
        td_abs = torch.empty(rows, device=dev, dtype=torch.float32)
        dq = torch.empty_like(q)
        bg = rows // groups
        if rows:
            block_r, block_a, sum_g, sum_r = _blocks(groups, bg, q.shape[1],
                                                     MIN_PROGRAMS if q.is_cuda else INTERPRET_MIN_PROGRAMS)
            programs = groups * triton.cdiv(bg, block_r)
            partials, ticket = _scratch(dev, programs)
            _dqn_td_loss_kernel[(programs,)](
                q, q_next_target, q_next_online if q_next_online is not None else q_next_target,
                action, reward, discount, weight if weight is not None else reward,
                delta_t if delta_t is not None else reward, delta_f,
                cql_alpha if cql_alpha is not None else reward, loss, td_abs, dq, partials, ticket,
                groups, bg, q.shape[1], 1.0 / bg,
                STACKED=stacked, DOUBLE=double, HAS_WEIGHT=weight is not None,
                DELTA_PER_GROUP=delta_t is not None, CQL=cql_alpha is not None, BLOCK_R=block_r, BLOCK_A=block_a, SUM_G=sum_g, SUM_R=sum_r,
                num_warps=NUM_WARPS)
        else:
            loss.fill_(float("nan"))  # the mean of nothing, as torch's
            dq.zero_()
        ctx.save_for_backward(dq)
        ctx.groups = groups
        ctx.mark_non_differentiable(td_abs)
        ctx.set_materialize_grads(False)  # no zeros filled for td_abs's (unused) gradient
        return (loss if delta_t is not None else loss.view(())), td_abs

    @staticmethod
    def backward(ctx, grad_loss, grad_td):
        (dq,) = ctx.saved_tensors
        if grad_loss is None:  # the loss did not reach the backward's roots
            return (None,) * 13
        grad_q = seed_scaled(dq, grad_loss, ctx.groups)
        return grad_q, None, None, None, None, None, None, None, None, None, None, None, None


# ----------------------------------------------------------------------------- checks
def _check(q, q_next_target, action, reward, discount, weight, q_next_online, double, huber_delta):
    """Validate; returns (q [Rq, A], q_next_target [B, A], q_next_online [B, A] | None, action,
    reward, discount, weight (flat [B] | None), groups, stacked)."""
    op = "dqn_td_loss"
    if q.dim() not in (2, 3) or q.dtype != torch.float32:
        raise ValueError(f"{op}: q must be float32 [B, A], [2B, A] or [G, ·, A], got {describe(q)}")
    a = q.shape[-1]
    q2 = q.reshape(-1, a)
    action = action.reshape(-1)
    b = action.shape[0]
    if action.dtype != torch.int64:
        raise ValueError(f"{op}: action must be int64 [B], got {describe(action)}")
    if a < 1 or q2.shape[0] not in (b, 2 * b):
        raise ValueError(f"{op}: q must have B={b} or 2B={2 * b} rows of A >= 1 actions, got {describe(q)}")
    stacked = q2.shape[0] == 2 * b and b > 0
    if stacked and not double:
        raise ValueError(f"{op}: a stacked q (2B rows: s then s') serves Double DQN only; pass double=True "
                         "or the B rows of s")
    if double and not stacked and q_next_online is None:
        raise ValueError(f"{op}: double=True needs q_next_online [B, A] or a stacked q of 2B rows")
    if stacked and q_next_online is not None:
        raise ValueError(f"{op}: give q_next_online or a stacked q, not both")
    q_next_target = q_next_target.reshape(-1, a) if q_next_target.shape[-1] == a else q_next_target
    if tuple(q_next_target.shape) != (b, a) or q_next_target.dtype != torch.float32:
        raise ValueError(f"{op}: q_next_target must be float32 [{b}, {a}], got {describe(q_next_target)}")
    if q_next_online is not None:
        if not double:
            raise ValueError(f"{op}: q_next_online is for double=True only")
        q_next_online = q_next_online.reshape(-1, a) if q_next_online.shape[-1] == a else q_next_online
        if tuple(q_next_online.shape) != (b, a) or q_next_online.dtype != torch.float32:
            raise ValueError(f"{op}: q_next_online must be float32 [{b}, {a}], got {describe(q_next_online)}")
    flat = flat_float32(op, b, (("reward", reward), ("discount", discount), ("weight", weight)))
    groups = group_count(op, "huber_delta", huber_delta, b, lambda d: d > 0, "a finite number > 0")
    check_devices(op, q, (("q_next_target", q_next_target), ("q_next_online", q_next_online), ("action", action),
                          ("reward", flat[0]), ("discount", flat[1]), ("weight", flat[2]), ("huber_delta", huber_delta)))
    return q2, q_next_target, q_next_online, action, *flat, groups, stacked


def _check_cql(cql_alpha, huber_delta, q) -> None:
    """``cql_alpha``: None, or float32 ``[G]`` on ``q``'s device with a ``[G]`` ``huber_delta``."""
    if cql_alpha is None:
        return
    if not isinstance(huber_delta, torch.Tensor) or not isinstance(cql_alpha, torch.Tensor) \
            or cql_alpha.dtype != torch.float32 or cql_alpha.shape != huber_delta.shape or cql_alpha.device != q.device:
        want = f"[{huber_delta.shape[0]}]" if isinstance(huber_delta, torch.Tensor) else "[G] with a [G] huber_delta"
        raise ValueError(f"dqn_td_loss: cql_alpha must be float32 {want} (one CQL α per group) on {q.device}, "
                         f"got {describe(cql_alpha)}")


# ----------------------------------------------------------------------------- reference
def huber_per_group(x: torch.Tensor, huber_delta: torch.Tensor) -> torch.Tensor:
    """Elementwise Huber penalty of ``x`` ``[G, ...]`` with group g's δ (``huber_delta`` float32
    ``[G]``): ``½ x²`` where ``|x| <= δ_g``, else ``δ_g (|x| − ½ δ_g)`` (torch.nn.functional.huber_loss
    with a δ per group; differentiable in ``x``)."""
    z = x.abs()
    delta = huber_delta.view(-1, *([1] * (x.dim() - 1)))
    return torch.where(z <= delta, 0.5 * x * x, delta * (z - 0.5 * delta))


def _reference(q2, q_next_target, q_next_online, action, reward, discount, weight, huber_delta, groups, stacked,
               double, cql_alpha=None):
    b, a = action.shape[0], q2.shape[1]
    if stacked:
        q4 = q2.view(groups, 2, b // groups, a)
        q_s = q4[:, 0].reshape(b, a)
        q_next_online = q4[:, 1].reshape(b, a)
    else:
        q_s = q2
    q_sa = q_s.gather(1, action[:, None]).squeeze(1)
    with torch.no_grad():  # foxdqn.objectives.dqn.double_dqn_target on given Q values
        if double:
            q_next = q_next_target.gather(1, q_next_online.argmax(dim=1, keepdim=True)).squeeze(1)
        else:
            q_next = q_next_target.max(dim=1).values
        y = reward + discount * q_next
    if isinstance(huber_delta, torch.Tensor):  # a δ per group (the population's members)
        per = huber_per_group((q_sa - y).view(groups, -1), huber_delta)
        if weight is not None:
            per = per * weight.view(groups, -1)
        loss = per.mean(dim=1)
        if cql_alpha is not None:  # + α · CQL(H), as foxdqn.objectives.cql.cql_regulariser computes it
            c = (torch.logsumexp(q_s, dim=-1) - q_sa).view(groups, -1)
            if weight is not None:
                c = c * weight.view(groups, -1)
            loss = loss + cql_alpha * c.mean(dim=-1)
    else:
        per = F.huber_loss(q_sa, y, reduction="none", delta=float(huber_delta))
        loss = (per * weight).mean() if weight is not None else per.mean()  # objectives.base.weighted_mean
    return loss, (q_sa - y).detach().abs()


def dqn_td_loss_reference(q, q_next_target, action, reward, discount, weight=None, *, q_next_online=None,
                          double=True, huber_delta=1.0, cql_alpha=None):
    """Plain-torch :func:`dqn_td_loss` (same arguments and results), differentiable by autograd:
    today's DQNObjective / member_dqn_loss arithmetic on given Q values."""
    q2, qt, qo, action, reward, discount, weight, groups, stacked = _check(
        q, q_next_target, action, reward, discount, weight, q_next_online, double, huber_delta)
    _check_cql(cql_alpha, huber_delta, q)
    return _reference(q2, qt, qo, action, reward, discount, weight, huber_delta, groups, stacked, double, cql_alpha)


# ----------------------------------------------------------------------------- public
def dqn_td_loss(q: torch.Tensor, q_next_target: torch.Tensor, action: torch.Tensor, reward: torch.Tensor,
                discount: torch.Tensor, weight: torch.Tensor | None = None, *,
                q_next_online: torch.Tensor | None = None, double: bool = True,
                huber_delta: float | torch.Tensor = 1.0, cql_alpha: torch.Tensor | None = None,
                backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """(Double) DQN Huber TD loss, its |TD| and (in backward) its gradient w.r.t. ``q``.

    Formulas: module docstring. One forward kernel (a grid of G·NB row-block programs; the loss is
    summed by the last program, the same bits on every call: module docstring), one multiply in
    backward. The first call of each size on a device allocates the kernel's small scratch, kept
    for the process (warm up eagerly before a CUDA graph capture).

    Args:
        q: float32 online Q values with gradient: ``[B, A]`` of the states s, or ``[2B, A]``
            stacked ``[G, 2, B/G, A]`` (per group its s rows, then its s' rows; Double DQN only;
            the s' rows get zero gradient). ``[G, B/G, A]`` / ``[G, 2B/G, A]`` are the same.
        q_next_target: float32 ``[B, A]`` target-network Q of s' (treated as a constant).
        action: int64 ``[B]`` in [0, A) (a device value: not checked; out of range gives Q(s, a) = 0
            in the kernel).
        reward: float32 ``[B]``, the n-step discounted reward sum (reward units).
        discount: float32 ``[B]``, γ^m, 0 where s' is terminal.
        weight: float32 ``[B]`` importance weights, or None (all 1).
        q_next_online: float32 ``[B, A]`` online Q of s' for the Double DQN selection, when ``q``
            is not stacked (treated as a constant).
        double: Double DQN (van Hasselt et al. 2016) target; False: max_a Q_target(s', a).
        huber_delta: δ > 0 in reward units (float), or float32 ``[G]`` (G dividing B), one δ per
            group of B/G consecutive rows.
        cql_alpha: None, or float32 ``[G]`` (with a ``[G]`` ``huber_delta``): each group's CQL α >= 0;
            its α · CQL(H) term (module docstring) is added to the group's loss and gradient in the
            same kernel.
        backend: ``"auto"`` (Triton for CUDA tensors, else torch), ``"triton"``, ``"torch"``.

    Returns:
        (loss, td_abs): loss float32 0-d (float δ) or ``[G]`` (tensor δ), the weighted mean of the
        per-sample Huber loss per group, differentiable w.r.t. ``q``; td_abs float32 ``[B]``,
        |Q(s, a) − y| detached (unweighted). On the Triton backend the loss's graph holds the
        gradient w.r.t. ``q`` (float32, ``q``'s ``[Rq, A]`` size) from this call until backward.

    Raises:
        ValueError: wrong shapes, dtypes or devices; a stacked ``q`` without ``double`` or with
            ``q_next_online``; double without an online Q of s'; a bad ``huber_delta``; an
            unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    q2, qt, qo, action, reward, discount, weight, groups, stacked = _check(
        q, q_next_target, action, reward, discount, weight, q_next_online, double, huber_delta)
    _check_cql(cql_alpha, huber_delta, q)
    if resolve_backend("dqn_td_loss", backend, q) == "torch":
        return _reference(q2, qt, qo, action, reward, discount, weight, huber_delta, groups, stacked, double,
                          cql_alpha)
    delta_t = huber_delta.contiguous() if isinstance(huber_delta, torch.Tensor) else None
    delta_f = 1.0 if delta_t is not None else float(huber_delta)
    return _DQNTDLoss.apply(q2.contiguous(), qt.detach().contiguous(),
                            None if qo is None else qo.detach().contiguous(), action.contiguous(),
                            reward.contiguous(), discount.contiguous(),
                            None if weight is None else weight.contiguous(), delta_t, delta_f, groups, stacked,
                            bool(double), None if cql_alpha is None else cql_alpha.contiguous())
