"""Dueling combine Q = V + A − mean_a A in one kernel, its backward in one more.

Source: Wang et al. (2016), "Dueling Network Architectures for Deep Reinforcement Learning",
eq. 9. Per row r (any leading axes flattened: ``[B]`` for one network, ``[P, B]`` for the
population's :class:`foxdqn.population.network.MemberQNetwork`), with A actions:

    Q[r, a]  = (V[r] + A[r, a]) − (Σ_a' A[r, a']) / A                      (forward)
    dV[r]    = Σ_a dQ[r, a]                                                (backward)
    dA[r, a] = dQ[r, a] − (Σ_a' dQ[r, a']) / A

The torch reference (:func:`dueling_combine_reference`) is the expression
``value + adv − adv.mean(-1, keepdim=True)`` and autograd of it. The kernel computes the same operations
in the same order; the results can differ only by float rounding of the two row sums (the mean's
summation order, and dV's, is the kernel's own, torch's differs between CPU and CUDA anyway). NaN
or ±inf in a row's inputs propagate into that row only, as in the reference.

Registration: a ``torch.autograd.Function`` (forward kernel; backward kernel writing dV and dA in
one launch; double backward is not supported). Capturable in a CUDA graph: device ops only, fixed
shapes, no host reads.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from foxdqn.ops.backend import resolve_backend

__all__ = ["dueling_combine", "dueling_combine_reference"]

TILE = 256  # elements of a program's [BLOCK_R, BLOCK_A] tile on the GPU (both from an H200 sweep:
#           docs/bench.md#launch-constants)
NUM_WARPS = 1  # warps per program


# ----------------------------------------------------------------------------- kernels
@triton.jit
def _tile(R, A, BLOCK_R: tl.constexpr, BLOCK_A: tl.constexpr):
    """This program's BLOCK_R rows of an [R, A] row-major array: (R, A as int64, rows, row mask,
    [BLOCK_R, BLOCK_A] mask, flat offsets)."""
    zero = tl.zeros([], dtype=tl.int64)  # an int argument equal to 1 arrives as a constexpr
    R, A = R + zero, A + zero
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_A)
    ok = rows < R
    m2 = ok[:, None] & (cols[None, :] < A)
    return R, A, rows, ok, m2, rows[:, None] * A + cols[None, :]


@triton.jit
def _dueling_forward_kernel(v_ptr, a_ptr, q_ptr, R, A, BLOCK_R: tl.constexpr, BLOCK_A: tl.constexpr):
    """v f32 [R], a f32 [R, A] contiguous → q f32 [R, A]."""
    R, A, rows, ok, m2, offs = _tile(R, A, BLOCK_R, BLOCK_A)
    adv = tl.load(a_ptr + offs, mask=m2, other=0.0)
    v = tl.load(v_ptr + rows, mask=ok, other=0.0)
    mean = tl.sum(adv, axis=1) / A.to(tl.float32)
    q = (v[:, None] + adv) - mean[:, None]
    tl.store(q_ptr + offs, q, mask=m2)


@triton.jit
def _dueling_backward_kernel(dq_ptr, dv_ptr, da_ptr, R, A, BLOCK_R: tl.constexpr, BLOCK_A: tl.constexpr):
    """dq f32 [R, A] contiguous → dv f32 [R] (Σ_a dq), da f32 [R, A] (dq − Σ_a dq / A)."""
    R, A, rows, ok, m2, offs = _tile(R, A, BLOCK_R, BLOCK_A)
    g = tl.load(dq_ptr + offs, mask=m2, other=0.0)
    s = tl.sum(g, axis=1)
    tl.store(dv_ptr + rows, s, mask=ok)
    tl.store(da_ptr + offs, g - (s / A.to(tl.float32))[:, None], mask=m2)


def _grid(rows: int, num_actions: int, interpret: bool) -> tuple[tuple[int], int, int]:
    block_a = triton.next_power_of_2(num_actions)
    budget = 1 << 16 if interpret else TILE
    block_r = max(1, min(triton.next_power_of_2(max(rows, 1)), budget // block_a))
    return (triton.cdiv(rows, block_r),), block_r, block_a


class _DuelingCombine(torch.autograd.Function):
    """q = kernel(v, a); backward: dv, da = kernel(dq)."""

    @staticmethod
    def forward(ctx, value, adv):
        rows, num_actions = adv.shape
        q = torch.empty_like(adv)
        if rows:
            grid, block_r, block_a = _grid(rows, num_actions, interpret=not adv.is_cuda)
            _dueling_forward_kernel[grid](value, adv, q, rows, num_actions, BLOCK_R=block_r, BLOCK_A=block_a,
                                          num_warps=NUM_WARPS)
        return q

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_q):
        grad_q = grad_q.contiguous()
        rows, num_actions = grad_q.shape
        grad_v = torch.empty(rows, device=grad_q.device, dtype=grad_q.dtype)
        grad_a = torch.empty_like(grad_q)
        if rows:
            grid, block_r, block_a = _grid(rows, num_actions, interpret=not grad_q.is_cuda)
            _dueling_backward_kernel[grid](grad_q, grad_v, grad_a, rows, num_actions, BLOCK_R=block_r,
                                           BLOCK_A=block_a, num_warps=NUM_WARPS)
        return grad_v, grad_a


# ----------------------------------------------------------------------------- checks
def _check(value: torch.Tensor, advantage: torch.Tensor) -> None:
    op = "dueling_combine"
    if not isinstance(value, torch.Tensor) or not isinstance(advantage, torch.Tensor):
        raise ValueError(f"{op}: value and advantage must be tensors")
    if advantage.dim() < 1 or advantage.shape[-1] < 1:
        raise ValueError(f"{op}: advantage must be [..., A] with A >= 1 actions, got {tuple(advantage.shape)}")
    lead = tuple(advantage.shape[:-1])
    if tuple(value.shape) not in (lead + (1,), lead):
        raise ValueError(f"{op}: value must be {list(lead + (1,))} or {list(lead)} for advantage "
                         f"{list(advantage.shape)}, got {list(value.shape)}")
    if value.dtype != advantage.dtype or value.device != advantage.device:
        raise ValueError(f"{op}: value and advantage must share dtype and device, got {value.dtype} on "
                         f"{value.device} and {advantage.dtype} on {advantage.device}")


# ----------------------------------------------------------------------------- reference
def dueling_combine_reference(value: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    """Plain-torch :func:`dueling_combine` (same arguments and result), differentiable by autograd:
    the dueling head's expression, eq. 9 of Wang et al."""
    _check(value, advantage)
    v = value if value.dim() == advantage.dim() else value.unsqueeze(-1)
    return v + advantage - advantage.mean(dim=-1, keepdim=True)


# ----------------------------------------------------------------------------- public
def dueling_combine(value: torch.Tensor, advantage: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """Q = V + A − mean_a A (Wang et al. 2016, eq. 9), forward and backward one kernel each.

    Args:
        value: the state value V, ``[..., 1]`` or ``[...]`` (the leading axes of ``advantage``),
            in reward units.
        advantage: the advantages A, ``[..., A]``, same dtype and device; any leading axes
            (``[B, A]``, the population's ``[P, B, A]``). Non-contiguous inputs are copied.
        backend: ``"auto"`` (the Triton kernels for float32 CUDA tensors, else the torch
            reference), ``"triton"`` (float32 only; CPU tensors need TRITON_INTERPRET=1) or
            ``"torch"``.

    Returns:
        Q, ``advantage``'s shape and dtype, differentiable w.r.t. both inputs (the kernel path:
        first-order gradients only).

    Raises:
        ValueError: shapes that do not match, mixed dtypes or devices, A < 1, a non-float32
            input with backend="triton", an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check(value, advantage)
    if backend == "auto" and advantage.dtype != torch.float32:
        backend = "torch"
    if resolve_backend("dueling_combine", backend, advantage) == "torch":
        return dueling_combine_reference(value, advantage)
    if advantage.dtype != torch.float32:
        raise ValueError(f"dueling_combine: backend='triton' needs float32 inputs, got {advantage.dtype}")
    num_actions = advantage.shape[-1]
    q = _DuelingCombine.apply(value.reshape(-1).contiguous(), advantage.reshape(-1, num_actions).contiguous())
    return q.view(advantage.shape)
