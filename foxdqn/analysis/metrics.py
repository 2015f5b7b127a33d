"""Trading performance metrics of one equity curve (host side, NumPy ``float64``).

Conventions (shared by every function here):

* ``equity`` has shape ``[S+1]``: ``equity[0]`` is the initial equity and ``equity[t+1]`` the
  equity at the close of bar ``t``. Values must be finite and strictly positive (an environment
  that can go bankrupt must clip equity to a small positive floor before calling).
* ``exposure`` has shape ``[S]``: the position held *during* bar ``t`` as a signed fraction of
  equity (usually in ``[-1, 1]``; the range is not enforced). The position before the first bar
  is 0 (flat).
* Per-bar simple returns ``r_t = equity[t+1] / equity[t] - 1``; per-bar PnL
  ``pnl_t = equity[t+1] - equity[t]`` (in equity units).
* ``bars_per_year`` annualises: e.g. 252 for daily equity bars, 365 for daily crypto bars,
  ``365 * 24`` for hourly crypto bars. It must be finite and > 0.
* The risk-free rate is 0 everywhere.
* Standard deviations at or below ``ZERO_STD_EPS`` (``1e-12``, in return units) count as zero:
  a curve growing at a constant rate gives returns that differ only by float rounding
  (~1e-17), and dividing by that would produce a meaningless ratio of ~1e15.
* Bad input (wrong number of dimensions, length mismatch, too few points, non-finite or
  non-positive equity, non-positive ``bars_per_year``) raises :class:`ValueError` whose message
  names the argument at fault.

References:
    W. F. Sharpe, "The Sharpe Ratio", Journal of Portfolio Management 21(1), 49-58, 1994.
    F. A. Sortino and L. N. Price, "Performance Measurement in a Downside Risk Framework",
    Journal of Investing 3(3), 59-64, 1994.
"""
from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

#: Metrics of performance_summary where a lower value is better (the rest: higher is better).
LOWER_IS_BETTER = frozenset({"max_drawdown"})

__all__ = [
    "ZERO_STD_EPS",
    "simple_returns",
    "sharpe_ratio",
    "sortino_ratio",
    "max_drawdown",
    "profit_factor",
    "hit_rate",
    "turnover",
    "count_trades",
    "annualised_return",
    "performance_summary",
]

ZERO_STD_EPS = 1e-12
"""Standard / downside deviations at or below this value (return units) are treated as zero."""


# --------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------
def _as_float_1d(x: Any, name: str, min_len: int = 0) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}: cannot be converted to a float64 array ({e})") from None
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.size < min_len:
        raise ValueError(f"{name} needs at least {min_len} value(s), got {a.size}")
    bad = ~np.isfinite(a)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{name} has a non-finite value ({a[i]!r}) at index {i}; all values must be finite"
        )
    return a


def _equity(x: Any, name: str = "equity", min_len: int = 2) -> np.ndarray:
    a = _as_float_1d(x, name, min_len)
    nonpos = a <= 0.0
    if nonpos.any():
        i = int(np.flatnonzero(nonpos)[0])
        raise ValueError(
            f"{name} must be > 0 everywhere, got {a[i]!r} at index {i} "
            "(clip equity to a small positive floor before computing metrics)"
        )
    return a


def _bars_per_year(bars_per_year: Any) -> float:
    if isinstance(bars_per_year, bool) or not isinstance(bars_per_year, numbers.Real):
        raise ValueError(f"bars_per_year must be a real number, got {bars_per_year!r}")
    b = float(bars_per_year)
    if not math.isfinite(b) or b <= 0.0:
        raise ValueError(f"bars_per_year must be finite and > 0, got {bars_per_year!r}")
    return b


# --------------------------------------------------------------------------------------------
# individual metrics
# --------------------------------------------------------------------------------------------
def simple_returns(equity: Any) -> np.ndarray:
    """Per-bar simple returns of an equity curve.

    Args:
        equity: ``[S+1]`` equity curve, finite and > 0, at least 2 points.

    Returns:
        ``[S]`` float64 array ``equity[1:] / equity[:-1] - 1`` (fractions, not percent).

    Raises:
        ValueError: not 1-D, fewer than 2 points, non-finite or non-positive values.
    """
    eq = _equity(equity)
    return eq[1:] / eq[:-1] - 1.0


def sharpe_ratio(returns: Any, bars_per_year: float) -> float:
    """Annualised Sharpe ratio (Sharpe 1994, ex-post, risk-free rate 0).

    ``mean(r) / std(r, ddof=1) * sqrt(bars_per_year)`` over per-bar simple returns ``r``.

    Returns 0.0 when there are fewer than 2 returns (the sample standard deviation is undefined)
    or when ``std(r, ddof=1) <= ZERO_STD_EPS`` (a flat or constant-growth curve: the ratio is
    undefined, and 0 keeps tables and comparisons finite).

    Args:
        returns: ``[S]`` per-bar simple returns (fractions), finite.
        bars_per_year: bars in one year (> 0).

    Returns:
        The annualised Sharpe ratio as a Python float (dimensionless).

    Raises:
        ValueError: ``returns`` not 1-D or non-finite; ``bars_per_year`` not finite and > 0.
    """
    r = _as_float_1d(returns, "returns")
    bpy = _bars_per_year(bars_per_year)
    if r.size < 2:
        return 0.0
    std = float(np.std(r, ddof=1))
    if std <= ZERO_STD_EPS:
        return 0.0
    return float(np.mean(r)) / std * math.sqrt(bpy)


def sortino_ratio(returns: Any, bars_per_year: float) -> float:
    """Annualised Sortino ratio (Sortino & Price 1994) with target (minimum acceptable) return 0.

    ``mean(r) * sqrt(bars_per_year) / DD`` where the downside deviation
    ``DD = sqrt(mean(min(r, 0)**2))`` is taken over *all* bars (bars with a non-negative return
    contribute 0 to the mean), as in Sortino & Price (1994).

    Special cases (``DD <= ZERO_STD_EPS``, i.e. no losing bar):
        * ``inf`` when ``mean(r) > 0`` (gains with no downside);
        * ``0.0`` when ``mean(r) <= 0`` (a flat curve);
        * ``0.0`` for an empty ``returns``.

    Args:
        returns: ``[S]`` per-bar simple returns (fractions), finite.
        bars_per_year: bars in one year (> 0).

    Returns:
        The annualised Sortino ratio as a Python float (may be ``inf``).

    Raises:
        ValueError: ``returns`` not 1-D or non-finite; ``bars_per_year`` not finite and > 0.
    """
    r = _as_float_1d(returns, "returns")
    bpy = _bars_per_year(bars_per_year)
    if r.size == 0:
        return 0.0
    mean = float(np.mean(r))
    downside = float(np.sqrt(np.mean(np.minimum(r, 0.0) ** 2)))
    if downside <= ZERO_STD_EPS:
        return math.inf if mean > 0.0 else 0.0
    return mean * math.sqrt(bpy) / downside


def max_drawdown(equity: Any) -> float:
    """Maximum drawdown as a positive fraction: ``max_t (1 - equity_t / max_{s<=t} equity_s)``.

    Example: ``[1, 2, 1, 3, 1.5]`` gives 0.5 (both falls are 50 % from their peak).

    Args:
        equity: ``[S+1]`` equity curve, finite and > 0, at least 1 point.

    Returns:
        A Python float in ``[0, 1)``; 0.0 for a curve that never falls.

    Raises:
        ValueError: not 1-D, empty, non-finite or non-positive values.
    """
    eq = _equity(equity, min_len=1)
    peak = np.maximum.accumulate(eq)
    return float(np.max(1.0 - eq / peak))


def profit_factor(pnl: Any) -> float:
    """Gross profit over gross loss: ``sum(pnl[pnl > 0]) / |sum(pnl[pnl < 0])|``.

    Special cases: ``inf`` when there are gains but no losses; ``0.0`` when there are no gains
    (including an all-zero or empty ``pnl``).

    Args:
        pnl: ``[S]`` per-bar PnL in equity units (``diff(equity)``), finite.

    Returns:
        A Python float ``>= 0`` (may be ``inf``).

    Raises:
        ValueError: ``pnl`` not 1-D or non-finite.
    """
    p = _as_float_1d(pnl, "pnl")
    gains = float(p[p > 0.0].sum())
    losses = float(-p[p < 0.0].sum())
    if gains <= 0.0:
        return 0.0
    if losses <= 0.0:
        return math.inf
    return gains / losses


def hit_rate(pnl: Any, exposure: Any) -> float:
    """Fraction of bars with positive PnL among the bars where ``exposure != 0``.

    Args:
        pnl: ``[S]`` per-bar PnL (equity units), finite.
        exposure: ``[S]`` exposure held during each bar, finite.

    Returns:
        A Python float in ``[0, 1]``; 0.0 when the agent never holds a position.

    Raises:
        ValueError: not 1-D, non-finite, or lengths differ.
    """
    p = _as_float_1d(pnl, "pnl")
    x = _as_float_1d(exposure, "exposure")
    if p.size != x.size:
        raise ValueError(f"pnl has {p.size} bars but exposure has {x.size}; they must match")
    held = x != 0.0
    n = int(held.sum())
    if n == 0:
        return 0.0
    return float(np.count_nonzero(p[held] > 0.0)) / n


def _exposure_changes(x: np.ndarray) -> np.ndarray:
    return np.diff(x, prepend=0.0)


def turnover(exposure: Any, bars_per_year: float) -> float:
    """Annualised turnover: ``sum_t |exposure_t - exposure_{t-1}| * bars_per_year / S``.

    ``exposure_{-1} = 0``: opening the first position counts; closing the last position after
    the final bar does not (the curve ends holding it). Units: multiples of equity traded per
    year (a flip from +1 to -1 counts 2).

    Args:
        exposure: ``[S]`` exposure during each bar, finite, ``S >= 1``.
        bars_per_year: bars in one year (> 0).

    Raises:
        ValueError: not 1-D, empty or non-finite; ``bars_per_year`` not finite and > 0.
    """
    x = _as_float_1d(exposure, "exposure", min_len=1)
    bpy = _bars_per_year(bars_per_year)
    return float(np.abs(_exposure_changes(x)).sum()) * bpy / x.size


def count_trades(exposure: Any) -> int:
    """Number of bars whose exposure differs from the previous bar's (``exposure_{-1} = 0``).

    Every change counts once: opening, closing, resizing, and flipping long<->short (one change,
    not two). Example: ``[0, 1, 1, 0, -1]`` has 3 trades.

    Raises:
        ValueError: ``exposure`` not 1-D or non-finite.
    """
    x = _as_float_1d(exposure, "exposure")
    return int(np.count_nonzero(_exposure_changes(x)))


def annualised_return(equity: Any, bars_per_year: float) -> float:
    """Compound annual growth rate ``(equity[-1] / equity[0]) ** (bars_per_year / S) - 1``.

    Short, strongly growing curves can overflow: the result is then ``inf`` (no warning).

    Args:
        equity: ``[S+1]`` equity curve, finite and > 0, at least 2 points.
        bars_per_year: bars in one year (> 0).

    Raises:
        ValueError: bad ``equity`` or ``bars_per_year``.
    """
    eq = _equity(equity)
    bpy = _bars_per_year(bars_per_year)
    exponent = bpy / (eq.size - 1)
    log_growth = math.log(eq[-1] / eq[0]) * exponent
    if log_growth > 709.0:  # exp overflows float64 just above 709.78
        return math.inf
    return math.expm1(log_growth)


# --------------------------------------------------------------------------------------------
# summary
# --------------------------------------------------------------------------------------------
def performance_summary(
    equity: np.ndarray,
    exposure: np.ndarray,
    bars_per_year: float,
    trades: int | None = None,
) -> dict[str, float]:
    """All metrics of one equity curve, as a flat ``dict[str, float]`` (JSON/CSV friendly).

    Args:
        equity: ``[S+1]`` equity curve starting at the initial equity; finite, > 0 (float64).
        exposure: ``[S]`` exposure held during each bar (signed fraction of equity, finite).
        bars_per_year: bars in one year (> 0), used to annualise.
        trades: number of trades counted by the environment; when ``None`` it is
            :func:`count_trades` of ``exposure``.

    Returns:
        Keys (all values Python floats; ``bars`` and ``num_trades`` are whole numbers):

        * ``total_return``: ``equity[-1] / equity[0] - 1``;
        * ``annualised_return``: :func:`annualised_return`;
        * ``sharpe``: :func:`sharpe_ratio` of the per-bar simple returns;
        * ``sortino``: :func:`sortino_ratio` of the per-bar simple returns (may be ``inf``);
        * ``max_drawdown``: :func:`max_drawdown` (positive fraction);
        * ``profit_factor``: :func:`profit_factor` of ``diff(equity)`` (may be ``inf``);
        * ``hit_rate``: :func:`hit_rate`;
        * ``turnover``: :func:`turnover` (annualised);
        * ``num_trades``: ``trades`` or :func:`count_trades`;
        * ``bars``: ``S``.

    Raises:
        ValueError: ``equity`` has < 2 points, is not 1-D, non-finite or non-positive;
            ``exposure`` is not 1-D, non-finite or its length is not ``len(equity) - 1``;
            ``bars_per_year`` is not finite and > 0; ``trades`` is not a non-negative integer.
    """
    eq = _equity(equity)
    x = _as_float_1d(exposure, "exposure")
    if x.size != eq.size - 1:
        raise ValueError(
            f"exposure must have len(equity) - 1 = {eq.size - 1} bars, got {x.size}"
        )
    bpy = _bars_per_year(bars_per_year)
    if trades is None:
        n_trades = count_trades(x)
    else:
        if isinstance(trades, bool) or not isinstance(trades, numbers.Integral) or trades < 0:
            raise ValueError(f"trades must be a non-negative integer or None, got {trades!r}")
        n_trades = int(trades)

    r = eq[1:] / eq[:-1] - 1.0
    pnl = np.diff(eq)
    return {
        "total_return": float(eq[-1] / eq[0] - 1.0),
        "annualised_return": annualised_return(eq, bpy),
        "sharpe": sharpe_ratio(r, bpy),
        "sortino": sortino_ratio(r, bpy),
        "max_drawdown": max_drawdown(eq),
        "profit_factor": profit_factor(pnl),
        "hit_rate": hit_rate(pnl, x),
        "turnover": turnover(x, bpy),
        "num_trades": float(n_trades),
        "bars": float(x.size),
    }
