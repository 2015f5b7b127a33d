"""Checks on the bar values and timestamps; each failure is one :class:`~foxdqn.errors.DataError`.

Rules (in the order checked):

1. prices (open, high, low, close) and volume are numeric: every cell is empty, a number
   (``1.5``, ``1e3``) or a float spelling of NaN/infinity (``nan``, ``inf``); text such as
   ``n/a``, ``NA``, ``null`` or ``-`` is refused as non-numeric, naming the value;
2. prices and volume are finite (no NaN, empty cell or +-Inf: "missing or non-finite");
3. prices are > 0; volume is >= 0;
4. ``high >= max(open, close)`` and ``low <= min(open, close)``;
5. timestamps are strictly increasing (no duplicates, no out-of-order rows);
6. with a bound ``b`` (``data.max_abs_log_return``), every price of bar t is within
   ``exp(±b)`` of the close of bar t - 1 (:func:`check_log_returns`).

Messages name the file (``source``), the column and the first offending row, as the 1-based data
row (header not counted) followed by its timestamp.
"""
from typing import Optional

import numpy as np
import pandas as pd

from foxdqn.data.rows import describe_row
from foxdqn.errors import DataError


def to_float_array(values: pd.Series, source: str, column: str,
                   timestamps: Optional[pd.DatetimeIndex] = None) -> np.ndarray:
    """Column values as float64 ``[T]``; raises DataError at the first non-numeric cell.

    Empty cells (None/NaN or blank text) and the float spellings ``nan``/``inf`` pass here (they
    become NaN/Inf) and are reported by :func:`check_finite` as missing or non-finite. Any other
    text (``n/a``, ``null``, ``abc``) raises DataError naming the column, the row and the value.
    """
    series = pd.Series(values).reset_index(drop=True)
    if pd.api.types.is_bool_dtype(series):
        raise DataError(f"{source}: column {column!r} holds true/false values; it must hold numbers")
    numbers = pd.to_numeric(series, errors="coerce")
    blank = series.isna() | series.astype(str).str.strip().eq("")
    unread = np.flatnonzero((numbers.isna() & ~blank).to_numpy())
    bad = [row for row in unread if not _is_float_text(series.iloc[row])]
    if bad:
        row = int(bad[0])
        raise DataError(
            f"{source}: column {column!r} has a non-numeric value {str(series.iloc[row])!r} at "
            f"{describe_row(row, timestamps)}; it must hold numbers"
        )
    return numbers.to_numpy(dtype=np.float64, na_value=np.nan, copy=True)


def _is_float_text(value: object) -> bool:
    """True for the float spellings of NaN and infinity: ``nan``, ``-inf``, ``Infinity`` (any case)."""
    return str(value).strip().lower().lstrip("+-") in {"nan", "inf", "infinity"}


def check_finite(values: np.ndarray, source: str, column: str, timestamps: pd.DatetimeIndex) -> None:
    """Raise DataError at the first NaN/blank/Inf value of ``column``."""
    bad = np.flatnonzero(~np.isfinite(values))
    if len(bad):
        row = int(bad[0])
        raise DataError(
            f"{source}: column {column!r} has a missing or non-finite value ({values[row]}) at "
            f"{describe_row(row, timestamps)}; every value must be a finite number"
        )


def check_ohlcv(prices: dict[str, np.ndarray], volume: Optional[np.ndarray], source: str,
                timestamps: pd.DatetimeIndex, names: Optional[dict[str, str]] = None) -> None:
    """Validate finite values, positive prices, the OHLC envelope and volume (float64 arrays ``[T]``).

    ``names`` maps ``open/high/low/close/volume`` to the column names as spelled in the file.
    """
    names = names or {}
    for key, values in prices.items():
        check_finite(values, source, names.get(key, key), timestamps)
    if volume is not None:
        check_finite(volume, source, names.get("volume", "volume"), timestamps)
    for key, values in prices.items():
        _first_violation(values <= 0, source, timestamps,
                         f"column {names.get(key, key)!r} has a price <= 0 ({{v}})",
                         "prices must be > 0", values)
    high, low, open_, close = prices["high"], prices["low"], prices["open"], prices["close"]
    for key, mask, rule in (
        ("high", high < np.maximum(open_, close), "high must be >= max(open, close)"),
        ("low", low > np.minimum(open_, close), "low must be <= min(open, close)"),
    ):
        bad = np.flatnonzero(mask)
        if len(bad):
            row = int(bad[0])
            raise DataError(
                f"{source}: column {names.get(key, key)!r} breaks the bar envelope at "
                f"{describe_row(row, timestamps)}: open={open_[row]}, high={high[row]}, "
                f"low={low[row]}, close={close[row]}; {rule}"
            )
    if volume is not None:
        _first_violation(volume < 0, source, timestamps,
                         f"column {names.get('volume', 'volume')!r} has a negative volume ({{v}})",
                         "volume must be >= 0", volume)


def check_increasing(timestamps: pd.DatetimeIndex, source: str, column: str) -> None:
    """Raise DataError at the first timestamp that is not later than the one before it."""
    values = timestamps.asi8 if timestamps.tz is None else timestamps.tz_convert("UTC").asi8
    step = np.diff(values)
    bad = np.flatnonzero(step <= 0)
    if len(bad):
        row = int(bad[0]) + 1
        kind = "duplicates" if step[row - 1] == 0 else "is earlier than"
        raise DataError(
            f"{source}: column {column!r} timestamps must be strictly increasing, but "
            f"{describe_row(row, timestamps)} {kind} {describe_row(row - 1, timestamps)}"
        )


def _first_violation(mask: np.ndarray, source: str, timestamps: pd.DatetimeIndex, what: str,
                     allowed: str, values: Optional[np.ndarray] = None) -> None:
    bad = np.flatnonzero(mask)
    if len(bad):
        row = int(bad[0])
        text = what.format(v=values[row]) if values is not None else what
        raise DataError(f"{source}: {text} at {describe_row(row, timestamps)}; {allowed}")


def check_log_returns(prices: dict[str, np.ndarray], bound: Optional[float], source: str,
                      timestamps: pd.DatetimeIndex, names: Optional[dict[str, str]] = None) -> None:
    """Raise DataError at the first price (open, high, low, close of bar t, t >= 1, in that order
    within a row) whose ``|log(price / close[t - 1])|`` exceeds ``bound`` (a log return per bar;
    None: no check). Prices must be finite and > 0 (:func:`check_ohlcv` first)."""
    if bound is None or len(prices["close"]) < 2:
        return
    names = names or {}
    previous = np.log(prices["close"][:-1])
    keys = ("open", "high", "low", "close")
    moves = np.stack([np.abs(np.log(prices[k][1:]) - previous) for k in keys], axis=1)  # [T-1, 4]
    bad = np.flatnonzero((moves > bound).any(axis=1))
    if len(bad):
        row = int(bad[0]) + 1
        k = int(np.argmax(moves[row - 1] > bound))
        raise DataError(
            f"{source}: column {names.get(keys[k], keys[k])!r} moves by a log return of "
            f"{moves[row - 1, k]:.4g} against the previous close ({prices['close'][row - 1]} -> "
            f"{prices[keys[k]][row]}) at {describe_row(row, timestamps)}; more than data.max_abs_log_return="
            f"{bound:g} per bar: fix the row, or raise the bound (null: none) if the move is real"
        )
