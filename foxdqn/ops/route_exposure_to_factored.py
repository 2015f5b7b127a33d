"""Route exposure actions (0..4) to factored actions (0..44) on the device.

Rule: docs/environments.md#routing-rule; the predecessor's kernel
``batch_route_exposure_to_factored`` (a port of ``OrderRouter::route()``), with the spread and
volatility given per row (the values at decision time of each environment) instead of one
scalar for the batch.

    factored = exposure * 9 + order_type * 3 + urgency

    order_type = 0 (market)       if median_spread <= 0
               = 1 (limit-maker)  elif spread < median_spread
               = 0 (market)       elif spread > 2 * median_spread
               = 2 (IoC)          otherwise
    urgency    = 1 (normal)       if median_volatility <= 0
               = 2 (aggressive)   elif volatility > 1.5 * median_volatility
               = 0 (patient)      elif volatility < 0.5 * median_volatility
               = 1 (normal)       otherwise

All products and comparisons are float32 IEEE, evaluated in exactly this order: a NaN median
makes ``median <= 0`` false and every strict comparison false (IoC / normal); a NaN value with
a positive median gives IoC / normal; a value exactly at 1x, 2x, 1.5x or 0.5x the median takes
the "otherwise" branch of that test. ``-0.0 <= 0`` is true. The exposure is NOT range-checked
(the caller guarantees 0..4); an out-of-range exposure goes through the same int64 formula in
the kernel and the reference, so both agree.
"""
from __future__ import annotations


import torch
import triton
import triton.language as tl

from foxdqn.ops.backend import resolve_backend
from foxdqn.ops.library import device_op, wrap_triton


# ---------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def _route_exposure_kernel(
    exp_ptr, spread_ptr, vol_ptr, med_spread_ptr, med_vol_ptr, out_ptr,
    N, spread_stride, vol_stride,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    exposure = tl.load(exp_ptr + offs, mask=mask, other=0).to(tl.int64)
    spread = tl.load(spread_ptr + offs * spread_stride, mask=mask, other=0.0)
    vol = tl.load(vol_ptr + offs * vol_stride, mask=mask, other=0.0)
    med_s = tl.load(med_spread_ptr)
    med_v = tl.load(med_vol_ptr)

    order_type = tl.where(
        med_s <= 0.0, 0,
        tl.where(spread < med_s, 1,
                 tl.where(spread > 2.0 * med_s, 0, 2)))
    urgency = tl.where(
        med_v <= 0.0, 1,
        tl.where(vol > 1.5 * med_v, 2,
                 tl.where(vol < 0.5 * med_v, 0, 1)))
    out = exposure * 9 + order_type.to(tl.int64) * 3 + urgency.to(tl.int64)
    tl.store(out_ptr + offs, out, mask=mask)


# ---------------------------------------------------------------------------------------------
# Launcher (a device_op, foxdqn/ops/library.py; the output is allocated here, outside the kernel)
# ---------------------------------------------------------------------------------------------
_BLOCK = 1024


@device_op("foxdqn::route_exposure_to_factored", mutates_args={})
def _route_op(exposure: torch.Tensor, spread: torch.Tensor, median_spread: torch.Tensor,
              volatility: torch.Tensor, median_volatility: torch.Tensor) -> torch.Tensor:
    n = exposure.shape[0]
    out = torch.empty((n,), dtype=torch.int64, device=exposure.device)
    if n == 0:
        return out
    # 0-d spread / volatility broadcast over the rows with stride 0.
    s_stride = spread.stride(0) if spread.dim() == 1 else 0
    v_stride = volatility.stride(0) if volatility.dim() == 1 else 0
    grid = (triton.cdiv(n, _BLOCK),)
    wrap_triton(_route_exposure_kernel)[grid](
        exposure, spread, volatility, median_spread, median_volatility, out,
        n, s_stride, v_stride, BLOCK=_BLOCK, num_warps=4,
    )
    return out


# ---------------------------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------------------------
def route_exposure_to_factored_reference(exposure: torch.Tensor, spread: torch.Tensor,
                                         median_spread: torch.Tensor, volatility: torch.Tensor,
                                         median_volatility: torch.Tensor) -> torch.Tensor:
    """Plain-torch reference of :func:`route_exposure_to_factored` (same arguments and result)."""
    zero = torch.zeros((), dtype=torch.int64, device=exposure.device)
    one, two = zero + 1, zero + 2
    order_type = torch.where(
        median_spread <= 0, zero,
        torch.where(spread < median_spread, one,
                    torch.where(spread > 2.0 * median_spread, zero, two)))
    urgency = torch.where(
        median_volatility <= 0, one,
        torch.where(volatility > 1.5 * median_volatility, two,
                    torch.where(volatility < 0.5 * median_volatility, zero, one)))
    n = exposure.shape[0]
    return exposure.to(torch.int64) * 9 + (order_type * 3 + urgency).expand(n)


# ---------------------------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------------------------
def route_exposure_to_factored(exposure: torch.Tensor, spread: torch.Tensor,
                               median_spread: torch.Tensor, volatility: torch.Tensor,
                               median_volatility: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """Factored action index ``exposure*9 + order_type*3 + urgency`` per row.

    Rule: docs/environments.md#routing-rule (``OrderRouter::route``); rules in the module
    docstring.

    Args:
        exposure: int64 (or int32) ``[N]``, exposure action 0..4 (not range-checked).
        spread: float32 ``[N]`` (or 0-d, broadcast), spread of each row at decision time.
        median_spread: float32 0-d, reference spread (device tensor: may change per call).
        volatility: float32 ``[N]`` (or 0-d, broadcast), volatility of each row.
        median_volatility: float32 0-d, reference volatility.
        backend: "auto" (Triton for CUDA tensors, torch for CPU), "triton", "torch".

    Returns:
        int64 ``[N]`` on the inputs' device, values 0..44 for exposures 0..4.

    Raises:
        ValueError: wrong dtype, shape or device of an argument, or an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check_args(exposure, spread, median_spread, volatility, median_volatility)
    if resolve_backend("route_exposure_to_factored", backend, exposure) == "torch":
        return route_exposure_to_factored_reference(exposure, spread, median_spread, volatility,
                                                    median_volatility)
    return _route_op(exposure, spread, median_spread, volatility, median_volatility)


def _check_args(exposure, spread, median_spread, volatility, median_volatility) -> None:
    if not isinstance(exposure, torch.Tensor) or exposure.dim() != 1 or exposure.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"exposure must be an int64/int32 tensor [N], got "
                         f"{getattr(exposure, 'dtype', type(exposure).__name__)} {tuple(getattr(exposure, 'shape', ()))}")
    if not exposure.is_contiguous():
        raise ValueError("exposure must be contiguous")
    n = exposure.shape[0]
    for name, t in (("spread", spread), ("volatility", volatility)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or not (t.dim() == 0 or t.shape == (n,)):
            raise ValueError(f"{name} must be a float32 tensor [N={n}] or 0-d, got "
                             f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    for name, t in (("median_spread", median_spread), ("median_volatility", median_volatility)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.dim() != 0:
            raise ValueError(f"{name} must be a 0-d float32 tensor, got "
                             f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    for name, t in (("spread", spread), ("median_spread", median_spread), ("volatility", volatility),
                    ("median_volatility", median_volatility)):
        if t.device != exposure.device:
            raise ValueError(f"{name} is on {t.device} but exposure is on {exposure.device}")
