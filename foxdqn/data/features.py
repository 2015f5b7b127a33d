"""Per-bar observation features, computed causally and normalised with training-split statistics.

Features, in this order (``feature_names``):

================  =====================================================================
``log_return``    ``ln(close[t] / close[t-1])``; undefined at t = 0
``range``         ``ln(high[t] / low[t])`` (>= 0)
``close_loc``     ``2 (close - low) / (high - low) - 1`` in [-1, 1]; 0 when high == low
``volatility``    sample std (ddof=1) of the last ``vol_window`` log returns; undefined
                  until ``vol_window`` returns exist (t < vol_window)
``volume_z``      ``(volume[t] - mean) / std`` over the last ``volume_window`` volumes
                  (ddof=1; 0 where that std is 0); undefined for t < volume_window - 1.
                  Present only when the file has volume and it is not constant (e.g. all
                  zero) over the training split.
================  =====================================================================

Every value at row t uses rows <= t only. Normalisation: ``(x - mean) / max(std, 1e-8)`` with
mean/std (ddof=0) over the finite values of the training-split rows only, then clipped to
``[-clip, clip]``. Warm-up rows where a feature is undefined are set to 0 *after* normalisation,
i.e. to the training mean of that feature.
"""
from typing import Optional

import numpy as np
import pandas as pd

STD_FLOOR = 1e-8


def log_returns(close: np.ndarray) -> np.ndarray:
    """1-bar log returns of ``close`` (float64 ``[T]``); NaN at row 0."""
    out = np.full(close.shape, np.nan)
    out[1:] = np.log(close[1:] / close[:-1])
    return out


def rolling_volatility(close: np.ndarray, window: int, min_periods: Optional[int] = None) -> np.ndarray:
    """Rolling sample std (ddof=1) of the 1-bar log returns over ``window`` bars (float64 ``[T]``).

    Row t uses the returns of rows ``t-window+1 .. t``. Rows with fewer than ``min_periods``
    returns (default: ``window``, i.e. a full window) are NaN.
    """
    returns = pd.Series(log_returns(close))
    return returns.rolling(window, min_periods=min_periods or window).std().to_numpy()


def volume_zscore(volume: np.ndarray, window: int) -> np.ndarray:
    """Rolling z-score of ``volume`` over ``window`` bars (float64 ``[T]``; NaN for t < window - 1)."""
    series = pd.Series(volume)
    mean = series.rolling(window).mean().to_numpy()
    std = series.rolling(window).std().to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (volume - mean) / std
    return np.where(std > 0, z, np.where(np.isnan(std), np.nan, 0.0))


def raw_features(open_: np.ndarray, high: np.ndarray, low: np.ndarray, close: np.ndarray,
                 volume: Optional[np.ndarray], train: tuple[int, int], vol_window: int,
                 volume_window: int) -> tuple[np.ndarray, list[str]]:
    """Un-normalised features, float64 ``[T, F]`` with NaN in warm-up rows, and their names.

    ``train`` (``[start, end)`` rows) only decides whether ``volume_z`` is included (volume
    present and not constant over the training rows).
    """
    span = high - low
    with np.errstate(divide="ignore", invalid="ignore"):
        close_loc = np.where(span > 0, 2.0 * (close - low) / span - 1.0, 0.0)
    columns = {
        "log_return": log_returns(close),
        "range": np.log(high / low),
        "close_loc": close_loc,
        "volatility": rolling_volatility(close, vol_window),
    }
    if volume is not None and np.ptp(volume[train[0]:train[1]]) > 0:
        columns["volume_z"] = volume_zscore(volume, volume_window)
    return np.stack(list(columns.values()), axis=1), list(columns)


def normalisation(raw: np.ndarray, train: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, std)``, float64 ``[F]`` each: the finite training-row values' mean and std (ddof=0,
    floored at ``STD_FLOOR``) of ``raw`` ``[T, F]``; a feature with no finite training value gets
    mean 0, std 1."""
    part = raw[train[0]:train[1]]
    finite = np.isfinite(part)
    count = finite.sum(axis=0)
    filled = np.where(finite, part, 0.0)
    mean = np.divide(filled.sum(axis=0), count, out=np.zeros(raw.shape[1]), where=count > 0)
    var = np.divide((np.where(finite, part - mean, 0.0) ** 2).sum(axis=0), count,
                    out=np.ones(raw.shape[1]), where=count > 0)
    return mean, np.maximum(np.sqrt(var), STD_FLOOR)


def normalise(raw: np.ndarray, train: tuple[int, int], clip: float) -> np.ndarray:
    """Standardise ``raw`` ``[T, F]`` with training-row mean/std (:func:`normalisation`), clip to
    ±``clip``; float32 ``[T, F]``. NaN (warm-up) entries become 0 after normalisation.
    """
    mean, std = normalisation(raw, train)
    out = np.clip((raw - mean) / std, -clip, clip)
    return np.nan_to_num(out, nan=0.0).astype(np.float32)
