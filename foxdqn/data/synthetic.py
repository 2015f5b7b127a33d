"""Synthetic OHLCV bars for tests and examples, and markets with a known answer.

* :func:`make_martingale_ohlcv` -- bars cut from one fine-grained random walk whose price is a
  martingale: no strategy has an edge before costs, so every strategy loses after costs. The
  market on which a trading backtest must show no edge (docs/backtest.md; built-in dataset
  ``martingale_1h``).
* :func:`make_ar1_ohlcv`, :func:`make_regime_ohlcv`, :func:`make_trend_ohlcv` -- markets with a
  known answer (docs/backtest.md#markets-with-a-known-answer; built-in datasets ``ar1_1h``,
  ``regime_1h``, ``trend_1h``): bar log returns follow an AR(1) process, an AR(1) whose
  coefficient switches sign with a two-state Markov chain, or a drift that switches sign between
  segments of random length, plus noise. Each returns a :class:`SyntheticMarket`: the bars and
  the expected returns that an oracle trades on.
* :func:`make_synthetic_ohlcv` -- a coarse geometric random walk with a drift (wicks drawn
  independently of the path), for data-pipeline tests and examples.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Union

import numpy as np

if TYPE_CHECKING:  # imported where a frame is built: a run without market data never loads pandas
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
    import pandas as pd

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


@dataclass(frozen=True)
class SyntheticMarket:
    """Bars of a market with a known answer, and what its oracle trades on.

    Every bar's log return is ``r_t = x_t - v/2``: ``x_t`` follows the market's process and ``v``
    is its variance given everything before bar ``t`` (the latent state included), so that
    ``E[close_t / close_{t-1} | before t] = exp(E[x_t | before t])``; a market whose ``x`` has no
    predictable part is a martingale, like :func:`make_martingale_ohlcv`'s.

    Attributes:
        bars: DataFrame ``timestamp, open, high, low, close, volume`` (float64 prices; the layout of
            :func:`make_martingale_ohlcv`), ``n`` rows.
        expected_return: float64 ``[n]``, ``m_t = E[x_{t+1} | bars up to t, latent state of bar
            t]``: the predictable part of the next bar's log return, known at the close of bar
            ``t`` by whoever knows the latent state (a fraction per bar).
        expected_future_return: float64 ``[n]``, ``G_t = sum over k >= 1 of E[x_{t+k} | bars up
            to t, latent state of bar t]``: what one unit of exposure held from the close of bar
            ``t`` on is expected to earn over every later bar (a fraction; a sum of ``E[x]``, not
            of ``E[r]``: a bar's expected gross return is ``exp(E[x])``, so this is, to first
            order, what the position earns in price).
        regime: int8 ``[n]``, the latent state of each bar, +1 or -1 (the sign of the AR
            coefficient of :func:`make_regime_ohlcv`, the sign of the drift of
            :func:`make_trend_ohlcv`; all +1 for :func:`make_ar1_ohlcv` and the martingale).
    """

    bars: pd.DataFrame
    expected_return: np.ndarray
    expected_future_return: np.ndarray
    regime: np.ndarray


def make_ar1_ohlcv(n: int, phi: float = 0.2, vol_per_bar: float = 2e-3, substeps: int = 64, seed: int = 0,
                   freq: str = "1h", start: str = "2017-01-02", price0: float = 1.1) -> SyntheticMarket:
    """``n`` OHLCV bars whose log returns follow an AR(1) process: momentum (``phi > 0``) or mean
    reversion (``phi < 0``).

    ``x_t = phi * x_{t-1} + s * e_t`` with ``e_t`` standard normal and ``s = vol_per_bar *
    sqrt(1 - phi**2)``, so the stationary standard deviation of ``x`` (and of the bar log return
    ``r_t = x_t - s**2/2``) is ``vol_per_bar`` and the lag-1 autocorrelation of the bar log
    returns is ``phi``; ``x_0`` is drawn from the stationary law. The oracle's inputs are exact:
    ``m_t = phi * x_t``, ``G_t = phi * x_t / (1 - phi)``. The bars are cut from a fine path whose
    increments within each bar are a Brownian bridge (``substeps`` steps of standard deviation
    ``s / sqrt(substeps)``) from the previous close to the bar's close: ``open`` is the previous
    close (``price0`` first), ``high``/``low`` the path's max/min over the bar. With ``phi = 0``
    the path has the law of :func:`make_martingale_ohlcv`'s (not its numbers). Volume is
    independent of prices (log-normal around 1000).

    Args:
        n: bars (>= 1).
        phi: AR coefficient, ``-1 < phi < 1`` (the markets measured: -0.3 .. 0.3).
        vol_per_bar: stationary standard deviation of one bar's log return (fraction, >= 0).
        substeps: fine-path steps per bar (>= 1).
        seed: NumPy generator seed; the same seed gives the same bars.
        freq, start: timestamps, ``pd.date_range(start, periods=n, freq=freq)``.
        price0: the first open (price units, > 0).

    Returns:
        :class:`SyntheticMarket` (``regime`` all +1).

    Raises:
        ValueError: an argument out of range (the message names it).
    """
    _check_args("make_ar1_ohlcv", n, vol_per_bar, substeps, price0)
    _check_phi("make_ar1_ohlcv", phi)
    rng = np.random.default_rng(seed)
    regime = np.ones(n, dtype=np.int8)
    x, s = _ar1(np.full(n, float(phi)), vol_per_bar, rng)
    return _market(x, s, phi * x, phi * x / (1.0 - phi), regime, substeps, rng, freq, start, price0)


def make_regime_ohlcv(n: int, phi: float = 0.2, regime_length: float = 500.0, vol_per_bar: float = 2e-3,
                      substeps: int = 64, seed: int = 0, freq: str = "1h", start: str = "2017-01-02",
                      price0: float = 1.1) -> SyntheticMarket:
    """``n`` OHLCV bars whose log returns switch between momentum and mean reversion: an AR(1)
    process whose coefficient ``phi_t = regime_t * phi`` follows a two-state Markov chain.

    ``regime_0`` is +1 or -1 with probability 1/2; each later bar keeps the previous bar's regime
    with probability ``1 - p`` and switches with probability ``p = 1 / regime_length``, so regimes
    last ``regime_length`` bars on average (geometric lengths). ``x_t = phi_t * x_{t-1} + s * e_t``
    with ``s = vol_per_bar * sqrt(1 - phi**2)`` (stationary standard deviation ``vol_per_bar`` in
    either regime); bars, ``r_t``, path and volume as :func:`make_ar1_ohlcv`. Known at the close of
    bar ``t`` to whoever knows ``regime_t``, with ``q = 1 - 2p`` and ``a = phi_t``:
    ``m_t = q * a * x_t`` and ``G_t = (1 + a) * a * q * x_t / (1 - a**2 * q)`` (exact:
    ``E[x_{t+k}] = a**k * q**ceil(k/2) * x_t``).

    Args:
        n: bars (>= 1).
        phi: the AR coefficient's magnitude in both regimes, ``-1 < phi < 1``.
        regime_length: mean regime length in bars (>= 1).
        vol_per_bar, substeps, seed, freq, start, price0: as :func:`make_ar1_ohlcv`.

    Returns:
        :class:`SyntheticMarket` (``regime``: the sign of ``phi_t / phi``).

    Raises:
        ValueError: an argument out of range (the message names it).
    """
    _check_args("make_regime_ohlcv", n, vol_per_bar, substeps, price0)
    _check_phi("make_regime_ohlcv", phi)
    p = _switch_probability("make_regime_ohlcv", regime_length)
    rng = np.random.default_rng(seed)
    regime = _two_state_chain(n, p, rng)
    a = regime * float(phi)
    x, s = _ar1(a, vol_per_bar, rng)
    q = 1.0 - 2.0 * p
    return _market(x, s, q * a * x, (1.0 + a) * a * q * x / (1.0 - a * a * q), regime, substeps, rng, freq, start,
                   price0)


def make_trend_ohlcv(n: int, drift: float = 2e-4, regime_length: float = 500.0, vol_per_bar: float = 2e-3,
                     substeps: int = 64, seed: int = 0, freq: str = "1h", start: str = "2017-01-02",
                     price0: float = 1.1) -> SyntheticMarket:
    """``n`` OHLCV bars of a trend with noise: a drift of ``+drift`` or ``-drift`` per bar that
    switches sign between segments of random length.

    ``x_t = regime_t * drift + vol_per_bar * e_t`` with the two-state chain of
    :func:`make_regime_ohlcv` (segments last ``regime_length`` bars on average, each the opposite
    sign of the one before); bars, ``r_t`` (here ``v = vol_per_bar**2``), path and volume as
    :func:`make_ar1_ohlcv`, the bridge's steps of standard deviation ``vol_per_bar /
    sqrt(substeps)``. Known at the close of bar ``t`` to whoever knows the segment's sign, with
    ``q = 1 - 2/regime_length`` and ``d_t = regime_t * drift``: ``m_t = q * d_t`` and
    ``G_t = d_t * q / (1 - q)``.

    Args:
        n: bars (>= 1).
        drift: the drift's magnitude, a log return per bar (>= 0).
        regime_length: mean segment length in bars (>= 1).
        vol_per_bar: standard deviation of one bar's log return around the drift (fraction, >= 0).
        substeps, seed, freq, start, price0: as :func:`make_ar1_ohlcv`.

    Returns:
        :class:`SyntheticMarket` (``regime``: the sign of each bar's drift).

    Raises:
        ValueError: an argument out of range (the message names it).
    """
    _check_args("make_trend_ohlcv", n, vol_per_bar, substeps, price0)
    if not (np.isfinite(drift) and drift >= 0):
        raise ValueError(f"make_trend_ohlcv: drift must be a finite log return per bar >= 0, got {drift!r}")
    p = _switch_probability("make_trend_ohlcv", regime_length)
    rng = np.random.default_rng(seed)
    regime = _two_state_chain(n, p, rng)
    d = regime * float(drift)
    x = d + vol_per_bar * rng.standard_normal(n)
    q = 1.0 - 2.0 * p
    return _market(x, float(vol_per_bar), q * d, d * (q / (1.0 - q)), regime, substeps, rng, freq, start, price0)


def _check_args(fn: str, n: int, vol_per_bar: float, substeps: int, price0: float) -> None:
    if n < 1 or substeps < 1 or not (np.isfinite(vol_per_bar) and vol_per_bar >= 0) or not price0 > 0:
        raise ValueError(f"{fn}: need n >= 1, substeps >= 1, a finite vol_per_bar >= 0, price0 > 0; "
                         f"got n={n}, substeps={substeps}, vol_per_bar={vol_per_bar}, price0={price0}")


def _check_phi(fn: str, phi: float) -> None:
    if not -1.0 < phi < 1.0:
        raise ValueError(f"{fn}: phi must be in (-1, 1) (a stationary AR(1) process), got {phi!r}")


def _switch_probability(fn: str, regime_length: float) -> float:
    if not (np.isfinite(regime_length) and regime_length >= 1):
        raise ValueError(f"{fn}: regime_length must be a finite number of bars >= 1, got {regime_length!r}")
    return 1.0 / float(regime_length)


def _two_state_chain(n: int, p: float, rng: np.random.Generator) -> np.ndarray:
    """``[n]`` int8 states +1/-1: the first +1 or -1 with probability 1/2, then each bar switches
    with probability ``p``."""
    first = 1 if rng.random() < 0.5 else -1
    switches = rng.random(n) < p
    switches[0] = False
    return (first * (1 - 2 * (np.cumsum(switches) % 2))).astype(np.int8)


def _ar1(phi: np.ndarray, vol_per_bar: float, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """``x_t = phi_t * x_{t-1} + s * e_t`` with ``|phi_t| = |phi_0|`` and ``s = vol_per_bar *
    sqrt(1 - phi_0**2)``, ``x_0 = vol_per_bar * e_0`` (stationary); returns ``(x, s)``."""
    s = float(vol_per_bar) * float(np.sqrt(1.0 - phi[0] ** 2))
    e = rng.standard_normal(phi.size)
    x = np.empty(phi.size)
    prev = float(vol_per_bar) * e[0]
    x[0] = prev
    for t, (a, shock) in enumerate(zip(phi[1:].tolist(), (s * e[1:]).tolist()), start=1):
        prev = a * prev + shock
        x[t] = prev
    return x, s


def _market(x: np.ndarray, s: float, expected: np.ndarray, future: np.ndarray, regime: np.ndarray, substeps: int,
            rng: np.random.Generator, freq: str, start: str, price0: float) -> SyntheticMarket:
    """Bars whose log returns are ``x - s**2/2``, cut from a Brownian bridge per bar (steps of
    standard deviation ``s / sqrt(substeps)``) pinned at each bar's close."""
    import pandas as pd

    n = x.size
    r = x - 0.5 * s * s
    steps = (s / np.sqrt(substeps)) * rng.standard_normal((n, substeps))
    steps += ((r - steps.sum(axis=1)) / substeps)[:, None]  # each bar's steps sum to its log return
    log_path = np.log(price0) + np.concatenate([[0.0], np.cumsum(steps.ravel())])
    rows = np.lib.stride_tricks.sliding_window_view(np.exp(log_path), substeps + 1)[::substeps]
    bars = pd.DataFrame({
        "timestamp": pd.date_range(start, periods=n, freq=freq),
        "open": rows[:, 0].copy(),
        "high": rows.max(axis=1),
        "low": rows.min(axis=1),
        "close": rows[:, -1].copy(),
        "volume": 1000.0 * np.exp(0.3 * rng.standard_normal(n)),
    })
    return SyntheticMarket(bars, np.asarray(expected, dtype=np.float64), np.asarray(future, dtype=np.float64),
                           regime)


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
    import pandas as pd

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
