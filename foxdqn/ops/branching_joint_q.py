r"""The joint Q of an action-branching (BDQ) head from its raw outputs, in one kernel: the dueling
aggregation per branch and the mean over branches for every joint action.

    Q_d[r, j]  = (V[r] + A_d[r, j]) − (1/n_d) Σ_i A_d[r, i]          (Tavakoli et al. 2018, eq. 1;
                                                                     A_d alone without V)
    Q[r, a]    = (Σ_d Q_d[r, a_d]) / D,   a = Σ_d a_d · Π_{e>d} n_e  (row-major, first branch slowest:
                                                                     :func:`foxdqn.nn.branching.combine_branches`)

for each row r of the ``R = P·M`` rows (members never mix: every value is its row's own), D of 1 to 3
branches (:data:`foxdqn.ops.branching_loss.MAX_BRANCHES`). Where
:class:`~foxdqn.population.branching.MemberBranchingNetwork`'s forward computed this with torch ops
(per branch ``+``, ``mean``, ``−``; then D − 1 broadcast adds and a division: 3·D + D kernels),
without a gradient (acting, evaluation, the monitors) it is this one kernel after the heads' Linears.

Kernel (Triton): a grid of row blocks; a program loads each branch's ``[BLOCK_R, n_d]`` tile for its
mean, then for every joint action the branches' values (:func:`foxdqn.ops.branching_loss._joint_q_part`,
the loss kernel's own code for the same joint Q) and stores ``((Q_0 + Q_1) + Q_2) / D``, the
reference's order of adds. Precision: float32; the mean is ``tl.sum`` / n_d, whose order of summing
may differ from torch's in the last bit, so Q equals :func:`branching_joint_q_reference` to float
rounding. NaN: a NaN in A_d makes every joint Q of its row NaN with dueling (its mean), else those
with that sub-action. No gradient (the op has no backward); capture: device ops only.

Errors: ``ValueError`` (``branching_joint_q: ...``) for arguments outside the contract (shapes,
float32, one device, no branch or more than 3, an input that needs a gradient under grad mode, an
unknown backend); ``RuntimeError`` for backend="triton" on CPU tensors without TRITON_INTERPRET=1.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.branching_loss import MAX_BRANCHES, _joint_q_part, _q_tile, joint_q

__all__ = ["branching_joint_q", "branching_joint_q_reference"]

TILE = 1024  #: elements of a program's [BLOCK_R, BLOCK_J] joint-Q tile (45 actions: 16 rows a program)
NUM_WARPS = 4


@triton.jit
def _branching_joint_q_kernel(a0, a1, a2, v_ptr, q_ptr, R, D: tl.constexpr, N0: tl.constexpr, N1: tl.constexpr,
                              N2: tl.constexpr, DUELING: tl.constexpr, BLOCK_R: tl.constexpr,
                              BLOCK_N: tl.constexpr, BLOCK_J: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = row < R
    if DUELING:
        v = tl.load(v_ptr + row, mask=ok, other=0.0)
    else:
        v = tl.zeros([BLOCK_R], tl.float32)
    j = tl.arange(0, BLOCK_J)
    jm = ok[:, None] & (j < N0 * N1 * N2)[None, :]
    _, m0, _, _ = _q_tile(a0, v, row, ok, N0, BLOCK_N, DUELING)
    total = _joint_q_part(a0, v, m0, row, j, jm, N1 * N2, N0, DUELING)
    if D > 1:
        _, m1, _, _ = _q_tile(a1, v, row, ok, N1, BLOCK_N, DUELING)
        total = total + _joint_q_part(a1, v, m1, row, j, jm, N2, N1, DUELING)
    if D > 2:
        _, m2, _, _ = _q_tile(a2, v, row, ok, N2, BLOCK_N, DUELING)
        total = total + _joint_q_part(a2, v, m2, row, j, jm, 1, N2, DUELING)
    tl.store(q_ptr + row[:, None] * (N0 * N1 * N2) + j[None, :], total / D, mask=jm)


def _problem(adv, value) -> str | None:
    """Why the arguments are outside the contract, or None."""
    op = "branching_joint_q"
    if not isinstance(adv, (list, tuple)) or not 1 <= len(adv) <= MAX_BRANCHES:
        return f"{op}: adv must be a list of 1 to {MAX_BRANCHES} tensors, got {type(adv).__name__} " \
               f"of {len(adv) if isinstance(adv, (list, tuple)) else '-'}"
    first = adv[0]
    if not isinstance(first, Tensor) or first.dim() < 1 or first.dtype != torch.float32:
        return f"{op}: adv[0] must be float32 [..., n_0], got {describe(first)}"
    lead = tuple(first.shape[:-1])
    for k, a in enumerate(adv):
        if not isinstance(a, Tensor) or a.dtype != torch.float32 or tuple(a.shape[:-1]) != lead or a.shape[-1] < 1 \
                or a.device != first.device:
            return f"{op}: adv[{k}] must be float32 {list(lead) + [f'n_{k}']} (n_{k} >= 1) on {first.device}, " \
                   f"got {describe(a)}"
    if value is not None and (not isinstance(value, Tensor) or value.dtype != torch.float32
                              or value.numel() != math.prod(lead) or value.device != first.device):
        return f"{op}: value must be None or float32 of {math.prod(lead)} elements ({list(lead) + [1]}) on " \
               f"{first.device}, got {describe(value)}"
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (*adv, value)):
        return f"{op}: no gradient: call it under torch.no_grad() or with inputs that need none"
    return None


def branching_joint_q_reference(adv: list[Tensor], value: Tensor | None) -> Tensor:
    """Plain torch, as :meth:`MemberBranchingNetwork.branch_q` and
    :func:`foxdqn.nn.branching.combine_branches` compute it (:func:`foxdqn.ops.branching_loss.joint_q`)."""
    branch_q = list(adv) if value is None else [value + a - a.mean(dim=-1, keepdim=True) for a in adv]
    return joint_q(branch_q)


def branching_joint_q(adv: list[Tensor], value: Tensor | None, *, backend: str = "auto") -> Tensor:
    """The joint Q float32 ``[..., Π n_d]`` of a BDQ head's raw outputs (module docstring), one kernel.

    Args:
        adv: D (1 to 3) float32 tensors ``[..., n_d]`` of one leading shape (a population's
            ``[P, M, n_d]``), the branches' advantages (their Q without dueling); any strides
            (non-contiguous ones are copied).
        value: None (no dueling), or V float32 of the leading shape's elements (``[P, M, 1]``).
        backend: ``"auto"`` (the kernel for CUDA tensors, else the reference; the kernel inside
            :func:`foxdqn.ops.backend.cpu_kernels`), ``"triton"`` (CPU tensors need
            TRITON_INTERPRET=1) or ``"torch"`` (:func:`branching_joint_q_reference`).

    Returns:
        Q float32 ``[..., Π n_d]`` contiguous, equal to the reference to float rounding.

    Raises:
        ValueError: outside the contract (module docstring), or an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    problem = _problem(adv, value)
    if problem is not None:
        raise ValueError(problem)
    if resolve_backend("branching_joint_q", backend, adv[0]) == "torch":
        return branching_joint_q_reference(adv, value)
    sizes = [a.shape[-1] for a in adv]
    d, nj = len(sizes), math.prod(sizes)
    lead = tuple(adv[0].shape[:-1])
    rows = math.prod(lead)
    q = torch.empty(*lead, nj, dtype=torch.float32, device=adv[0].device)
    if rows == 0:
        return q
    flat = [a.reshape(rows, n).contiguous() for a, n in zip(adv, sizes)]
    flat += [flat[0]] * (MAX_BRANCHES - d)
    n = sizes + [1] * (MAX_BRANCHES - d)
    block_j = triton.next_power_of_2(nj)
    block_r = max(1, min(triton.next_power_of_2(rows), TILE // block_j))
    _branching_joint_q_kernel[(triton.cdiv(rows, block_r),)](
        *flat, value.reshape(rows).contiguous() if value is not None else flat[0], q, rows,
        D=d, N0=n[0], N1=n[1], N2=n[2], DUELING=value is not None, BLOCK_R=block_r,
        BLOCK_N=triton.next_power_of_2(max(sizes)), BLOCK_J=block_j, num_warps=NUM_WARPS)
    return q
