"""How much a Sharpe ratio can be trusted: probabilistic Sharpe ratio and a block-bootstrap interval.

Host side, NumPy ``float64``. ``returns`` are per-bar simple returns ``[S]`` as in
:mod:`foxdqn.analysis.metrics` (fractions, finite).

* :func:`probabilistic_sharpe_ratio` -- Bailey & López de Prado (2012), "The Sharpe Ratio
  Efficient Frontier", Journal of Risk 15(2), eq. 11:
  ``PSR(SR*) = Φ((SR^ − SR*) · sqrt(n − 1) / sqrt(1 − γ3·SR^ + (γ4 − 1)/4 · SR^²))``
  with the per-bar (not annualised) Sharpe ratio ``SR^ = mean / std`` (ddof=1), the sample
  skewness ``γ3`` and (non-excess) kurtosis ``γ4`` of the returns, and ``n`` returns. It is the
  probability that the true Sharpe ratio exceeds the benchmark ``SR*`` given the sample's length
  and its non-normality. Against ``SR* = 0``: is the agent's Sharpe above zero? Applied to the
  agent's return minus buy-and-hold's (the active return): does the agent beat holding? The
  formula assumes serially independent returns; with positive autocorrelation it overstates the
  confidence (the block-bootstrap interval below does not assume independence).
* :func:`sharpe_confidence_interval` -- a percentile interval of the annualised Sharpe ratio from
  the circular moving-block bootstrap (Politis & Romano 1992; blocks keep the returns' serial
  dependence, e.g. volatility clustering): ``resamples`` series of ``S`` returns made of blocks of
  ``block`` consecutive bars starting at uniform positions, wrapping around the end.

Both are undefined for a curve without variance (a flat policy): PSR is then NaN and the
interval is ``(0, 0)`` like :func:`foxdqn.analysis.metrics.sharpe_ratio`'s convention.
"""
from __future__ import annotations

import math

import numpy as np

from foxdqn.analysis.metrics import ZERO_STD_EPS

__all__ = ["probabilistic_sharpe_ratio", "sharpe_confidence_interval", "per_bar_sharpe", "default_block"]


def _returns(returns) -> np.ndarray:
    r = np.asarray(returns, dtype=np.float64)
    if r.ndim != 1 or not np.isfinite(r).all():
        raise ValueError(f"returns must be a 1-D array of finite per-bar returns, got shape {r.shape}")
    return r


def per_bar_sharpe(returns) -> float:
    """``mean / std`` (ddof=1) of per-bar returns, not annualised; NaN with < 2 returns or no variance."""
    r = _returns(returns)
    if r.size < 2:
        return math.nan
    std = float(np.std(r, ddof=1))
    return math.nan if std <= ZERO_STD_EPS else float(np.mean(r)) / std


def probabilistic_sharpe_ratio(returns, benchmark: float = 0.0) -> float:
    """PSR of ``returns`` ``[S]`` against the per-bar benchmark Sharpe ratio ``benchmark``.

    Args:
        returns: ``[S]`` per-bar simple returns (fractions), finite, ``S >= 3``.
        benchmark: ``SR*`` per bar (annualised ratio / sqrt(bars_per_year)); 0 for "above zero".

    Returns:
        A probability in ``[0, 1]``; NaN when ``S < 3``, the returns have no variance, or the
        denominator is not positive (a sample too skewed for the normal approximation).

    Raises:
        ValueError: ``returns`` not 1-D or not finite; ``benchmark`` not finite.
    """
    r = _returns(returns)
    if not math.isfinite(benchmark):
        raise ValueError(f"benchmark must be a finite per-bar Sharpe ratio, got {benchmark!r}")
    sr = per_bar_sharpe(r)
    if r.size < 3 or math.isnan(sr):
        return math.nan
    centred = r - r.mean()
    m2 = float(np.mean(centred ** 2))
    skew = float(np.mean(centred ** 3)) / m2 ** 1.5
    kurt = float(np.mean(centred ** 4)) / m2 ** 2
    var = 1.0 - skew * sr + (kurt - 1.0) / 4.0 * sr * sr
    if not var > 0:
        return math.nan
    z = (sr - benchmark) * math.sqrt(r.size - 1) / math.sqrt(var)
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def default_block(n: int) -> int:
    """Block length ``ceil(n ** (1/3))`` (at least 1), the usual rate for the block bootstrap."""
    return max(1, math.ceil(n ** (1.0 / 3.0)))


def sharpe_confidence_interval(returns, bars_per_year: float, level: float = 0.95, block: int | None = None,
                               resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile interval of the annualised Sharpe ratio by circular moving-block bootstrap.

    Args:
        returns: ``[S]`` per-bar simple returns (fractions), finite.
        bars_per_year: annualisation (> 0), as :func:`foxdqn.analysis.metrics.sharpe_ratio`.
        level: coverage in ``(0, 1)``.
        block: bars per block (default :func:`default_block`); clipped to ``S``.
        resamples: bootstrap series (>= 10).
        seed: NumPy generator seed (the interval is deterministic for a given seed).

    Returns:
        ``(low, high)`` annualised Sharpe ratios; ``(0.0, 0.0)`` for fewer than 2 returns or no
        variance.

    Raises:
        ValueError: bad ``returns``, ``level`` outside (0, 1), ``block < 1`` or ``resamples < 10``.
    """
    r = _returns(returns)
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if resamples < 10:
        raise ValueError(f"resamples must be >= 10, got {resamples!r}")
    if r.size < 2 or math.isnan(per_bar_sharpe(r)):
        return 0.0, 0.0
    n = r.size
    b = default_block(n) if block is None else int(block)
    if b < 1:
        raise ValueError(f"block must be >= 1, got {block!r}")
    b = min(b, n)
    rng = np.random.default_rng(seed)
    blocks = math.ceil(n / b)
    starts = rng.integers(0, n, size=(resamples, blocks))
    idx = ((starts[:, :, None] + np.arange(b)[None, None, :]) % n).reshape(resamples, -1)[:, :n]
    sample = r[idx]
    mean = sample.mean(axis=1)
    std = sample.std(axis=1, ddof=1)
    sr = np.where(std > ZERO_STD_EPS, mean / np.where(std > ZERO_STD_EPS, std, 1.0), 0.0) * math.sqrt(bars_per_year)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(sr, [tail, 1.0 - tail])
    return float(low), float(high)
