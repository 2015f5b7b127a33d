r"""ε-greedy actions of a population's action-branching (BDQ) head from its features, in one kernel:
the branch Linears, the shared value, the per-branch dueling aggregation, the joint Q and the selection.

    A_d[p, m] = h[p, m] · W_d[p] + b_d[p]                              [n_d]   (branch d of D, D = 1 to 3)
    Q_d = (V + A_d) − mean(A_d),  V = h[p, m] · w_v[p] + b_v[p]        (dueling; else Q_d = A_d: BDQ eq. 1)
    Q[p, m, (a_1, .., a_D)] = (Q_1[a_1] + .. + Q_D[a_D]) / D           (joint index row-major, first branch slowest)
    action[p·M + m] = epsilon_greedy(Q[p, m], step, start[p], end[p], duration[p], u[p, :, m])

Tavakoli, Pardo & Kormushev 2018, "Action Branching Architectures for Deep Reinforcement
Learning", eq. 1; the joint Q is :func:`foxdqn.nn.branching.combine_branches`'s (the sums in its
order: ``((Q_1 + Q_2) + Q_3) / D``). For member p of P and row m of M; h float32 ``[P, M, H]`` (the
encoder's output), weights in the population layout of
:class:`foxdqn.population.branching.MemberBranchingNetwork` (``[P, in, out]``, biases
``[P, 1, out]``). The selection is :func:`foxdqn.ops.epsilon_greedy.epsilon_greedy`'s rule (shared
``@triton.jit`` helpers) with one linear ε schedule per member over the Π n_d joint actions. The
collect step of a branching population acts through it (:meth:`MemberBranchingNetwork.fused_epsilon_greedy`,
:func:`foxdqn.step.act.act`): one kernel where the head's D + 1 Linears, the D dueling combines
(3 ops each), the joint sum and ε-greedy were 15 (trading's D = 3).

Kernel (Triton): a grid of (blocks of :data:`BLOCK_M` rows, P members); program (r, p) reads only
member p's weights and rows. Per branch, one ``tl.dot`` of the h tile with W_d gives A_d (its mean
over the n_d real columns), and one with W_d's columns gathered per joint action (column a_d(j) for
joint column j) gives A_d[a_d(j)] in the joint layout, so the joint Q is a ``[BLOCK_M, Π n_d]``
register tile (never stored). Widths: H 1 to 256, Π n_d 1 to 64.

Precision: :mod:`foxdqn.ops.q_forward`'s rule (TF32 operands rounded to nearest where torch's
float32 CUDA matmuls use TF32; no multiply-add contraction); the division by D is IEEE
(``div_rn``), as torch's. The products sum in another order than torch's, so Q equals
:func:`branching_epsilon_greedy_reference`'s to float rounding and the actions agree wherever the
reference's argmax is clear. NaN: a NaN in a row's h makes its joint Q NaN (action 0 greedy).

No gradient: integer actions. Capture: device ops only, the output is ``torch.empty``. Registered
as ``torch.ops.foxdqn.branching_epsilon_greedy`` by :func:`foxdqn.ops.library.register_ops`.

Errors: ``ValueError`` (messages start with ``branching_epsilon_greedy:``) for arguments outside
the contract; ``RuntimeError`` for backend="triton" on CPU tensors without TRITON_INTERPRET=1.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.epsilon_greedy import (RANDOM_BITS, check_member_schedule, epsilon_greedy_reference,
                                      store_member_actions)
from foxdqn.ops.library import device_op, wrap_triton
from foxdqn.ops.mlp_chain import _pad, _prec, _tf32

__all__ = ["MAX_ACTIONS", "MAX_BRANCHES", "MAX_WIDTH", "branching_epsilon_greedy",
           "branching_epsilon_greedy_reference"]

MAX_WIDTH = 256  # largest feature width H
MAX_ACTIONS = 64  # largest joint action count Π n_d: the Q tile [BLOCK_M, 64]
MAX_BRANCHES = 3
BLOCK_M = 16  # rows per program (tl.dot's smallest tile)
NUM_WARPS = 4


@triton.jit
def _branch_q(h, w, b, w_so, w_si, v, pick, n, n_ok, N: tl.constexpr, PN: tl.constexpr,
              DUELING: tl.constexpr, PREC: tl.constexpr):
    """Branch Q_d[pick] [BLOCK_M, PJ] of the joint columns (``pick`` [PJ]: each joint column's
    sub-action, padded columns any valid one): h · W_d[:, pick] + b_d[pick], with the dueling
    ``(V + A) − mean A`` over the N real sub-actions."""
    c = tl.arange(0, PN)
    c_ok = c < N
    wt = tl.load(w + n[:, None] * w_si + pick[None, :] * w_so, mask=n_ok[:, None], other=0.0)
    out = tl.dot(h, _tf32(wt, PREC), input_precision=PREC) + tl.load(b + pick)[None, :]
    if DUELING:
        wf = tl.load(w + n[:, None] * w_si + c[None, :] * w_so, mask=n_ok[:, None] & c_ok[None, :], other=0.0)
        full = tl.dot(h, _tf32(wf, PREC), input_precision=PREC) + tl.load(b + c, mask=c_ok, other=0.0)[None, :]
        mean = tl.sum(tl.where(c_ok[None, :], full, 0.0), axis=1) / N
        out = (v[:, None] + out) - mean[:, None]
    return out


@triton.jit
def _branching_epsilon_greedy_kernel(h_ptr, out_ptr, M, w0, b0, w1, b1, w2, b2, wv, bv,
                                     step_ptr, start_ptr, end_ptr, duration_ptr, u_ptr,
                                     w0_sp, w0_so, w0_si, b0_sp, w1_sp, w1_so, w1_si, b1_sp,
                                     w2_sp, w2_so, w2_si, b2_sp, wv_sp, wv_si, bv_sp,
                                     H: tl.constexpr, N0: tl.constexpr, N1: tl.constexpr, N2: tl.constexpr,
                                     D: tl.constexpr, PH: tl.constexpr, PN0: tl.constexpr, PN1: tl.constexpr,
                                     PN2: tl.constexpr, PJ: tl.constexpr, DUELING: tl.constexpr,
                                     BLOCK_M: tl.constexpr, PREC: tl.constexpr, RANDOM_BITS: tl.constexpr):
    """Actions (int64 [P·M] at out_ptr) of member ``program_id(1)``'s rows ``program_id(0)``.
    Branches beyond D have size 1 and are not read (their pointers are branch 0's). Biases are
    contiguous in their last axis."""
    A: tl.constexpr = N0 * N1 * N2
    p = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    ok = rows < M
    n = tl.arange(0, PH)
    n_ok = n < H
    j = tl.arange(0, PJ)
    j_ok = j < A
    jj = tl.where(j_ok, j, 0)  # padded joint columns read sub-action 0 (masked out of the argmax)
    h_raw = tl.load(h_ptr + (p * M + rows)[:, None] * H + n[None, :], mask=ok[:, None] & n_ok[None, :], other=0.0)
    h = _tf32(h_raw, PREC)
    v = tl.zeros([BLOCK_M], dtype=tl.float32)
    if DUELING:
        wvt = tl.load(wv + p * wv_sp + n * wv_si, mask=n_ok, other=0.0)
        v = tl.sum(h_raw * wvt[None, :], axis=1) + tl.load(bv + p * bv_sp)
    total = _branch_q(h, w0 + p * w0_sp, b0 + p * b0_sp, w0_so, w0_si, v, jj // (N1 * N2), n, n_ok, N0, PN0,
                      DUELING, PREC)
    if D >= 2:
        total = total + _branch_q(h, w1 + p * w1_sp, b1 + p * b1_sp, w1_so, w1_si, v, (jj // N2) % N1, n,
                                  n_ok, N1, PN1, DUELING, PREC)
    if D >= 3:
        total = total + _branch_q(h, w2 + p * w2_sp, b2 + p * b2_sp, w2_so, w2_si, v, jj % N2, n, n_ok, N2,
                                  PN2, DUELING, PREC)
    q = tl.math.div_rn(total, tl.full(total.shape, D, tl.float32))
    store_member_actions(q, j, j_ok, A, out_ptr, rows, ok, p, M, step_ptr, start_ptr,
                         end_ptr, duration_ptr, u_ptr, RANDOM_BITS)


@device_op("foxdqn::branching_epsilon_greedy", mutates_args=())
def _branching_epsilon_greedy_op(h: Tensor, branches: list[Tensor], branch_biases: list[Tensor], value: list[Tensor],
                                 step: Tensor, start: Tensor, end: Tensor, duration: Tensor, u: Tensor) -> Tensor:
    members, rows, width = h.shape
    out = torch.empty(members * rows, dtype=torch.int64, device=h.device)
    if out.numel() == 0:
        return out
    d = len(branches)
    sizes = [w.shape[2] for w in branches] + [1] * (MAX_BRANCHES - d)
    ws = list(branches) + [branches[0]] * (MAX_BRANCHES - d)
    bs = list(branch_biases) + [branch_biases[0]] * (MAX_BRANCHES - d)
    wv, bv = (value[0], value[1]) if value else (ws[0], bs[0])
    strides = [s for w, b in zip(ws, bs) for s in (w.stride(0), w.stride(2), w.stride(1), b.stride(0))]
    grid = (triton.cdiv(rows, BLOCK_M), members)
    wrap_triton(_branching_epsilon_greedy_kernel)[grid](
        h, out, rows, ws[0], bs[0], ws[1], bs[1], ws[2], bs[2], wv, bv, step, start, end, duration, u,
        *strides, wv.stride(0), wv.stride(1), bv.stride(0),
        H=width, N0=sizes[0], N1=sizes[1], N2=sizes[2], D=d, PH=_pad(width), PN0=_pad(sizes[0]), PN1=_pad(sizes[1]),
        PN2=_pad(sizes[2]), PJ=_pad(math.prod(sizes)), DUELING=bool(value), BLOCK_M=BLOCK_M, PREC=_prec(h),
        RANDOM_BITS=RANDOM_BITS, num_warps=NUM_WARPS, enable_fp_fusion=False)
    return out


def _check(h, branches, branch_biases, value, step, start, end, duration, u) -> None:
    op = "branching_epsilon_greedy"
    if not isinstance(h, Tensor) or h.dim() != 3 or h.dtype != torch.float32 or not h.is_contiguous():
        raise ValueError(f"{op}: h must be a contiguous float32 [P, M, H] tensor, got {describe(h)}")
    members, _, width = h.shape
    if not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"{op}: the feature width H must be 1 to {MAX_WIDTH}, got {width}")
    if not isinstance(branches, (list, tuple)) or not isinstance(branch_biases, (list, tuple)) \
            or not 1 <= len(branches) <= MAX_BRANCHES or len(branch_biases) != len(branches):
        raise ValueError(f"{op}: branches and branch_biases must be lists of 1 to {MAX_BRANCHES} tensors, one bias "
                         "per branch")
    if not isinstance(value, (list, tuple)) or len(value) not in (0, 2):
        raise ValueError(f"{op}: value must be [] (no value stream) or [w_v, b_v]")
    layers = [(f"branches[{i}]", w, f"branch_biases[{i}]", b) for i, (w, b) in enumerate(zip(branches, branch_biases))]
    if value:
        layers.append(("value[0]", value[0], "value[1]", value[1]))
    for wname, w, bname, b in layers:
        out = w.shape[-1] if isinstance(w, Tensor) and w.dim() == 3 else -1
        if not isinstance(w, Tensor) or tuple(w.shape) != (members, width, out) or w.dtype != torch.float32 \
                or w.device != h.device or out < 1 or (wname == "value[0]" and out != 1):
            raise ValueError(f"{op}: {wname} must be a float32 [{members}, {width}, out] tensor on {h.device} "
                             f"(w_v: out = 1), got {describe(w)}")
        if not isinstance(b, Tensor) or tuple(b.shape) != (members, 1, out) or b.dtype != torch.float32 \
                or b.device != h.device or b.stride(2) != 1:
            raise ValueError(f"{op}: {bname} must be a float32 [{members}, 1, {out}] tensor on {h.device} with "
                             f"contiguous rows, got {describe(b)}")
    joint = math.prod(w.shape[2] for w in branches)
    if joint > MAX_ACTIONS:
        raise ValueError(f"{op}: the joint actions Π n_d must be at most {MAX_ACTIONS}, got {joint}")
    check_member_schedule(op, h, step, start, end, duration, u)


def branching_q_reference(h: Tensor, branches: list[Tensor], branch_biases: list[Tensor],
                          value: list[Tensor]) -> Tensor:
    """Plain torch: the joint Q float32 ``[P, M, Π n_d]`` of :func:`branching_epsilon_greedy`, as
    :class:`~foxdqn.population.branching.MemberBranchingNetwork` computes it from its features
    (``torch.baddbmm`` per Linear, ``v + adv − adv.mean`` per branch, the joint sum over the
    branches' broadcast in :func:`foxdqn.nn.branching.combine_branches`' order, divided by D)."""
    qs = [torch.baddbmm(b, h, w) for w, b in zip(branches, branch_biases)]
    if value:
        v = torch.baddbmm(value[1], h, value[0])
        qs = [v + adv - adv.mean(dim=-1, keepdim=True) for adv in qs]
    lead = list(h.shape[:2])
    total = None
    for d, q in enumerate(qs):
        shape = lead + [1] * len(qs)
        shape[2 + d] = q.shape[-1]
        q = q.reshape(shape)
        total = q if total is None else total + q
    return (total / len(qs)).reshape(*lead, -1)


def branching_epsilon_greedy_reference(h: Tensor, branches: list[Tensor], branch_biases: list[Tensor],
                                       value: list[Tensor], *, step: Tensor, start: Tensor, end: Tensor,
                                       duration: Tensor, u: Tensor) -> Tensor:
    """Plain torch (the spec): :func:`~foxdqn.ops.epsilon_greedy.epsilon_greedy_reference` of
    :func:`branching_q_reference`'s joint Q, rows member-major. Same arguments, result and errors
    as :func:`branching_epsilon_greedy`."""
    _check(h, branches, branch_biases, value, step, start, end, duration, u)
    with torch.no_grad():
        q = branching_q_reference(h, branches, branch_biases, value)
    return epsilon_greedy_reference(q.reshape(-1, q.shape[-1]), step, start, end, duration, u)


def branching_epsilon_greedy(h: Tensor, branches: list[Tensor], branch_biases: list[Tensor], value: list[Tensor], *,
                             step: Tensor, start: Tensor, end: Tensor, duration: Tensor, u: Tensor,
                             backend: str = "auto") -> Tensor:
    """ε-greedy joint actions of P BDQ heads on their features, one kernel (module docstring).

    Args:
        h: float32 ``[P, M, H]`` contiguous, each member's features (1 <= H <= 256).
        branches: D (1 to 3) float32 ``[P, H, n_d]`` branch weights, Π n_d <= 64.
        branch_biases: the matching float32 ``[P, 1, n_d]`` (rows contiguous).
        value: ``[w_v [P, H, 1], b_v [P, 1, 1]]`` (the shared value stream) or ``[]`` (none: Q_d = A_d).
        step, start, end, duration, u: :func:`~foxdqn.ops.epsilon_greedy.epsilon_greedy`'s
            schedule with one group per member (start etc. ``[P]``, u float32 ``[P, 2, M]``).
        backend: "auto" (the kernel for CUDA tensors, else the reference), "triton" (CPU tensors
            need TRITON_INTERPRET=1), "torch" (:func:`branching_epsilon_greedy_reference`).

    Returns:
        int64 ``[P·M]`` joint actions in ``[0, Π n_d)`` (row-major, first branch slowest), member-major.

    Raises:
        ValueError: arguments outside the contract (the message names the argument), an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check(h, branches, branch_biases, value, step, start, end, duration, u)
    if resolve_backend("branching_epsilon_greedy", backend, h) == "torch":
        return branching_epsilon_greedy_reference(h, branches, branch_biases, value, step=step, start=start, end=end,
                                                  duration=duration, u=u)
    return _branching_epsilon_greedy_op(h, list(branches), list(branch_biases), list(value), step, start, end,
                                        duration, u)
