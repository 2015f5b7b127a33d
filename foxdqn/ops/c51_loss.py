r"""The C51 loss of a batch in one forward and one backward kernel: a* at s', the categorical
projection of its target distribution and the cross-entropy against the online distribution at s.

Source: Bellemare, Dabney & Munos (2017), "A Distributional Perspective on Reinforcement
Learning", Algorithm 1 (categorical algorithm), with Double DQN's selection of a* (van Hasselt et
al. 2016) as :func:`foxdqn.objectives.c51.c51_cross_entropy` computes it. Per row r of a batch of
R rows, with A actions of K atoms and the row's group g (a population's member: rows
``g·R/G .. (g+1)·R/G − 1``), its atoms ``z_g`` (``support[g]``) and bounds (``table[g]``,
:func:`foxdqn.ops.c51_project.support_table`)::

    q[r, a]  = Σ_k softmax(logits[r, a])_k z_g,k                 expected Q at s (no gradient)
    sel[r, a] = Σ_k softmax(select_logits[r, a])_k z_g,k          (Double DQN: the online net at s')
              = Σ_k softmax(target_logits[r, a])_k z_g,k          (else: the target net at s')
              − penalty[r, a]                                    (action.switch_margin, if given)
    a*       = argmax_a sel[r, a]                                (the first maximum; a NaN wins, as torch.argmax)
    m        = Φ(softmax(target_logits[r, a*]), reward_r, discount_r)   Algorithm 1's projection onto z_g
    ce[r]    = −Σ_k m_k log softmax(logits[r, action_r])_k

Φ is :func:`foxdqn.ops.c51_project.c51_project`'s, written as its hat-weight gather with the same
roundings (``z_j = fl(fl(j·Δz) + v_min)``, ``Tz_j = fl(r + fl(d·z_j))``, ``b_j = fl(fl(Tz_j −
v_min)·(1/Δz))`` clamped to [0, K − 1]; an all-NaN m where a p_j is NaN or ±Inf or a Tz_j is NaN).

Gradient (backward kernel; only ``logits`` gets one): with p = softmax(logits[r, action_r]),

    ∂ce[r] / ∂logits[r, a, k] = −m_k + p_k Σ_i m_i   for a = action_r,   0 for every other a.

Kernel and reference (:func:`c51_loss_reference`, the torch ops of ``c51_cross_entropy``) agree to
float32 rounding (exp, log and the order of the sums differ), and on a* wherever the selection's
maximum is clear. Each program owns ``BLOCK_R`` rows and holds ``[BLOCK_R, next_pow2(K)]`` tiles,
looping over the actions (the selection); the projection is one ``[BLOCK_R, K, K]`` tile of hat
weights, or with ``LOOP`` a loop over the output atoms, one atom's hat weights at a time
(:func:`_blocks` chooses: K ≤ :data:`MAX_ATOMS`). The choice follows R, so on CUDA a row's last
bits may depend on how many rows (members) the batch has, as a batched matmul's may
(docs/design/population.md); on the CPU both projections give the same bits.

Groups and the weighted mean: each program holds ``BLOCK_R`` rows of one group (``G · NB``
programs, NB = cdiv(R/G, BLOCK_R)). :func:`c51_weighted_loss` also returns each group's
importance-weighted mean ``Σ_{r in g} w_r ce_r / B_g`` with its gradient, summed by the forward's
last program (:func:`foxdqn.ops.dqn_td_loss.group_sums_of_last_program`) and scaled into the
backward's rows: the weighted mean of :func:`foxdqn.objectives.base.weighted_mean` without its four
launches.

Biases (:class:`C51Biases`): the streams may come as their layers' products without the bias
(``bmm`` in place of ``baddbmm``, whose copy of the bias into its output is a launch and a pass
over ``[R, A·K]``); the kernels then add each group's bias row as they load a stream, so the
logits are the ones ``baddbmm`` would have given (one float32 add of the same operands), and the
backward returns the bias gradients as each group's rows of the stream gradients summed.

Rainbow's dueling head (Hessel et al. 2018, §"Dueling networks" per atom): given the value
streams, each network's logits are ``v + adv − mean_a adv`` formed in the kernels, and the
backward gives ``∂/∂v = G`` (the taken action's gradient G above) and
``∂/∂adv_a = 1{a = action}·G − G/A``.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.c51_project import _mul_rn, c51_project_reference
from foxdqn.ops.dqn_td_loss import _scratch, group_block_rows, group_sum_blocks, group_sums_of_last_program
from foxdqn.ops.library import device_op, wrap_triton

#: The most atoms the kernels take (their [BLOCK_R, next_pow2(K)] tiles live in registers).
MAX_ATOMS = 128
#: Rows per program with the projection's loop over atoms (``LOOP``), taken where the [BLOCK_R, K, K]
#: tile allows fewer rows and the batch still gives MIN_PROGRAMS programs of LOOP_ROWS rows. On the
#: H200 (docs/bench.md#kernels): 64 members of 256 rows at K = 51, the forward 1,316 µs with one row
#: per program and 463 µs with 8; one member of 256 rows 87 µs with one row (the tile) and 172 µs
#: with 8, so one member keeps the tile.
LOOP_ROWS = 8
MIN_PROGRAMS = 264  # 2 programs per H200 multiprocessor


@triton.jit
def _softmax_rows(x):
    """softmax over axis 1 of a [R, BK] tile whose padding is −inf (torch's formula: exp(x − max) / Σ)."""
    e = tl.exp(x - tl.max(x, axis=1)[:, None])
    return e / tl.sum(e, axis=1)[:, None]


@triton.jit
def _load_adv(adv_ptr, ab_ptr, rows64, g, act, j, ok, A, K, BIAS: tl.constexpr):
    """adv[r, act[r], :] ([BLOCK_R, BK], 0 in the padding), plus its group's bias row
    ``ab[g_r, act[r]·K :]`` with BIAS (the head's output before its bias: module docstring)."""
    x = tl.load(adv_ptr + (rows64[:, None] * A + act) * K + j[None, :], mask=ok, other=0.0)
    if BIAS:
        x += tl.load(ab_ptr + (g[:, None] * A + act) * K + j[None, :], mask=ok, other=0.0)
    return x


@triton.jit
def _mean_over_actions(adv_ptr, ab_ptr, rows64, g, j, ok, A, K, DUELING: tl.constexpr, BIAS: tl.constexpr,
                       BLOCK_R: tl.constexpr, BK: tl.constexpr):
    """(1/A) Σ_a adv[r, a, :] ([BLOCK_R, BK]; zeros without DUELING): the dueling combine's mean."""
    acc = tl.zeros([BLOCK_R, BK], dtype=tl.float32)
    if DUELING:
        for a in range(0, A):
            acc += _load_adv(adv_ptr, ab_ptr, rows64, g, a, j, ok, A, K, BIAS)
        acc = acc / A
    return acc


@triton.jit
def _action_logits(adv_ptr, v_ptr, ab_ptr, vb_ptr, mean, rows64, g, act, j, ok, A, K, DUELING: tl.constexpr,
                   BIAS: tl.constexpr):
    """Row r's logits of action act[r] ([BLOCK_R, BK], −inf in the padding): the tensor's own, or
    Rainbow's v + adv − mean_a adv (DUELING); with BIAS each stream's bias row added first."""
    x = _load_adv(adv_ptr, ab_ptr, rows64, g, act, j, ok, A, K, BIAS)
    if DUELING:
        v = tl.load(v_ptr + rows64[:, None] * K + j[None, :], mask=ok, other=0.0)
        if BIAS:
            v += tl.load(vb_ptr + g[:, None] * K + j[None, :], mask=ok, other=0.0)
        x = v + x - mean
    return tl.where(ok, x, float("-inf"))


@triton.jit
def _c51_loss_fwd_kernel(
    logits_ptr, action_ptr, tlog_ptr, slog_ptr, pen_ptr, r_ptr, d_ptr, support_ptr, table_ptr,
    ce_ptr, q_ptr, m_ptr, lse_ptr, v_ptr, tv_ptr, sv_ptr,
    weight_ptr, loss_ptr, part_ptr, ticket_ptr,  # MEAN: w [R], loss [G] out, scratch (dqn_td_loss._scratch)
    lb_ptr, tb_ptr, sb_ptr, vb_ptr, tvb_ptr, svb_ptr,  # BIAS: [G, A·K] logits' and [G, K] value streams' biases
    G, A, K, rows_per_group, inv_rows,
    DOUBLE: tl.constexpr, PENALTY: tl.constexpr, DUELING: tl.constexpr, BLOCK_R: tl.constexpr, BK: tl.constexpr,
    LOOP: tl.constexpr, MEAN: tl.constexpr, SUM_G: tl.constexpr, SUM_R: tl.constexpr, BIAS: tl.constexpr,
):
    # G · NB programs of BLOCK_R rows of one group each (dqn_td_loss.group_block_rows)
    rows_per_group = rows_per_group + tl.zeros([], dtype=tl.int64)  # an int argument equal to 1 arrives as a constexpr
    group, b, row_ok, NB = group_block_rows(rows_per_group, BLOCK_R)
    rows = group * rows_per_group + b
    rows64 = rows.to(tl.int64)
    j = tl.arange(0, BK)
    jm = j < K
    ok = row_ok[:, None] & jm[None, :]
    g = (rows // rows_per_group).to(tl.int64)
    z = tl.load(support_ptr + g[:, None] * K + j[None, :], mask=ok, other=0.0)  # the member's atoms
    sup = table_ptr + g * 4
    v_min = tl.load(sup, mask=row_ok, other=0.0)[:, None]
    v_max = tl.load(sup + 1, mask=row_ok, other=1.0)[:, None]
    dz = tl.load(sup + 2, mask=row_ok, other=1.0)[:, None]
    inv_dz = tl.load(sup + 3, mask=row_ok, other=1.0)[:, None]

    mean = _mean_over_actions(logits_ptr, lb_ptr, rows64, g, j, ok, A, K, DUELING, BIAS, BLOCK_R, BK)
    t_mean = _mean_over_actions(tlog_ptr, tb_ptr, rows64, g, j, ok, A, K, DUELING, BIAS, BLOCK_R, BK)
    s_mean = _mean_over_actions(slog_ptr, sb_ptr, rows64, g, j, ok, A, K, DUELING and DOUBLE, BIAS, BLOCK_R, BK)
    best = tl.full([BLOCK_R], float("-inf"), tl.float32)
    p_best = tl.zeros([BLOCK_R, BK], dtype=tl.float32)
    for a in range(0, A):
        act_a = tl.zeros([BLOCK_R, 1], dtype=tl.int64) + a
        x = _action_logits(logits_ptr, v_ptr, lb_ptr, vb_ptr, mean, rows64, g, act_a, j, ok, A, K, DUELING, BIAS)
        tl.store(q_ptr + rows64 * A + a, tl.sum(tl.where(ok, _softmax_rows(x) * z, 0.0), axis=1), mask=row_ok)
        pt = tl.where(ok, _softmax_rows(_action_logits(tlog_ptr, tv_ptr, tb_ptr, tvb_ptr, t_mean, rows64, g, act_a, j,
                                                       ok, A, K, DUELING, BIAS)), 0.0)
        if DOUBLE:
            ps = tl.where(ok, _softmax_rows(_action_logits(slog_ptr, sv_ptr, sb_ptr, svb_ptr, s_mean, rows64, g,
                                                           act_a, j, ok, A, K, DUELING, BIAS)), 0.0)
            sel = tl.sum(ps * z, axis=1)
        else:
            sel = tl.sum(pt * z, axis=1)
        if PENALTY:
            sel = sel - tl.load(pen_ptr + rows64 * A + a, mask=row_ok, other=0.0)
        better = (a == 0) | (sel > best) | ((sel != sel) & (best == best))
        best = tl.where(better, sel, best)
        p_best = tl.where(better[:, None], pt, p_best)

    # Algorithm 1's projection of p_best onto the row's support (c51_project's roundings)
    r = tl.load(r_ptr + rows64, mask=row_ok, other=0.0)[:, None]
    d = tl.load(d_ptr + rows64, mask=row_ok, other=0.0)[:, None]
    zp = _mul_rn(j.to(tl.float32)[None, :], dz) + v_min
    tz = r + _mul_rn(d, zp)
    bad = tl.sum(tl.where(ok & ((tz != tz) | (p_best != p_best) | (tl.abs(p_best) == float("inf"))), 1, 0), axis=1)
    tz = tl.minimum(tl.maximum(tz, v_min), v_max)
    b = _mul_rn(tz - v_min, inv_dz)
    b = tl.minimum(tl.maximum(b, 0.0), (K - 1) * 1.0)
    if LOOP:  # one output atom i at a time: [R, j] tiles only
        m = tl.zeros([BLOCK_R, BK], dtype=tl.float32)  # [R, i]
        for i in range(0, K):
            hat = tl.maximum(1.0 - tl.abs(b - i * 1.0), 0.0)  # [R, j]: source atom j's share of atom i
            m = tl.where(j[None, :] == i, tl.sum(tl.where(ok, p_best * hat, 0.0), axis=1)[:, None], m)
    else:
        hat = tl.maximum(1.0 - tl.abs(b[:, None, :] - j.to(tl.float32)[None, :, None]), 0.0)  # [R, i, j]
        m = tl.sum(tl.where(ok[:, None, :], p_best[:, None, :] * hat, 0.0), axis=2)  # [R, i]
    m = tl.where(bad[:, None] > 0, float("nan"), m)

    act = tl.load(action_ptr + rows64, mask=row_ok, other=0).to(tl.int64)
    x = _action_logits(logits_ptr, v_ptr, lb_ptr, vb_ptr, mean, rows64, g, act[:, None], j, ok, A, K, DUELING, BIAS)
    mx = tl.max(x, axis=1)
    lse = mx + tl.log(tl.sum(tl.exp(x - mx[:, None]), axis=1))
    ce = -tl.sum(tl.where(ok, m * (x - lse[:, None]), 0.0), axis=1)
    tl.store(ce_ptr + rows64, ce, mask=row_ok)
    tl.store(lse_ptr + rows64, lse, mask=row_ok)
    tl.store(m_ptr + rows64[:, None] * K + j[None, :], m, mask=ok)
    if MEAN:  # loss[g] = Σ_b w_b ce_b / B_g: this program's part, the groups' sums by the last program
        w = tl.load(weight_ptr + rows64, mask=row_ok, other=0.0)
        tl.store(part_ptr + tl.program_id(0), tl.sum(tl.where(row_ok, w * ce, 0.0), axis=0))
        group_sums_of_last_program(part_ptr, ticket_ptr, loss_ptr, G, NB, inv_rows, SUM_G, SUM_R)


@triton.jit
def _c51_loss_bwd_kernel(grad_ptr, logits_ptr, v_ptr, action_ptr, m_ptr, lse_ptr, out_ptr, v_out_ptr, weight_ptr,
                         lb_ptr, vb_ptr, R, A, K, rows_per_group, inv_rows,
                         DUELING: tl.constexpr, BLOCK_R: tl.constexpr, BK: tl.constexpr, MEAN: tl.constexpr,
                         BIAS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < R
    rows64 = rows.to(tl.int64)
    g = tl.where(row_ok, rows64 // rows_per_group, 0)
    j = tl.arange(0, BK)
    ok = row_ok[:, None] & (j < K)[None, :]
    act = tl.load(action_ptr + rows64, mask=row_ok, other=0).to(tl.int64)
    mean = _mean_over_actions(logits_ptr, lb_ptr, rows64, g, j, ok, A, K, DUELING, BIAS, BLOCK_R, BK)
    x = _action_logits(logits_ptr, v_ptr, lb_ptr, vb_ptr, mean, rows64, g, act[:, None], j, ok, A, K, DUELING, BIAS)
    p = tl.exp(x - tl.load(lse_ptr + rows64, mask=row_ok, other=0.0)[:, None])
    m = tl.load(m_ptr + rows64[:, None] * K + j[None, :], mask=ok, other=0.0)
    if MEAN:  # ∂loss[g]/∂ce_r = w_r / B_g, times the group's upstream gradient (weighted_mean's backward)
        up = tl.load(grad_ptr + g, mask=row_ok, other=0.0) * inv_rows \
            * tl.load(weight_ptr + rows64, mask=row_ok, other=0.0)
    else:
        up = tl.load(grad_ptr + rows64, mask=row_ok, other=0.0)
    grad = up[:, None] * (p * tl.sum(m, axis=1)[:, None] - m)
    shared = tl.zeros([BLOCK_R, BK], dtype=tl.float32)
    if DUELING:  # logits = v + adv − mean_a adv: ∂/∂v = the taken action's, ∂/∂adv_a = its own − their mean
        tl.store(v_out_ptr + rows64[:, None] * K + j[None, :], grad, mask=ok)
        shared = grad / A
    for a in range(0, A):
        tl.store(out_ptr + (rows64[:, None] * A + a) * K + j[None, :],
                 tl.where(act[:, None] == a, grad, 0.0) - shared, mask=ok)


def _blocks(r: int, k: int) -> tuple[int, int, bool]:
    """(rows per program, padded atoms, LOOP) for R rows of K atoms: the rows the [rows, K, K]
    projection tile allows (at most 16 in 4,096 elements), or :data:`LOOP_ROWS` rows with the loop
    over atoms where that is more and R gives :data:`MIN_PROGRAMS` programs of them."""
    bk = triton.next_power_of_2(k)
    tile = max(1, min(16, 4096 // (bk * bk)))
    if tile < LOOP_ROWS and triton.cdiv(r, LOOP_ROWS) >= MIN_PROGRAMS:
        return LOOP_ROWS, bk, True
    return tile, bk, False


# partials and ticket are the launch's scratch: written and read by this kernel only, the ticket back
# at 0 when it ends, so the op is functional as seen from outside (a mutated input would make
# torch.library refuse its autograd formula)
@device_op("foxdqn::c51_loss", mutates_args=())
def _c51_loss_op(logits: Tensor, action: Tensor, target_logits: Tensor, select_logits: Optional[Tensor],
                 penalty: Optional[Tensor], reward: Tensor, discount: Tensor, support: Tensor,
                 table: Tensor, value: Optional[Tensor], target_value: Optional[Tensor],
                 select_value: Optional[Tensor], weight: Optional[Tensor], partials: Optional[Tensor],
                 ticket: Optional[Tensor], logits_bias: Optional[Tensor], target_bias: Optional[Tensor],
                 select_bias: Optional[Tensor], value_bias: Optional[Tensor], target_value_bias: Optional[Tensor],
                 select_value_bias: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    # value, target_value, select_value: None, or (dueling) [R, K], the value streams of the three
    # networks whose advantages logits, target_logits and select_logits then are. weight: None, or
    # [R]: the fifth output is then each group's Σ w·ce / B_g ([G]; else empty), summed through
    # partials and ticket (:func:`_launch`'s scratch). The biases: all None, or C51Biases' fields
    # ([G, A·K], [G, K]; select's with select_logits, the value streams' with value)
    r, a, k = logits.shape
    g = table.shape[0]
    dev = logits.device
    ce = torch.empty(r, device=dev, dtype=torch.float32)
    q = torch.empty(r, a, device=dev, dtype=torch.float32)
    m = torch.empty(r, k, device=dev, dtype=torch.float32)
    lse = torch.empty(r, device=dev, dtype=torch.float32)
    loss = torch.empty(g if weight is not None else 0, device=dev, dtype=torch.float32)
    block_r, bk, loop = _blocks(r, k)
    nb = triton.cdiv(r // g, block_r)
    sum_g, sum_r = group_sum_blocks(g, nb)
    dueling = value is not None
    unused = reward  # a float32 pointer the kernel does not read
    biases = [unused if b is None else b for b in (logits_bias, target_bias, select_bias, value_bias,
                                                    target_value_bias, select_value_bias)]
    wrap_triton(_c51_loss_fwd_kernel)[(g * nb,)](
        logits, action, target_logits, target_logits if select_logits is None else select_logits,
        reward if penalty is None else penalty, reward, discount, support, table, ce, q, m, lse,
        value if dueling else unused, target_value if dueling else unused,
        select_value if dueling and select_value is not None else unused,
        unused if weight is None else weight, unused if weight is None else loss,
        unused if partials is None else partials, action if ticket is None else ticket, *biases,
        g, a, k, r // g, g / r,
        DOUBLE=select_logits is not None, PENALTY=penalty is not None, DUELING=dueling, BLOCK_R=block_r, BK=bk,
        LOOP=loop, MEAN=weight is not None, SUM_G=sum_g, SUM_R=sum_r, BIAS=logits_bias is not None, num_warps=4)
    return ce, q, m, lse, loss


@device_op("foxdqn::c51_loss_backward", mutates_args=())
def _c51_loss_backward_op(grad: Tensor, logits: Tensor, value: Optional[Tensor], action: Tensor, m: Tensor,
                          lse: Tensor, weight: Optional[Tensor], logits_bias: Optional[Tensor],
                          value_bias: Optional[Tensor], groups: int) -> tuple[Tensor, Tensor]:
    # grad: the upstream gradient of ce ([R]), or with weight that of the groups' means ([G])
    r, a, k = logits.shape
    out = torch.empty_like(logits)
    v_out = torch.empty(r if value is not None else 0, k, device=logits.device, dtype=torch.float32)
    block_r, bk, _ = _blocks(r, k)
    wrap_triton(_c51_loss_bwd_kernel)[(triton.cdiv(r, block_r),)](
        grad.contiguous(), logits, logits if value is None else value, action, m, lse, out, v_out,
        lse if weight is None else weight, lse if logits_bias is None else logits_bias,
        lse if value_bias is None else value_bias, r, a, k, r // groups, groups / r,
        DUELING=value is not None, BLOCK_R=block_r, BK=bk, MEAN=weight is not None, BIAS=logits_bias is not None,
        num_warps=4)
    return out, v_out


def _c51_loss_setup_context(ctx, inputs, output):
    logits, action, weight = inputs[0], inputs[1], inputs[12]
    ctx.save_for_backward(logits, inputs[9], action, output[2], output[3], weight, inputs[15], inputs[18])
    ctx.mean = weight is not None
    ctx.groups = inputs[8].shape[0]  # the table's rows
    # q, m, lse; ce too where the groups' means (the fifth output) carry the gradient
    ctx.mark_non_differentiable(*output[1:4], *((output[0],) if ctx.mean else (output[4],)))
    ctx.set_materialize_grads(False)  # no zero tensors for them in the backward: three memsets fewer


def _c51_loss_backward(ctx, grad_ce, grad_q, grad_m, grad_lse, grad_loss):
    logits, value, action, m, lse, weight, logits_bias, value_bias = ctx.saved_tensors
    upstream = grad_loss if ctx.mean else grad_ce
    need = ctx.needs_input_grad
    grad = grad_v = grad_lb = grad_vb = None
    if upstream is not None and (need[0] or need[9] or need[15] or need[18]):
        grad, grad_v = _c51_loss_backward_op(upstream, logits, value, action, m, lse, weight, logits_bias,
                                             value_bias, ctx.groups)
        g = ctx.groups  # a bias row's gradient: the sum of its group's rows (baddbmm's bias gradient)
        grad_lb = grad.view(g, -1, logits_bias.shape[-1]).sum(dim=1).view_as(logits_bias) if need[15] else None
        grad_vb = grad_v.view(g, -1, value_bias.shape[-1]).sum(dim=1).view_as(value_bias) if need[18] else None
        grad = grad if need[0] else None
        grad_v = grad_v if value is not None and need[9] else None
    # only the online logits (advantages), value stream and their biases get a gradient
    return ((grad, None, None, None, None, None, None, None, None, grad_v) + (None,) * 5
            + (grad_lb, None, None, grad_vb, None, None))


_c51_loss_op.register_autograd(_c51_loss_backward, setup_context=_c51_loss_setup_context)


class C51Biases(NamedTuple):
    """The head layers' biases that their outputs do not hold yet (each computed by a ``bmm``
    without its bias: ``baddbmm`` would copy the bias into its [R, A·K] output first, a launch and
    a pass over the output), one row per group; the kernels add them as they read the logits.

    Fields: ``logits``, ``target``, ``select``: float32 ``[G, A·K]`` contiguous, the bias of the
    online, target and selecting network's logits (their advantages with the dueling head);
    ``select`` with ``select_logits`` only. ``value``, ``target_value``, ``select_value``: float32
    ``[G, K]`` contiguous, the value streams' (with the dueling head), else None."""

    logits: Tensor
    target: Tensor
    select: Optional[Tensor] = None
    value: Optional[Tensor] = None
    target_value: Optional[Tensor] = None
    select_value: Optional[Tensor] = None


def _biased(t: Tensor | None, bias: Tensor | None) -> Tensor | None:
    """``t`` ``[R, ...]`` plus group g's bias row (``bias`` ``[G, numel/R]``) on each of its rows."""
    if t is None or bias is None:
        return t
    g = bias.shape[0]
    return (t.reshape(g, -1, bias.shape[-1]) + bias[:, None, :]).view(t.shape)


def dueling_logits(value: Tensor | None, advantage: Tensor | None) -> Tensor | None:
    """Rainbow's atom logits ``v + adv − mean_a adv`` (``[R, A, K]``) of a value stream ``[R, K]`` and
    advantages ``[R, A, K]`` (the ops of :meth:`foxdqn.population.distributional.MemberC51Network.logits`);
    ``advantage`` itself when ``value`` is None."""
    if value is None or advantage is None:
        return advantage
    return value[:, None, :] + advantage - advantage.mean(dim=1, keepdim=True)


def c51_loss_reference(logits: Tensor, action: Tensor, target_logits: Tensor, select_logits: Tensor | None,
                       penalty: Tensor | None, reward: Tensor, discount: Tensor, support: Tensor,
                       v_min: Tensor, v_max: Tensor, value: Tensor | None = None, target_value: Tensor | None = None,
                       select_value: Tensor | None = None, bias: C51Biases | None = None) -> tuple[Tensor, Tensor]:
    """Plain-torch :func:`c51_loss` (``c51_cross_entropy``'s ops on ``[G, R/G, ...]`` views): the
    same arguments, with the float64 ``[G]`` bounds for the projection in place of the table."""
    if bias is not None:  # each stream plus its group's bias row, as baddbmm would have returned it
        logits, target_logits, select_logits = (_biased(logits, bias.logits), _biased(target_logits, bias.target),
                                                 _biased(select_logits, bias.select))
        value, target_value, select_value = (_biased(value, bias.value), _biased(target_value, bias.target_value),
                                              _biased(select_value, bias.select_value))
    logits, target_logits = dueling_logits(value, logits), dueling_logits(target_value, target_logits)
    select_logits = dueling_logits(select_value, select_logits)
    r, a, k = logits.shape
    g = support.shape[0]
    z = support.view(g, 1, 1, k)
    log_p_all = F.log_softmax(logits.view(g, -1, a, k), dim=-1)
    q = (log_p_all.exp() * z).sum(dim=-1).view(r, a)
    log_p = log_p_all.view(r, a, k).gather(1, action.view(r, 1, 1).expand(r, 1, k)).squeeze(1)
    with torch.no_grad():
        p_next_all = F.softmax(target_logits.view(g, -1, a, k), dim=-1)
        sel_p = p_next_all if select_logits is None else F.softmax(select_logits.view(g, -1, a, k), dim=-1)
        select = (sel_p * z).sum(dim=-1).view(r, a)
        if penalty is not None:
            select = select - penalty.view(r, a)
        a_star = select.argmax(dim=-1)
        p_next = p_next_all.view(r, a, k).gather(1, a_star.view(r, 1, 1).expand(r, 1, k)).squeeze(1)
        m = c51_project_reference(p_next, reward, discount, v_min, v_max)
    return -(m * log_p).sum(dim=-1), q.detach()


def c51_loss(logits: Tensor, action: Tensor, target_logits: Tensor, select_logits: Tensor | None,
             penalty: Tensor | None, reward: Tensor, discount: Tensor, support: Tensor, v_min: Tensor,
             v_max: Tensor, table: Tensor | None = None, value: Tensor | None = None,
             target_value: Tensor | None = None, select_value: Tensor | None = None,
             bias: C51Biases | None = None, backend: str = "auto") -> tuple[Tensor, Tensor]:
    """(ce float32 ``[R]`` with its gradient to ``logits``, q float32 ``[R, A]`` without one): the C51
    loss of R rows in G groups (module docstring), one forward and one backward kernel on the device.

    Args:
        logits: float32 ``[R, A, K]`` contiguous, the online atom logits at s (may require grad).
        action: int64 ``[R]``, the action taken (in 0..A−1).
        target_logits: float32 ``[R, A, K]`` contiguous, the target network's logits at s'.
        select_logits: None, or float32 ``[R, A, K]`` contiguous, the online logits at s' that pick
            a* (Double DQN); None: the target's expected Q picks it.
        penalty: None, or float32 ``[R, A]`` contiguous, subtracted from the Q that picks a*.
        reward, discount: float32 ``[R]`` (R and γ^m, 0 at a terminal).
        support: float32 ``[G, K]`` contiguous, each group's atoms z_k (G divides R).
        v_min, v_max: float ``[G]`` tensors, each group's bounds (the reference projects with them).
        table: None, or :func:`foxdqn.ops.c51_project.support_table` of the bounds (float32
            ``[G, 4]``; None: made here, seven small ops: pass it to save them).
        value, target_value, select_value: None, or (Rainbow's dueling head) float32 ``[R, K]``
            contiguous value streams of the online, target and selecting networks (``select_value``
            with ``select_logits``): each network's logits are then ``v + adv − mean_a adv``
            (:func:`dueling_logits`) of its stream and ``logits`` / ``target_logits`` /
            ``select_logits``, its advantages; ``value`` gets a gradient too.
        bias: None, or :class:`C51Biases`: the streams are then their layers' products without
            the bias, which the kernels add (the reference adds it first); ``bias.logits`` and
            ``bias.value`` get their gradients (each group's rows summed, one launch each).
        backend: "auto" (Triton for CUDA tensors, torch for CPU ones), "triton" or "torch".

    Raises:
        ValueError: a wrong shape, dtype, layout or device; K > :data:`MAX_ATOMS` for the kernel; G
            not dividing R; an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    args = (logits, action, target_logits, select_logits, penalty, reward, discount, support, v_min, v_max)
    if _backend(*args, value, target_value, select_value, bias, backend) == "torch":
        return c51_loss_reference(*args, value, target_value, select_value, bias)
    ce, q, _, _, _ = _launch(*args, table, value, target_value, select_value, bias, None)
    return ce, q.detach()


def c51_weighted_loss(logits: Tensor, action: Tensor, target_logits: Tensor, select_logits: Tensor | None,
                      penalty: Tensor | None, reward: Tensor, discount: Tensor, support: Tensor, v_min: Tensor,
                      v_max: Tensor, weight: Tensor, table: Tensor | None = None, value: Tensor | None = None,
                      target_value: Tensor | None = None, select_value: Tensor | None = None,
                      bias: C51Biases | None = None, backend: str = "auto") -> tuple[Tensor, Tensor, Tensor]:
    """(loss float32 ``[G]`` with its gradient to ``logits`` (and ``value``), ce float32 ``[R]``
    detached, q float32 ``[R, A]`` detached): :func:`c51_loss` and each group's importance-weighted
    mean ``loss_g = Σ_{r in g} w_r · ce_r / B_g`` (B_g = R/G; PER's weighting, Schaul et al. 2016,
    §3.4; :func:`foxdqn.objectives.base.weighted_mean`'s) in the same two kernels: the forward's
    programs each hold one group's rows and store their part, the last program sums each group's
    parts (:func:`foxdqn.ops.dqn_td_loss.group_sums_of_last_program`), and the backward scales each
    row's gradient by ``upstream_g · (1/B_g) · w_r`` (``(upstream_g / B_g) · w_r``, the weighted
    mean's backward, where B_g is a power of two; within an ulp otherwise). The mean's sum runs in
    program order, so it equals the reference's to float32 rounding. Four launches fewer per
    update than :func:`c51_loss` and a weighted mean (a multiply and a mean, their backward's
    divide and multiply).

    Args:
        weight: float32 ``[R]`` contiguous, each row's importance weight (ones with uniform replay).
        the rest: as :func:`c51_loss`.

    Raises:
        ValueError: as :func:`c51_loss`, and a weight that is not float32 ``[R]`` on logits' device.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.

    Scratch: :func:`foxdqn.ops.dqn_td_loss._scratch`'s partials and ticket (calls on one stream).
    """
    args = (logits, action, target_logits, select_logits, penalty, reward, discount, support, v_min, v_max)
    r = logits.shape[0] if isinstance(logits, Tensor) and logits.dim() == 3 else -1
    if not isinstance(weight, Tensor) or tuple(weight.shape) != (r,) or weight.dtype != torch.float32 \
            or not weight.is_contiguous() or weight.device != getattr(logits, "device", None):
        raise ValueError(f"c51_weighted_loss: weight must be a contiguous float32 tensor [{r}] on logits' "
                         f"device, got {describe(weight)}")
    if _backend(*args, value, target_value, select_value, bias, backend, "c51_weighted_loss") == "torch":
        ce, q = c51_loss_reference(*args, value, target_value, select_value, bias)
        return (ce.view(support.shape[0], -1) * weight.view(support.shape[0], -1)).mean(dim=-1), ce.detach(), q
    ce, q, _, _, loss = _launch(*args, table, value, target_value, select_value, bias, weight)
    return loss, ce.detach(), q.detach()


def _backend(logits, action, target_logits, select_logits, penalty, reward, discount, support, v_min, v_max,
             value, target_value, select_value, bias, backend, name="c51_loss") -> str:
    """Check the arguments; "torch" or "triton" (raises for too many atoms on the kernel's path)."""
    _check(logits, action, target_logits, select_logits, penalty, reward, discount, support, v_min, v_max)
    _check_values(logits, value, target_value, select_value, select_logits)
    _check_bias(logits, support, bias, select_logits is not None, value is not None)
    chosen = resolve_backend(name, backend, logits)
    if chosen != "torch" and logits.shape[-1] > MAX_ATOMS:
        raise ValueError(f"{name}: the kernel takes at most {MAX_ATOMS} atoms, got {logits.shape[-1]}")
    return chosen


def _launch(logits, action, target_logits, select_logits, penalty, reward, discount, support, v_min, v_max,
            table, value, target_value, select_value, bias, weight):
    """The forward op's outputs (ce, q, m, lse, loss), the table made where not given and, with
    ``weight``, the scratch of ``G · NB`` programs."""
    if table is None:
        from foxdqn.ops.c51_project import support_table

        table = support_table(v_min, v_max, logits.shape[-1])
    partials = ticket = None
    if weight is not None:
        r, _, k = logits.shape
        g = support.shape[0]
        partials, ticket = _scratch(logits.device, g * triton.cdiv(r // g, _blocks(r, k)[0]))
    return _c51_loss_op(logits, action, target_logits, select_logits, penalty, reward.contiguous(),
                        discount.contiguous(), support, table, value, target_value, select_value, weight, partials,
                        ticket, *(bias if bias is not None else (None,) * 6))


def _check_bias(logits, support, bias, double: bool, dueling: bool) -> None:
    """A :class:`C51Biases` whose fields match the streams given (module docstring), or None."""
    if bias is None:
        return
    if not isinstance(bias, C51Biases):
        raise ValueError(f"c51_loss: bias must be None or a C51Biases, got {type(bias).__name__}")
    _, a, k = logits.shape
    g = support.shape[0]
    for name, width, wanted in (("logits", a * k, True), ("target", a * k, True), ("select", a * k, double),
                                ("value", k, dueling), ("target_value", k, dueling),
                                ("select_value", k, dueling and double)):
        t = getattr(bias, name)
        if not wanted:
            if t is not None:
                raise ValueError(f"c51_loss: bias.{name} must be None here (no such stream is given)")
            continue
        if not isinstance(t, Tensor) or tuple(t.shape) != (g, width) or t.dtype != torch.float32 \
                or not t.is_contiguous() or t.device != logits.device:
            raise ValueError(f"c51_loss: bias.{name} must be a contiguous float32 tensor [{g}, {width}] on "
                             f"{logits.device}, got {describe(t)}")


def _check_values(logits, value, target_value, select_value, select_logits) -> None:
    r, _, k = logits.shape
    given = [v is not None for v in (value, target_value)] + ([select_value is not None] if select_logits is not None
                                                              else [])
    if any(given) and not all(given) or select_logits is None and select_value is not None:
        raise ValueError("c51_loss: value streams for every network or none (select_value with select_logits only)")
    for name, t in (("value", value), ("target_value", target_value), ("select_value", select_value)):
        if t is None:
            continue
        if not isinstance(t, Tensor) or tuple(t.shape) != (r, k) or t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"c51_loss: {name} must be a contiguous float32 tensor [{r}, {k}], got {describe(t)}")
        if t.device != logits.device:
            raise ValueError(f"c51_loss: {name} is on {t.device}, logits on {logits.device}")


def _check(logits, action, target_logits, select_logits, penalty, reward, discount, support, v_min, v_max) -> None:
    if not isinstance(logits, Tensor) or logits.dim() != 3 or logits.dtype != torch.float32 \
            or not logits.is_contiguous():
        raise ValueError(f"c51_loss: logits must be a contiguous float32 tensor [R, A, K], got {describe(logits)}")
    r, a, k = logits.shape
    g = support.shape[0] if isinstance(support, Tensor) and support.dim() == 2 else 0
    want = [("target_logits", target_logits, (r, a, k), torch.float32),
            ("select_logits", select_logits, (r, a, k), torch.float32), ("penalty", penalty, (r, a), torch.float32),
            ("action", action, (r,), torch.int64), ("reward", reward, (r,), torch.float32),
            ("discount", discount, (r,), torch.float32), ("support", support, (g, k), torch.float32)]
    for name, t, shape, dtype in want:
        if t is None and name in ("select_logits", "penalty"):
            continue
        if not isinstance(t, Tensor) or tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous():
            raise ValueError(f"c51_loss: {name} must be a contiguous {dtype} tensor {list(shape)}, got {describe(t)}")
        if t.device != logits.device:
            raise ValueError(f"c51_loss: {name} is on {t.device}, logits on {logits.device}")
    if g == 0 or r % g:
        raise ValueError(f"c51_loss: support must be [G, K] with G dividing R = {r}, got {describe(support)}")
    for name, t in (("v_min", v_min), ("v_max", v_max)):
        if not isinstance(t, Tensor) or tuple(t.shape) != (g,) or not t.dtype.is_floating_point:
            raise ValueError(f"c51_loss: {name} must be a float tensor [{g}], got {describe(t)}")
