"""Every validation failure is one DataError line naming the file and the column and/or row."""
import importlib.util

import pandas as pd
import pytest

from foxdqn.data import DataConfig, SplitConfig, load_market_data
from foxdqn.errors import DataError

WINDOW, EPISODE = 5, 5


def load(path, **cfg):
    return load_market_data(DataConfig(path=str(path), **cfg), window=WINDOW, episode_length=EPISODE)


def set_cell(path, row, column, text):
    """Overwrite the cell at 0-based data ``row`` of ``column`` in a simple CSV with ``text``."""
    lines = path.read_text().splitlines()
    col = lines[0].split(",").index(column)
    fields = lines[row + 1].split(",")
    fields[col] = text
    lines[row + 1] = ",".join(fields)
    path.write_text("\n".join(lines) + "\n")


def error_of(path, **cfg) -> str:
    with pytest.raises(DataError) as info:
        load(path, **cfg)
    message = str(info.value)
    assert "\n" not in message, "error messages must be a single line"
    assert str(path) in message, f"message does not name the file: {message}"
    return message


def test_valid_file_loads(bars, write):
    data = load(write(bars))
    assert len(data.timestamps) == len(bars)


# (column, 0-based row, new cell text or callable(frame, row) -> text, fragments expected in the message)
VALUE_ERRORS = {
    "non_numeric": ("close", 7, "abc", ["'close'", "non-numeric", "'abc'", "must hold numbers"]),
    "na_text": ("close", 7, "n/a", ["'close'", "non-numeric", "'n/a'", "must hold numbers"]),
    "NA_text": ("open", 8, "NA", ["'open'", "non-numeric", "'NA'"]),
    "null_volume": ("volume", 2, "null", ["'volume'", "non-numeric", "'null'"]),
    "blank_price": ("open", 3, "", ["'open'", "missing or non-finite", "finite number"]),
    "spaces_price": ("open", 3, "  ", ["'open'", "missing or non-finite", "finite number"]),
    "nan_price": ("high", 5, "NaN", ["'high'", "missing or non-finite"]),
    "inf_price": ("low", 9, "inf", ["'low'", "non-finite value (inf)"]),
    "negative_price": ("close", 2, "-1.5", ["'close'", "price <= 0 (-1.5)", "prices must be > 0"]),
    "zero_price": ("open", 4, "0", ["'open'", "price <= 0 (0.0)", "prices must be > 0"]),
    "high_below_body": ("high", 6, lambda df, r: repr(float(df.low[r])),
                        ["'high'", "high must be >= max(open, close)"]),
    "low_above_body": ("low", 6, lambda df, r: repr(float(df.high[r])),
                       ["'low'", "low must be <= min(open, close)"]),
    "negative_volume": ("volume", 3, "-5", ["'volume'", "negative volume (-5.0)", "volume must be >= 0"]),
    "blank_volume": ("volume", 11, "", ["'volume'", "missing or non-finite"]),
}


@pytest.mark.parametrize("case", list(VALUE_ERRORS), ids=list(VALUE_ERRORS))
def test_bad_value_names_file_column_and_row(case, bars, write):
    column, row, text, fragments = VALUE_ERRORS[case]
    path = write(bars)
    set_cell(path, row, column, text(bars, row) if callable(text) else text)
    message = error_of(path)
    for fragment in fragments:
        assert fragment in message, message
    assert f"data row {row + 1} (1-based" in message, message
    assert str(bars.timestamp[row]) in message, message


@pytest.mark.parametrize("text, fragment", [
    ("not a date", "unparsable timestamp 'not a date'"),
    ("2020-01-01 05:00:00 PM", "unparsable timestamp '2020-01-01 05:00:00 PM'"),
    ("", "missing timestamp"),
])
def test_bad_timestamp_names_column_and_row(text, fragment, bars, write):
    path = write(bars)
    set_cell(path, 5, "timestamp", text)
    message = error_of(path)
    assert fragment in message and "'timestamp'" in message and "data row 6 (1-based" in message, message


def test_bad_integer_date_names_column_and_row(bars, write):
    path = write(bars.assign(timestamp=pd.date_range("2020-01-01", periods=len(bars)).strftime("%Y%m%d")))
    set_cell(path, 7, "timestamp", "20200231")
    message = error_of(path)
    assert "'timestamp'" in message and "'20200231'" in message and "data row 8 (1-based" in message, message


@pytest.mark.parametrize("source_row, fragment", [
    (4, "data row 6 (1-based, header not counted; timestamp 2020-01-01 04:00:00) duplicates data row 5"),
    (2, "data row 6 (1-based, header not counted; timestamp 2020-01-01 02:00:00) is earlier than data row 5"),
])
def test_timestamps_must_strictly_increase(source_row, fragment, bars, write):
    path = write(bars)
    set_cell(path, 5, "timestamp", str(bars.timestamp[source_row]))
    message = error_of(path)
    assert "strictly increasing" in message and "'timestamp'" in message and fragment in message, message


def test_missing_file(tmp_path):
    path = tmp_path / "nope.csv"
    message = error_of(path)
    assert "not found" in message


def test_unparsable_csv(tmp_path):
    path = tmp_path / "broken.csv"
    for rows in ("2020-01-01,1,2,0.5,1.5,9,9,9\n2020-01-02,1,2,0.5,1.5\n",
                 "2020-01-01,1,2,0.5,1.5\n2020-01-02,1,2,0.5,1.5,9,9,9\n"):
        path.write_text("timestamp,open,high,low,close\n" + rows)
        message = error_of(path)
        assert "cannot parse the file as CSV" in message, message


def test_unparsable_parquet(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_text("this is not parquet")
    message = error_of(path)
    assert "cannot parse the file as Parquet" in message


def test_unsupported_suffix(bars, write):
    path = write(bars, "bars.txt")
    message = error_of(path)
    assert "unsupported file type" in message and ".parquet" in message


def test_header_only_file(bars, write):
    path = write(bars.iloc[:0])
    assert "no data rows" in error_of(path)


def test_missing_columns_lists_what_was_found(bars, write):
    path = write(bars.drop(columns=["high", "low"]))
    message = error_of(path)
    assert "missing required column(s) high, low" in message, message
    assert "found columns: timestamp, open, close, volume" in message, message


def test_columns_matching_twice_are_rejected(bars, write):
    path = write(bars.assign(Close=bars.close))
    message = error_of(path)
    assert "close, Close" in message and "case-insensitively" in message, message


@pytest.mark.parametrize("extra, name, positions", [
    ("close", "close", "5, 7"),
    ("timestamp", "timestamp", "1, 7"),
    ("volume", "volume", "6, 7"),
])
def test_duplicate_used_column_in_the_header_is_refused(extra, name, positions, bars, write):
    # pandas reads a second "close" as "close.1", so the first would be used silently.
    path = write(bars.assign(extra=bars[extra]).rename(columns={"extra": extra}))
    assert path.read_text().splitlines()[0].count(name) == 2
    message = error_of(path)
    assert f"column {name!r} appears 2 times in the header (columns {positions})" in message, message


def test_duplicate_named_timestamp_column_is_refused(bars, write):
    frame = bars.rename(columns={"timestamp": "Stamp"})
    path = write(frame.assign(extra=frame.Stamp).rename(columns={"extra": "Stamp"}))
    message = error_of(path, timestamp_column="stamp")
    assert "column 'Stamp' appears 2 times" in message, message


def test_duplicate_unused_column_is_ignored(bars, write):
    path = write(bars.assign(note="a", other="b").rename(columns={"other": "note"}))
    assert len(load(path).timestamps) == len(bars)


def test_non_numeric_text_in_a_frame_names_column_row_and_value(bars):
    from foxdqn.data import market_data_from_frame

    frame = bars.astype({"high": object})
    frame.loc[6, "high"] = "N/A"
    with pytest.raises(DataError) as info:
        market_data_from_frame(frame, DataConfig(), window=WINDOW, episode_length=EPISODE, source="my-frame")
    assert str(info.value).startswith(
        "my-frame: column 'high' has a non-numeric value 'N/A' at data row 7 (1-based"), str(info.value)


def test_no_timestamp_column(bars, write):
    path = write(bars.rename(columns={"timestamp": "when"}))
    message = error_of(path)
    assert "no timestamp column found" in message and "found columns: when" in message, message


def test_several_timestamp_candidates(bars, write):
    path = write(bars.rename(columns={"timestamp": "Date"}).assign(Time="00:00"))
    message = error_of(path)
    assert "Date, Time" in message and "data.timestamp_column" in message, message


def test_named_timestamp_column_absent(bars, write):
    path = write(bars)
    message = error_of(path, timestamp_column="stamp")
    assert "'stamp'" in message and "data.timestamp_column" in message and "found columns" in message


def test_parquet_without_pyarrow_says_pip_install(bars, tmp_path, monkeypatch):
    path = tmp_path / "bars.parquet"
    path.write_bytes(b"placeholder")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "pyarrow" else real_find_spec(name, *a))
    message = error_of(path)
    assert "pip install pyarrow" in message


@pytest.mark.parametrize("split, n_rows, name, have, need", [
    # train needs WINDOW + EPISODE = 10 rows
    (SplitConfig(train=0.2, val=0.4, test=0.4), 40, "train", 8, 10),
    (SplitConfig(train=0.96, val=0.02, test=0.02), 40, "val", 1, 2),
    (SplitConfig(val_start="2020-01-01 20:00", test_start="2020-01-02 15:00"), 40, "test", 1, 2),
])
def test_too_few_rows_for_a_split(split, n_rows, name, have, need, bars, write):
    path = write(bars.iloc[:n_rows])
    message = error_of(path, split=split)
    assert f"the {name} split has {have} rows" in message, message
    assert f"needs at least {need}" in message, message


def test_train_row_requirement_is_window_plus_episode(bars, write):
    # 40 rows, train 0.25 -> 10 rows: exactly window + episode_length, so it loads ...
    path = write(bars)
    load(path, split=SplitConfig(train=0.25, val=0.375, test=0.375))
    # ... and one more step does not fit.
    with pytest.raises(DataError, match="train split has 10 rows .* needs at least 11"):
        load_market_data(DataConfig(path=str(path), split=SplitConfig(train=0.25, val=0.375, test=0.375)),
                         window=WINDOW, episode_length=EPISODE + 1)


def test_error_rows_are_reported_from_a_frame_too(bars):
    from foxdqn.data import market_data_from_frame

    frame = bars.copy()
    frame.loc[3, "close"] = -2.0
    with pytest.raises(DataError) as info:
        market_data_from_frame(frame, DataConfig(), window=WINDOW, episode_length=EPISODE, source="my-frame")
    assert str(info.value).startswith(
        "my-frame: column 'close' has a price <= 0 (-2.0) at data row 4 (1-based, header not counted; "
        "timestamp 2020-01-01 03:00:00)"), str(info.value)
