"""IQN's loss of a population's update in one kernel: the taken action's quantiles, the target
action's target quantiles, the quantile Huber loss, its importance-weighted mean per group and its
gradient, computed in one pass.

Sources: Dabney, Ostrovski, Silver & Munos (2018), "Implicit Quantile Networks for Distributional
RL", eq. 3 (the loss) and §3.1 (a* by the expected Q at s'; Double DQN's online selection, van
Hasselt et al. 2016); QR-DQN's ρ^κ (Dabney et al. 2018, AAAI, eqs. 9–10, through
:mod:`foxdqn.ops.quantile_huber_loss`, whose expressions this kernel evaluates); the
importance-weighted mean of PER, Schaul et al. (2016), §3.4. Per sample b of group g (R_b the
n-step reward sum, discount_b = γ^m or 0; κ_g the group's threshold; N online and N' target
quantile fractions):

    θ_i     = Z(s_b, τ_i)[a_b]                                   (the online head at the taken action)
    a*      = argmax_a (select_b[a] − penalty_b[a])              (the expected Q at s', first index on ties)
    T_j     = R_b + discount_b · Z'(s'_b, τ'_j)[a*]              (the target head)
    ρ_b     = Σ_i (1/N') Σ_j |τ_i − 1{T_j − θ_i < 0}| · L_κg(T_j − θ_i) / κ_g  (eq. 3; κ_g = 0: |·|)
    loss_g  = Σ_{b in g} w_b ρ_b / B_g
    ∂loss_g/∂Z(s_b, τ_i)[a] = −1{a = a_b} · w_b / (B_g N') · Σ_j |τ_i − 1{δ_ij < 0}| ψ_κg(δ_ij)

with ψ_κ(δ) = clamp(δ/κ, −1, 1) (sign(δ) for κ = 0), as :mod:`foxdqn.ops.quantile_huber_loss`'s
backward kernel. The arithmetic is :func:`iqn_loss_reference`'s, which is the population's torch
ops before this op (:func:`foxdqn.objectives.iqn.iqn_quantile_loss`, then
:func:`foxdqn.objectives.base.weighted_mean`): a gather, an argmax, a gather, a multiply and an add,
the two loss kernels, the weighted mean and the backward's divide, multiply and gather's backward,
twelve launches, are this kernel and one multiply in backward. Rounding: each pair's terms are
the quantile Huber kernels' own expressions; the sums over j and i run in the tile's order and the
loss's sum over rows in program order (:func:`foxdqn.ops.dqn_td_loss.group_sums_of_last_program`),
so the results equal the reference to float rounding. A NaN in ``select`` is not picked as the
maximum here, where torch's argmax picks it.

Biases: ``bias`` and ``target_bias`` (``[G, A]``) are the output layers' biases where ``z`` and
``z_target`` come without them (a ``bmm`` in place of ``baddbmm``, whose copy of the bias into the
``[B, N, A]`` output is a launch); the kernel adds them to θ and Z' as it loads those, so θ and T_j
are the ones the biased inputs give (one float32 add of the same operands). Where ``bias`` needs
a gradient, the kernel also writes it: each program stores its rows' part (Σ_i ∂loss/∂Z(s_b, τ_i)
added into the taken action's slot), and the last program of each group (a ticket per group, as
the loss's) sums the group's parts in program order, where torch's ``sum`` of ∂loss/∂z over the
group's rows and fractions would be a second launch.

Registration: a ``torch.autograd.Function`` (as :mod:`foxdqn.ops.iql_loss`). The forward writes
the loss, ρ (detached: PER's priority signal) and the gradient w.r.t. ``z`` (float32, z's shape,
zero off the taken action), kept until backward, which multiplies it by the upstream gradient
(not a population's unit seed: :func:`foxdqn.device.scalars.is_ones_vector`). Capturable in a CUDA
graph (device ops only, fixed shapes); double backward is not supported.

Launch: ``G · NB`` programs of BLOCK_R rows of one group each (BLOCK_R from one group's rows alone,
so a member's loss has the bits of its run alone whatever the population's size); scratch of
:func:`foxdqn.ops.dqn_td_loss._scratch` (calls on one stream, as that op's docstring says).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from foxdqn.ops import dqn_td_loss as _td
from foxdqn.ops.backend import check_devices, describe, flat_float32, resolve_backend
from foxdqn.ops.dqn_td_loss import group_block_rows, group_sums_of_last_program
from foxdqn.ops.quantile_huber_loss import quantile_huber_loss_reference
from foxdqn.ops.tensor_list import group_scratch, last_of_group, sum_of_parts

__all__ = ["iqn_loss", "iqn_loss_reference"]

NUM_WARPS = 4  #: warps per program
MIN_PROGRAMS = 64  #: BLOCK_R is halved (down to 1) until one group has at least this many row blocks
INTERPRET_MIN_PROGRAMS = 1  #: MIN_PROGRAMS in Triton's interpreter
TILE = 2048  #: elements of a program's pair tile [BLOCK_R, BLOCK_I, BLOCK_J] and gradient tile [.., BLOCK_G]
#: elements of the bias gradient's sum tile [SUM_B, BLOCK_A] in a group's last program (docs/bench.md#launch-constants)
BIAS_TILE = 1024


@triton.jit
def _iqn_loss_kernel(
    z_ptr,  # f32 [G·Bg, N, A] contiguous: online Z(s, τ)
    zt_ptr,  # f32 [G·Bg, N', A] contiguous: target Z'(s', τ')
    sel_ptr,  # f32 [G, Bg, A], strides (ssg, ssb, ssa): the expected Q at s' that picks a*
    pen_ptr,  # f32 [G·Bg, A] (PENALISED): subtracted from sel
    tau_ptr,  # f32 [G, Bg, N], strides (stg, N, 1): τ (a group's rows contiguous)
    action_ptr, reward_ptr, discount_ptr, weight_ptr,  # [G·Bg]
    kappa_ptr,  # f32 [G]
    loss_ptr,  # f32 [G] out (the last program)
    rho_ptr,  # f32 [G·Bg] out ρ
    grad_ptr,  # f32 [G·Bg, N, A] out ∂loss/∂z
    part_ptr, ticket_ptr,  # scratch
    zb_ptr, ztb_ptr,  # f32 [G, A] (BIAS): the output layers' biases that z and z_target do not hold
    dzb_ptr,  # f32 [G, A] out (BIAS_GRAD): ∂loss/∂bias, each group's rows of ∂loss/∂z summed
    bpart_ptr,  # f32 [G·NB, A] scratch (BIAS_GRAD): each program's part of it
    gticket_ptr,  # i32 [G] scratch (BIAS_GRAD): each group's ticket, zero between launches
    G, Bg, N, NT, A, inv_n, inv_nt, ssg, ssb, ssa, stg,
    PENALISED: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr,
    BLOCK_A: tl.constexpr, BLOCK_G: tl.constexpr, SUM_G: tl.constexpr, SUM_R: tl.constexpr, BIAS: tl.constexpr,
    BIAS_GRAD: tl.constexpr, SUM_B: tl.constexpr,
):
    zero = tl.zeros([], dtype=tl.int64)  # an int argument equal to 1 arrives as a constexpr
    G, Bg, N, NT, A = G + zero, Bg + zero, N + zero, NT + zero, A + zero
    g, b, ok, NB = group_block_rows(Bg, BLOCK_R)
    inv_n = tl.cast(inv_n, tl.float32)
    inv_nt = tl.cast(inv_nt, tl.float32)
    row = g * Bg + b
    kappa = tl.load(kappa_ptr + g)
    kappa_div = tl.where(kappa == 0.0, 1.0, kappa)  # 1 stands in for 0 as a divisor (the branch not taken)
    act = tl.load(action_ptr + row, mask=ok, other=0)
    r = tl.load(reward_ptr + row, mask=ok, other=0.0)
    disc = tl.load(discount_ptr + row, mask=ok, other=0.0)
    w = tl.load(weight_ptr + row, mask=ok, other=0.0)

    # a* of each row: the first argmax of select − penalty over the A actions
    cols = tl.arange(0, BLOCK_A)
    am = ok[:, None] & (cols < A)[None, :]
    sel = tl.load(sel_ptr + (g.to(tl.int64) * ssg + b.to(tl.int64) * ssb)[:, None] + cols[None, :] * ssa, mask=am,
                  other=0.0)
    if PENALISED:
        sel = sel - tl.load(pen_ptr + row[:, None] * A + cols[None, :], mask=am, other=0.0)
    a_star = tl.argmax(tl.where(am, sel, float("-inf")), axis=1, tie_break_left=True)
    if BIAS:  # the group's bias of the taken action and of a*
        theta_bias = tl.load(zb_ptr + g * A + act, mask=ok, other=0.0)
        target_bias = tl.load(ztb_ptr + g * A + a_star, mask=ok, other=0.0)

    total = tl.zeros([BLOCK_R], tl.float32)
    grad_rows = tl.zeros([BLOCK_R], tl.float32)  # Σ_i ∂loss/∂Z(s_b, τ_i)[a_b] (BIAS_GRAD)
    for i0 in range(0, N, BLOCK_I):
        ii = i0 + tl.arange(0, BLOCK_I)
        mi = ok[:, None] & (ii < N)[None, :]
        theta = tl.load(z_ptr + (row[:, None] * N + ii[None, :]) * A + act[:, None], mask=mi, other=0.0)
        if BIAS:
            theta += theta_bias[:, None]
        tau = tl.load(tau_ptr + (g.to(tl.int64) * stg + b * N)[:, None] + ii[None, :], mask=mi, other=0.0)
        acc = tl.zeros([BLOCK_R, BLOCK_I], tl.float32)
        acc_psi = tl.zeros([BLOCK_R, BLOCK_I], tl.float32)
        for j0 in range(0, NT, BLOCK_J):
            jj = j0 + tl.arange(0, BLOCK_J)
            mj = ok[:, None] & (jj < NT)[None, :]
            zt = tl.load(zt_ptr + (row[:, None] * NT + jj[None, :]) * A + a_star[:, None], mask=mj, other=0.0)
            if BIAS:
                zt += target_bias[:, None]
            t = r[:, None] + disc[:, None] * zt  # T_j
            delta = t[:, None, :] - theta[:, :, None]
            weight = tl.abs(tau[:, :, None] - tl.where(delta < 0.0, 1.0, 0.0))
            adelta = tl.abs(delta)
            lk = tl.where(kappa == 0.0, adelta,
                          tl.where(adelta <= kappa, 0.5 * delta * delta / kappa_div, adelta - 0.5 * kappa))
            sign = tl.where(delta > 0.0, 1.0, tl.where(delta < 0.0, -1.0, tl.where(delta != delta, delta, 0.0)))
            psi = tl.where(kappa == 0.0, sign,
                           tl.where(delta > kappa, 1.0, tl.where(delta < -kappa, -1.0, delta / kappa_div)))
            valid = mi[:, :, None] & mj[:, None, :]
            acc += tl.sum(tl.where(valid, weight * lk, 0.0), axis=2)
            acc_psi += tl.sum(tl.where(valid, weight * psi, 0.0), axis=2)
        total += tl.sum(acc, axis=1)
        # ∂loss/∂Z(s, τ_i)[a]: the taken action's column, zero elsewhere (the whole [N, A] rows written)
        gi = -((w * inv_n) * inv_nt)[:, None] * acc_psi  # [BLOCK_R, BLOCK_I]
        if BIAS_GRAD:
            grad_rows += tl.sum(tl.where(mi, gi, 0.0), axis=1)
        for a0 in range(0, A, BLOCK_G):
            aa = a0 + tl.arange(0, BLOCK_G)
            hit = aa[None, None, :] == act[:, None, None]
            out = tl.where(hit, gi[:, :, None], 0.0)
            tl.store(grad_ptr + (row[:, None, None] * N + ii[None, :, None]) * A + aa[None, None, :], out,
                     mask=mi[:, :, None] & (aa < A)[None, None, :])
    rho = total * inv_nt
    tl.store(rho_ptr + row, rho, mask=ok)
    tl.store(part_ptr + tl.program_id(0), tl.sum(tl.where(ok, rho * w, 0.0), axis=0))
    if BIAS_GRAD:  # this program's rows' part of ∂loss/∂bias, then the group's last program sums them
        hit_a = (cols[None, :] == act[:, None]) & ok[:, None]
        tl.store(bpart_ptr + tl.program_id(0) * A + cols, tl.sum(tl.where(hit_a, grad_rows[:, None], 0.0), axis=0),
                 mask=cols < A)
        if last_of_group(gticket_ptr + g, NB):
            tl.store(dzb_ptr + g * A + cols, sum_of_parts(bpart_ptr, g * NB, NB, A, cols, cols < A, SUM_B, BLOCK_A),
                     mask=cols < A)
            tl.store(gticket_ptr + g, 0)
    group_sums_of_last_program(part_ptr, ticket_ptr, loss_ptr, G, NB, inv_n, SUM_G, SUM_R)


def _blocks(groups: int, rows_per_group: int, n: int, nt: int, actions: int, min_programs: int
            ) -> tuple[int, int, int, int, int, int, int]:
    """(BLOCK_R, BLOCK_I, BLOCK_J, BLOCK_A, BLOCK_G, SUM_G, SUM_R) of a launch of ``groups ·
    cdiv(rows_per_group, BLOCK_R)`` programs: the pair tile of :mod:`foxdqn.ops.quantile_huber_loss`'s
    CUDA shape (BLOCK_I <= 64, BLOCK_J <= 32, TILE elements), BLOCK_R from one group's rows alone
    (module docstring), every action in the argmax's tile (BLOCK_A) and the gradient's rows written
    BLOCK_G actions at a time."""
    block_i = min(triton.next_power_of_2(n), 64)
    block_j = min(triton.next_power_of_2(nt), 32)
    block_r = max(1, min(triton.next_power_of_2(max(rows_per_group, 1)), TILE // (block_i * block_j)))
    while block_r > 1 and triton.cdiv(rows_per_group, block_r) < min_programs:
        block_r //= 2
    block_a = triton.next_power_of_2(actions)
    block_g = max(1, min(block_a, TILE // (block_r * block_i)))
    return (block_r, block_i, block_j, block_a, block_g,
            *_td.group_sum_blocks(groups, triton.cdiv(rows_per_group, block_r)))


class _IQNLoss(torch.autograd.Function):
    """loss, ρ = kernel(z, ...); backward: the saved ∂loss/∂z times the upstream gradient."""

    @staticmethod
    def forward(ctx, z, z_target, select, penalty, taus, action, reward, discount, weight, kappa, groups, bias,
                target_bias):
        rows, n, a = z.shape
        nt = z_target.shape[1]
        dev = z.device
        loss = torch.empty(groups, device=dev, dtype=torch.float32)
        rho = torch.empty(rows, device=dev, dtype=torch.float32)
        grad = torch.empty_like(z)
        bias_grad = bias is not None and ctx.needs_input_grad[11]
        grad_bias = None
        if bias_grad:  # the kernel writes it; no rows: zeros, as torch's sum of nothing
            grad_bias = z.new_empty(groups, a) if rows else z.new_zeros(groups, a)
        bg = rows // groups
        if rows:
            block_r, block_i, block_j, block_a, block_g, sum_g, sum_r = _blocks(
                groups, bg, n, nt, a, MIN_PROGRAMS if dev.type == "cuda" else INTERPRET_MIN_PROGRAMS)
            nb = triton.cdiv(bg, block_r)
            programs = groups * nb
            partials, ticket = _td._scratch(dev, programs)
            parts, tickets = group_scratch("iqn_loss", dev, programs * a, groups) if bias_grad else (reward, ticket)
            _iqn_loss_kernel[(programs,)](
                z, z_target, select, penalty if penalty is not None else select, taus, action, reward, discount,
                weight, kappa, loss, rho, grad, partials, ticket, reward if bias is None else bias,
                reward if target_bias is None else target_bias, grad_bias if bias_grad else reward, parts, tickets,
                groups, bg, n, nt, a, 1.0 / bg, 1.0 / nt,
                select.stride(0), select.stride(1), select.stride(2), taus.stride(0), PENALISED=penalty is not None,
                BLOCK_R=block_r,
                BLOCK_I=block_i, BLOCK_J=block_j, BLOCK_A=block_a, BLOCK_G=block_g, SUM_G=sum_g, SUM_R=sum_r,
                BIAS=bias is not None, BIAS_GRAD=bias_grad,
                SUM_B=max(1, min(triton.next_power_of_2(nb), BIAS_TILE // block_a)), num_warps=NUM_WARPS)
        else:
            loss.fill_(float("nan"))  # the mean of nothing, as torch's
        ctx.save_for_backward(grad, grad_bias)
        ctx.groups = groups
        ctx.mark_non_differentiable(rho)
        ctx.set_materialize_grads(False)
        return loss, rho

    @staticmethod
    def backward(ctx, grad_loss, grad_rho):
        grad, grad_bias = ctx.saved_tensors
        need_z, need_bias = ctx.needs_input_grad[0], ctx.needs_input_grad[11]
        if grad_loss is None or not (need_z or need_bias):
            return (None,) * 13
        scaled = _td.seed_scaled(grad, grad_loss, ctx.groups) if need_z else None
        # the bias row's gradient: its group's rows and fractions summed (baddbmm's bias gradient), by the kernel
        scaled_bias = _td.seed_scaled(grad_bias, grad_loss, ctx.groups) if need_bias else None
        return (scaled,) + (None,) * 10 + (scaled_bias, None)


def _check(z, z_target, select, taus, action, reward, discount, weight, kappa, penalty):
    """Validate; returns (z [B, N, A], z_target [B, N', A], select [G, B/G, A], taus [G, B/G, N], action,
    reward, discount, weight, kappa, penalty [B, A] or None, groups) as views (select: a view where
    its layout allows, e.g. a population's [P, B, A] slice of a longer [P, 2B, A]; the kernel reads
    its strides; taus: a view where it allows, e.g. a population's [P, B/P, N] slice of one draw of τ
    and τ', the kernel reading its group stride)."""
    op = "iqn_loss"
    action = action.reshape(-1)
    b = action.shape[0]
    if action.dtype != torch.int64:
        raise ValueError(f"{op}: action must be int64 [B], got {describe(action)}")
    if not isinstance(z, torch.Tensor) or z.dtype != torch.float32 or z.dim() < 3 or z.shape[-1] < 1 \
            or z.shape[-2] < 1 or z.numel() != b * z.shape[-2] * z.shape[-1]:
        raise ValueError(f"{op}: z must be float32 [..., B, N, A] of B={b} rows, got {describe(z)}")
    n, a = z.shape[-2:]
    if not isinstance(z_target, torch.Tensor) or z_target.dtype != torch.float32 or z_target.dim() < 3 \
            or z_target.shape[-1] != a or z_target.shape[-2] < 1 or z_target.numel() != b * z_target.shape[-2] * a:
        raise ValueError(f"{op}: z_target must be float32 [..., B, N', {a}] of B={b} rows, got {describe(z_target)}")
    for name, t, width in (("select", select, a), ("taus", taus, n), ("penalty", penalty, a)):
        if t is not None and (not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() != b * width):
            raise ValueError(f"{op}: {name} must be float32 with B={b} rows of {width}, got {describe(t)}")
    if not isinstance(kappa, torch.Tensor) or kappa.dim() != 1 or kappa.dtype != torch.float32 \
            or kappa.shape[0] < 1 or b % kappa.shape[0]:
        raise ValueError(f"{op}: kappa must be float32 [G] with G dividing B={b}, got {describe(kappa)}")
    reward, discount, weight = flat_float32(op, b, (("reward", reward), ("discount", discount), ("weight", weight)))
    check_devices(op, z, (("z_target", z_target), ("select", select), ("taus", taus), ("action", action),
                          ("reward", reward), ("discount", discount), ("weight", weight), ("kappa", kappa),
                          ("penalty", penalty)))
    groups = kappa.shape[0]
    return (z.reshape(b, n, a), z_target.reshape(b, z_target.shape[-2], a), select.reshape(groups, b // groups, a),
            taus.reshape(groups, b // groups, n),
            action, reward,
            discount, weight, kappa, None if penalty is None else penalty.reshape(b, a), groups)


def _reference(z, z_target, select, taus, action, reward, discount, weight, kappa, penalty, groups, bias=None,
               target_bias=None):
    """The population's torch ops before this op (module docstring), on rows ``[B]``; the biases
    (``[G, A]``) added to each group's rows first."""
    n, nt = z.shape[1], z_target.shape[1]
    if bias is not None:
        z = (z.view(groups, -1, n, z.shape[-1]) + bias[:, None, None, :]).view(z.shape)
        z_target = (z_target.view(groups, -1, nt, z.shape[-1]) + target_bias[:, None, None, :]).view(z_target.shape)
    z_sa = z.gather(-1, action[:, None, None].expand(-1, n, 1)).squeeze(-1)  # [B, N]
    with torch.no_grad():
        select = select.reshape(-1, select.shape[-1])
        sel = select if penalty is None else select - penalty
        a_star = sel.argmax(dim=-1)
        z_next = z_target.gather(-1, a_star[:, None, None].expand(-1, nt, 1)).squeeze(-1)  # [B, N']
        t = reward[:, None] + discount[:, None] * z_next
    rho = quantile_huber_loss_reference(z_sa, t, taus.reshape(-1, n), kappa)  # [B]
    loss = (rho.view(groups, -1) * weight.view(groups, -1)).mean(dim=-1)  # objectives.base.weighted_mean
    return loss, rho.detach()


def iqn_loss_reference(z, z_target, select, taus, action, reward, discount, weight, kappa, *, penalty=None,
                       bias=None, target_bias=None):
    """Plain-torch :func:`iqn_loss` (same arguments and results), differentiable by autograd."""
    checked = _check(z, z_target, select, taus, action, reward, discount, weight, kappa, penalty)
    return _reference(*checked, *_check_bias(checked[0], checked[-1], bias, target_bias))


def iqn_loss(z: torch.Tensor, z_target: torch.Tensor, select: torch.Tensor, taus: torch.Tensor, action: torch.Tensor,
             reward: torch.Tensor, discount: torch.Tensor, weight: torch.Tensor, kappa: torch.Tensor, *,
             penalty: torch.Tensor | None = None, bias: torch.Tensor | None = None,
             target_bias: torch.Tensor | None = None, backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """IQN's weighted loss per group (eq. 3; module docstring), each row's ρ and (in backward) the
    gradient w.r.t. ``z``, in one forward kernel and one multiply in backward.

    Args:
        z: float32 ``[..., B, N, A]`` (a population's ``[P, B/P, N, A]``), the online head's
            quantiles Z(s, τ), with gradient.
        z_target: float32 ``[..., B, N', A]``, the target head's Z'(s', τ') (a constant).
        select: float32 ``[..., B, A]``, any strides (read in place where it views as ``[G, B/G, A]``),
            the expected Q at s' whose argmax is a* (the online
            network's with Double DQN, else the target's; a constant).
        taus: float32 ``[..., B, N]``, the online quantile fractions τ in [0, 1); read in place where
            each group's rows are contiguous (a population's slice of a longer draw), else copied.
        action: int64 ``[B]`` in [0, A) (a device value: not checked).
        reward, discount, weight: float32 ``[B]``: the n-step reward sum, γ^m or 0, the importance
            weights (ones with uniform replay).
        kappa: float32 ``[G]``, each group's κ >= 0 (values not checked), G dividing B; group g is
            rows g·B/G .. (g+1)·B/G − 1.
        penalty: None, or float32 ``[..., B, A]``, the switch penalty of s' subtracted before the argmax.
        bias, target_bias: None, or both float32 ``[G, A]`` (any layout that views so): the output
            layers' biases that ``z`` and ``z_target`` do not hold yet (their products by ``bmm``:
            no copy of the bias into ``[B, N, A]`` as ``baddbmm`` launches); the kernel adds group
            g's bias of the taken action to θ and of a* to Z' as it loads them, and ``bias`` gets
            its gradient (its group's rows of ∂loss/∂z summed, in the forward's kernel).
        backend: ``"auto"`` (Triton for CUDA tensors, else torch), ``"triton"``, ``"torch"``.

    Returns:
        (loss, rho): loss float32 ``[G]`` = Σ_b w_b ρ_b / B_g of each group's rows, differentiable
        w.r.t. ``z``; rho float32 ``[B]``, detached. On the Triton backend the loss's graph holds
        ∂loss/∂z (float32, z's size) until backward.

    Raises:
        ValueError: wrong shapes, dtypes or devices; a ``kappa`` that is not float32 ``[G]`` with G
            dividing B; an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    checked = _check(z, z_target, select, taus, action, reward, discount, weight, kappa, penalty)
    bias, target_bias = _check_bias(checked[0], checked[-1], bias, target_bias)
    if resolve_backend("iqn_loss", backend, z) == "torch":
        return _reference(*checked, bias, target_bias)
    z3, zt3, sel, tau, action, reward, discount, weight, kappa, pen, groups = checked
    loss, rho = _IQNLoss.apply(z3.contiguous(), zt3.detach().contiguous(), sel.detach(),
                               None if pen is None else pen.detach().contiguous(), _group_rows(tau.detach()),
                               action.contiguous(), reward.contiguous(), discount.contiguous(), weight.contiguous(),
                               kappa.contiguous(), groups, bias, None if target_bias is None else target_bias.detach())
    return loss, rho


def _group_rows(taus: torch.Tensor) -> torch.Tensor:
    """``taus`` [G, Bg, N] as the kernel reads it: each group's rows contiguous (strides (any, N, 1))."""
    g, bg, n = taus.shape
    if (bg == 1 or taus.stride(1) == n) and (n == 1 or taus.stride(2) == 1):
        return taus
    return taus.contiguous()


def _check_bias(z3, groups, bias, target_bias):
    """(bias, target_bias) as contiguous ``[G, A]`` views, or (None, None)."""
    if bias is None and target_bias is None:
        return None, None
    a = z3.shape[-1]
    for name, t in (("bias", bias), ("target_bias", target_bias)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() != groups * a \
                or t.device != z3.device:
            raise ValueError(f"iqn_loss: {name} must be float32 [{groups}, {a}] on {z3.device} (bias and "
                             f"target_bias both or neither), got {describe(t)}")
    return bias.reshape(groups, a).contiguous(), target_bias.reshape(groups, a).contiguous()
