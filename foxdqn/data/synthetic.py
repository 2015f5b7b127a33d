"""Synthetic OHLCV bars for tests and examples.

* :func:`make_martingale_ohlcv` -- bars cut from one fine-grained random walk whose price is a
  martingale: no strategy has an edge before costs, so every strategy loses after costs. The
  market on which a trading backtest must show no edge (docs/backtest.md; built-in dataset
  ``martingale_1h``).
* :func:`make_synthetic_ohlcv` -- a coarse geometric random walk with a drift (wicks drawn
  independently of the path), for data-pipeline tests and examples.
"""
from pathlib import Path
from typing import Union

import numpy as np
import pandas as pd


def make_martingale_ohlcv(n: int, vol_per_bar: float = 1e-3, substeps: int = 64, seed: int = 0,
                          freq: str = "1h", start: str = "2020-01-01", price0: float = 1.1) -> pd.DataFrame:
    """``n`` OHLCV bars cut from one fine random walk whose price is a martingale.

    The fine path has ``n * substeps + 1`` points: ``p_0 = price0`` and
    ``p_{k+1} = p_k * exp(sigma * z_k - sigma**2 / 2)``, ``z_k`` standard normal,
    ``sigma = vol_per_bar / sqrt(substeps)``, so ``E[p_{k+1} | p_0..p_k] = p_k`` exactly (the
    ``-sigma**2/2`` term removes the drift of a plain geometric walk). Bar ``i`` is the points
    ``i*substeps .. (i+1)*substeps``: ``open`` the first, ``close`` the last, ``high``/``low``
    their max/min. The next bar's open is this bar's close (the same point), so nothing happens
    between bars and every bar's envelope is the path's own. Volume is independent of prices
    (log-normal around 1000).

    Args:
        n: bars (>= 1).
        vol_per_bar: standard deviation of one bar's log return (fraction, e.g. ``1e-3`` = 10 bp,
            about EUR/USD's hourly volatility).
        substeps: fine-path steps per bar (>= 1); the bar's high/low are taken over them.
        seed: NumPy generator seed.
        freq, start: timestamps, ``pd.date_range(start, periods=n, freq=freq)``.
        price0: the first open (price units, > 0).

    Returns:
        DataFrame ``timestamp, open, high, low, close, volume`` (float64 prices), ``n`` rows.

    Raises:
        ValueError: ``n < 1``, ``substeps < 1``, ``vol_per_bar < 0`` or ``price0 <= 0``.
    """
    if n < 1 or substeps < 1 or not vol_per_bar >= 0 or not price0 > 0:
        raise ValueError(f"make_martingale_ohlcv: need n >= 1, substeps >= 1, vol_per_bar >= 0, price0 > 0; "
                         f"got n={n}, substeps={substeps}, vol_per_bar={vol_per_bar}, price0={price0}")
    rng = np.random.default_rng(seed)
    sigma = vol_per_bar / np.sqrt(substeps)
    steps = sigma * rng.standard_normal((n, substeps)) - 0.5 * sigma * sigma
    log_path = np.log(price0) + np.concatenate([[0.0], np.cumsum(steps.ravel())])
    path = np.exp(log_path)
    rows = np.lib.stride_tricks.sliding_window_view(path, substeps + 1)[::substeps]  # [n, substeps+1] views
    return pd.DataFrame({
        "timestamp": pd.date_range(start, periods=n, freq=freq),
        "open": rows[:, 0].copy(),
        "high": rows.max(axis=1),
        "low": rows.min(axis=1),
        "close": rows[:, -1].copy(),
        "volume": 1000.0 * np.exp(0.3 * rng.standard_normal(n)),
    })


def make_synthetic_ohlcv(n: int, drift_per_bar: float = 0.0, vol: float = 0.01, seed: int = 0,
                         freq: str = "1h", start: str = "2020-01-01") -> pd.DataFrame:
    """``n`` bars of a geometric random walk starting at 100.

    ``close[t] = close[t-1] * exp(drift_per_bar + vol * z[t])`` with standard normal ``z``;
    ``open[t] = close[t-1]`` (``open[0] = 100``); high/low extend ``max/min(open, close)`` by
    ``exp(±0.5 vol |u|)`` wicks, so ``vol=0`` with ``drift_per_bar > 0`` gives a steadily rising
    series with ``high == close`` and ``low == open``. Volume is log-normal around 1000.

    Returns:
        DataFrame with columns ``timestamp`` (``pd.date_range(start, periods=n, freq=freq)``),
        ``open, high, low, close, volume`` (float64), ``n`` rows.
    """
    rng = np.random.default_rng(seed)
    steps = drift_per_bar + vol * rng.standard_normal(n)
    close = 100.0 * np.exp(np.cumsum(steps))
    open_ = np.concatenate([[100.0], close[:-1]])
    wick_up = np.exp(0.5 * vol * np.abs(rng.standard_normal(n)))
    wick_down = np.exp(-0.5 * vol * np.abs(rng.standard_normal(n)))
    return pd.DataFrame({
        "timestamp": pd.date_range(start, periods=n, freq=freq),
        "open": open_,
        "high": np.maximum(open_, close) * wick_up,
        "low": np.minimum(open_, close) * wick_down,
        "close": close,
        "volume": 1000.0 * np.exp(0.3 * rng.standard_normal(n)),
    })


def write_csv(df: pd.DataFrame, path: Union[str, Path]) -> Path:
    """Write ``df`` as CSV without its index (ISO timestamps); returns the path."""
    path = Path(path)
    df.to_csv(path, index=False)
    return path
