r"""ε-greedy actions of a population's IQN head from its features, in one kernel: the cosine
embedding of the K policy fractions, the head's layers at each, the mean over them and the selection.

    φ_k = relu(cos(π i τ_k)_i · W_e[p] + b_e[p])                       [H]    (IQN eq. 4, τ_k the policy fractions)
    y_k = relu((h[p, m] ⊙ φ_k) · W_h[p] + b_h[p])                      [F]
    Z_k = y_k · W_o[p] + b_o[p]                                        [A]    (plain head)
    Z_k = (y_k · w_v[p] + b_v[p] + Adv_k) − mean_a Adv_k,  Adv_k = y_k · W_a[p] + b_a[p]   (dueling)
    Q[p, m] = (1/K) Σ_k Z_k,   action[p·M + m] = epsilon_greedy(Q[p, m], step, start[p], end[p], duration[p], u[p, :, m])

Dabney, Ostrovski, Silver & Munos 2018, "Implicit Quantile Networks for Distributional RL", §3.1,
eq. 4 (the embedding) and the policy as the mean of Z over K fractions; the head of
:class:`foxdqn.population.distributional.MemberIQNNetwork` (its ``policy_q``) from its features h
float32 ``[P, M, H]``, weights in the population layout (``[P, in, out]``, biases ``[P, 1, out]``),
``pi_i`` float32 ``[n]`` (π·i) and ``taus`` float32 ``[K]`` the network's buffers. The selection is
:func:`foxdqn.ops.epsilon_greedy.epsilon_greedy`'s rule (shared ``@triton.jit`` helpers) with one
linear ε schedule per member. The collect step of an IQN population acts through it
(:meth:`MemberIQNNetwork.fused_epsilon_greedy`, :func:`foxdqn.step.act.act`): one kernel where
the product, cosine, three or four Linears with their ReLUs, the mean and ε-greedy were 10 to 13.

Kernel (Triton): a grid of (blocks of :data:`BLOCK_M` rows, P members); program (r, p) reads only
member p's weights and rows. Per fraction k: the cosines in chunks of :data:`BLOCK_I` as
``[BLOCK_M, BLOCK_I]`` tiles (every row the same), each ``tl.dot`` with its W_e rows accumulating φ_k per row, then the hidden layer in chunks of
:data:`BLOCK_N` units accumulated straight into the head (as :mod:`foxdqn.ops.q_forward`'s second
layer), Z_k added to a ``[BLOCK_M, A]`` register tile; Q is never stored. Widths: n, H and F 1 to
256, A 1 to 64.

Precision: :mod:`foxdqn.ops.q_forward`'s rule (TF32 operands rounded to nearest where torch's
float32 CUDA matmuls use TF32; no multiply-add contraction); the cosine is Triton's, the sums run
in another order than torch's, so Q equals :func:`iqn_epsilon_greedy_reference`'s to float
rounding and the actions agree wherever the reference's argmax is clear. NaN: a NaN in a row's h
makes its Q NaN (action 0 greedy); the padded units are exactly 0 after each ReLU.

No gradient: integer actions. Capture: device ops only, the output is ``torch.empty``. Registered
as ``torch.ops.foxdqn.iqn_epsilon_greedy`` by :func:`foxdqn.ops.library.register_ops`.

Errors: ``ValueError`` (messages start with ``iqn_epsilon_greedy:``) for arguments outside the
contract; ``RuntimeError`` for backend="triton" on CPU tensors without TRITON_INTERPRET=1.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.epsilon_greedy import (RANDOM_BITS, check_member_schedule, epsilon_greedy_reference,
                                      store_member_actions)
from foxdqn.ops.library import device_op, wrap_triton
from foxdqn.ops.mlp_chain import _pad, _prec, _relu, _tf32

__all__ = ["MAX_ACTIONS", "MAX_WIDTH", "iqn_epsilon_greedy", "iqn_epsilon_greedy_reference"]

MAX_WIDTH = 256  # largest n, H and F
MAX_ACTIONS = 64  # largest A
BLOCK_M = 16  # rows per program (tl.dot's smallest tile)
BLOCK_N = 64  # hidden units per step of the head loop: a [H, 64] W_h tile
BLOCK_I = 64  # cosines per step of the embedding loop: a [64, H] W_e tile
NUM_WARPS = 4
#: no software pipelining of the loops: with Triton's default stages the W_h tiles of eurusd_iqn
#: (H = F = 256, n = 64) took 244 KiB of shared memory, above the H200's 227 KiB
NUM_STAGES = 1


@triton.jit
def _iqn_epsilon_greedy_kernel(h_ptr, out_ptr, M, pi_ptr, tau_ptr, we, be, wh, bh, wv, bv, wo, bo,
                               step_ptr, start_ptr, end_ptr, duration_ptr, u_ptr,
                               we_sp, we_so, we_si, be_sp, wh_sp, wh_so, wh_si, bh_sp,
                               wv_sp, wv_si, bv_sp, wo_sp, wo_so, wo_si, bo_sp,
                               E: tl.constexpr, H: tl.constexpr, F: tl.constexpr, A: tl.constexpr,
                               K: tl.constexpr, PH: tl.constexpr, PA: tl.constexpr,
                               DUELING: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_I: tl.constexpr,
                               PREC: tl.constexpr, RANDOM_BITS: tl.constexpr):
    """Actions (int64 [P·M] at out_ptr) of member ``program_id(1)``'s rows ``program_id(0)``.
    wo, bo: W_o, b_o (plain) or W_a, b_a (dueling); wv, bv: w_v, b_v (dueling, else unused).
    Biases are contiguous in their last axis."""
    p = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    ok = rows < M
    n = tl.arange(0, PH)
    n_ok = n < H
    a = tl.arange(0, PA)
    a_ok = a < A
    h = tl.load(h_ptr + (p * M + rows)[:, None] * H + n[None, :], mask=ok[:, None] & n_ok[None, :], other=0.0)
    we += p * we_sp
    wh += p * wh_sp
    wo += p * wo_sp
    wv += p * wv_sp
    bias_e = tl.load(be + p * be_sp + n, mask=n_ok, other=0.0)
    bias_o = tl.load(bo + p * bo_sp + a, mask=a_ok, other=0.0)
    qsum = tl.zeros([BLOCK_M, PA], dtype=tl.float32)
    for k in range(K):
        tau = tl.load(tau_ptr + k)
        phi = tl.zeros([BLOCK_M, PH], dtype=tl.float32)
        for i0 in range(0, E, BLOCK_I):  # the embedding in chunks of BLOCK_I cosines: a [BLOCK_I, H] W_e tile
            i = i0 + tl.arange(0, BLOCK_I)
            i_ok = i < E
            cos = tl.where(i_ok, tl.cos(tau * tl.load(pi_ptr + i, mask=i_ok, other=0.0)), 0.0)
            cos_tile = tl.zeros([BLOCK_M, BLOCK_I], dtype=tl.float32) + cos[None, :]
            wet = tl.load(we + i[:, None] * we_si + n[None, :] * we_so, mask=i_ok[:, None] & n_ok[None, :], other=0.0)
            phi = tl.dot(_tf32(cos_tile, PREC), _tf32(wet, PREC), acc=phi, input_precision=PREC)
        phi = tl.where(n_ok[None, :], _relu(phi + bias_e[None, :]), 0.0)
        x = _tf32(h * phi, PREC)
        z = tl.zeros([BLOCK_M, PA], dtype=tl.float32)
        value = tl.zeros([BLOCK_M], dtype=tl.float32)
        for j0 in range(0, F, BLOCK_N):
            j = j0 + tl.arange(0, BLOCK_N)
            j_ok = j < F
            wht = tl.load(wh + n[:, None] * wh_si + j[None, :] * wh_so, mask=n_ok[:, None] & j_ok[None, :], other=0.0)
            y = tl.dot(x, _tf32(wht, PREC), input_precision=PREC) + tl.load(bh + p * bh_sp + j, mask=j_ok,
                                                                             other=0.0)[None, :]
            y = tl.where(j_ok[None, :], _relu(y), 0.0)
            wot = tl.load(wo + j[:, None] * wo_si + a[None, :] * wo_so, mask=j_ok[:, None] & a_ok[None, :], other=0.0)
            z = tl.dot(_tf32(y, PREC), _tf32(wot, PREC), acc=z, input_precision=PREC)
            if DUELING:
                wvt = tl.load(wv + j * wv_si, mask=j_ok, other=0.0)
                value += tl.sum(y * wvt[None, :], axis=1)
        z += bias_o[None, :]
        if DUELING:
            value += tl.load(bv + p * bv_sp)
            mean = tl.sum(tl.where(a_ok[None, :], z, 0.0), axis=1) / A
            z = (value[:, None] + z) - mean[:, None]
        qsum += z
    q = qsum / K
    store_member_actions(q, a, a_ok, A, out_ptr, rows, ok, p, M, step_ptr, start_ptr,
                         end_ptr, duration_ptr, u_ptr, RANDOM_BITS)


@device_op("foxdqn::iqn_epsilon_greedy", mutates_args=())
def _iqn_epsilon_greedy_op(h: Tensor, weights: list[Tensor], biases: list[Tensor], pi_i: Tensor, taus: Tensor,
                           step: Tensor, start: Tensor, end: Tensor, duration: Tensor, u: Tensor) -> Tensor:
    members, rows, width = h.shape
    out = torch.empty(members * rows, dtype=torch.int64, device=h.device)
    if out.numel() == 0:
        return out
    dueling = len(weights) == 4
    we, wh, wo = weights[0], weights[1], weights[-1]
    be, bh, bo = biases[0], biases[1], biases[-1]
    wv, bv = (weights[2], biases[2]) if dueling else (wo, bo)
    hidden, actions = wh.shape[2], wo.shape[2]
    grid = (triton.cdiv(rows, BLOCK_M), members)
    wrap_triton(_iqn_epsilon_greedy_kernel)[grid](
        h, out, rows, pi_i, taus, we, be, wh, bh, wv, bv, wo, bo, step, start, end, duration, u,
        we.stride(0), we.stride(2), we.stride(1), be.stride(0), wh.stride(0), wh.stride(2), wh.stride(1), bh.stride(0),
        wv.stride(0), wv.stride(1), bv.stride(0), wo.stride(0), wo.stride(2), wo.stride(1), bo.stride(0),
        E=pi_i.shape[0], H=width, F=hidden, A=actions, K=taus.shape[0], PH=_pad(width),
        PA=_pad(actions), DUELING=dueling, BLOCK_M=BLOCK_M, BLOCK_N=min(BLOCK_N, _pad(hidden)),
        BLOCK_I=min(BLOCK_I, _pad(pi_i.shape[0])), PREC=_prec(h), RANDOM_BITS=RANDOM_BITS, num_warps=NUM_WARPS,
        num_stages=NUM_STAGES, enable_fp_fusion=False)
    return out


def _check(h, weights, biases, pi_i, taus, step, start, end, duration, u) -> None:
    op = "iqn_epsilon_greedy"
    if not isinstance(h, Tensor) or h.dim() != 3 or h.dtype != torch.float32 or not h.is_contiguous():
        raise ValueError(f"{op}: h must be a contiguous float32 [P, M, H] tensor, got {describe(h)}")
    members, _, width = h.shape
    for name, t in (("pi_i", pi_i), ("taus", taus)):
        if not isinstance(t, Tensor) or t.dim() != 1 or t.dtype != torch.float32 or not t.is_contiguous() \
                or t.device != h.device or t.shape[0] < 1:
            raise ValueError(f"{op}: {name} must be a contiguous float32 [n >= 1] tensor on {h.device}, got "
                             f"{describe(t)}")
    if not isinstance(weights, (list, tuple)) or not isinstance(biases, (list, tuple)) \
            or len(weights) not in (3, 4) or len(biases) != len(weights):
        raise ValueError(f"{op}: weights and biases must be lists of [W_e, W_h, W_o] or [W_e, W_h, w_v, W_a] "
                         "(dueling) tensors, one bias per weight")
    dueling = len(weights) == 4
    names = ["W_e", "W_h", "w_v", "W_a"] if dueling else ["W_e", "W_h", "W_o"]
    ins = [pi_i.shape[0], width] + [weights[1].shape[-1] if isinstance(weights[1], Tensor) else -1] * (len(names) - 2)
    for name, w, b, d_in in zip(names, weights, biases, ins):
        out = w.shape[-1] if isinstance(w, Tensor) and w.dim() == 3 else -1
        if not isinstance(w, Tensor) or tuple(w.shape) != (members, d_in, out) or w.dtype != torch.float32 \
                or w.device != h.device or out < 1 or (name == "W_e" and out != width) or (name == "w_v" and out != 1):
            raise ValueError(f"{op}: {name} must be a float32 [{members}, {d_in}, out] tensor on {h.device} "
                             f"(W_e: out = H = {width}; w_v: out = 1), got {describe(w)}")
        if not isinstance(b, Tensor) or tuple(b.shape) != (members, 1, out) or b.dtype != torch.float32 \
                or b.device != h.device or b.stride(2) != 1:
            raise ValueError(f"{op}: the bias of {name} must be a float32 [{members}, 1, {out}] tensor on {h.device} "
                             f"with contiguous rows, got {describe(b)}")
    for what, size, top in (("n", pi_i.shape[0], MAX_WIDTH), ("H", width, MAX_WIDTH),
                            ("F", weights[1].shape[2], MAX_WIDTH), ("A", weights[-1].shape[2], MAX_ACTIONS)):
        if not 1 <= size <= top:
            raise ValueError(f"{op}: {what} must be 1 to {top}, got {size}")
    check_member_schedule(op, h, step, start, end, duration, u)


def iqn_policy_q_reference(h: Tensor, weights: list[Tensor], biases: list[Tensor], pi_i: Tensor,
                           taus: Tensor) -> Tensor:
    """Plain torch: the expected Q float32 ``[P, M, A]`` of :func:`iqn_epsilon_greedy`, the mean of
    Z over the K fractions (``torch.baddbmm`` per Linear on the ``M·K`` rows of each member).
    :meth:`~foxdqn.population.distributional.MemberIQNNetwork.policy_q` computes the same Q with
    its output layer on the hidden layer's means over the fractions: equal to float rounding."""
    members, rows, width = h.shape
    k = taus.shape[0]
    cos = torch.cos(taus.expand(members, rows, k)[..., None] * pi_i).view(members, rows * k, -1)
    phi = torch.relu(torch.baddbmm(biases[0], cos, weights[0]))
    x = (h[:, :, None, :] * phi.view(members, rows, k, -1)).view(members, rows * k, -1)
    y = torch.relu(torch.baddbmm(biases[1], x, weights[1]))
    if len(weights) == 4:
        adv = torch.baddbmm(biases[3], y, weights[3])
        z = torch.baddbmm(biases[2], y, weights[2]) + adv - adv.mean(dim=-1, keepdim=True)
    else:
        z = torch.baddbmm(biases[2], y, weights[2])
    return z.view(members, rows, k, -1).mean(dim=2)


def iqn_epsilon_greedy_reference(h: Tensor, weights: list[Tensor], biases: list[Tensor], pi_i: Tensor, taus: Tensor,
                                 *, step: Tensor, start: Tensor, end: Tensor, duration: Tensor, u: Tensor) -> Tensor:
    """Plain torch (the spec): :func:`~foxdqn.ops.epsilon_greedy.epsilon_greedy_reference` of
    :func:`iqn_policy_q_reference`'s Q, rows member-major. Same arguments, result and errors as
    :func:`iqn_epsilon_greedy`."""
    _check(h, weights, biases, pi_i, taus, step, start, end, duration, u)
    with torch.no_grad():
        q = iqn_policy_q_reference(h, weights, biases, pi_i, taus)
    return epsilon_greedy_reference(q.reshape(-1, q.shape[-1]), step, start, end, duration, u)


def iqn_epsilon_greedy(h: Tensor, weights: list[Tensor], biases: list[Tensor], pi_i: Tensor, taus: Tensor, *,
                       step: Tensor, start: Tensor, end: Tensor, duration: Tensor, u: Tensor,
                       backend: str = "auto") -> Tensor:
    """ε-greedy actions of P IQN heads on their features, one kernel (module docstring).

    Args:
        h: float32 ``[P, M, H]`` contiguous, each member's features (1 <= H <= 256).
        weights: ``[W_e [P, n, H], W_h [P, H, F], W_o [P, F, A]]`` or with a dueling head
            ``[W_e, W_h, w_v [P, F, 1], W_a [P, F, A]]``, float32 (n, F <= 256, A <= 64).
        biases: the matching float32 ``[P, 1, out]`` (rows contiguous).
        pi_i: float32 ``[n]``, π·i of the cosine basis (the network's buffer).
        taus: float32 ``[K]``, the policy fractions τ_k (the network's ``policy_taus``).
        step, start, end, duration, u: :func:`~foxdqn.ops.epsilon_greedy.epsilon_greedy`'s
            schedule with one group per member (start etc. ``[P]``, u float32 ``[P, 2, M]``).
        backend: "auto" (the kernel for CUDA tensors, else the reference), "triton" (CPU tensors
            need TRITON_INTERPRET=1), "torch" (:func:`iqn_epsilon_greedy_reference`).

    Returns:
        int64 ``[P·M]`` actions in ``[0, A)``, member-major.

    Raises:
        ValueError: arguments outside the contract (the message names the argument), an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check(h, weights, biases, pi_i, taus, step, start, end, duration, u)
    if resolve_backend("iqn_epsilon_greedy", backend, h) == "torch":
        return iqn_epsilon_greedy_reference(h, weights, biases, pi_i, taus, step=step, start=start, end=end,
                                            duration=duration, u=u)
    return _iqn_epsilon_greedy_op(h, list(weights), list(biases), pi_i, taus, step, start, end, duration, u)
