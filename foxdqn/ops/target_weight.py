r"""The target update's lerp weight for this update, and the update counter's advance, in one kernel.

Source: :mod:`foxdqn.step.target_update` (θ' ← θ' + w (θ − θ'); Polyak averaging, or the hard
copy every C updates of Mnih et al. 2015) and docs/design/hot_loop.md#device-resident-values.
Per group ``g`` (one group: 0-d tensors; a population: ``[G]`` tensors, one per member), with
``u`` = ``updates`` (the updates done before this one)::

    base[g]   = tau[g]                                         (Polyak, HARD False)
              = 1.0 if (u + 1) mod hard_period[g] == 0 else 0.0  (hard, HARD True)
    weight[g] = base[g] * (1 - skip[g])                        (float32, in this order)
    updates   = u + 1                                          (only with ADVANCE, after the reads)

So a skipped update (training guard, ``skip`` = 1) leaves the targets unchanged. The float32
arithmetic is torch's ``torch.mul(base, 1.0 - skip)``, bit for bit.

Kernel saving (issue 17): the torch expressions are two kernels for Polyak (``1 - skip``, the
multiply) and six for the hard copy (add, remainder, eq, cast, ``1 - skip``, multiply), plus one
more for ``updates.add_(1)`` at the end of the update; this op is one kernel for all of them.

Not in the training loop any more: :func:`foxdqn.ops.target_lerp.target_lerp_` computes the same
weight (its reference calls :func:`target_weight_reference`, the definition) and lerps the targets
in the same kernel. The op is kept with its tests and bench as that definition and as a building
block.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.library import device_op, wrap_triton

MAX_GROUPS = 65536  # groups one single-block program handles (population sizes are far below)


@triton.jit
def _target_weight_kernel(updates_ptr, skip_ptr, tau_ptr, period_ptr, weight_ptr, G,
                          HARD: tl.constexpr, ADVANCE: tl.constexpr, BLOCK: tl.constexpr):
    g = tl.arange(0, BLOCK)
    m = g < G
    u = tl.load(updates_ptr)
    if HARD:
        period = tl.load(period_ptr + g, mask=m, other=1)
        base = tl.where((u + 1) % period == 0, 1.0, 0.0).to(tl.float32)  # == 0 whatever % rounds toward
    else:
        base = tl.load(tau_ptr + g, mask=m, other=0.0)
    skip = tl.load(skip_ptr + g, mask=m, other=0.0)
    tl.store(weight_ptr + g, base * (1.0 - skip), mask=m)
    if ADVANCE:
        tl.store(updates_ptr, u + 1)


@device_op("foxdqn::target_weight", mutates_args={"weight", "updates"})
def _target_weight_op(updates: Tensor, skip: Tensor, tau: Tensor, hard_period: Tensor, weight: Tensor,
                      hard: bool, advance: bool) -> None:
    g = weight.numel()
    wrap_triton(_target_weight_kernel)[(1,)](
        updates, skip, tau, hard_period, weight, g, HARD=hard, ADVANCE=advance,
        BLOCK=max(triton.next_power_of_2(g), 16), num_warps=1)


def target_weight_reference(updates: Tensor, skip: Tensor, tau: Tensor, hard_period: Tensor, weight: Tensor,
                            hard: bool, advance: bool = False) -> None:
    """Plain-torch reference of :func:`target_weight` (same arguments, same in-place writes): the
    former ``TargetUpdate.weight_for`` and ``updates.add_(1)``."""
    base = ((updates + 1) % hard_period == 0).to(torch.float32) if hard else tau
    torch.mul(base, 1.0 - skip, out=weight)
    if advance:
        updates.add_(1)


def target_weight(updates: Tensor, skip: Tensor, tau: Tensor, hard_period: Tensor, weight: Tensor, *,
                  hard: bool, advance: bool = False, backend: str = "auto") -> None:
    """Write this update's target-update weight into ``weight`` (and advance ``updates`` if asked).

    Rules in the module docstring. Device ops only (no host reads): capturable in a CUDA graph.
    One kernel launch on CUDA.

    Args:
        updates: int64 0-d, the updates done before this one; incremented in place with ``advance``.
        skip: float32, 1.0 = this update is skipped (the guard's flag): 0-d, or ``[G]`` per group.
        tau: float32 Polyak τ in [0, 1], the shape of ``skip`` (read only when not ``hard``).
        hard_period: int64 >= 1, updates between hard copies, the shape of ``skip`` (read only when ``hard``).
        weight: float32, the shape of ``skip``, contiguous: written.
        hard: the hard copy (``target.update=hard``) instead of Polyak averaging.
        advance: also add 1 to ``updates`` (after reading it).
        backend: "auto" (Triton for CUDA tensors, torch reference for CPU), "triton", "torch".

    Raises:
        ValueError: a tensor of the wrong dtype, shape (all but ``updates`` the shape of ``weight``,
            0-d or ``[G]`` with 1 <= G <= 65536), contiguity or device; an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    if (not isinstance(weight, Tensor) or weight.dtype != torch.float32 or weight.dim() > 1
            or not weight.is_contiguous() or not 1 <= weight.numel() <= MAX_GROUPS):
        raise ValueError(f"target_weight: weight must be a contiguous float32 tensor, 0-d or [G] with "
                         f"1 <= G <= {MAX_GROUPS}, got {describe(weight)}")
    dev, shape = weight.device, tuple(weight.shape)
    for name, t, dtype, want in (("updates", updates, torch.int64, ()), ("skip", skip, torch.float32, shape),
                                 ("tau", tau, torch.float32, shape), ("hard_period", hard_period, torch.int64, shape)):
        if (not isinstance(t, Tensor) or t.dtype != dtype or tuple(t.shape) != want or t.device != dev
                or not t.is_contiguous()):
            raise ValueError(f"target_weight: {name} must be a contiguous {dtype} tensor {list(want)} on {dev} "
                             f"(as weight), got {describe(t)}")
    if resolve_backend("target_weight", backend, weight) == "torch":
        target_weight_reference(updates, skip, tau, hard_period, weight, hard, advance)
    else:
        _target_weight_op(updates, skip, tau, hard_period, weight, bool(hard), bool(advance))
