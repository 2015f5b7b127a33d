"""Bars per year (the annualisation factor of returns, volatility and Sharpe ratios).

Rule, from the median gap ``d`` between consecutive timestamps (``data.bars_per_year`` overrides):

* ``d >= 20 hours`` and ``d < 4 days`` -- daily bars: **252** (trading days per year; the
  weekend/holiday gaps are what make some gaps longer than a day).
* ``d >= 4 days`` -- weekly or slower bars: ``365.25 days / d`` (weekly ~52.2, monthly ~12).
* ``d < 20 hours`` -- intraday bars: ``252 x bars per day``, where bars per day is the median
  number of bars per calendar date. On one 252-day basis for every market, Sharpe ratios of
  different assets compare directly. For 24-hour markets this undercounts slightly: EUR/USD hourly
  gives 252 x 24 = 6,048, while FX trades ~260 days (~6,240 bars) a year -- an annualised Sharpe
  ~1.6 % low (sqrt(6048/6240)). Crypto (365 days) would read ~17 % low; set ``data.bars_per_year``
  (e.g. 8766 for 24/7 hourly bars) where that matters.
"""
import pandas as pd

TRADING_DAYS_PER_YEAR = 252.0
DAILY_MIN_GAP = pd.Timedelta(hours=20)
WEEKLY_MIN_GAP = pd.Timedelta(days=4)
DAYS_PER_YEAR = 365.25


def infer_bars_per_year(timestamps: pd.DatetimeIndex) -> float:
    """Bars per year inferred from ``timestamps`` (strictly increasing, ``[T]``); 252 when T < 2."""
    if len(timestamps) < 2:
        return TRADING_DAYS_PER_YEAR
    gap = pd.Series(timestamps).diff().median()
    if gap >= WEEKLY_MIN_GAP:
        return DAYS_PER_YEAR * (pd.Timedelta(days=1) / gap)
    if gap >= DAILY_MIN_GAP:
        return TRADING_DAYS_PER_YEAR
    bars_per_day = float(pd.Series(timestamps.date).value_counts().median())
    return TRADING_DAYS_PER_YEAR * bars_per_day
