"""Synthetic OHLCV bars for tests and examples (geometric random walk with valid bar envelopes)."""
from pathlib import Path
from typing import Union

import numpy as np
import pandas as pd


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
