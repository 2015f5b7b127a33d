"""Implicit Q-Learning's loss L_Q + L_V in one kernel, with its gradients computed in the same pass.

Source: Kostrikov, Nair & Levine (2021), "Offline Reinforcement Learning with Implicit Q-Learning",
§4, eqs. 5–6 (the arithmetic of :func:`foxdqn.objectives.iql.iql_loss`, whose docstring derives
it); the importance-weighted mean of PER, Schaul et al. (2016), §3.4. Per sample b of group g
(R_b the n-step reward sum, discount_b = γ^m or 0, foxdqn/replay/buffer.py; τ_g the group's
expectile):

    u_b     = Q_target(s_b, a_b) − V(s_b)
    L_V,b   = |τ_g − 1{u_b < 0}| u_b²                         (eq. 5, :func:`expectile_loss`)
    td_b    = R_b + discount_b · V(s'_b) − Q(s_b, a_b)
    L_Q,b   = td_b²                                           (eq. 6)
    loss_g  = Σ_{b in group g} w_b (L_Q,b + L_V,b) / B_g
    ∂loss_g/∂Q(s_b, a) = −1{a = a_b} · 2 td_b · w_b / B_g
    ∂loss_g/∂V(s_b)    = −2 |τ_g − 1{u_b < 0}| u_b · w_b / B_g

Q_target(s, ·) and V(s') are constants (the target network; V(s') detached in eq. 6), so L_V sends
no gradient to Q and L_Q none to V(s). G = 1 (one run, a float τ): loss is 0-d
(foxdqn.objectives.iql.IQLObjective). G > 1 or a ``[G]`` τ (a population of G members, rows
g·B_g .. (g+1)·B_g − 1 are member g's): loss is ``[G]`` (foxdqn.population.objective.member_loss).

Registration: a ``torch.autograd.Function``, as :mod:`foxdqn.ops.dqn_td_loss`. The forward kernel
writes the loss, |td_b| (detached: td's only use is PER's priority signal) and both gradients;
backward multiplies the saved gradients by the upstream gradient (one multiply each; none for a
population's unit seed, :func:`foxdqn.device.scalars.is_ones_vector`). Memory: the
forward allocates ∂loss/∂q (float32, ``[G·B_g, A]``, contiguous whatever ``q``'s strides) and
∂loss/∂V (float32 ``[G·B_g]``) and keeps them until backward runs (or the graph is freed). Capturable in a CUDA graph (device ops only, fixed shapes).
Double backward is not supported. NaN: a NaN in a row's inputs makes its loss terms, hence its
group's loss, NaN (and its |td| and gradients); the other groups' stay finite; the guard skips such
an update.

Launch: one kernel of ``G · NB`` programs, ``NB = ceil(B_g / BLOCK_R)`` row blocks per group. Unlike
:mod:`foxdqn.ops.dqn_td_loss`, BLOCK_R is chosen from one group's rows alone (``_blocks``: a tile of
at most ``dqn_td_loss.TILE`` values, halved until one group has ``MIN_PROGRAMS`` blocks), so that a
member's blocks, its partial sums and their order, hence its loss's bits, are those of its run of
one member whatever the population's size. Program ``p = g·NB + k`` handles rows ``k·BLOCK_R ..``
of group g only: it reads Q(s, a) and Q_target(s, a) at the taken action only (one value a row,
through ``q``'s strides), writes |td|, ∂loss/∂V and the row's ∂loss/∂q (zero off the taken action)
and its partial Σ w_b (L_Q,b + L_V,b) (``tl.sum``, a fixed tree) into slot p of a float32 scratch.
The last program to finish (a ticket, as in :mod:`foxdqn.ops.dqn_td_loss`:
``dqn_td_loss.group_sums_of_last_program``) sums each group's partials in program order and
writes ``loss_g`` = that sum · 1/B_g: the same bits from call to call for one shape and one
compiled kernel. Rounding: that order is not torch's ``mean`` of the reference's two terms (the
loss may differ from it in the last float32 bits); the gradients are per row. Triton's interpreter
uses ``INTERPRET_MIN_PROGRAMS`` = 1 (fewer, larger blocks on the CPU).

Scratch: the partials and ticket of :func:`foxdqn.ops.dqn_td_loss._scratch`, one cache per
(device, programs) shared with that op (a few KiB, made on the first call of a size and kept for
the process; a CUDA graph captured after that call keeps pointing at them). Calls sharing an entry
must be ordered (one stream, or graphs replayed in order), as that op's docstring says.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from foxdqn.ops import dqn_td_loss as _td
from foxdqn.ops.backend import check_devices, describe, flat_float32, group_count, resolve_backend
from foxdqn.ops.dqn_td_loss import group_block_rows, group_sums_of_last_program

__all__ = ["iql_loss", "iql_loss_reference", "expectile_loss"]

NUM_WARPS = 4  #: warps per program
MIN_PROGRAMS = 64  #: BLOCK_R is halved (down to 1) until one group has at least this many row blocks
INTERPRET_MIN_PROGRAMS = 1  #: MIN_PROGRAMS in Triton's interpreter (each program is slow there)


# ----------------------------------------------------------------------------- kernel
@triton.jit
def _iql_loss_kernel(
    q_ptr,  # f32 [G, Bg, A] (strides q_sg, q_sb, q_sa): online Q of s
    qt_ptr,  # f32 [G, Bg, A] (strides qt_sg, qt_sb, qt_sa): target Q of s
    v_ptr, vn_ptr,  # f32 [G·Bg]: V(s), V(s')
    action_ptr, reward_ptr, discount_ptr, weight_ptr,  # [G·Bg]
    tau_ptr,  # f32 [G] (TAU_PER_GROUP)
    tau, one_minus_tau,  # float τ and 1 − τ (not TAU_PER_GROUP)
    loss_ptr,  # f32 [G] out (written by the last program)
    td_ptr,  # f32 [G·Bg] out |td|
    dq_ptr,  # f32 [G·Bg, A] contiguous, out ∂loss/∂q
    dv_ptr,  # f32 [G·Bg] out ∂loss/∂V(s)
    part_ptr,  # f32 [G·NB] scratch: program p's partial Σ w (L_Q + L_V)
    ticket_ptr,  # i32 0-d scratch, zero between launches
    G, Bg, A, inv_n, q_sg, q_sb, q_sa, qt_sg, qt_sb, qt_sa,
    TAU_PER_GROUP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_A: tl.constexpr, SUM_G: tl.constexpr,
    SUM_R: tl.constexpr,
):
    zero = tl.zeros([], dtype=tl.int64)  # an int argument equal to 1 arrives as a constexpr
    G, Bg, A = G + zero, Bg + zero, A + zero
    q_sg, q_sb, q_sa = q_sg + zero, q_sb + zero, q_sa + zero
    qt_sg, qt_sb, qt_sa = qt_sg + zero, qt_sb + zero, qt_sa + zero
    g, b, ok, NB = group_block_rows(Bg, BLOCK_R)  # this program's BLOCK_R rows b of group g
    inv_n = tl.cast(inv_n, tl.float32)
    if TAU_PER_GROUP:
        t = tl.load(tau_ptr + g)
        t_neg = 1.0 - t  # float32, as the reference's 1.0 − τ of a float32 tensor
    else:
        t = tl.cast(tau, tl.float32)
        t_neg = tl.cast(one_minus_tau, tl.float32)  # rounded from the host's double, as torch.where's scalar

    # ---- this program's rows: td, ∂loss/∂V, ∂loss/∂q and one partial loss sum
    row = g * Bg + b  # sample row
    a = tl.load(action_ptr + row, mask=ok, other=0)
    a_ok = ok & (a >= 0) & (a < A)
    q_sa_v = tl.load(q_ptr + g * q_sg + b * q_sb + a * q_sa, mask=a_ok, other=0.0)  # Q(s, a)
    qt_sa_v = tl.load(qt_ptr + g * qt_sg + b * qt_sb + a * qt_sa, mask=a_ok, other=0.0)  # Q_target(s, a)
    v = tl.load(v_ptr + row, mask=ok, other=0.0)
    vn = tl.load(vn_ptr + row, mask=ok, other=0.0)
    r = tl.load(reward_ptr + row, mask=ok, other=0.0)
    disc = tl.load(discount_ptr + row, mask=ok, other=0.0)
    w = tl.load(weight_ptr + row, mask=ok, other=0.0)
    u = qt_sa_v - v
    k = tl.where(u < 0, t_neg, t)  # |τ − 1{u<0}| (a NaN u takes τ, as torch.where; u² is NaN anyway)
    loss_v = k * (u * u)  # eq. 5
    td = (r + disc * vn) - q_sa_v
    loss_q = td * td  # eq. 6
    loss = loss_q * w + loss_v * w
    tl.store(part_ptr + tl.program_id(0), tl.sum(tl.where(ok, loss, 0.0), axis=0))
    tl.store(td_ptr + row, tl.abs(td), mask=ok)
    scale = w * inv_n
    tl.store(dv_ptr + row, -((scale * k) * (2.0 * u)), mask=ok)
    grad = -(scale * (2.0 * td))
    cols = tl.arange(0, BLOCK_A)
    hit = cols[None, :] == a[:, None]
    tl.store(dq_ptr + row[:, None] * A + cols[None, :], tl.where(hit, grad[:, None], 0.0),
             mask=ok[:, None] & (cols < A)[None, :])

    # ---- the last program sums each group's partials in program order (module docstring)
    group_sums_of_last_program(part_ptr, ticket_ptr, loss_ptr, G, NB, inv_n, SUM_G, SUM_R)


def _blocks(groups: int, rows_per_group: int, num_actions: int, min_programs: int = MIN_PROGRAMS
            ) -> tuple[int, int, int, int]:
    """(BLOCK_R, BLOCK_A, SUM_G, SUM_R) of a launch of ``groups · cdiv(rows_per_group, BLOCK_R)``
    programs: BLOCK_R, BLOCK_A and SUM_R are :func:`foxdqn.ops.dqn_td_loss._blocks`'s for one group
    (independent of ``groups``: module docstring); SUM_G the groups of the last program's tile."""
    block_r, block_a, _, sum_r = _td._blocks(1, rows_per_group, num_actions, min_programs)
    sum_g = max(1, min(triton.next_power_of_2(groups), _td.SUM_TILE // sum_r))
    return block_r, block_a, sum_g, sum_r


class _IQLLoss(torch.autograd.Function):
    """loss, |td| = kernel(q, ...); backward: saved ∂loss/∂q and ∂loss/∂V times the upstream gradient."""

    @staticmethod
    def forward(ctx, q3, qt3, v, v_next, action, reward, discount, weight, tau_t, tau_f, groups):
        rows = action.shape[0]
        dev = q3.device
        a_n = q3.shape[2]
        loss = torch.empty(groups, device=dev, dtype=torch.float32)
        td = torch.empty(rows, device=dev, dtype=torch.float32)
        dq = torch.empty(rows, a_n, device=dev, dtype=torch.float32)
        dv = torch.empty(rows, device=dev, dtype=torch.float32)
        bg = rows // groups
        if rows:
            block_r, block_a, sum_g, sum_r = _blocks(groups, bg, a_n,
                                                     MIN_PROGRAMS if q3.is_cuda else INTERPRET_MIN_PROGRAMS)
            programs = groups * triton.cdiv(bg, block_r)
            partials, ticket = _td._scratch(dev, programs)
            _iql_loss_kernel[(programs,)](
                q3, qt3, v, v_next, action, reward, discount, weight, tau_t if tau_t is not None else reward,
                tau_f, 1.0 - tau_f, loss, td, dq, dv, partials, ticket,
                groups, bg, a_n, 1.0 / bg, *q3.stride(), *qt3.stride(),
                TAU_PER_GROUP=tau_t is not None, BLOCK_R=block_r, BLOCK_A=block_a, SUM_G=sum_g, SUM_R=sum_r,
                num_warps=NUM_WARPS)
        else:
            loss.fill_(float("nan"))  # the mean of nothing, as torch's
            dq.zero_()
            dv.zero_()
        ctx.save_for_backward(dq, dv)
        ctx.groups = groups
        ctx.q_shape, ctx.v_shape = q3.shape, v.shape
        ctx.mark_non_differentiable(td)
        ctx.set_materialize_grads(False)  # no zeros filled for td's (unused) gradient
        return (loss if tau_t is not None else loss.view(())), td

    @staticmethod
    def backward(ctx, grad_loss, grad_td):
        dq, dv = ctx.saved_tensors
        none = (None,) * 9
        if grad_loss is None:  # the loss did not reach the backward's roots
            return (None, None, *none)
        groups = grad_loss.numel()  # 1 (0-d loss) or G
        grad_q = grad_v = None
        if ctx.needs_input_grad[0]:
            grad_q = _td.seed_scaled(dq, grad_loss, groups).view(ctx.q_shape)
        if ctx.needs_input_grad[2]:
            grad_v = _td.seed_scaled(dv, grad_loss, groups).view(ctx.v_shape)
        return grad_q, None, grad_v, *none[:8]


# ----------------------------------------------------------------------------- checks
def _check(q, q_target, v, v_next, action, reward, discount, weight, expectile):
    """Validate; returns (q [G, B_g, A] (a view), q_target [G, B_g, A] (a view), v, v_next, action,
    reward, discount, weight (flat [B]), groups)."""
    op = "iql_loss"
    if q.dim() not in (2, 3) or q.dtype != torch.float32 or q.shape[-1] < 1:
        raise ValueError(f"{op}: q must be float32 [B, A] or [G, B/G, A] with A >= 1, got {describe(q)}")
    a = q.shape[-1]
    action = action.reshape(-1)
    b = action.shape[0]
    if action.dtype != torch.int64:
        raise ValueError(f"{op}: action must be int64 [B], got {describe(action)}")
    if q.numel() != b * a:
        raise ValueError(f"{op}: q must have B={b} rows of A actions, got {describe(q)}")
    if tuple(q_target.shape) != tuple(q.shape) or q_target.dtype != torch.float32:
        raise ValueError(f"{op}: q_target must be float32 of q's shape {list(q.shape)}, got {describe(q_target)}")
    groups = group_count(op, "expectile", expectile, b, lambda t: 0.0 < t < 1.0, "a number in (0, 1)")
    if q.dim() == 3 and q.shape[0] != groups:
        raise ValueError(f"{op}: q [G, B/G, A] must have G={groups} groups (expectile's), got {describe(q)}")
    flat = flat_float32(op, b, (("v", v), ("v_next", v_next), ("reward", reward), ("discount", discount),
                                ("weight", weight)))
    check_devices(op, q, (("q_target", q_target), ("v", v), ("v_next", v_next), ("action", action),
                          ("reward", reward), ("discount", discount), ("weight", weight), ("expectile", expectile)))
    shape3 = (groups, b // groups, a)
    return q.view(shape3), q_target.view(shape3), *flat[:2], action, *flat[2:], groups


# ----------------------------------------------------------------------------- reference
def expectile_loss(diff: torch.Tensor, tau: float | torch.Tensor) -> torch.Tensor:
    """IQL eq. 5 asymmetric square L₂^τ(u) = |τ − 1{u < 0}| · u², elementwise.

    Args:
        diff: float32 [...] u = Q_target(s, a) − V(s).
        tau: expectile in (0, 1): a float, or a float32 tensor that broadcasts against ``diff``
            (a population's ``[P, 1]``, one τ per member).

    Returns:
        float32 [...], differentiable w.r.t. ``diff`` (the indicator is piecewise constant).
    """
    weight = torch.where(diff < 0, 1.0 - tau, tau)  # |τ − 1{u<0}|
    return weight * diff.square()


def _reference(q3, qt3, v, v_next, action, reward, discount, weight, expectile, groups):
    """The arithmetic :func:`foxdqn.objectives.iql.iql_loss` had before this op: rows ``[B]`` for a
    float τ, ``[G, B_g]`` for a ``[G]`` τ, means over the last axis."""
    if isinstance(expectile, torch.Tensor):
        rows, tau = q3.shape[:2], expectile.view(groups, 1)
    else:
        rows, tau = (action.shape[0],), expectile
    q_all = q3.reshape(*rows, q3.shape[2])
    act = action.view(rows)[..., None]
    q_sa = q_all.gather(-1, act).squeeze(-1)
    v_s = v.view(rows)
    with torch.no_grad():
        q_target_sa = qt3.reshape(*rows, q3.shape[2]).gather(-1, act).squeeze(-1)
        y = reward.view(rows) + discount.view(rows) * v_next.view(rows)  # eq. 6 target
    loss_v = expectile_loss(q_target_sa - v_s, tau)  # eq. 5
    td = y - q_sa
    loss_q = td.square()  # eq. 6
    w = weight.view(rows)  # objectives.base.weighted_mean, twice
    return (loss_q * w).mean(dim=-1) + (loss_v * w).mean(dim=-1), td.detach().abs().reshape(-1)


def iql_loss_reference(q, q_target, v, v_next, action, reward, discount, weight, expectile):
    """Plain-torch :func:`iql_loss` (same arguments and results), differentiable by autograd."""
    checked = _check(q, q_target, v, v_next, action, reward, discount, weight, expectile)
    return _reference(*checked[:-1], expectile, checked[-1])


# ----------------------------------------------------------------------------- public
def iql_loss(q: torch.Tensor, q_target: torch.Tensor, v: torch.Tensor, v_next: torch.Tensor, action: torch.Tensor,
             reward: torch.Tensor, discount: torch.Tensor, weight: torch.Tensor, expectile: float | torch.Tensor, *,
             backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """IQL's loss L_Q + L_V (Kostrikov et al. 2021, eqs. 5–6), its |td| and (in backward) its
    gradients w.r.t. ``q`` (at the taken actions) and ``v``.

    Formulas: module docstring. One forward kernel (a grid of G·NB row-block programs; each
    group's loss summed by the last program, the same bits on every call and whatever G), one
    multiply per input in backward. The first call of each size on a device allocates the kernel's
    small scratch, kept for the process (warm up eagerly before a CUDA graph capture).

    Args:
        q: float32 online Q of the states s, with gradient: ``[B, A]``, or ``[G, B/G, A]``
            (member-major); any strides (read in place, not copied).
        q_target: float32, ``q``'s shape: target-network Q of s (a constant); any strides.
        v: float32 V(s), with gradient: B elements (``[B]`` or ``[G, B/G]``; contiguous, or it is copied).
        v_next: float32 V(s'), B elements (a constant).
        action: int64 ``[B]`` in [0, A) (a device value: not checked; out of range reads Q = 0 in
            the kernel).
        reward: float32 ``[B]``, the n-step discounted reward sum (reward units).
        discount: float32 ``[B]``, γ^m, 0 where s' is terminal.
        weight: float32 ``[B]``, the replay importance weights (ones with uniform replay).
        expectile: τ in (0, 1), a float (one run; 0-d loss), or float32 ``[G]`` (G dividing B; its
            values are not checked), one τ per group of B/G consecutive rows.
        backend: ``"auto"`` (Triton for CUDA tensors, else torch), ``"triton"``, ``"torch"``.

    Returns:
        (loss, td_abs): loss float32 0-d (float τ) or ``[G]`` (tensor τ), Σ_b w_b (L_Q,b + L_V,b) / B_g
        of each group's own rows, differentiable w.r.t. ``q`` and ``v``; td_abs float32 ``[B]`` =
        |R + discount · V(s') − Q(s, a)|, detached (PER's priority signal: the kernel writes it, no
        ``abs`` launch after it). On the Triton backend the loss's graph holds ∂loss/∂q (float32
        ``[B, A]``) and ∂loss/∂V (``[B]``) from this call until backward.

    Raises:
        ValueError: wrong shapes, dtypes or devices; a float τ not in (0, 1); a ``[G]`` τ whose G
            does not divide B or differs from ``q``'s leading axis; an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    q3, qt3, v1, vn1, action, reward, discount, weight, groups = _check(
        q, q_target, v, v_next, action, reward, discount, weight, expectile)
    if resolve_backend("iql_loss", backend, q) == "torch":
        return _reference(q3, qt3, v1, vn1, action, reward, discount, weight, expectile, groups)
    tau_t = expectile.contiguous() if isinstance(expectile, torch.Tensor) else None
    tau_f = 0.5 if tau_t is not None else float(expectile)
    loss, td_abs = _IQLLoss.apply(q3, qt3.detach(), v1.contiguous(), vn1.detach().contiguous(), action.contiguous(),
                                  reward.contiguous(), discount.contiguous(), weight.contiguous(), tau_t, tau_f,
                                  groups)
    return loss, td_abs
