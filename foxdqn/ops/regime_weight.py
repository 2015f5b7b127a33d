"""Regime-weighted TD errors' sample weights in one kernel: each sampled row's stored volatility
ratio, its regime and its loss weight, times the row's incoming weight.

Source: docs/design/update.md#regime-weights and :mod:`foxdqn.replay.regime` (the rule and its
reference, :class:`~foxdqn.replay.regime.RegimeWeights`): for sampled row b of the ring,

    r_b    = ratio[index_b]                         (float32, written at insert time)
    regime = high if r_b > high, low elif r_b < low, normal otherwise (NaN: normal)
    out_b  = weight_b · weights[regime]             (float32; w^PER · w_regime)

The torch reference is the eleven launches it replaces (a gather, the regime's comparisons and
selects, the table lookup, the product); the kernel does the same float32 product: the same bits.
No host synchronisation, fixed shapes, capturable.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from foxdqn.ops.backend import describe, resolve_backend

__all__ = ["regime_weight", "regime_weight_reference"]

_BLOCK = 1024


@triton.jit
def _regime_weight_kernel(ratio_ptr, index_ptr, weight_ptr, low_ptr, high_ptr, table_ptr, out_ptr, B,
                          BLOCK: tl.constexpr):
    b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = b < B
    r = tl.load(ratio_ptr + tl.load(index_ptr + b, mask=ok, other=0), mask=ok, other=1.0)
    regime = tl.where(r > tl.load(high_ptr), 2, tl.where(r < tl.load(low_ptr), 0, 1))
    w = tl.load(table_ptr + regime, mask=ok, other=0.0)
    tl.store(out_ptr + b, tl.load(weight_ptr + b, mask=ok, other=0.0) * w, mask=ok)


def regime_weight_reference(ratio: torch.Tensor, index: torch.Tensor, weight: torch.Tensor, low: torch.Tensor,
                            high: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Plain-torch :func:`regime_weight` (same arguments, same result): the
    :class:`~foxdqn.replay.regime.RegimeWeights` lookup of the gathered ratios, times ``weight``."""
    r = ratio[index]
    one = torch.ones_like(r, dtype=torch.int64)
    regime = torch.where(r > high, one * 2, torch.where(r < low, one * 0, one))
    return weight * weights[regime]


def regime_weight(ratio: torch.Tensor, index: torch.Tensor, weight: torch.Tensor, low: torch.Tensor,
                  high: torch.Tensor, weights: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """float32 ``[B]``: ``weight`` times the regime weight of each sampled row (module docstring).

    Args:
        ratio: float32 contiguous ``[R]``, the ring's stored volatility ratio of each flat row.
        index: int64 ``[B]``, the sampled flat rows (in ``[0, R)``; not checked: device values).
        weight: float32 ``[B]``, the rows' incoming weights (importance weights, or ones).
        low, high: float32 0-d thresholds (``regime.low_threshold``, ``regime.high_threshold``).
        weights: float32 ``[3]``, [w_low, w_normal, w_high] (``regime.weights``).
        backend: ``"auto"`` (Triton for CUDA tensors, else torch), ``"triton"``, ``"torch"``.

    Raises:
        ValueError: a wrong dtype, shape or device; an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    op = "regime_weight"
    if not isinstance(ratio, torch.Tensor) or ratio.dtype != torch.float32 or ratio.dim() != 1 \
            or not ratio.is_contiguous():
        raise ValueError(f"{op}: ratio must be contiguous float32 [R], got {describe(ratio)}")
    if not isinstance(index, torch.Tensor) or index.dtype != torch.int64 or index.dim() != 1:
        raise ValueError(f"{op}: index must be int64 [B], got {describe(index)}")
    b = index.shape[0]
    for name, t, shape in (("weight", weight, (b,)), ("low", low, ()), ("high", high, ()), ("weights", weights, (3,))):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or tuple(t.shape) != shape:
            raise ValueError(f"{op}: {name} must be float32 {list(shape)}, got {describe(t)}")
    for name, t in (("index", index), ("weight", weight), ("low", low), ("high", high), ("weights", weights)):
        if t.device != ratio.device:
            raise ValueError(f"{op}: {name} is on {t.device}, ratio on {ratio.device}")
    if resolve_backend(op, backend, ratio) == "torch":
        return regime_weight_reference(ratio, index, weight, low, high, weights)
    out = torch.empty(b, dtype=torch.float32, device=ratio.device)
    if b:
        _regime_weight_kernel[(triton.cdiv(b, _BLOCK),)](ratio, index.contiguous(), weight.contiguous(), low, high,
                                                         weights.contiguous(), out, b, BLOCK=_BLOCK, num_warps=4)
    return out
