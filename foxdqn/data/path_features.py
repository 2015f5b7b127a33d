"""The data pipeline's per-bar quantities of many bar series at once, in torch on the run's device.

For ``P`` series of ``T`` bars each (``[P, T]`` float64 tensors, oldest bar first), the same
definitions as the NumPy/pandas pipeline that builds :class:`foxdqn.data.MarketData`, which is
their reference (tests/data/test_augment.py compares them):

* :func:`raw_features`: :func:`foxdqn.data.features.raw_features` (log return, range, close
  location, volatility, volume z-score), then :func:`normalise` with given training statistics
  (:func:`foxdqn.data.features.normalisation`, as :func:`foxdqn.data.features.normalise` does);
* :func:`spread`: :func:`foxdqn.data.spread.estimate_spread` (Corwin & Schultz 2012, causal mean);
* :func:`volatility`: ``MarketData.volatility`` (rolling std of log returns, at least 2, else 0).

Every value of bar ``t`` reads bars ``<= t`` of its own series. Rolling windows are read as
``[P, T, window]`` views (``Tensor.unfold``) with NaN before the first bar; a window's statistic
counts its finite values, as pandas' ``rolling`` does. Results agree with the reference to float64
rounding (pandas' rolling variance updates running sums; here each window is summed afresh).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from foxdqn.data.features import STD_FLOOR

__all__ = ["log_returns", "normalise", "raw_features", "rolling_mean", "rolling_std", "spread", "volatility"]

_K = 3.0 - 2.0 * math.sqrt(2.0)  # Corwin & Schultz's 3 - 2 sqrt(2)


def log_returns(close: Tensor) -> Tensor:
    """``[P, T]`` 1-bar log returns of ``close`` ``[P, T]``; NaN at bar 0."""
    out = torch.full_like(close, float("nan"))
    out[:, 1:] = torch.log(close[:, 1:] / close[:, :-1])
    return out


def _windows(x: Tensor, window: int) -> Tensor:
    """``[P, T, window]``: bar t's window is bars ``t-window+1 .. t`` (NaN before bar 0)."""
    pad = torch.full((x.shape[0], window - 1), float("nan"), dtype=x.dtype, device=x.device)
    return torch.cat([pad, x], dim=1).unfold(1, window, 1)


def rolling_mean(x: Tensor, window: int, min_periods: int) -> Tensor:
    """``[P, T]`` mean of the finite values of each window of ``window`` bars; NaN where fewer than
    ``min_periods`` are finite (pandas ``rolling(window, min_periods).mean()``)."""
    w = _windows(x, window)
    finite = torch.isfinite(w)
    count = finite.sum(dim=2)
    mean = torch.where(finite, w, torch.zeros_like(w)).sum(dim=2) / count.clamp(min=1)
    return torch.where(count >= min_periods, mean, torch.full_like(mean, float("nan")))


def rolling_std(x: Tensor, window: int, min_periods: int) -> Tensor:
    """``[P, T]`` sample std (ddof=1) of the finite values of each window of ``window`` bars; NaN
    where fewer than ``max(min_periods, 2)`` are finite (pandas ``rolling(window, min_periods).std()``)."""
    w = _windows(x, window)
    finite = torch.isfinite(w)
    count = finite.sum(dim=2)
    zero = torch.zeros_like(w)
    mean = torch.where(finite, w, zero).sum(dim=2, keepdim=True) / count.clamp(min=1).unsqueeze(2)
    square = torch.where(finite, (w - mean) ** 2, zero).sum(dim=2)
    std = torch.sqrt(square / (count - 1).clamp(min=1))
    return torch.where(count >= max(min_periods, 2), std, torch.full_like(std, float("nan")))


def raw_features(high: Tensor, low: Tensor, close: Tensor, volume: Tensor | None, vol_window: int,
                 volume_window: int) -> Tensor:
    """``[P, T, F]`` un-normalised features (NaN in warm-up bars), in the order of
    :func:`foxdqn.data.features.raw_features`: log return, range, close location, volatility over
    ``vol_window`` bars, and with ``volume`` (``[P, T]``) the volume z-score over ``volume_window``
    bars (F = 5; without it F = 4). Whether a market uses the volume feature is decided on its
    training split by the reference (``"volume_z"`` in ``MarketData.feature_names``)."""
    returns = log_returns(close)
    span = high - low
    close_loc = torch.where(span > 0, 2.0 * (close - low) / torch.where(span > 0, span, torch.ones_like(span)) - 1.0,
                            torch.zeros_like(span))
    columns = [returns, torch.log(high / low), close_loc, rolling_std(returns, vol_window, vol_window)]
    if volume is not None:
        mean, std = rolling_mean(volume, volume_window, volume_window), rolling_std(volume, volume_window,
                                                                                    volume_window)
        z = (volume - mean) / torch.where(std > 0, std, torch.ones_like(std))
        columns.append(torch.where(std > 0, z, torch.where(torch.isnan(std), std, torch.zeros_like(std))))
    return torch.stack(columns, dim=2)


def normalise(raw: Tensor, mean: Tensor, std: Tensor, clip: float) -> Tensor:
    """float32 ``[P, T, F]``: ``(raw - mean) / std`` clipped to ±``clip``, NaN (warm-up) to 0, with
    ``mean``, ``std`` float64 ``[F]`` (the training split's, :func:`foxdqn.data.features.normalisation`;
    ``std`` already floored at ``STD_FLOOR``)."""
    out = ((raw - mean) / std.clamp(min=STD_FLOOR)).clamp(-clip, clip)
    return torch.nan_to_num(out, nan=0.0).to(torch.float32)


def spread(high: Tensor, low: Tensor, close: Tensor, window: int) -> Tensor:
    """``[P, T]`` relative spread: the two-bar Corwin-Schultz estimate (:func:`foxdqn.data.spread.corwin_schultz`,
    bar t's high and low shifted by its gap from close ``t-1``, negative estimates 0, bar 0 0), then
    its mean over the last ``window`` bars (fewer at the start), at least 0."""
    prev_high, prev_low, prev_close = high[:, :-1], low[:, :-1], close[:, :-1]
    shift = torch.clamp(prev_close - high[:, 1:], min=0.0) - torch.clamp(low[:, 1:] - prev_close, min=0.0)
    cur_high, cur_low = high[:, 1:] + shift, low[:, 1:] + shift
    beta = torch.log(prev_high / prev_low) ** 2 + torch.log(cur_high / cur_low) ** 2
    gamma = torch.log(torch.maximum(prev_high, cur_high) / torch.minimum(prev_low, cur_low)) ** 2
    alpha = (torch.sqrt(2.0 * beta) - torch.sqrt(beta)) / _K - torch.sqrt(gamma / _K)
    two_bar = torch.zeros_like(close)
    two_bar[:, 1:] = torch.clamp(2.0 * (torch.exp(alpha) - 1.0) / (1.0 + torch.exp(alpha)), min=0.0)
    return torch.clamp(rolling_mean(two_bar, window, 1), min=0.0)


def volatility(close: Tensor, window: int) -> Tensor:
    """``[P, T]`` per-bar volatility: rolling std of the log returns over ``window`` bars with at
    least 2 returns, else 0 (``MarketData.volatility``)."""
    return torch.nan_to_num(rolling_std(log_returns(close), window, 2), nan=0.0)
