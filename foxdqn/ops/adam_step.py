r"""Adam's update of a list of parameters, step counts included, in one kernel launch (up to
:data:`~foxdqn.ops.tensor_list.MAX_SLOTS` tensors per launch).

Source: Kingma & Ba 2015, "Adam: A Method for Stochastic Optimization", Algorithm 1, as
``torch.optim.Adam(fused=True, capturable=True)`` computes it with ``amsgrad=False``,
``weight_decay=0``, ``maximize=False`` (``torch/optim/adam.py`` ``_fused_adam``:
``_foreach_add_(steps, 1)``, ``torch._fused_adam_``, ``_foreach_sub_(steps, found_inf)``; the
element rule is ATen's ``FusedAdamMathFunctor`` / ``adam_math`` in
``aten/src/ATen/native/cuda/fused_adam_utils.cuh``, as shipped with torch 2.13). Per tensor ``k``,
member ``p`` (one network: P = 1) and element, in float32 (``b1``, ``b2``, ``eps`` the Python floats
rounded to float32, as ATen's ``static_cast<float>``)::

    if skip[p] != 0: nothing changes (param, moments, step count, prior) # torch: found_inf == 1
    prior = param                                                          # (with ``prior``: the weights before the step)
    t    = step_k[p] + 1                                                   # the count after this update
    bc1  = 1 - powf(b1, t);   bc2_sqrt = sqrt_rn(1 - powf(b2, t))
    step_size = div_rn(lr[p], bc1)
    g    = grad * grad_scale[p]                                            # (no grad_scale: g = grad)
    m    = fma(b1, m, fma(-b1, g, g))                                      # b1 m + (1 - b1) g
    v    = fma(b2, v, fma(-b2, g*g, g*g))                                  # b2 v + (1 - b2) g²
    denom = sqrt_rn(v) / bc2_sqrt + eps[p]                               # "/": see Rounding
    param = param - (step_size * m) / denom
    step_k[p] = t                                                          # once per call, see below

``prior`` (optional, one tensor per param) receives each applied step's input weights, bit for
bit: the copy of the weights from before the last applied update that a halt saves
(``guard.keep_last_good``: :attr:`foxdqn.population.optim.MemberAdam.last_good`), at the cost of one
more store per element and no launch.

``grad_scale`` is a MULTIPLIER (the clip coefficient of :func:`foxdqn.ops.grad_norm.grad_norm_coefficient`),
not torch's AMP divisor: ``g`` is bit for bit what ``torch._foreach_mul_(grads, coef)`` would leave
in the gradients, which are not modified here. ``powf`` is libdevice's ``__nv_powf`` when compiled
(what ``std::pow(float, float)`` is in torch's CUDA kernel); the interpreter, which has no
libdevice, computes ``exp(t · log b)`` in float64 and rounds it once (within an ulp of ``powf``).

Rounding vs torch: on CUDA the scalar part (``powf``, ``sqrt_rn``, the ``div_rn`` of the step size)
and the moment updates (explicit fma) are rounded as in ATen's kernel; the two element divisions are
Triton's ``/`` (PTX ``div.full.f32``, each within 2 ulp of its quotient), as in ``torch.compile``'s
kernel of the reference, where ATen divides with IEEE rounding (IEEE divisions are slower here:
docs/bench.md#launch-constants). The first division's error enters ``denom``, so the step
(``step_size·m / denom``) is within about 4 ulp of the IEEE step; the stored ``param`` then differs
from the IEEE result by at most an ulp of ``param`` where ``|param|`` is much larger than the step,
by more ulps of ``param`` where it is comparable (a zero-initialised bias at step 1, a weight
crossing zero: there the error is a few ulp of the step), and the differences build up over steps
(``bench/results/2026-12-02_NVIDIA-H200_adam-epsilon-variants.txt``, its "max int diff" lines:
params after three steps against the IEEE kernel). So the result follows
``torch.optim.Adam(fused=True)`` to a few ulps of the step per step, not bit for bit: the GPU
test checks within 1e-3 of a step's size after several steps against torch 2.11, whose fused
kernel also computes ``m`` as ``b1·m + (1 - b1)·g`` with two roundings
(``tests/ops/test_adam_step.py``); torch's CPU and foreach paths (float64 bias corrections,
``lerp``) differ by a few float32 ulps per step too. The interpreter's ``/`` is IEEE. The
reference (:func:`adam_step_reference`) is the same rule in float32 torch ops (multi-tensor
``torch._foreach_*``), the moment updates as ``b·m + (1 - b)·g`` (two or three roundings in place
of the fma, about an ulp apart; it is also the run's Adam on CPU, so it is written for speed there).

Kernel count: one launch for up to 16 tensors in place of fused Adam's three (``steps += 1``, the
fused kernel, ``steps -= found_inf``), and the clip's ``_foreach_mul_`` when ``grad_scale`` is
passed. The grid is one program per row, member-major (:mod:`foxdqn.ops.tensor_list`, "Rows": a
row is BLOCK elements of a member's slice of one tensor), so ~120k parameters run on ~240 programs
at BLOCK = 512 instead of the few blocks ``multi_tensor_apply`` launches. Each program reads its
member's hyperparameters once; more rows per program were slower (the stores of one row come
before the loads of the next), and 512 elements beat 1,024 for a population of small networks
(docs/bench.md#launch-constants).

The target update (``follow``, a :class:`foxdqn.ops.target_lerp.TargetFollow`). Each program also
reads the update counter (before its ticket, as it reads its step count) and computes its member's
target weight w by :func:`foxdqn.ops.target_lerp.target_weight`; where w is not 0 it moves its row
of the target toward the param as this step stored it (the new value where applied, the old where
skipped) by :func:`foxdqn.ops.target_lerp.lerp_toward`, the element rule of ``target_lerp_``, so
the targets are bit for bit those of ``target_lerp_`` after the step: one launch and one read of
the params fewer. The last program of the last launch stores the counter + 1 after its wait
("Step counts").

Step counts. Every program reads its tensor's ``step[p]`` and computes with ``t = step + 1``;
nothing is written to the counts until every program has read them. Every program but the last (the
highest program id) adds 1 to the launch's ticket once it has read its count, after a barrier of its
warps (``atomic_add``, release at GPU scope; nothing waits for its result). The last program loads
the first ``PB`` members' counts and skips before it waits; after its own element loads it polls the
ticket (acquire at GPU scope) until the others' increments are all in, and only then stores each
count + 1 where ``skip[p] == 0`` (the members past ``PB`` loaded and stored after the wait) and
zeroes the ticket: each other program's read precedes its release, which the last program's acquire
orders before its stores (the release/acquire pattern through one location's chain of atomic adds).
Only the last program writes the counts, so the values it loaded before the wait are the ones to
advance. The wait ends whatever order the blocks are dispatched in: one program waits, only on
programs that never wait, and it holds one slot of a GPU that can hold at least two of these 4-warp
blocks at once. The exception is a misuse: two calls of this op running concurrently on two streams
of one device share the ticket, and there one last program can pass on the other launch's increments
and the other then waits forever (:mod:`foxdqn.ops.tensor_list`, "Scratch"; the training step calls
it on one stream). The interpreter runs the programs in pid order, so there the last one finds every
increment in. What the counts cost in-graph, against no counts and against a ticket that every
program draws and waits for: docs/bench.md#launch-constants. With one count per tensor
(torch's optimizer state) each launch's last program advances its own tensors' counts; with one
count shared by all tensors (:class:`foxdqn.population.optim.MemberAdam`'s ``steps``) only the last
launch's last program advances it, after every launch has read it (the earlier launches completed,
in stream order).

Scratch: the ticket of :func:`foxdqn.ops.tensor_list.scratch`, per device, made on the first
(eager) call.
"""
from __future__ import annotations

import math
import struct
from typing import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice

from foxdqn.ops.backend import INTERPRET, resolve_backend
from foxdqn.ops.library import device_op, wrap_triton
from foxdqn.ops.target_lerp import TargetFollow, check_target_args, lerp_toward, target_lerp_reference, target_weight
from foxdqn.ops.tensor_list import (MAX_SLOTS, F32, check_list, check_member_vector, check_members, describe, fma,
                                    member_row, pick16, plan, scratch, slots)

BLOCK = 512  # elements of a row, one program's (H200 sweeps: docs/bench.md#launch-constants)
NUM_WARPS = 4  # warps per program
_PB = 64  # members per iteration of the last program's loop


# ---------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------
if INTERPRET:

    @triton.jit
    def _powf(base, t, LOG_BASE: tl.constexpr):
        # No libdevice in the interpreter: base**t in float64, rounded once (LOG_BASE = log(base)).
        return tl.exp(t.to(tl.float64) * tl.full([], LOG_BASE, tl.float64)).to(tl.float32)

else:

    @triton.jit
    def _powf(base, t, LOG_BASE: tl.constexpr):
        return libdevice.pow(base, t)  # __nv_powf, as std::pow(float, float) in torch's kernel


@triton.jit
def _next_counts(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
                 skip_ptr, q0, members, N_INC: tl.constexpr, HAS_SKIP: tl.constexpr, PB: tl.constexpr):
    """The advanced step counts of members ``q0 .. q0 + PB`` (those below ``members``) of the first
    ``N_INC`` counts: ``(pointers, mask, values)`` of a ``[16, PB]`` tile, each count plus 1 where
    the member is not skipped (the counts are distinct tensors whenever ``N_INC`` > 1)."""
    q = q0 + tl.arange(0, PB)
    qm = q < members
    if HAS_SKIP:
        inc = tl.where(tl.load(skip_ptr + q, mask=qm, other=1.0) == 0.0, 1.0, 0.0)
    else:
        inc = tl.full([PB], 1.0, tl.float32)
    k = tl.arange(0, 16)[:, None]
    base = tl.where(k == 1, s1, s0)
    base = tl.where(k == 2, s2, base)
    base = tl.where(k == 3, s3, base)
    base = tl.where(k == 4, s4, base)
    base = tl.where(k == 5, s5, base)
    base = tl.where(k == 6, s6, base)
    base = tl.where(k == 7, s7, base)
    base = tl.where(k == 8, s8, base)
    base = tl.where(k == 9, s9, base)
    base = tl.where(k == 10, s10, base)
    base = tl.where(k == 11, s11, base)
    base = tl.where(k == 12, s12, base)
    base = tl.where(k == 13, s13, base)
    base = tl.where(k == 14, s14, base)
    base = tl.where(k == 15, s15, base)
    ptrs = base + q[None, :]
    mask = (k < N_INC) & qm[None, :]
    return ptrs, mask, tl.load(ptrs, mask=mask, other=0.0) + inc[None, :]


@triton.jit
def _signal_read(ticket_ptr):
    """Every program but the last, once its step count is read and used: add 1 to the launch's
    ticket (release at GPU scope, after a barrier of the program's warps; nothing waits for it)."""
    tl.debug_barrier()  # every warp has read the step count before the (one-thread) increment
    tl.atomic_add(ticket_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _wait_reads(ticket_ptr):
    """The launch's last program: wait until every other program has signalled its read (acquire
    at GPU scope); its own reads precede its writes through a barrier of its warps."""
    tl.debug_barrier()
    others = tl.num_programs(0) - 1
    seen = tl.atomic_add(ticket_ptr, 0, sem="acquire", scope="gpu")
    while seen < others:
        seen = tl.atomic_add(ticket_ptr, 0, sem="acquire", scope="gpu")


@triton.jit
def _advance_counts(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
                    skip_ptr, ticket_ptr, members, N_INC: tl.constexpr, HAS_SKIP: tl.constexpr, PB: tl.constexpr):
    """The launch's last program: add 1 to the first ``N_INC`` counts of each member not skipped,
    once every other program has read its count, and zero the ticket. The first ``PB`` members'
    counts are loaded before the wait (only this program writes them, so they hold their values
    until it does)."""
    ptrs, mask, first = _next_counts(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
                                     skip_ptr, 0, members, N_INC, HAS_SKIP, PB)
    _wait_reads(ticket_ptr)
    tl.store(ptrs, first, mask=mask)
    for q0 in range(PB, members, PB):
        ptrs, mask, later = _next_counts(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
                                         skip_ptr, q0, members, N_INC, HAS_SKIP, PB)
        tl.store(ptrs, later, mask=mask)
    tl.store(ticket_ptr, 0)


@triton.jit(do_not_specialize=[*(f"r{i}" for i in range(16)), "rows_in_launch", "members"])
def _adam_step_kernel(p0, p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, p15,
                      g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10, g11, g12, g13, g14, g15,
                      m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15,
                      v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
                      s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
                      k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11, k12, k13, k14, k15,
                      t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15,
                      n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, n11, n12, n13, n14, n15,
                      r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15,
                      lr_ptr, eps_ptr, scale_ptr, skip_ptr, ticket_ptr, updates_ptr, tau_ptr, period_ptr,
                      rows_in_launch, members, beta1, beta2, eps_value,
                      N_INC: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_SKIP: tl.constexpr, HAS_PRIOR: tl.constexpr,
                      EPS_TENSOR: tl.constexpr, LOG_BETA1: tl.constexpr, LOG_BETA2: tl.constexpr,
                      FOLLOW: tl.constexpr, HARD: tl.constexpr, ADVANCE: tl.constexpr,
                      BLOCK: tl.constexpr, PB: tl.constexpr):
    pid = tl.program_id(0)
    per_member = tl.maximum(rows_in_launch, 1)  # one row per program, member-major (tensor_list, "Rows")
    member = pid // per_member
    b1 = tl.zeros([], tl.float32) + beta1  # float32 scalars (a Python float argument is fp32 when launched eagerly)
    b2 = tl.zeros([], tl.float32) + beta2
    if EPS_TENSOR:
        eps = tl.load(eps_ptr + member)
    else:
        eps = tl.zeros([], tl.float32) + eps_value
    lr = tl.load(lr_ptr + member)
    if HAS_SCALE:
        scale = tl.load(scale_ptr + member)
    if HAS_SKIP:
        # a skipped member: no writes (the skip broadcast to the block first: the interpreter
        # cannot AND a block of bools with a scalar bool)
        keep = (tl.zeros([BLOCK], tl.float32) + tl.load(skip_ptr + member)) == 0.0
    if FOLLOW:  # the target update's weight (ops/target_lerp.py); the counter read before the ticket
        u = tl.load(updates_ptr)
        w = target_weight(u, member, member >= 0, skip_ptr, tau_ptr, period_ptr, HARD)
    slot, col, mask, idx, live = member_row(
        member, pid - member * per_member, rows_in_launch, n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, n11, n12, n13,
        n14, n15, r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15, BLOCK)
    valid = mask  # the row's elements: the target update writes them even where the skip masks Adam's stores
    t = tl.load(pick16(slot, s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15) + member) + 1.0
    # the element loads do not wait on the skip (it masks only the stores)
    pp = pick16(slot, p0, p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, p15) + idx
    gp = pick16(slot, g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10, g11, g12, g13, g14, g15) + idx
    mp = pick16(slot, m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15) + idx
    vp = pick16(slot, v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15) + idx
    param = tl.load(pp, mask=mask, other=0.0)
    g = tl.load(gp, mask=mask, other=0.0)
    m = tl.load(mp, mask=mask, other=0.0)
    v = tl.load(vp, mask=mask, other=0.0)
    if HAS_SCALE:
        g = g * scale
    if HAS_SKIP:
        mask = mask & keep
    bc1 = 1.0 - _powf(b1, t, LOG_BETA1)
    bc2_sqrt = tl.sqrt_rn(1.0 - _powf(b2, t, LOG_BETA2))
    step_size = tl.div_rn(lr, bc1)
    m = fma(b1, m, fma(-b1, g, g))
    gg = g * g
    v = fma(b2, v, fma(-b2, gg, gg))
    denom = tl.sqrt_rn(v) / bc2_sqrt + eps  # Triton's "/" (module docstring, "Rounding")
    new = param - (step_size * m) / denom
    if HAS_PRIOR:  # the step's input weights, where the step is applied
        kp = pick16(slot, k0, k1, k2, k3, k4, k5, k6, k7, k8, k9, k10, k11, k12, k13, k14, k15) + idx
        tl.store(kp, param, mask=mask)
    tl.store(mp, m, mask=mask)
    tl.store(vp, v, mask=mask)
    tl.store(pp, new, mask=mask)
    if FOLLOW:  # the target follows the param as stored (module docstring, "The target update")
        if w != 0.0:
            tp = pick16(slot, t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15) + idx
            stored = new
            if HAS_SKIP:  # a skipped member's params stay (and w is 0 unless its skip is NaN)
                stored = tl.where(keep, new, param)
            wb = tl.zeros([BLOCK], tl.float32) + w
            tl.store(tp, lerp_toward(tl.load(tp, mask=valid, other=0.0), stored, wb), mask=valid)
    if N_INC > 0:  # every step count this program uses is read (module docstring, "Step counts")
        if pid != tl.num_programs(0) - 1:
            _signal_read(ticket_ptr)
        else:
            _advance_counts(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
                            skip_ptr, ticket_ptr, members, N_INC, HAS_SKIP, PB)
            if ADVANCE:  # every program has read the counter (the wait above)
                tl.store(updates_ptr, u + 1)


def _f32(x: float) -> float:
    """``x`` rounded to float32 (to nearest), on the host."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _log(beta: float) -> float:
    b = _f32(beta)
    return math.log(b) if b > 0.0 else -math.inf


@device_op("foxdqn::adam_step_",
                         mutates_args={"params", "exp_avgs", "exp_avg_sqs", "steps", "prior", "targets", "ticket",
                                       "updates"})
def _adam_step_op(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
                  steps: list[Tensor], prior: list[Tensor], targets: list[Tensor], lr: Tensor, eps_tensor: Tensor,
                  grad_scale: Tensor, skip: Tensor, ticket: Tensor, updates: Tensor, tau: Tensor, hard_period: Tensor,
                  eps: float, beta1: float, beta2: float, members: int, has_eps_tensor: bool, has_scale: bool,
                  has_skip: bool, has_prior: bool, has_follow: bool, hard: bool, block: int) -> None:
    shared = len(steps) == 1 and len(params) > 1
    numels = tuple(p.numel() // members for p in params)
    launches, _ = plan(numels, block)
    for launch in launches:
        if shared:
            step_slots, n_inc = [steps[0]] * MAX_SLOTS, (1 if launch.final else 0)
        else:
            step_slots, n_inc = slots(steps, launch), launch.count
        wrap_triton(_adam_step_kernel)[(max(1, members * launch.row_count),)](
            *slots(params, launch), *slots(grads, launch), *slots(exp_avgs, launch), *slots(exp_avg_sqs, launch),
            *step_slots, *slots(prior if has_prior else params, launch), *slots(targets if has_follow else params, launch),
            *launch.numels, *launch.rows, lr, eps_tensor, grad_scale, skip, ticket, updates, tau, hard_period,
            launch.row_count, members, beta1, beta2, eps,
            N_INC=n_inc, HAS_SCALE=has_scale, HAS_SKIP=has_skip, HAS_PRIOR=has_prior, EPS_TENSOR=has_eps_tensor,
            LOG_BETA1=_log(beta1), LOG_BETA2=_log(beta2), FOLLOW=has_follow, HARD=hard,
            ADVANCE=has_follow and launch.final, BLOCK=block, PB=_PB, num_warps=NUM_WARPS)


# ---------------------------------------------------------------------------------------------
# Reference (plain torch; the CPU path)
# ---------------------------------------------------------------------------------------------
def adam_step_reference(params: Sequence[Tensor], grads: Sequence[Tensor], exp_avgs: Sequence[Tensor],
                        exp_avg_sqs: Sequence[Tensor], steps: Sequence[Tensor], *, lr: Tensor, beta1: float,
                        beta2: float, eps: float | Tensor, grad_scale: Tensor | None = None,
                        skip: Tensor | None = None, members: int = 1,
                        prior: Sequence[Tensor] | None = None) -> None:
    """Plain-torch reference of :func:`adam_step_` (same arguments, same in-place writes; the
    module docstring's rule in torch ops, float32, ``powf`` as ``torch.pow``). Device ops only:
    the update is computed out of place and written back (through ``torch.where`` when ``skip`` is
    given, so skipped members keep their values bit for bit)."""
    b1, b2 = _f32(beta1), _f32(beta2)  # exact in float32: the scalar ops below are float32 ops
    c1, c2 = 1.0 - b1, 1.0 - b2  # float32-exact for β >= 0.5 (Sterbenz; the run's 0.9, 0.999), else one more rounding
    pm, n = members, len(params)
    keep = None if skip is None else skip.reshape(pm) != 0
    shared = len(steps) == 1 and n > 1
    cols = [(pm,) + (1,) * (p.dim() - 1) if pm > 1 else () for p in params]

    def per(xs: Sequence[Tensor]) -> list[Tensor]:  # [P] values (0-d for P = 1) -> over each member's slice
        return [x.reshape(c) for x, c in zip(xs, cols)]

    def each(x: Tensor) -> list[Tensor]:  # one [P] tensor for every param
        return per([x.reshape(pm)] * n)

    # multi-tensor (foreach) torch ops, one pass per op over all tensors: this is also the run's Adam
    # on CPU, so it is written for speed there
    t = torch._foreach_add([st.reshape(pm) for st in (steps * n if shared else steps)], 1.0)
    bc1 = torch._foreach_pow(b1, t)
    torch._foreach_neg_(bc1)
    torch._foreach_add_(bc1, 1.0)
    bc2_sqrt = torch._foreach_pow(b2, t)
    torch._foreach_neg_(bc2_sqrt)
    torch._foreach_add_(bc2_sqrt, 1.0)
    torch._foreach_sqrt_(bc2_sqrt)
    step_size = torch._foreach_div([lr.reshape(pm)] * n, bc1)
    g = list(grads) if grad_scale is None else torch._foreach_mul(list(grads), each(grad_scale))
    # the kernel's fma(b, x, fma(-b, y, y)) = b·x + (1 - b)·y rounded about once; here
    # b·x + (1 - b)·y in float32, two or three roundings (about an ulp more; torch's own CPU Adam
    # rounds as often)
    m_new = torch._foreach_mul(list(exp_avgs), b1)
    torch._foreach_add_(m_new, g, alpha=c1)
    v_new = torch._foreach_mul(list(exp_avg_sqs), b2)
    torch._foreach_addcmul_(v_new, g, g, value=c2)
    denom = torch._foreach_sqrt(v_new)
    torch._foreach_div_(denom, per(bc2_sqrt))
    if isinstance(eps, Tensor):
        torch._foreach_add_(denom, each(eps))
    else:
        torch._foreach_add_(denom, _f32(eps))
    p_new = torch._foreach_mul(m_new, per(step_size))
    torch._foreach_div_(p_new, denom)
    p_new = torch._foreach_sub(list(params), p_new)
    pairs = ((exp_avgs, m_new), (exp_avg_sqs, v_new), (params, p_new))
    for olds, news in ((prior, params),) + pairs if prior is not None else pairs:  # prior first: the old params
        if keep is None:
            torch._foreach_copy_(list(olds), news)
        else:  # skipped members keep their values bit for bit (elementwise: out may alias)
            for old, new, k in zip(olds, news, each(keep)):
                torch.where(k, old, new, out=old)
    _advance_steps(steps, shared, keep)


def _advance_steps(steps: Sequence[Tensor], shared: bool, keep: Tensor | None) -> None:
    for step in (steps[:1] if shared else steps):
        if keep is None:
            step.add_(1.0)
        else:
            step.add_((~keep).to(F32).reshape(step.shape))


# ---------------------------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------------------------
def _check(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps, grad_scale, skip, members, prior,
           follow=None):
    op = "adam_step_"
    members = check_members(op, members)
    numels = check_list(op, "params", params, members)
    device = params[0].device
    lists = (("grads", grads), ("exp_avgs", exp_avgs), ("exp_avg_sqs", exp_avg_sqs))
    for name, lst in lists + ((("prior", prior),) if prior is not None else ()):
        check_list(op, name, lst, members, like=params, device=device)
    if prior is not None and {t.data_ptr() for t in prior} & {t.data_ptr() for t in params if t.numel()}:
        raise ValueError(f"{op}: prior must not share memory with params (it receives their values before the step)")
    if isinstance(steps, Tensor) or not isinstance(steps, (list, tuple)) or len(steps) not in (1, len(params)):
        raise ValueError(f"{op}: steps must be a list of one step-count tensor per param ({len(params)}) or of one "
                         f"shared by all, got {describe(steps) if isinstance(steps, Tensor) else repr(steps)[:80]}")
    for k, s in enumerate(steps):
        check_member_vector(op, f"steps[{k}]", s, members, device)
    if len({s.data_ptr() for s in steps}) != len(steps):
        raise ValueError(f"{op}: steps must be distinct tensors (one count per param), or a list of one shared count")
    check_member_vector(op, "lr", lr, members, device)
    if isinstance(eps, Tensor):
        check_member_vector(op, "eps", eps, members, device)
    elif isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"{op}: eps must be a finite float >= 0 or a float32 tensor per member, got {eps!r}")
    for name, b in (("beta1", beta1), ("beta2", beta2)):
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0.0 <= b < 1.0:
            raise ValueError(f"{op}: {name} must be a float in [0, 1), got {b!r}")
    for name, t in (("grad_scale", grad_scale), ("skip", skip)):
        if t is not None:
            check_member_vector(op, name, t, members, device)
    if follow is not None:
        if not isinstance(follow, TargetFollow) or skip is None:
            raise ValueError(f"{op}: follow must be a TargetFollow, with a skip (the target update's), got "
                             f"{type(follow).__name__} and skip={describe(skip) if skip is not None else None}")
        check_list(op, "follow.targets", follow.targets, members, like=params, device=device)
        check_target_args(f"{op} follow", follow.targets, params, follow.updates, skip, follow.tau,
                          follow.hard_period, members)
        if {t.data_ptr() for t in follow.targets} & {t.data_ptr() for t in params if t.numel()}:
            raise ValueError(f"{op}: follow.targets must not share memory with params")
    return numels


def adam_step_(params: Sequence[Tensor], grads: Sequence[Tensor], exp_avgs: Sequence[Tensor],
               exp_avg_sqs: Sequence[Tensor], steps: Sequence[Tensor], *, lr: Tensor, beta1: float = 0.9,
               beta2: float = 0.999, eps: float | Tensor = 1e-8, grad_scale: Tensor | None = None,
               skip: Tensor | None = None, members: int = 1, prior: Sequence[Tensor] | None = None,
               follow: TargetFollow | None = None, backend: str = "auto") -> None:
    """One Adam step of every tensor of ``params`` (and of every member), in place; with ``follow``
    the target networks' update in the same launch.

    Rule, rounding, the step counts' single advance and the launch structure in the module
    docstring. Device ops only (no host reads): capturable in a CUDA graph (after one eager call,
    which makes the ticket); changing ``lr``, ``eps``, ``grad_scale`` or ``skip`` in place takes
    effect at the next replay. One kernel launch per 16 tensors on CUDA.

    Args (tensors on one device):
        params: non-empty list of contiguous float32 tensors; ``[P, ...]`` with ``members`` = P > 1.
        grads: their gradients (the same shapes, contiguous float32); not modified.
        exp_avgs, exp_avg_sqs: Adam's moment estimates (torch's ``exp_avg``, ``exp_avg_sq``), the
            same shapes; updated.
        steps: float32 step counts (the updates done so far): one per param (torch's optimizer
            ``state[p]["step"]``, distinct tensors), or a list of one count shared by all params;
            each 0-d or ``[1]`` for P = 1, ``[P]`` for P > 1. Advanced by 1 where not skipped
            (exact up to 2**24).
        lr: float32 learning rate(s), 0-d/``[1]`` or ``[P]`` (>= 0; a device value, not checked).
        beta1, beta2: floats in [0, 1), shared by all members (compiled into the kernel).
        eps: the denominator term: a float >= 0, or a float32 tensor 0-d/``[1]`` or ``[P]``.
        grad_scale: None, or float32 0-d/``[1]``/``[P]``: the gradients are MULTIPLIED by it
            (the clip coefficient).
        skip: None, or float32 0-d/``[1]``/``[P]``: any value but 0.0 (the guard's 1.0; NaN too)
            leaves member ``p``'s params, moments and step counts bit for bit unchanged.
        members: P (1: one network).
        prior: None, or one tensor per param (the same shapes, contiguous float32), distinct from
            ``params``: where member ``p`` is not skipped, its params from before this step are
            copied into it; where skipped, it is left unchanged.
        follow: None, or a :class:`~foxdqn.ops.target_lerp.TargetFollow` (needs ``skip``): one
            target tensor per param, each moved toward its param as this step stored it by
            :func:`~foxdqn.ops.target_lerp.target_lerp_`'s rule and weight (``skip`` its skip), and
            ``follow.updates`` advanced by 1 after every read: what Adam then ``target_lerp_(targets,
            params, updates, skip, tau, hard_period, hard=hard, advance=True)`` do, bit for bit, in
            Adam's launch (module docstring, "The target update").
        backend: "auto" (Triton for CUDA tensors, torch reference for CPU), "triton", "torch".

    Raises:
        ValueError: a list of the wrong length, dtype, shape, layout or device; steps that are not
            distinct; a per-member tensor of the wrong dtype, shape or device; a beta outside
            [0, 1); eps negative or not finite; ``members`` not an int >= 1; an unknown backend;
            ``follow`` without ``skip``, or with arguments :func:`~foxdqn.ops.target_lerp.target_lerp_`
            refuses, or targets that share memory with ``params``.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1; the first call
            on a device inside CUDA-graph capture.
    """
    _check(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps, grad_scale, skip, members, prior,
           follow)
    with torch.no_grad():  # params are leaves that require grad
        if resolve_backend("adam_step_", backend, params[0]) == "torch":
            adam_step_reference(params, grads, exp_avgs, exp_avg_sqs, steps, lr=lr, beta1=float(beta1),
                                beta2=float(beta2), eps=eps, grad_scale=grad_scale, skip=skip, members=members,
                                prior=prior)
            if follow is not None:
                target_lerp_reference(follow.targets, params, follow.updates, skip, follow.tau, follow.hard_period,
                                      hard=bool(follow.hard), advance=True, members=members)
        else:
            _adam_step_launch(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps, grad_scale, skip,
                              members, prior, follow)


def _adam_step_launch(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps, grad_scale, skip,
                      members, prior, follow) -> None:
    device = params[0].device
    spare, ticket = scratch("adam_step_", device, 1)  # spare: the unused counter argument without follow
    has_eps = isinstance(eps, Tensor)
    _adam_step_op(list(params), list(grads), list(exp_avgs), list(exp_avg_sqs), list(steps),
                  [] if prior is None else list(prior), [] if follow is None else list(follow.targets), lr,
                  eps if has_eps else lr, lr if grad_scale is None else grad_scale, lr if skip is None else skip,
                  ticket, spare if follow is None else follow.updates, lr if follow is None else follow.tau,
                  lr if follow is None else follow.hard_period, 0.0 if has_eps else float(eps), float(beta1),
                  float(beta2), members, has_eps, grad_scale is not None, skip is not None, prior is not None,
                  follow is not None, bool(follow is not None and follow.hard), BLOCK)
