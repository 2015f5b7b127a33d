r"""ε-greedy actions of a population's C51 head from its features, in one kernel: the head's
Linear(s), the softmax over atoms, the expected Q and the selection.

    logits[p, m, a, :] = h[p, m] · W[p][:, a·K : (a+1)·K] + b[p][a·K : (a+1)·K]        (plain head)
    logits[p, m, a, :] = (v + adv_a) − (1/A) Σ_a' adv_a'                               (dueling: Rainbow,
        v = h[p, m] · W_v[p] + b_v[p]  [K],  adv_a = h[p, m] · W_a[p][:, a·K : (a+1)·K] + b_a[p][..]   Hessel et al. 2018)
    Q[p, m, a] = Σ_k softmax_k(logits[p, m, a, :]) · z[p, k]                           (Bellemare et al. 2017, §4)
    action[p·M + m] = epsilon_greedy(Q[p, m], step, start[p], end[p], duration[p], u[p, :, m])

For member p of P and row m of M; h float32 ``[P, M, H]`` (the encoder's output), weights in the
population layout of :class:`foxdqn.population.distributional.MemberC51Network` (``[P, in, out]``,
biases ``[P, 1, out]``), z the member's support ``[P, K]`` (any strides). The selection is
:func:`foxdqn.ops.epsilon_greedy.epsilon_greedy`'s rule (shared ``@triton.jit`` helpers: schedule,
explore test, random action, argmax with NaN largest and ties to the first index) with one linear ε
schedule per member (G = P groups of M rows). The collect step of a C51 population acts through it
(:meth:`MemberC51Network.fused_epsilon_greedy`, :func:`foxdqn.step.act.act`): one kernel where the
head's Linear(s), the dueling combine (3 ops), softmax, product, sum and ε-greedy were 5 to 9.

Kernel (Triton): a grid of (blocks of :data:`BLOCK_M` rows, P members); program (r, p) reads only
member p's weights, support and rows (members never mix, a member's actions do not depend on P).
The h tile ``[BLOCK_M, H]`` stays in registers; per action a, a ``tl.dot`` with W's K columns of a
gives the atom logits ``[BLOCK_M, K]`` (with a dueling head, a first pass over the actions sums the
advantages for their mean); the softmax over the K real atoms (max subtracted, padded atoms masked
out) and its product with z give Q's column a in a ``[BLOCK_M, A]`` register tile, never stored.
Widths: H 1 to 256, K 1 to 128 (padded to powers of two >= 16), A 1 to 64.

Precision: :mod:`foxdqn.ops.q_forward`'s rule (TF32 operands rounded to nearest where torch's
float32 CUDA matmuls use TF32, else IEEE float32; no multiply-add contraction, as the ε schedule
needs). The sums run in another order than torch's (the dot's, the advantage mean's sequential sum,
the softmax's), so Q equals :func:`c51_epsilon_greedy_reference`'s to float rounding and the actions
agree wherever the reference's argmax is clear. NaN: a NaN in h or a weight makes that row's logits,
hence its Q, NaN (the first NaN action is its greedy pick, as torch.argmax's).

No gradient: integer actions. Capture: device ops only, the output is ``torch.empty``. Registered as
``torch.ops.foxdqn.c51_epsilon_greedy`` by :func:`foxdqn.ops.library.register_ops`.

Errors: ``ValueError`` (messages start with ``c51_epsilon_greedy:``) for arguments outside the
contract (shapes, float32, devices, widths above, the schedule's as
:func:`~foxdqn.ops.epsilon_greedy.epsilon_greedy`'s with G = P); ``RuntimeError`` for
backend="triton" on CPU tensors without TRITON_INTERPRET=1.
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
from foxdqn.ops.mlp_chain import _pad, _prec, _tf32

__all__ = ["MAX_ACTIONS", "MAX_ATOMS", "MAX_WIDTH", "c51_epsilon_greedy", "c51_epsilon_greedy_reference"]

MAX_WIDTH = 256  # largest feature width H: the h tile [BLOCK_M, 256] per program
MAX_ATOMS = 128  # largest K
MAX_ACTIONS = 64  # largest A: the Q tile [BLOCK_M, 64]
BLOCK_M = 16  # rows per program (tl.dot's smallest tile): the collect step's rows are few per member
NUM_WARPS = 4
#: no software pipelining of the action loop: with Triton's default stages the [H, K] W tiles at
#: the widest shapes (H = 256, K = 128: 128 KiB each) asked for more shared memory than the H200 has
NUM_STAGES = 1


@triton.jit
def _atom_logits(h, w_ptr, b_ptr, col0, n, n_ok, k, k_ok, w_so, w_si, PREC: tl.constexpr):
    """h [BLOCK_M, PH] · W[:, col0 + k] + b[col0 + k] → [BLOCK_M, PK] (padded atoms 0)."""
    wt = tl.load(w_ptr + n[:, None] * w_si + (col0 + k)[None, :] * w_so, mask=n_ok[:, None] & k_ok[None, :],
                 other=0.0)
    out = tl.dot(h, _tf32(wt, PREC), input_precision=PREC)
    return out + tl.load(b_ptr + col0 + k, mask=k_ok, other=0.0)[None, :]


@triton.jit
def _c51_epsilon_greedy_kernel(h_ptr, out_ptr, M, wv, bv, wa, ba, z_ptr,
                               step_ptr, start_ptr, end_ptr, duration_ptr, u_ptr,
                               wv_sp, wv_so, wv_si, bv_sp, wa_sp, wa_so, wa_si, ba_sp, z_sp, z_sk,
                               H: tl.constexpr, K: tl.constexpr, A: tl.constexpr, PH: tl.constexpr,
                               PK: tl.constexpr, PA: tl.constexpr, DUELING: tl.constexpr, BLOCK_M: tl.constexpr,
                               PREC: tl.constexpr, RANDOM_BITS: tl.constexpr):
    """Actions (int64 [P·M] at out_ptr) of member ``program_id(1)``'s rows ``program_id(0)``.
    wa, ba: W and b (plain) or W_a and b_a (dueling); wv, bv: W_v and b_v (dueling, else unused).
    Biases are contiguous in their last axis (``[P, 1, out]`` rows)."""
    p = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    ok = rows < M
    n = tl.arange(0, PH)
    n_ok = n < H
    k = tl.arange(0, PK)
    k_ok = k < K
    a_idx = tl.arange(0, PA)
    a_ok = a_idx < A
    h = tl.load(h_ptr + (p * M + rows)[:, None] * H + n[None, :], mask=ok[:, None] & n_ok[None, :], other=0.0)
    h = _tf32(h, PREC)
    wa += p * wa_sp
    ba += p * ba_sp
    z = tl.load(z_ptr + p * z_sp + k * z_sk, mask=k_ok, other=0.0)
    if DUELING:
        value = _atom_logits(h, wv + p * wv_sp, bv + p * bv_sp, 0, n, n_ok, k, k_ok, wv_so, wv_si, PREC)
        adv_sum = tl.zeros([BLOCK_M, PK], dtype=tl.float32)
        for a in range(A):
            adv_sum += _atom_logits(h, wa, ba, a * K, n, n_ok, k, k_ok, wa_so, wa_si, PREC)
        adv_mean = adv_sum / A
    q = tl.zeros([BLOCK_M, PA], dtype=tl.float32)
    for a in range(A):
        logits = _atom_logits(h, wa, ba, a * K, n, n_ok, k, k_ok, wa_so, wa_si, PREC)
        if DUELING:
            logits = (value + logits) - adv_mean
        top = tl.max(tl.where(k_ok[None, :], logits, float("-inf")), axis=1)
        e = tl.where(k_ok[None, :], tl.exp(logits - top[:, None]), 0.0)
        prob = e / tl.sum(e, axis=1)[:, None]
        qa = tl.sum(prob * z[None, :], axis=1)
        q = tl.where(a_idx[None, :] == a, qa[:, None], q)
    store_member_actions(q, a_idx, a_ok, A, out_ptr, rows, ok, p, M, step_ptr, start_ptr,
                         end_ptr, duration_ptr, u_ptr, RANDOM_BITS)


@device_op("foxdqn::c51_epsilon_greedy", mutates_args=())
def _c51_epsilon_greedy_op(h: Tensor, weights: list[Tensor], biases: list[Tensor], support: Tensor, step: Tensor,
                           start: Tensor, end: Tensor, duration: Tensor, u: Tensor) -> Tensor:
    members, rows, width = h.shape
    out = torch.empty(members * rows, dtype=torch.int64, device=h.device)
    if out.numel() == 0:
        return out
    dueling = len(weights) == 2
    atoms = support.shape[1]
    wa, ba = weights[-1], biases[-1]
    wv, bv = (weights[0], biases[0]) if dueling else (wa, ba)
    actions = wa.shape[2] // atoms
    grid = (triton.cdiv(rows, BLOCK_M), members)
    wrap_triton(_c51_epsilon_greedy_kernel)[grid](
        h, out, rows, wv, bv, wa, ba, support, step, start, end, duration, u,
        wv.stride(0), wv.stride(2), wv.stride(1), bv.stride(0), wa.stride(0), wa.stride(2), wa.stride(1), ba.stride(0),
        support.stride(0), support.stride(1),
        H=width, K=atoms, A=actions, PH=_pad(width), PK=_pad(atoms), PA=_pad(actions), DUELING=dueling,
        BLOCK_M=BLOCK_M, PREC=_prec(h), RANDOM_BITS=RANDOM_BITS, num_warps=NUM_WARPS,
        num_stages=NUM_STAGES, enable_fp_fusion=False)
    return out


def _check(h, weights, biases, support, step, start, end, duration, u) -> None:
    op = "c51_epsilon_greedy"
    if not isinstance(h, Tensor) or h.dim() != 3 or h.dtype != torch.float32 or not h.is_contiguous():
        raise ValueError(f"{op}: h must be a contiguous float32 [P, M, H] tensor, got {describe(h)}")
    members, _, width = h.shape
    if not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"{op}: the feature width H must be 1 to {MAX_WIDTH}, got {width}")
    if not isinstance(support, Tensor) or support.dim() != 2 or support.shape[0] != members \
            or support.dtype != torch.float32 or support.device != h.device or not 1 <= support.shape[1] <= MAX_ATOMS:
        raise ValueError(f"{op}: support must be a float32 [{members}, K] tensor on {h.device} (1 <= K <= "
                         f"{MAX_ATOMS}), got {describe(support)}")
    atoms = support.shape[1]
    if not isinstance(weights, (list, tuple)) or not isinstance(biases, (list, tuple)) \
            or len(weights) not in (1, 2) or len(biases) != len(weights):
        raise ValueError(f"{op}: weights and biases must be lists of 1 (W) or 2 (W_v, W_a: dueling) tensors")
    for i, (w, b) in enumerate(zip(weights, biases)):
        out = atoms if len(weights) == 2 and i == 0 else (w.shape[-1] if isinstance(w, Tensor) else -1)
        if not isinstance(w, Tensor) or w.dim() != 3 or tuple(w.shape) != (members, width, out) \
                or w.dtype != torch.float32 or w.device != h.device:
            raise ValueError(f"{op}: weights[{i}] must be a float32 [{members}, {width}, out] tensor on {h.device} "
                             f"(W_v: out = K = {atoms}), got {describe(w)}")
        if not isinstance(b, Tensor) or tuple(b.shape) != (members, 1, out) or b.dtype != torch.float32 \
                or b.device != h.device or b.stride(2) != 1:
            raise ValueError(f"{op}: biases[{i}] must be a float32 [{members}, 1, {out}] tensor on {h.device} "
                             f"with contiguous rows, got {describe(b)}")
    cols = weights[-1].shape[2]
    if cols % atoms or not 1 <= cols // atoms <= MAX_ACTIONS:
        raise ValueError(f"{op}: the last weight's outputs must be A·K (K = {atoms}, 1 <= A <= {MAX_ACTIONS}), "
                         f"got {cols}")
    check_member_schedule(op, h, step, start, end, duration, u)


def c51_expected_q_reference(h: Tensor, weights: list[Tensor], biases: list[Tensor], support: Tensor) -> Tensor:
    """Plain torch: the expected Q float32 ``[P, M, A]`` of :func:`c51_epsilon_greedy` (module
    docstring), as :class:`~foxdqn.population.distributional.MemberC51Network` computes it from its
    features (``torch.baddbmm`` per Linear, ``v + adv − adv.mean``, softmax, product with z, sum)."""
    members, rows, _ = h.shape
    atoms = support.shape[1]
    adv = torch.baddbmm(biases[-1], h, weights[-1]).view(members, rows, -1, atoms)
    if len(weights) == 2:
        v = torch.baddbmm(biases[0], h, weights[0])[:, :, None, :]
        adv = v + adv - adv.mean(dim=2, keepdim=True)
    return (torch.softmax(adv, dim=-1) * support[:, None, None, :]).sum(dim=-1)


def c51_epsilon_greedy_reference(h: Tensor, weights: list[Tensor], biases: list[Tensor], support: Tensor, *,
                                 step: Tensor, start: Tensor, end: Tensor, duration: Tensor, u: Tensor) -> Tensor:
    """Plain torch (the spec): :func:`~foxdqn.ops.epsilon_greedy.epsilon_greedy_reference` of
    :func:`c51_expected_q_reference`'s Q, rows member-major. Same arguments, result and errors as
    :func:`c51_epsilon_greedy`."""
    _check(h, weights, biases, support, step, start, end, duration, u)
    with torch.no_grad():
        q = c51_expected_q_reference(h, weights, biases, support)
    return epsilon_greedy_reference(q.reshape(-1, q.shape[-1]), step, start, end, duration, u)


def c51_epsilon_greedy(h: Tensor, weights: list[Tensor], biases: list[Tensor], support: Tensor, *, step: Tensor,
                       start: Tensor, end: Tensor, duration: Tensor, u: Tensor, backend: str = "auto") -> Tensor:
    """ε-greedy actions of P C51 heads on their features, one kernel (module docstring).

    Args:
        h: float32 ``[P, M, H]`` contiguous, each member's features (1 <= H <= 256).
        weights: ``[W]`` (plain head: float32 ``[P, H, A·K]``, action a's logits in columns
            a·K .. a·K + K − 1) or ``[W_v, W_a]`` (dueling: ``[P, H, K]`` and ``[P, H, A·K]``).
        biases: the matching float32 ``[P, 1, out]`` tensors (rows contiguous).
        support: float32 ``[P, K]`` (any strides), member p's atoms z (return units), 1 <= K <= 128.
        step, start, end, duration, u: :func:`~foxdqn.ops.epsilon_greedy.epsilon_greedy`'s
            schedule with one group per member (start etc. ``[P]``, u float32 ``[P, 2, M]``).
        backend: "auto" (the kernel for CUDA tensors, else the reference), "triton" (CPU tensors
            need TRITON_INTERPRET=1), "torch" (:func:`c51_epsilon_greedy_reference`).

    Returns:
        int64 ``[P·M]`` actions in ``[0, A)``, member-major.

    Raises:
        ValueError: arguments outside the contract (the message names the argument), an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check(h, weights, biases, support, step, start, end, duration, u)
    if resolve_backend("c51_epsilon_greedy", backend, h) == "torch":
        return c51_epsilon_greedy_reference(h, weights, biases, support, step=step, start=start, end=end,
                                            duration=duration, u=u)
    return _c51_epsilon_greedy_op(h, list(weights), list(biases), support, step, start, end, duration, u)
