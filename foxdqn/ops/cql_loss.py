"""CQL(H) regulariser of each member, times its α, in one kernel with its gradient.

Source: Kumar, Zhou, Tucker & Levine (2020), "Conservative Q-Learning for Offline Reinforcement
Learning", eq. 4 (CQL(H), the variant of their discrete-action experiments), weighted by the
replay's importance weights as every foxdqn objective is (Schaul et al. 2016, §3.4). Per member g
of G, with B_g rows ``b`` of its own and A actions:

    c_b      = logsumexp_a Q(s_b, a) − Q(s_b, a_b)                      (≥ 0)
    loss_g   = α_g · Σ_b w_b c_b / B_g
    ∂loss_g/∂Q(s_b, a) = α_g · w_b / B_g · (softmax_a Q(s_b, ·) − 1{a = a_b})

This is what :func:`foxdqn.objectives.cql.cql_regulariser` times α computes
(:func:`cql_loss_reference`); :func:`foxdqn.population.objective.member_loss` adds it to each
member's base loss (a member with α = 0 adds 0 · its term).

Registration: a ``torch.autograd.Function``. The forward kernel writes the loss and ∂loss/∂Q
(float32 ``[G, B_g, A]``, kept until backward); backward is one multiply of it by the upstream
gradient. Capturable in a CUDA graph (device ops only, fixed shapes, no scratch). Double backward
is not supported. NaN: a NaN in member g's Q rows makes its loss NaN (as torch's logsumexp); the
other members' losses stay finite. An infinite Q gives NaN or inf where torch may give inf (the
guard skips such an update either way).

Launch: one kernel of G programs; program g walks its member's rows in blocks of ``BLOCK_R``
(a ``TILE``-element tile of ``[BLOCK_R, BLOCK_A]``), accumulating ``w_b c_b`` per row lane, and
sums the lanes once at the end (a fixed order: the same bits on every call, and a member's bits
do not depend on G). Q may be a strided view (a member's s rows of the stacked ``[G, 2B_g, A]``
online forward) as long as its last axis is contiguous: no copy.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from foxdqn.ops.backend import describe, resolve_backend

__all__ = ["cql_loss", "cql_loss_reference", "cql_rows"]

TILE = 2048  #: elements of a program's [BLOCK_R, BLOCK_A] tile
NUM_WARPS = 4  #: warps per program


# ----------------------------------------------------------------------------- kernel
@triton.jit
def cql_rows(q, hit, ok, col_ok):
    """``(c, dc)`` of a tile of Q rows ``q`` f32 ``[R, BLOCK_A]`` (any value in masked columns),
    ``hit`` the data action's column, ``ok`` the real rows: c f32 ``[R]`` = logsumexp_a Q − Q(a_data)
    (0 in masked rows), dc f32 ``[R, BLOCK_A]`` = softmax_a Q − 1{a = a_data}, its gradient w.r.t. the
    row. logsumexp as torch's: the row's max, then log Σ exp(Q − max); a NaN propagates through the
    sum. Also the CQL term of :mod:`foxdqn.ops.dqn_td_loss`'s kernel (``cql_alpha``)."""
    qm = tl.where(col_ok[None, :], q, float("-inf"))
    top = tl.where(ok, tl.max(qm, axis=1), 0.0)
    e = tl.exp(qm - top[:, None])  # 0 in masked columns (exp(−inf))
    total = tl.where(ok, tl.sum(e, axis=1), 1.0)
    c = tl.where(ok, top + tl.log(total) - tl.sum(tl.where(hit, q, 0.0), axis=1), 0.0)
    return c, e / total[:, None] - tl.where(hit, 1.0, 0.0)


@triton.jit
def _cql_loss_kernel(
    q_ptr,  # f32 [G, Bg, A] view: strides (stride_g, stride_b, 1)
    action_ptr,  # i64 [G·Bg]
    weight_ptr,  # f32 [G·Bg] (HAS_WEIGHT)
    alpha_ptr,  # f32 [G]
    loss_ptr,  # f32 [G] out
    dq_ptr,  # f32 [G, Bg, A] contiguous out: ∂loss/∂Q
    Bg, A, stride_g, stride_b, inv_n,
    HAS_WEIGHT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_A: tl.constexpr,
):
    g = tl.program_id(0).to(tl.int64)
    zero = tl.zeros([], dtype=tl.int64)  # an int argument equal to 1 arrives as a constexpr
    Bg, A = Bg + zero, A + zero
    inv_n = tl.cast(inv_n, tl.float32)
    alpha = tl.load(alpha_ptr + g)
    cols = tl.arange(0, BLOCK_A)
    col_ok = cols < A
    acc = tl.zeros([BLOCK_R], tl.float32)
    for r0 in range(0, Bg, BLOCK_R):
        b = r0 + tl.arange(0, BLOCK_R)
        ok = b < Bg
        m2 = ok[:, None] & col_ok[None, :]
        row = g * Bg + b
        q = tl.load(q_ptr + g * stride_g + b[:, None] * stride_b + cols[None, :], mask=m2, other=float("-inf"))
        a = tl.load(action_ptr + row, mask=ok, other=0)
        c, dc = cql_rows(q, cols[None, :] == a[:, None], ok, col_ok)
        if HAS_WEIGHT:
            w = tl.load(weight_ptr + row, mask=ok, other=0.0)
        else:
            w = tl.where(ok, 1.0, 0.0)
        acc += w * c
        scale = alpha * w * inv_n
        tl.store(dq_ptr + row[:, None] * A + cols[None, :], dc * scale[:, None], mask=m2)
    tl.store(loss_ptr + g, alpha * (tl.sum(acc, axis=0) * inv_n))


def _blocks(rows_per_group: int, num_actions: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_A): BLOCK_A the actions rounded up to a power of two, BLOCK_R the rows of a
    ``TILE``-element tile (at least 1, at most the member's rows rounded up to a power of two)."""
    block_a = triton.next_power_of_2(num_actions)
    block_r = max(1, min(triton.next_power_of_2(max(rows_per_group, 1)), TILE // block_a))
    return block_r, block_a


class _CQLLoss(torch.autograd.Function):
    """loss = kernel(q, ...); backward: the saved ∂loss/∂Q times the upstream gradient."""

    @staticmethod
    def forward(ctx, q, action, weight, alpha):
        g, bg, a = q.shape
        loss = torch.empty(g, device=q.device, dtype=torch.float32)
        dq = torch.empty((g, bg, a), device=q.device, dtype=torch.float32)
        if bg:
            block_r, block_a = _blocks(bg, a)
            _cql_loss_kernel[(g,)](q, action, weight if weight is not None else alpha, alpha, loss, dq,
                                   bg, a, q.stride(0), q.stride(1), 1.0 / bg,
                                   HAS_WEIGHT=weight is not None, BLOCK_R=block_r, BLOCK_A=block_a,
                                   num_warps=NUM_WARPS)
        else:
            loss.fill_(float("nan"))  # the mean of nothing, as torch's
        ctx.save_for_backward(dq)
        ctx.set_materialize_grads(False)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        (dq,) = ctx.saved_tensors
        if grad_loss is None:
            return None, None, None, None
        return dq * grad_loss[:, None, None], None, None, None


# ----------------------------------------------------------------------------- checks
def _check(q, action, weight, alpha):
    """Validate; returns (action [G·Bg], weight [G·Bg] | None)."""
    op = "cql_loss"
    if q.dim() != 3 or q.dtype != torch.float32 or q.shape[-1] < 1:
        raise ValueError(f"cql_loss: q must be float32 [G, B, A] with A >= 1, got {describe(q)}")
    g, bg, _ = q.shape
    if not isinstance(alpha, torch.Tensor) or alpha.dtype != torch.float32 or tuple(alpha.shape) != (g,):
        raise ValueError(f"{op}: alpha must be float32 [{g}] (one CQL α per member), got {describe(alpha)}")
    action = action.reshape(-1)
    if action.dtype != torch.int64 or action.shape[0] != g * bg:
        raise ValueError(f"{op}: action must be int64 [{g * bg}] (G·B rows, member-major), got {describe(action)}")
    if weight is not None:
        weight = weight.reshape(-1)
        if weight.dtype != torch.float32 or weight.shape[0] != g * bg:
            raise ValueError(f"{op}: weight must be float32 [{g * bg}] or None, got {describe(weight)}")
    for name, x in (("action", action), ("weight", weight), ("alpha", alpha)):
        if x is not None and x.device != q.device:
            raise ValueError(f"{op}: {name} is on {x.device}, q on {q.device}")
    return action, weight


# ----------------------------------------------------------------------------- reference
def cql_loss_reference(q: torch.Tensor, action: torch.Tensor, weight: torch.Tensor | None,
                       alpha: torch.Tensor) -> torch.Tensor:
    """Plain-torch :func:`cql_loss` (same arguments and result), differentiable by autograd: the
    arithmetic of ``α · cql_regulariser(q, action, weight)`` (:mod:`foxdqn.objectives.cql`, which
    sits above the ops and is not imported here)."""
    action, weight = _check(q, action, weight, alpha)
    g, bg, _ = q.shape
    per_sample = torch.logsumexp(q, dim=-1) - q.gather(-1, action.view(g, bg, 1)).squeeze(-1)  # [G, B]
    if weight is not None:
        per_sample = per_sample * weight.view(g, bg)
    return alpha * per_sample.mean(dim=-1)


# ----------------------------------------------------------------------------- public
def cql_loss(q: torch.Tensor, action: torch.Tensor, weight: torch.Tensor | None, alpha: torch.Tensor,
             backend: str = "auto") -> torch.Tensor:
    """Each member's α · CQL(H) regulariser (Kumar et al. 2020, eq. 4; module docstring), with its
    gradient w.r.t. ``q`` computed in the same kernel.

    Args:
        q: float32 ``[G, B, A]`` online Q of the sampled states (expected Q for C51 / IQN heads),
            with gradient; a strided view is read in place when its last axis is contiguous.
        action: int64 ``[G·B]`` (or ``[G, B]``) dataset actions in [0, A), member-major (a device
            value: not checked; out of range reads Q(s, a) = 0 in the kernel).
        weight: float32 ``[G·B]`` importance weights, or None (all 1).
        alpha: float32 ``[G]``, each member's CQL α >= 0 (``objective.cql_alpha``).
        backend: ``"auto"`` (Triton for CUDA tensors, else torch), ``"triton"``, ``"torch"``.

    Returns:
        float32 ``[G]``: α_g · Σ_b w_b (logsumexp_a Q_g(s_b, a) − Q_g(s_b, a_b)) / B, member g's own
        rows only; differentiable w.r.t. ``q``. On the Triton backend its graph holds ∂loss/∂Q
        (float32 ``[G, B, A]``) from this call until backward.

    Raises:
        ValueError: wrong shapes, dtypes or devices; an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    action, weight = _check(q, action, weight, alpha)
    if resolve_backend("cql_loss", backend, q) == "torch":
        return cql_loss_reference(q, action, weight, alpha)
    if q.stride(-1) != 1:
        q = q.contiguous()
    return _CQLLoss.apply(q, action.contiguous(), None if weight is None else weight.contiguous(),
                          alpha.contiguous())
