"""Bar spacing checks: a change of bar frequency part-way through, and gaps in the bars.

Spacings are the ``T - 1`` differences between consecutive timestamps (strictly increasing, in
absolute time); ``m`` is the median spacing of all the data.

Frequency change (``data.on_frequency_change``: ``error``, the default, or ``warn``): the median
spacing of two parts of the data differs by more than a factor of **1.5** (larger / smaller).
Compared, in this order, and reported at the first pair that differs: the first third of the
spacings with the last third, then the train split with the val split and with the test split.
A part with fewer than **10** spacings is not compared (its median says little). Hourly bars
turning 4-hourly or daily, so that evaluation runs at another frequency than training, fail this.

Gaps (``data.on_gaps``: ``warn``, the default, ``error`` or ``ignore``): a spacing strictly longer
than ``max(data.max_gap_bars x m, calendar)``, where ``calendar`` is the longest spacing a regular
trading calendar produces: **3 days + m** for intraday bars (``m < 20 h``: nights and weekends,
e.g. EUR/USD's ~49 h weekend), **3.5 days** for daily bars (``20 h <= m < 4 days``: weekends) and
0 for weekly or slower bars. With the default 5 bars, daily bars may skip 5 days (a holiday next
to a weekend, a market closure) but a 12.5-day hole in hourly bars is a gap.

:func:`check_spacing` raises :class:`~foxdqn.errors.DataError` (one line: the file, what, the
counts, the first timestamps concerned and the key that changes the behaviour) or returns the
warnings as one-line strings for the caller to log.
"""
from typing import Optional

import numpy as np
import pandas as pd

from foxdqn.data.frequency import DAILY_MIN_GAP, WEEKLY_MIN_GAP
from foxdqn.errors import DataError

#: Medians of two parts of the data differing by more than this factor are a frequency change.
FREQUENCY_CHANGE_FACTOR = 1.5
#: Parts with fewer spacings than this are not compared.
MIN_SPACINGS = 10
#: Longest spacing of a regular calendar: daily bars (weekend) and intraday bars (+ one bar).
DAILY_CALENDAR_GAP = pd.Timedelta(days=3.5)
INTRADAY_CALENDAR_GAP = pd.Timedelta(days=3)
#: Gaps listed in a message.
SHOWN = 3


def check_spacing(timestamps: pd.DatetimeIndex, source: str, column: str, *,
                  on_frequency_change: str = "error", on_gaps: str = "warn", max_gap_bars: float = 5.0,
                  splits: Optional[dict[str, tuple[int, int]]] = None) -> list[str]:
    """Check the bar spacing of ``timestamps`` (``[T]``, strictly increasing) by the module rules.

    Args:
        timestamps: bar times, oldest first.
        source: the file (or dataset) named in the messages; ``column`` the timestamp column.
        on_frequency_change: ``"error"`` or ``"warn"``.
        on_gaps: ``"error"``, ``"warn"`` or ``"ignore"``.
        max_gap_bars: gap threshold in median spacings (>= 1).
        splits: optional ``"train"/"val"/"test"`` -> ``[start, end)`` row ranges to compare too.

    Returns:
        Warning lines (possibly empty), one per problem found in ``warn`` mode.

    Raises:
        DataError: a frequency change (``on_frequency_change="error"``) or a gap (``on_gaps="error"``).
    """
    if len(timestamps) < 3:
        return []
    spacing = pd.TimedeltaIndex(timestamps[1:] - timestamps[:-1])  # absolute time, also across DST
    lines = []
    change = _frequency_change(timestamps, spacing, splits or {})
    if change is not None:
        if on_frequency_change == "error":
            raise DataError(f"{source}: {change}; resample the file to one bar frequency, or set "
                            "data.on_frequency_change=warn to load it anyway")
        lines.append(f"{source}: {change} (data.on_frequency_change=warn)")
    if on_gaps != "ignore":
        gaps = _gaps(timestamps, spacing, column, max_gap_bars)
        if gaps is not None and on_gaps == "error":
            raise DataError(f"{source}: {gaps}; fill or cut the data, raise data.max_gap_bars, or set "
                            "data.on_gaps=warn (or ignore) to load it anyway")
        if gaps is not None:
            lines.append(f"{source}: {gaps}; data.on_gaps=error refuses such files, "
                            "data.on_gaps=ignore silences this")
    return lines


def _frequency_change(timestamps, spacing: pd.TimedeltaIndex, splits) -> Optional[str]:
    """The first pair of parts whose median spacings differ by more than the factor, described."""
    n, third = len(spacing), len(spacing) // 3
    parts = {"first third": (0, third), "last third": (n - third, n)}
    # Spacing i lies between rows i and i + 1, so the rows [start, end) hold spacings [start, end - 1).
    parts.update({f"{name} split": (start, end - 1) for name, (start, end) in splits.items()})
    pairs = [("first third", "last third"), ("train split", "val split"), ("train split", "test split")]
    for a, b in pairs:
        if a not in parts or b not in parts or min(_size(parts[a]), _size(parts[b])) < MIN_SPACINGS:
            continue
        med_a, med_b = (spacing[slice(*parts[p])].median() for p in (a, b))
        factor = max(med_a, med_b) / min(med_a, med_b)
        if factor > FREQUENCY_CHANGE_FACTOR:
            return (f"the bar frequency changes part-way through: median spacing {_duration(med_a)} over the "
                    f"{a} ({_rows(timestamps, *parts[a])}) but {_duration(med_b)} over the {b} "
                    f"({_rows(timestamps, *parts[b])}), a factor of {factor:.3g} > {FREQUENCY_CHANGE_FACTOR}")
    return None


def _gaps(timestamps, spacing: pd.TimedeltaIndex, column: str, max_gap_bars: float) -> Optional[str]:
    """The gaps (spacings over the threshold) described in one line, or None."""
    median = spacing.median()
    calendar = (INTRADAY_CALENDAR_GAP + median if median < DAILY_MIN_GAP
                else DAILY_CALENDAR_GAP if median < WEEKLY_MIN_GAP else pd.Timedelta(0))
    limit = max(median * max_gap_bars, calendar)
    rows = np.flatnonzero(spacing > limit)
    if len(rows) == 0:
        return None
    shown = ", ".join(f"{timestamps[i]} -> {timestamps[i + 1]} ({_duration(spacing[i])}, data rows {i + 1}-{i + 2})"
                      for i in rows[:SHOWN])
    more = f", ... ({len(rows) - SHOWN} more)" if len(rows) > SHOWN else ""
    weekend = f" or {_duration(calendar)} for a weekend" if calendar > pd.Timedelta(0) else ""
    return (f"column {column!r} has {len(rows)} gap(s) longer than {_duration(limit)} (the larger of "
            f"data.max_gap_bars={max_gap_bars:g} x the median spacing {_duration(median)}{weekend}): "
            f"{shown}{more}")


def _size(part: tuple[int, int]) -> int:
    return part[1] - part[0]


def _rows(timestamps: pd.DatetimeIndex, start: int, end: int) -> str:
    """Rows spanned by spacings ``[start, end)``, 1-based, with their first and last timestamp."""
    return f"data rows {start + 1}..{end + 1}, {timestamps[start]} .. {timestamps[end]}"


def _duration(value: pd.Timedelta) -> str:
    """A spacing as ``'15min'``, ``'73h'``, ``'1 day'``, ``'12.5 days'`` (days: whole days or >= 4 days)."""
    seconds = value / pd.Timedelta(seconds=1)
    days = seconds / 86400
    if days >= 4 or (days >= 1 and days == int(days)):
        return f"{days:.4g} {'day' if days == 1 else 'days'}"
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.4g}{unit}"
    return f"{seconds:.4g}s"
