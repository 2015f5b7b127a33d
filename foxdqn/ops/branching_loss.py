"""Action branching's (BDQ) loss in one kernel, from the heads' raw outputs, with its gradient
computed in the same pass.

Source: Tavakoli, Pardo & Kormushev (2018), "Action Branching Architectures for Deep Reinforcement
Learning": eq. 1 (the dueling aggregation per branch), eq. 6 (the mean-operator target with the
online network's per-branch argmax), eq. 7 (the loss averaged over branches; Huber here, as
:class:`foxdqn.objectives.branching.BranchingObjective`); the importance-weighted mean of PER,
Schaul et al. (2016), §3.4. Per sample b of group g (R_b the n-step reward sum, discount_b = γ^m or
0, foxdqn/replay/buffer.py; δ_g the group's Huber threshold; D branches of n_d sub-actions):

    Q_d(s, ·)   = V(s) + A_d(s, ·) − mean_j A_d(s, j)        (eq. 1; A_d alone without dueling)
    a*_d        = argmax_j Q^sel_d(s'_b, j)                   (Q^sel: the online network's, Double DQN;
                                                               the target's otherwise; the exposure
                                                               branch d = 0 minus D · penalty_b)
    y_b         = R_b + discount_b · (1/D) Σ_d Q^target_d(s'_b, a*_d)            (eq. 6)
    x_db        = Q_d(s_b, a_db) − y_b                         (a_db: the joint action's branch d)
    loss_g      = Σ_{b in group g} w_b · (1/D) Σ_d Huber_δg(x_db) / B_g
    td_abs_b    = (1/D) Σ_d |x_db|                             (PER's priority signal)
    ∂loss_g/∂A_d(s_b, j) = c_db · (1{j = a_db} − 1/n_d)       (1{j = a_db} without dueling)
    ∂loss_g/∂V(s_b)      = Σ_d c_db,   c_db = w_b / (D · B_g) · Huber'_δg(x_db)

The joint action a = Σ_d a_d · Π_{e>d} n_e (row-major, first branch slowest:
:func:`foxdqn.nn.branching.factor_branches`). The kernel also writes the joint Q of s,
``(1/D) Σ_d Q_d(s, a_d)`` for all Π n_d joint actions (:func:`foxdqn.nn.branching.combine_branches`,
the same sums in the same order), which the monitors read (no gradient).

The arithmetic is :func:`branching_loss_reference`'s, which is the population's torch ops before
this op (:func:`foxdqn.population.objective.member_branching_loss`,
:func:`foxdqn.objectives.branching.branching_target`).
Rounding: the mean of A_d is ``tl.sum`` / n_d (torch's own order of summing n_d <= 64 values may
differ in the last bit), and the loss's sum is in program order (as :mod:`foxdqn.ops.dqn_td_loss`'s);
the rest is elementwise, as the reference. Ties of the argmax take the first index (as torch);
a NaN in Q^sel is not picked as the maximum here, where torch's argmax picks it (its target value
is then the one read; the guard skips an update whose loss is NaN in either).

Registration: a ``torch.autograd.Function``, as :mod:`foxdqn.ops.iql_loss`. The forward kernel
writes the loss, |td| (mean over branches), the joint Q and the gradient w.r.t. every branch's A_d
and V(s), into one float32 buffer ``[B, Σ n_d + 1]`` (A_0's columns, A_1's, .., V's last); backward
multiplies it by the upstream gradient (one multiply; none for a population's unit seed,
:func:`foxdqn.device.scalars.is_ones_vector`) and hands each input its columns (strided views).
Memory: that buffer lives until backward runs (or the graph is freed). Capturable in a CUDA graph
(device ops only, fixed shapes). Double backward is not supported.

Stacked (``stacked=True``): the online tensors hold ``2B`` rows, each group's B_g rows of s then its
B_g rows of s' (one forward of the replay's stacked pair, as :mod:`foxdqn.ops.dqn_td_loss`'s
STACKED): the selection reads the s' rows, the gradient buffer has ``2B`` rows and the kernel
writes zeros into the s' rows' (they only select).

Launch: one kernel of ``G · NB`` programs, ``NB = ceil(B_g / BLOCK_R)`` row blocks per group,
BLOCK_R from one group's rows alone (:func:`foxdqn.ops.iql_loss._blocks`' rule), so that a member's
loss has the bits of its run of one member whatever the population's size; each group's loss is
summed by the last program (:func:`foxdqn.ops.dqn_td_loss.group_sums_of_last_program`). Scratch:
:func:`foxdqn.ops.dqn_td_loss._scratch`'s, shared with that op (its docstring: calls on one stream).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from foxdqn.ops import dqn_td_loss as _td
from foxdqn.ops.backend import check_devices, describe, flat_float32, group_count, resolve_backend
from foxdqn.ops.dqn_td_loss import group_block_rows, group_sums_of_last_program, huber_per_group
from foxdqn.ops.iql_loss import _blocks

__all__ = ["branching_loss", "branching_loss_reference", "MAX_BRANCHES"]

NUM_WARPS = 4  #: warps per program
MIN_PROGRAMS = 64  #: BLOCK_R is halved (down to 1) until one group has at least this many row blocks
INTERPRET_MIN_PROGRAMS = 1  #: MIN_PROGRAMS in Triton's interpreter (each program is slow there)
MAX_BRANCHES = 3  #: branches the kernel takes (trading's exposure, order type, urgency)


# ----------------------------------------------------------------------------- kernel
@triton.jit
def _q_tile(a_ptr, v, row, ok, N: tl.constexpr, BLOCK_N: tl.constexpr, DUELING: tl.constexpr):
    """(Q ``[BLOCK_R, BLOCK_N]``, mean_j A ``[BLOCK_R]``, cols, mask) of one branch's A ``[rows, N]``
    (contiguous) at ``row``: ``(V + A) − mean A`` (eq. 1), A alone without DUELING."""
    cols = tl.arange(0, BLOCK_N)
    m = ok[:, None] & (cols < N)[None, :]
    a = tl.load(a_ptr + row[:, None] * N + cols[None, :], mask=m, other=0.0)
    if DUELING:
        mean = tl.sum(a, axis=1) / N
        q = (v[:, None] + a) - mean[:, None]
    else:
        mean = tl.zeros_like(v)
        q = a
    return q, mean, cols, m


@triton.jit
def _branch(qa_ptr, ta_ptr, sa_ptr, pen_ptr, v, vt, vs, srow, row, nrow, ok, a_d, D: tl.constexpr, N: tl.constexpr,
            PENALISED: tl.constexpr, BLOCK_N: tl.constexpr, DUELING: tl.constexpr):
    """(Q_d(s, a_d), Q^target_d(s', a*_d), mean_j A_d(s, j)) of one branch, ``[BLOCK_R]`` each: the
    online tensors read at rows ``srow``, the target's (and the penalty) at ``row``, the selecting
    network's at ``nrow``."""
    q, mean, cols, m = _q_tile(qa_ptr, v, srow, ok, N, BLOCK_N, DUELING)
    q_sa = tl.sum(tl.where(cols[None, :] == a_d[:, None], q, 0.0), axis=1)
    qt, _, _, _ = _q_tile(ta_ptr, vt, row, ok, N, BLOCK_N, DUELING)
    qs, _, _, _ = _q_tile(sa_ptr, vs, nrow, ok, N, BLOCK_N, DUELING)
    if PENALISED:
        pen = tl.load(pen_ptr + row[:, None] * N + cols[None, :], mask=m, other=0.0)
        qs = qs - D * pen
    best = tl.argmax(tl.where(m, qs, float("-inf")), axis=1, tie_break_left=True)
    q_next = tl.sum(tl.where(cols[None, :] == best[:, None], qt, 0.0), axis=1)
    return q_sa, q_next, mean


@triton.jit
def _huber(x, delta):
    """(Huber_δ(x), Huber'_δ(x)) elementwise (:func:`foxdqn.ops.dqn_td_loss.huber_per_group`)."""
    z = tl.abs(x)
    small = z <= delta
    value = tl.where(small, 0.5 * x * x, delta * (z - 0.5 * delta))
    slope = tl.where(small, x, tl.where(x < 0, -delta, delta))
    return value, slope


@triton.jit
def _store_grad(grad_ptr, row, ok, a_d, c, W, OFF: tl.constexpr, N: tl.constexpr, BLOCK_N: tl.constexpr,
                DUELING: tl.constexpr):
    """∂loss/∂A_d of one branch into its columns ``OFF .. OFF + N`` of the ``[rows, W]`` buffer."""
    cols = tl.arange(0, BLOCK_N)
    hit = tl.where(cols[None, :] == a_d[:, None], c[:, None], 0.0)
    if DUELING:
        hit = hit - (c / N)[:, None]
    tl.store(grad_ptr + row[:, None] * W + OFF + cols[None, :], hit, mask=ok[:, None] & (cols < N)[None, :])


@triton.jit
def _joint_q_part(a_ptr, v, mean, row, j, m, STRIDE: tl.constexpr, N: tl.constexpr, DUELING: tl.constexpr):
    """Q_d(s, j_d) at each joint action j (``j_d = (j // STRIDE) % N``), ``[BLOCK_R, BLOCK_J]``."""
    jd = (j // STRIDE) % N
    a = tl.load(a_ptr + row[:, None] * N + jd[None, :], mask=m, other=0.0)
    if DUELING:
        return (v[:, None] + a) - mean[:, None]
    return a


@triton.jit
def _branching_loss_kernel(
    qa0, qa1, qa2, qv,  # f32 [G·Bg, n_d] contiguous, [G·Bg]: the online heads' A_d(s), V(s)
    ta0, ta1, ta2, tv,  # the same of the target network at s'
    sa0, sa1, sa2, sv,  # the same of the selecting network at s' (the online's, or the target's)
    action_ptr, reward_ptr, discount_ptr, weight_ptr,  # [G·Bg]
    delta_ptr,  # f32 [G]: Huber δ per group
    pen_ptr,  # f32 [G·Bg, N0]: the exposure branch's penalty at s' (PENALISED)
    loss_ptr,  # f32 [G] out (written by the last program)
    td_ptr,  # f32 [G·Bg] out |td| (mean over branches)
    grad_ptr,  # f32 [G·Bg, W] out: ∂loss/∂A_0 | ∂loss/∂A_1 | .. | ∂loss/∂V
    joint_ptr,  # f32 [G·Bg, N0·N1·N2] out: the joint Q of s
    part_ptr,  # f32 [G·NB] scratch: program p's partial Σ w · per-sample loss
    ticket_ptr,  # i32 0-d scratch, zero between launches
    G, Bg, W, inv_n,
    STACKED: tl.constexpr, D: tl.constexpr, N0: tl.constexpr, N1: tl.constexpr, N2: tl.constexpr, DUELING: tl.constexpr,
    PENALISED: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_J: tl.constexpr,
    BLOCK_W: tl.constexpr, SUM_G: tl.constexpr, SUM_R: tl.constexpr,
):
    zero = tl.zeros([], dtype=tl.int64)  # an int argument equal to 1 arrives as a constexpr
    G, Bg, W = G + zero, Bg + zero, W + zero
    g, b, ok, NB = group_block_rows(Bg, BLOCK_R)
    inv_n = tl.cast(inv_n, tl.float32)
    row = g * Bg + b  # the batch's row: target, penalty, action, reward, |td|, joint Q
    if STACKED:  # the online tensors hold each group's s rows, then its s' rows (the selecting network's)
        srow = g * (2 * Bg) + b
        nrow = srow + Bg
    else:
        srow = row
        nrow = row
    delta = tl.load(delta_ptr + g)
    act = tl.load(action_ptr + row, mask=ok, other=0)
    if DUELING:
        v = tl.load(qv + srow, mask=ok, other=0.0)
        vt = tl.load(tv + row, mask=ok, other=0.0)
        vs = tl.load(sv + nrow, mask=ok, other=0.0)
    else:
        v = tl.zeros([BLOCK_R], tl.float32)
        vt = v
        vs = v
    r = tl.load(reward_ptr + row, mask=ok, other=0.0)
    disc = tl.load(discount_ptr + row, mask=ok, other=0.0)
    w = tl.load(weight_ptr + row, mask=ok, other=0.0)

    # the joint action's branches, first branch slowest (factor_branches)
    a0 = act // (N1 * N2)
    a1 = (act // N2) % N1
    a2 = act % N2
    q0, n0, m0 = _branch(qa0, ta0, sa0, pen_ptr, v, vt, vs, srow, row, nrow, ok, a0, D, N0, PENALISED, BLOCK_N, DUELING)
    next_sum = n0
    if D > 1:
        q1, n1, m1 = _branch(qa1, ta1, sa1, pen_ptr, v, vt, vs, srow, row, nrow, ok, a1, D, N1, False, BLOCK_N, DUELING)
        next_sum = next_sum + n1
    if D > 2:
        q2, n2, m2 = _branch(qa2, ta2, sa2, pen_ptr, v, vt, vs, srow, row, nrow, ok, a2, D, N2, False, BLOCK_N, DUELING)
        next_sum = next_sum + n2
    y = r + disc * (next_sum / D)  # eq. 6

    x0 = q0 - y
    h0, s0 = _huber(x0, delta)
    h_sum = h0
    z_sum = tl.abs(x0)
    if D > 1:
        x1 = q1 - y
        h1, s1 = _huber(x1, delta)
        h_sum = h_sum + h1
        z_sum = z_sum + tl.abs(x1)
    if D > 2:
        x2 = q2 - y
        h2, s2 = _huber(x2, delta)
        h_sum = h_sum + h2
        z_sum = z_sum + tl.abs(x2)
    per_sample = h_sum / D
    tl.store(part_ptr + tl.program_id(0), tl.sum(tl.where(ok, per_sample * w, 0.0), axis=0))
    tl.store(td_ptr + row, z_sum / D, mask=ok)

    # gradients: c_db = w_b / (D · B_g) · Huber'(x_db)
    scale = (w * inv_n) / D
    c0 = scale * s0
    _store_grad(grad_ptr, srow, ok, a0, c0, W, 0, N0, BLOCK_N, DUELING)
    c_sum = c0
    if D > 1:
        c1 = scale * s1
        _store_grad(grad_ptr, srow, ok, a1, c1, W, N0, N1, BLOCK_N, DUELING)
        c_sum = c_sum + c1
    if D > 2:
        c2 = scale * s2
        _store_grad(grad_ptr, srow, ok, a2, c2, W, N0 + N1, N2, BLOCK_N, DUELING)
        c_sum = c_sum + c2
    # V's column: ∂loss/∂V(s) with dueling, else zeros (no input reads it; written so the buffer holds no garbage)
    tl.store(grad_ptr + srow * W + (W - 1), c_sum if DUELING else tl.zeros_like(c_sum), mask=ok)
    if STACKED:  # the s' rows' gradient: zero (they select only)
        wc = tl.arange(0, BLOCK_W)
        tl.store(grad_ptr + nrow[:, None] * W + wc[None, :], tl.zeros([BLOCK_R, BLOCK_W], tl.float32),
                 mask=ok[:, None] & (wc < W)[None, :])

    # the joint Q of s (combine_branches: ((Q_0 + Q_1) + Q_2) / D, broadcast over the joint actions)
    j = tl.arange(0, BLOCK_J)
    jm = ok[:, None] & (j < N0 * N1 * N2)[None, :]
    total = _joint_q_part(qa0, v, m0, srow, j, jm, N1 * N2, N0, DUELING)
    if D > 1:
        total = total + _joint_q_part(qa1, v, m1, srow, j, jm, N2, N1, DUELING)
    if D > 2:
        total = total + _joint_q_part(qa2, v, m2, srow, j, jm, 1, N2, DUELING)
    tl.store(joint_ptr + row[:, None] * (N0 * N1 * N2) + j[None, :], total / D, mask=jm)

    group_sums_of_last_program(part_ptr, ticket_ptr, loss_ptr, G, NB, inv_n, SUM_G, SUM_R)


class _BranchingLoss(torch.autograd.Function):
    """loss, |td|, joint Q = kernel(A_d, V, ...); backward: the saved gradient times the upstream one.

    ``heads``: the online network's D flat ``[B, n_d]`` advantages and ``[B]`` value (None without
    dueling), then the target's, then the selecting network's, each contiguous; ``stacked``: the
    online tensors have ``2B`` rows (each group's s rows, then its s' rows) and the selecting
    network's entries are the online tensors again (read at the s' rows; no gradient)."""

    @staticmethod
    def forward(ctx, groups, sizes, dueling, stacked, penalty, action, reward, discount, weight, delta, *heads):
        d = len(sizes)
        rows = action.shape[0]
        dev = action.device
        width = sum(sizes) + 1
        nj = math.prod(sizes)
        loss = torch.empty(groups, device=dev, dtype=torch.float32)
        td = torch.empty(rows, device=dev, dtype=torch.float32)
        grad = torch.empty(2 * rows if stacked else rows, width, device=dev, dtype=torch.float32)
        joint = torch.empty(rows, nj, device=dev, dtype=torch.float32)
        bg = rows // groups
        if rows:
            n = list(sizes) + [1] * (MAX_BRANCHES - d)
            args = []
            for k in range(3):  # online, target, select: MAX_BRANCHES advantage pointers (the first repeated), V
                adv, v = list(heads[k * (d + 1):k * (d + 1) + d]), heads[k * (d + 1) + d]
                args += adv + [adv[0]] * (MAX_BRANCHES - d) + [v if v is not None else reward]
            block_r, block_j, sum_g, sum_r = _blocks(groups, bg, nj,
                                                     MIN_PROGRAMS if dev.type == "cuda" else INTERPRET_MIN_PROGRAMS)
            programs = groups * triton.cdiv(bg, block_r)
            partials, ticket = _td._scratch(dev, programs)
            _branching_loss_kernel[(programs,)](
                *args, action, reward, discount, weight, delta, penalty if penalty is not None else reward,
                loss, td, grad, joint, partials, ticket, groups, bg, width, 1.0 / bg,
                STACKED=stacked, D=d, N0=n[0], N1=n[1], N2=n[2], DUELING=dueling, PENALISED=penalty is not None,
                BLOCK_R=block_r, BLOCK_N=triton.next_power_of_2(max(sizes)), BLOCK_J=block_j,
                BLOCK_W=triton.next_power_of_2(width), SUM_G=sum_g, SUM_R=sum_r, num_warps=NUM_WARPS)
        else:
            loss.fill_(float("nan"))  # the mean of nothing, as torch's
            grad.zero_()
        ctx.save_for_backward(grad)
        ctx.groups, ctx.sizes, ctx.dueling = groups, tuple(sizes), dueling
        ctx.mark_non_differentiable(td, joint)
        ctx.set_materialize_grads(False)
        return loss, td, joint

    @staticmethod
    def backward(ctx, grad_loss, grad_td, grad_joint):
        (grad,) = ctx.saved_tensors
        d = len(ctx.sizes)
        first = 10  # the online tensors' place among forward's inputs
        if grad_loss is None:  # the loss did not reach the backward's roots
            return (None,) * (first + 3 * (d + 1))
        scaled = _td.seed_scaled(grad, grad_loss, ctx.groups)
        out, col = [], 0
        for k, size in enumerate(ctx.sizes):
            out.append(scaled[:, col:col + size] if ctx.needs_input_grad[first + k] else None)
            col += size
        v_grad = scaled[:, -1] if ctx.dueling and ctx.needs_input_grad[first + d] else None
        return (None,) * first + (*out, v_grad) + (None,) * (2 * (d + 1))


# ----------------------------------------------------------------------------- checks
def _check(online, target, select, action, reward, discount, weight, huber_delta, penalty, stacked=False):
    """Validate; returns (sizes, dueling, groups, action, reward, discount, weight, penalty)."""
    op = "branching_loss"
    if stacked and select is not None:
        raise ValueError(f"{op}: stacked: select must be None (the online tensors' s' rows select)")
    heads = (("online", online), ("target", target)) + ((("select", select),) if not stacked else ())
    for name, head in heads:
        if not isinstance(head, (tuple, list)) or len(head) != 2 or not isinstance(head[0], (tuple, list)):
            raise ValueError(f"{op}: {name} must be (advantages: a list of D tensors, value: a tensor or None), "
                             f"got {type(head).__name__}")
    adv0, v0 = online
    d = len(adv0)
    if not 1 <= d <= MAX_BRANCHES:
        raise ValueError(f"{op}: online must have 1 to {MAX_BRANCHES} branches, got {d}")
    action = action.reshape(-1)
    b = action.shape[0]
    if action.dtype != torch.int64:
        raise ValueError(f"{op}: action must be int64 [B], got {describe(action)}")
    sizes = []
    for k, a in enumerate(adv0):
        if not isinstance(a, torch.Tensor) or a.dtype != torch.float32 or a.dim() < 2 or a.shape[-1] < 1:
            raise ValueError(f"{op}: online's advantages[{k}] must be float32 [..., n_{k}], got {describe(a)}")
        sizes.append(a.shape[-1])
    dueling = v0 is not None
    for name, (adv, v) in heads:
        rows = 2 * b if stacked and name == "online" else b
        if len(adv) != d or any(not isinstance(a, torch.Tensor) or a.dtype != torch.float32 or a.shape[-1] != sizes[k]
                                or a.numel() != rows * sizes[k] for k, a in enumerate(adv)):
            raise ValueError(f"{op}: {name}'s advantages must be {d} float32 tensors of {rows} rows of "
                             f"{sizes} values (B={b}" + (", online's s and s' rows stacked" if stacked else "")
                             + f"), got {[describe(a) for a in adv]}")
        if (v is None) != (not dueling) or (v is not None and (v.dtype != torch.float32 or v.numel() != rows)):
            raise ValueError(f"{op}: {name}'s value must be " + (f"float32 of {rows} elements" if dueling else "None")
                             + f" (as online's), got {describe(v) if v is not None else None}")
    groups = group_count(op, "huber_delta", huber_delta, b, lambda t: t > 0.0, "a number > 0")
    if penalty is not None and (penalty.dtype != torch.float32 or penalty.numel() != b * sizes[0]):
        raise ValueError(f"{op}: penalty must be float32 [B={b}, n_0={sizes[0]}], got {describe(penalty)}")
    reward, discount, weight = flat_float32(op, b, (("reward", reward), ("discount", discount), ("weight", weight)))
    check_devices(op, adv0[0], (("action", action), ("reward", reward), ("discount", discount), ("weight", weight),
                                ("huber_delta", huber_delta), ("penalty", penalty),
                                *((f"{name}'s tensors", t) for name, (adv, v) in heads for t in (*adv, v))))
    return sizes, dueling, groups, action, reward, discount, weight, penalty


# ----------------------------------------------------------------------------- reference
def _branch_q(adv, v):
    """The heads' Q_d (eq. 1), the population's ops (:meth:`MemberBranchingNetwork.branch_q`)."""
    if v is None:
        return list(adv)
    return [v + a - a.mean(dim=-1, keepdim=True) for a in adv]


def factor_joint(action: torch.Tensor, sizes) -> list[torch.Tensor]:
    """The joint action's branch indices, D int64 tensors of ``action``'s shape: ``a_d = (a // Π_{e>d}
    n_e) mod n_d`` (first branch slowest; :func:`foxdqn.nn.branching.factor_branches`'s layout)."""
    out = []
    for d, n in enumerate(sizes):
        out.append(torch.div(action, math.prod(sizes[d + 1:]), rounding_mode="floor") % n)
    return out


def joint_q(branch_q) -> torch.Tensor:
    """``(Σ_d Q_d[..., a_d]) / D`` over the joint actions, ``[..., Π n_d]`` row-major, summed in branch
    order (:func:`foxdqn.nn.branching.combine_branches`'s sums and layout) of D ``[..., n_d]``."""
    d = len(branch_q)
    lead = tuple(branch_q[0].shape[:-1])
    total = None
    for k, q in enumerate(branch_q):
        grid = q.reshape(*lead, *(q.shape[-1] if e == k else 1 for e in range(d)))
        total = grid if total is None else total + grid
    return (total / d).reshape(*lead, -1)


def _halves(head, groups, sizes):
    """(s rows, s' rows) of a stacked head's tensors (each group's s rows, then its s' rows)."""
    def split(t, n, k):
        return t.reshape(groups, 2, -1, n)[:, k]
    adv, v = head
    return tuple(([split(a, n, k) for a, n in zip(adv, sizes)], None if v is None else split(v, 1, k))
                 for k in (0, 1))


def _reference(online, target, select, action, reward, discount, weight, huber_delta, penalty, sizes, groups,
               stacked=False):
    """The arithmetic of the population's loss before this op (module docstring), on rows ``[G, B_g]``."""
    if stacked:
        online, select = _halves(online, groups, sizes)
    d = len(sizes)
    view = lambda t, n: t.reshape(groups, -1, n)  # noqa: E731
    q_s = _branch_q([view(a, n) for a, n in zip(online[0], sizes)],
                    None if online[1] is None else view(online[1], 1))
    acts = factor_joint(action.view(groups, -1), sizes)
    q_sa = torch.stack([q.gather(-1, a[..., None]).squeeze(-1) for q, a in zip(q_s, acts)])  # [D, G, Bg]
    with torch.no_grad():
        q_t = _branch_q([view(a, n) for a, n in zip(target[0], sizes)],
                        None if target[1] is None else view(target[1], 1))
        q_sel = _branch_q([view(a, n) for a, n in zip(select[0], sizes)],
                          None if select[1] is None else view(select[1], 1))
        if penalty is not None:
            q_sel[0] = q_sel[0] - d * view(penalty, sizes[0])
        q_next = [qt.gather(-1, qs.argmax(dim=-1, keepdim=True)).squeeze(-1) for qt, qs in zip(q_t, q_sel)]
        y = reward.view(groups, -1) + discount.view(groups, -1) * torch.stack(q_next, dim=0).mean(dim=0)
    x = (q_sa - y).transpose(0, 1)  # [G, D, Bg]
    delta = huber_delta if isinstance(huber_delta, torch.Tensor) else torch.full((groups,), float(huber_delta),
                                                                                  device=x.device)
    per_sample = huber_per_group(x, delta).mean(dim=1)  # [G, Bg]
    loss = (per_sample * weight.view(groups, -1)).mean(dim=-1)  # objectives.base.weighted_mean
    td_abs = x.detach().abs().mean(dim=1).reshape(-1)
    joint = joint_q([q.detach() for q in q_s]).reshape(action.shape[0], -1)
    return loss, td_abs, joint


def branching_loss_reference(online, target, select, action, reward, discount, weight, huber_delta, *,
                             penalty=None, stacked=False):
    """Plain-torch :func:`branching_loss` (same arguments and results), differentiable by autograd."""
    sizes, _, groups, action, reward, discount, weight, penalty = _check(
        online, target, select, action, reward, discount, weight, huber_delta, penalty, stacked)
    return _reference(online, target, select, action, reward, discount, weight, huber_delta, penalty, sizes, groups,
                      stacked)


# ----------------------------------------------------------------------------- public
def branching_loss(online, target, select, action: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor,
                   weight: torch.Tensor, huber_delta: torch.Tensor, *, penalty: torch.Tensor | None = None,
                   stacked: bool = False, backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """BDQ's loss (Tavakoli et al. 2018, eqs. 1, 6, 7 with Huber), its |td| and the joint Q of s,
    from the branch heads' raw outputs; in backward, its gradients w.r.t. the online heads' A_d(s)
    and V(s).

    Formulas: module docstring. One forward kernel (G·NB row-block programs; each group's loss
    summed by the last program, the same bits on every call and whatever G), one multiply in
    backward. The first call of each size on a device allocates the kernel's small scratch, kept
    for the process (warm up eagerly before a CUDA graph capture).

    Args:
        online: ``(advantages, value)`` of the online network at s, with gradient: D (1 to 3)
            float32 tensors of B rows of n_d values (``[B, n_d]`` or a population's ``[P, B/P, n_d]``),
            and V(s) float32 of B values (``[..., 1]``), or None for a head without dueling.
        target: the same of the target network at s' (constants).
        select: the same of the network whose per-branch argmax at s' is evaluated by the target's
            (Double DQN: the online network's at s'; else ``target`` itself); None with ``stacked``.
        action: int64 ``[B]``, the joint action in [0, Π n_d) (a device value: not checked).
        reward: float32 ``[B]``, the n-step discounted reward sum (reward units).
        discount: float32 ``[B]``, γ^m, 0 where s' is terminal.
        weight: float32 ``[B]``, the replay importance weights (ones with uniform replay).
        huber_delta: float32 ``[G]``, each group's Huber δ > 0 (values not checked); G divides B,
            group g is rows g·B/G .. (g+1)·B/G − 1 (a population's members).
        penalty: None, or float32 ``[B, n_0]``, the switch penalty of each exposure at s'
            (:func:`foxdqn.objectives.branching.branching_target`): branch 0's selection is the
            argmax of ``Q^sel_0 − D · penalty``.
        stacked: ``online``'s tensors hold 2B rows, each group's B_g rows of s then its B_g rows of
            s' (one forward of the replay's stacked pair, ``[G, 2, B_g, ...]``): Double DQN's
            selection reads the s' rows, which get a zero gradient.
        backend: ``"auto"`` (Triton for CUDA tensors, else torch), ``"triton"``, ``"torch"``.

    Returns:
        (loss, td_abs, joint_q): loss float32 ``[G]``, differentiable w.r.t. ``online``'s tensors;
        td_abs float32 ``[B]`` and joint_q float32 ``[B, Π n_d]``, detached. On the Triton backend
        the loss's graph holds the gradient buffer (float32 ``[B, Σ n_d + 1]``, 2B rows with
        ``stacked``) until backward.

    Raises:
        ValueError: wrong shapes, dtypes or devices; no branch or more than MAX_BRANCHES; a value
            given for some networks and not for others; a ``huber_delta`` that is not ``[G]`` with
            G dividing B; ``select`` given with ``stacked``; an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    sizes, dueling, groups, action, reward, discount, weight, penalty = _check(
        online, target, select, action, reward, discount, weight, huber_delta, penalty, stacked)
    if resolve_backend("branching_loss", backend, action) == "torch":
        return _reference(online, target, select, action, reward, discount, weight, huber_delta, penalty, sizes,
                          groups, stacked)
    if not isinstance(huber_delta, torch.Tensor):
        huber_delta = torch.full((groups,), float(huber_delta), device=action.device)
    heads = []
    for k, (adv, v) in enumerate((online, target, online if stacked else select)):
        part = [a.reshape(-1, n).contiguous() for a, n in zip(adv, sizes)]
        part.append(None if v is None else v.reshape(-1).contiguous())
        heads += part if k == 0 else [None if t is None else t.detach() for t in part]
    return _BranchingLoss.apply(groups, tuple(sizes), dueling, stacked,
                                None if penalty is None else penalty.reshape(-1, sizes[0]).contiguous(),
                                action.contiguous(), reward.contiguous(), discount.contiguous(), weight.contiguous(),
                                huber_delta.contiguous(), *heads)
