"""Reading a bar file and finding its columns.

* :func:`read_table` reads a CSV (optionally compressed) or Parquet file into a DataFrame. In a
  CSV only an empty cell is missing: text such as ``n/a``, ``NA`` or ``null`` is kept as text (and
  refused as non-numeric in a price column). A CSV header that names a column the pipeline uses
  (open/high/low/close/volume or the timestamp column, any case) twice is refused: pandas would
  rename the second to ``close.1`` and the first would be used silently.
* :func:`find_columns` matches ``open/high/low/close`` (required) and ``volume`` (optional)
  case-insensitively, ignoring every other column, and finds the timestamps: the column named by
  ``data.timestamp_column``, else the one column called timestamp/datetime/date/time/gmt time/...
  (any case), else a datetime index (Parquet).
* :func:`parse_timestamps` turns the timestamp values into a :class:`pandas.DatetimeIndex`.
  Numbers are read as Unix epoch times only in the unit named by ``data.time_unit`` (never
  guessed: row numbers or seconds read as 1970 dates would skew every annualised figure);
  without it only 8-digit ``YYYYMMDD`` integers are accepted, as dates.

Every failure raises :class:`~foxdqn.errors.DataError` naming the file (``source``), the column
and/or the first bad row.
"""
import importlib.util
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np
import pandas as pd

from foxdqn.data.rows import describe_row
from foxdqn.errors import DataError

PRICE_COLUMNS = ("open", "high", "low", "close")
VOLUME_COLUMN = "volume"
#: Timestamp column names recognised by auto-detection (compared case-insensitively).
TIMESTAMP_NAMES = (
    "timestamp", "datetime", "date_time", "date", "time", "gmt time", "local time",
    "open_time", "open time",
)
CSV_SUFFIXES = (".csv", ".csv.gz", ".csv.bz2", ".csv.zip", ".csv.xz", ".csv.zst")
PARQUET_SUFFIXES = (".parquet", ".pq")


def read_table(path: Union[str, Path], timestamp_column: Optional[str] = None) -> pd.DataFrame:
    """Read a CSV or Parquet file of bars, all columns as stored (no conversion).

    ``timestamp_column`` (``data.timestamp_column``; None: the auto-detected names) is the
    timestamp column checked for duplicates in a CSV header, with open/high/low/close/volume.

    Raises:
        DataError: the file does not exist, has an unsupported suffix, cannot be parsed, has no data
            rows, is Parquet and pyarrow is not installed (``pip install pyarrow``), or is a CSV
            whose header names a used column twice.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        raise DataError(f"{path}: is a directory (data.path must name a CSV or Parquet file)")
    if not path.is_file():
        raise DataError(f"{path.resolve()}: data file not found (data.path must name an existing CSV or Parquet file)")
    name = path.name.lower()
    if name.endswith(PARQUET_SUFFIXES):
        if importlib.util.find_spec("pyarrow") is None:
            raise DataError(f"{path}: reading Parquet files needs pyarrow: pip install pyarrow")
        kind, reader = "Parquet", pd.read_parquet
    elif name.endswith(CSV_SUFFIXES):
        kind, reader = "CSV", _read_csv
    else:
        raise DataError(
            f"{path}: unsupported file type; allowed: {', '.join(CSV_SUFFIXES + PARQUET_SUFFIXES)}"
        )
    try:
        frame = reader(path)
    except Exception as exc:  # pandas/pyarrow raise many types; all mean "cannot parse"
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{path}: cannot parse the file as {kind}: {detail}") from None
    if kind == "CSV":
        _check_duplicate_header(path, timestamp_column)
    if len(frame) == 0:
        raise DataError(f"{path}: the file has no data rows")
    return frame


def _read_csv(path: Path, **kwargs) -> pd.DataFrame:
    # index_col=False: a row with more fields than the header is an error, not a silent index.
    # keep_default_na=False, na_values=[""]: only an empty cell is missing; "n/a" stays text.
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.ParserWarning)
        return pd.read_csv(path, index_col=False, keep_default_na=False, na_values=[""], **kwargs)


def _check_duplicate_header(path: Path, timestamp_column: Optional[str]) -> None:
    """Raise DataError if the raw header names a used column twice (pandas renames it ``name.1``)."""
    header = [str(name) for name in _read_csv(path, header=None, nrows=1, dtype=str).iloc[0]]
    timestamps = (timestamp_column.strip().lower(),) if timestamp_column else TIMESTAMP_NAMES
    used = set(PRICE_COLUMNS) | {VOLUME_COLUMN} | set(timestamps)
    for name in dict.fromkeys(header):
        positions = [i + 1 for i, other in enumerate(header) if other == name]
        if len(positions) > 1 and name.strip().lower() in used:
            raise DataError(
                f"{path}: column {name!r} appears {len(positions)} times in the header (columns "
                f"{', '.join(map(str, positions))}); pandas would read the others as {name + '.1'!r}, ... "
                "and only the first would be used; keep one column of that name"
            )


@dataclass
class Columns:
    """Where the data lives in a frame: raw timestamp values and the matched OHLC(V) columns."""

    timestamp_name: str              # column (or index) name as spelled in the file
    timestamp_values: pd.Series      # raw values, one per row, in file order
    prices: dict[str, pd.Series]     # "open"/"high"/"low"/"close" -> raw column
    volume: Optional[pd.Series]      # raw volume column or None


def find_columns(frame: pd.DataFrame, source: str, timestamp_column: Optional[str] = None) -> Columns:
    """Match the OHLC(V) and timestamp columns of ``frame`` (names compared case-insensitively).

    Raises:
        DataError: a required column is missing (the message lists the columns found), two columns
            match the same name, the named timestamp column is absent, or no timestamp column /
            datetime index can be found (or several candidates are found).
    """
    by_name: dict[str, list[str]] = {}
    for column in frame.columns:
        by_name.setdefault(str(column).strip().lower(), []).append(column)
    found = ", ".join(str(c).replace("\n", "\\n").replace("\r", "\\r") for c in frame.columns) or "(none)"

    def pick(key: str) -> Optional[str]:
        matches = by_name.get(key, [])
        if len(matches) > 1:
            raise DataError(
                f"{source}: columns {', '.join(map(str, matches))} all match {key!r} "
                "(names are matched case-insensitively); keep only one"
            )
        return matches[0] if matches else None

    missing = [key for key in PRICE_COLUMNS if pick(key) is None]
    if missing:
        raise DataError(
            f"{source}: missing required column(s) {', '.join(missing)} (matched case-insensitively); "
            f"found columns: {found}; need open, high, low, close, optional volume and a timestamp column"
        )
    prices = {key: frame[pick(key)] for key in PRICE_COLUMNS}
    volume_name = pick(VOLUME_COLUMN)
    volume = frame[volume_name] if volume_name is not None else None
    name, values = _find_timestamps(frame, source, timestamp_column, pick, found)
    return Columns(name, values.reset_index(drop=True), {k: v.reset_index(drop=True) for k, v in prices.items()},
                   None if volume is None else volume.reset_index(drop=True))


def _find_timestamps(frame, source, timestamp_column, pick, found) -> tuple[str, pd.Series]:
    index_name = str(frame.index.name).strip().lower() if frame.index.name is not None else None
    if timestamp_column is not None:
        key = timestamp_column.strip().lower()
        column = pick(key)
        if column is not None:
            return str(column), frame[column]
        if index_name == key:
            return str(frame.index.name), frame.index.to_series()
        raise DataError(
            f"{source}: timestamp column {timestamp_column!r} (data.timestamp_column) not found; "
            f"found columns: {found}"
        )
    candidates = [pick(key) for key in TIMESTAMP_NAMES if pick(key) is not None]
    if len(candidates) > 1:
        raise DataError(
            f"{source}: several possible timestamp columns ({', '.join(map(str, candidates))}); "
            "set data.timestamp_column to the one holding the bar times"
        )
    if candidates:
        return str(candidates[0]), frame[candidates[0]]
    if isinstance(frame.index, pd.DatetimeIndex) or index_name in TIMESTAMP_NAMES:
        return str(frame.index.name or "index"), frame.index.to_series()
    raise DataError(
        f"{source}: no timestamp column found; found columns: {found}; name it one of "
        f"{', '.join(TIMESTAMP_NAMES)} (any case), set data.timestamp_column, or store a datetime index (Parquet)"
    )


def parse_timestamps(values: pd.Series, source: str, column: str, fmt: Optional[str] = None,
                     unit: Optional[str] = None) -> pd.DatetimeIndex:
    """Parse timestamp values into a :class:`pandas.DatetimeIndex` (one entry per row).

    Accepts datetimes, strings (format inferred unless ``fmt`` is given, month first and, when that
    does not read every row, day first: ``13.01.2017`` is the 13th of January; mixed UTC offsets are
    converted to UTC) and numbers: with ``unit`` (``data.time_unit``: s/ms/us/ns) as Unix epoch
    times in that unit; without it only 8-digit integers, as ``YYYYMMDD`` dates.

    Raises:
        DataError: naming the column and the first data row (1-based) that is missing or
            unparsable; numbers other than ``YYYYMMDD`` dates while ``unit`` is None (set
            data.time_unit); ``unit`` set but the values are not numbers.
    """
    values = pd.Series(values).reset_index(drop=True)
    missing = values.isna() | values.astype(str).str.strip().eq("")
    if missing.any():
        row = int(np.flatnonzero(missing.to_numpy())[0])
        raise DataError(f"{source}: column {column!r} has a missing timestamp at {describe_row(row)}")
    numeric = pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)
    if unit is not None and not numeric:
        raise DataError(
            f"{source}: data.time_unit={unit} is set but column {column!r} holds dates/times such as "
            f"{str(values.iloc[0])!r}, not numbers; unset data.time_unit"
        )
    if pd.api.types.is_datetime64_any_dtype(values):
        return pd.DatetimeIndex(values)
    if numeric:
        return _parse_numeric(values, source, column, unit)
    for dayfirst, utc in ((False, False), (False, True), (True, False), (True, True)):
        if fmt is not None and dayfirst:
            break
        try:
            with warnings.catch_warnings():  # pandas warns when it infers day first
                warnings.simplefilter("ignore")
                return pd.DatetimeIndex(pd.to_datetime(values, format=fmt, utc=utc, dayfirst=dayfirst))
        except (ValueError, TypeError, OverflowError):
            if fmt is not None and utc:
                break
    coerced = pd.to_datetime(values, format=fmt, errors="coerce", utc=True)
    bad = np.flatnonzero(coerced.isna().to_numpy())
    row = int(bad[0]) if len(bad) else 0
    expected = f"format {fmt!r}" if fmt else "a date/time such as 2020-01-31 or 2020-01-31 13:00:00"
    raise DataError(
        f"{source}: column {column!r} has an unparsable timestamp {str(values.iloc[row])!r} at "
        f"{describe_row(row)}; expected {expected}, in one consistent format"
    )


def _parse_numeric(values: pd.Series, source: str, column: str, unit: Optional[str]) -> pd.DatetimeIndex:
    numbers = values.to_numpy(dtype=np.float64)
    if unit is not None:
        what = f"Unix epoch times in {unit} (data.time_unit)"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parsed = pd.to_datetime(values, unit=unit, errors="coerce")
    elif np.all((numbers >= 1e7) & (numbers < 1e8) & (numbers == np.round(numbers))):
        what = "YYYYMMDD dates"
        parsed = pd.to_datetime(values.astype(np.int64).astype(str), format="%Y%m%d", errors="coerce")
    else:
        raise DataError(
            f"{source}: column {column!r} holds numbers, not dates ({str(values.iloc[0])!r} at "
            f"{describe_row(0)}); if they are Unix epoch times set data.time_unit to s, ms, us or ns, "
            "else write the timestamps as ISO dates/times"
        )
    bad = np.flatnonzero(pd.isna(parsed))
    if len(bad):
        row = int(bad[0])
        raise DataError(
            f"{source}: column {column!r} holds numbers read as {what}, but {str(values.iloc[row])!r} at "
            f"{describe_row(row)} is not a valid one; write the timestamps as ISO dates/times"
        )
    return pd.DatetimeIndex(parsed)
