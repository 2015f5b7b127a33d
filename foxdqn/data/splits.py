"""Chronological train/val/test split of the rows, and the minimum rows each split must hold.

Splits are ``[start, end)`` row ranges, contiguous, in the order train, val, test, covering all
rows.

* By fractions (``data.split.train/val/test``): ``train_end = round(T * train)``,
  ``val_end = round(T * (train + val))``, the test split takes the rest.
* By dates (``data.split.val_start/test_start``, both set): val starts at the first bar at or
  after ``val_start``, test at the first bar at or after ``test_start``. Both dates must lie inside
  the data: ``first timestamp < val_start < test_start <= last timestamp``. A date without a time
  zone is taken in the data's time zone; for time-zone-naive data a zoned date is converted to UTC.

Walk-forward (``data.split.folds`` K > 1): the test split ``[b, T)`` found above is cut into K
blocks, block k ``[b_k, b_{k+1})`` with ``b_k = b + round(k (T - b) / K)``; fold
``data.split.fold`` = k tests on block k, validates on the ``V`` rows before it (``V`` the val
split's rows above) and trains on ``[0, b_k - V)``: an expanding window. The rows after block k
are not part of fold k's data (:func:`fold_end`), so nothing of the future is even loaded. The K
test blocks together are the test split of the run without folds.

Minimum rows (:func:`required_rows`): the train split needs ``window + episode_length`` rows (the
first observation window of W bars, then ``episode_length`` steps each moving one bar on); val and
test need 2 rows each (one step; their first observation window may reach W-1 bars back into the
previous split).
"""
import pandas as pd

from foxdqn.data.config import SplitConfig, parse_split_date
from foxdqn.errors import DataError

SPLIT_NAMES = ("train", "val", "test")
MIN_EVAL_ROWS = 2


def split_rows(timestamps: pd.DatetimeIndex, split: SplitConfig, source: str) -> dict[str, tuple[int, int]]:
    """Row ranges ``{"train": (0, a), "val": (a, b), "test": (b, T)}`` for ``timestamps`` ``[T]``.

    Raises:
        ConfigError: a split date does not parse (see :meth:`SplitConfig.validate`).
        DataError: a split date lies outside the data (names the field and the data range).
    """
    n = len(timestamps)
    if split.by_dates:
        val_idx = _date_row(timestamps, split.val_start, "data.split.val_start", source)
        test_idx = _date_row(timestamps, split.test_start, "data.split.test_start", source)
    else:
        val_idx = int(round(n * split.train))
        test_idx = int(round(n * (split.train + split.val)))
    val_idx, test_idx = min(max(val_idx, 0), n), min(max(test_idx, 0), n)
    if split.folds > 1:
        start = test_idx + int(round(split.fold * (n - test_idx) / split.folds))
        end = test_idx + int(round((split.fold + 1) * (n - test_idx) / split.folds))
        val_rows = test_idx - val_idx
        return {"train": (0, start - val_rows), "val": (start - val_rows, start), "test": (start, end)}
    return {"train": (0, val_idx), "val": (val_idx, test_idx), "test": (test_idx, n)}


def fold_end(rows: dict[str, tuple[int, int]]) -> int:
    """The number of rows a run's data keeps: the end of its test split (all rows without
    walk-forward; the end of the fold's block with it)."""
    return rows["test"][1]


def required_rows(window: int, episode_length: int) -> dict[str, int]:
    """Minimum rows per split: train ``window + episode_length``, val and test 2."""
    return {"train": window + episode_length, "val": MIN_EVAL_ROWS, "test": MIN_EVAL_ROWS}


def check_split_sizes(splits: dict[str, tuple[int, int]], timestamps: pd.DatetimeIndex,
                      window: int, episode_length: int, source: str) -> None:
    """Raise DataError naming the first split with fewer rows than :func:`required_rows` asks."""
    need = required_rows(window, episode_length)
    why = {
        "train": f"window {window} + episode_length {episode_length}",
        "val": "one step needs 2 bars",
        "test": "one step needs 2 bars",
    }
    for name in SPLIT_NAMES:
        start, end = splits[name]
        have = end - start
        if have < need[name]:
            span = f" ({timestamps[start]} .. {timestamps[end - 1]})" if have > 0 else ""
            raise DataError(
                f"{source}: the {name} split has {have} rows{span} of {len(timestamps)} in all, "
                f"but needs at least {need[name]} ({why[name]}); use more data, change data.split, "
                "or shorten the window/episode_length"
            )


def _date_row(timestamps: pd.DatetimeIndex, value: str, field_name: str, source: str) -> int:
    boundary = parse_split_date(value, field_name)
    if timestamps.tz is not None and boundary.tzinfo is None:
        boundary = boundary.tz_localize(timestamps.tz)
    elif timestamps.tz is None and boundary.tzinfo is not None:
        boundary = boundary.tz_convert("UTC").tz_localize(None)
    first, last = timestamps[0], timestamps[-1]
    if not first < boundary <= last:
        raise DataError(
            f"{source}: {field_name}={value} is outside the data, which runs from {first} to "
            f"{last}; it must be after the first and at or before the last timestamp"
        )
    return int(timestamps.searchsorted(boundary, side="left"))
