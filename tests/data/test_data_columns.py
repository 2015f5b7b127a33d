"""Column matching (any case, extra columns ignored) and where the timestamps come from."""
import numpy as np
import pandas as pd
import pytest

from foxdqn.data import DataConfig, load_market_data
from foxdqn.data.synthetic import make_synthetic_ohlcv

WINDOW, EPISODE = 5, 5


def load(path, **cfg):
    return load_market_data(DataConfig(path=str(path), **cfg), window=WINDOW, episode_length=EPISODE)


def assert_same_bars(data, bars):
    np.testing.assert_array_equal(data.timestamps, pd.DatetimeIndex(bars.timestamp))
    for key in ("open", "high", "low", "close"):
        np.testing.assert_allclose(getattr(data, key), bars[key].to_numpy(), rtol=1e-12)
        assert getattr(data, key).dtype == np.float64


@pytest.mark.parametrize("names", [
    {"timestamp": "Date", "open": "OPEN", "high": "High", "low": "low", "close": "ClOsE", "volume": "VOLUME"},
    {"timestamp": "Gmt time", "open": " Open ", "high": "HIGH", "low": "Low", "close": "Close", "volume": "Volume"},
    {"timestamp": "DATETIME", "open": "open", "high": "high", "low": "LOW", "close": "close", "volume": "vOlUmE"},
])
def test_columns_match_in_any_case_and_extra_columns_are_ignored(names, bars, write):
    frame = bars.rename(columns=names).assign(**{"Adj Close": bars.close * 2, "Symbol": "XYZ"})
    data = load(write(frame))
    assert_same_bars(data, bars)
    np.testing.assert_allclose(data.volume, bars.volume.to_numpy())


def test_named_timestamp_column(bars, write):
    frame = bars.rename(columns={"timestamp": "bar_end"}).assign(date="ignored")
    data = load(write(frame), timestamp_column="BAR_END")
    assert_same_bars(data, bars)


def test_file_without_volume(bars, write):
    data = load(write(bars.drop(columns=["volume"])))
    assert data.volume is None
    assert data.feature_names == ["log_return", "range", "close_loc", "volatility"]
    assert data.features.shape == (len(bars), 4)


@pytest.mark.parametrize("constant", [0.0, 7.0])
def test_constant_volume_has_no_volume_feature(constant, bars, write):
    data = load(write(bars.assign(volume=constant)))
    np.testing.assert_array_equal(data.volume, constant)
    assert "volume_z" not in data.feature_names


def test_varying_volume_adds_volume_feature(bars, write):
    data = load(write(bars))
    assert data.feature_names == ["log_return", "range", "close_loc", "volatility", "volume_z"]


def test_parquet_with_datetime_index(bars, tmp_path):
    path = tmp_path / "bars.parquet"
    bars.set_index("timestamp").rename(columns=str.upper).to_parquet(path)
    data = load(path)
    assert_same_bars(data, bars)


def test_parquet_with_timestamp_column(bars, tmp_path):
    path = tmp_path / "bars.parquet"
    bars.rename(columns={"timestamp": "Time"}).to_parquet(path, index=False)
    assert_same_bars(load(path), bars)


def test_timezone_aware_timestamps_are_kept(bars, write):
    frame = bars.assign(timestamp=bars.timestamp.dt.tz_localize("UTC").dt.tz_convert("Europe/Berlin"))
    data = load(write(frame))
    assert str(data.timestamps.tz) == "UTC+01:00"  # the offset written in the file (winter time)
    np.testing.assert_array_equal(data.timestamps.tz_convert("UTC").tz_localize(None), bars.timestamp)


@pytest.mark.parametrize("unit, per_second", [("s", 1), ("ms", 1000), ("us", 10**6), ("ns", 10**9)])
def test_epoch_timestamps_in_the_unit_of_data_time_unit(unit, per_second, bars, write):
    seconds = (bars.timestamp - pd.Timestamp("1970-01-01")) // pd.Timedelta(seconds=1)
    data = load(write(bars.assign(timestamp=seconds * per_second)), time_unit=unit)
    assert_same_bars(data, bars)


def test_float_epoch_seconds_with_time_unit(bars, write):
    seconds = (bars.timestamp - pd.Timestamp("1970-01-01")) / pd.Timedelta(seconds=1) + 0.5
    data = load(write(bars.assign(timestamp=seconds)), time_unit="s")
    assert_same_bars(data, bars.assign(timestamp=bars.timestamp + pd.Timedelta(milliseconds=500)))


@pytest.mark.parametrize("stamps", [
    lambda b: (b.timestamp - pd.Timestamp("1970-01-01")) // pd.Timedelta(seconds=1),  # epoch seconds
    lambda b: np.arange(len(b)),                                                      # row numbers
    lambda b: np.arange(len(b)) * 3600.0 + 0.25,                                      # floats
])
def test_numeric_timestamps_without_time_unit_are_refused(stamps, bars, write):
    # Once read as 1970 epoch seconds: 1-second bars, ~541,000 bars a year, Sharpe ratios x20.
    from foxdqn.errors import DataError

    path = write(bars.assign(timestamp=stamps(bars)))
    with pytest.raises(DataError) as info:
        load(path)
    message = str(info.value)
    assert str(path) in message and "'timestamp'" in message and "data.time_unit" in message, message


def test_time_unit_with_date_timestamps_is_refused(bars, write):
    from foxdqn.errors import DataError

    path = write(bars)
    with pytest.raises(DataError, match="data.time_unit=s is set but column 'timestamp' holds dates"):
        load(path, time_unit="s")


def test_mixed_utc_offsets_are_converted_to_utc(bars, write):
    # Across the spring DST change a Berlin exchange writes +01:00 and then +02:00.
    frame = bars.assign(timestamp=pd.date_range("2020-03-28 12:00", periods=len(bars), freq="1h", tz="UTC"))
    frame["timestamp"] = frame.timestamp.dt.tz_convert("Europe/Berlin").astype(str)
    assert frame.timestamp.str[-6:].nunique() == 2
    data = load(write(frame))
    assert str(data.timestamps.tz) == "UTC"
    assert data.timestamps[0] == pd.Timestamp("2020-03-28 12:00", tz="UTC")


def test_yyyymmdd_integer_dates(write):
    daily = make_synthetic_ohlcv(60, 0.0, 0.01, seed=2, freq="D")
    ints = daily.assign(timestamp=daily.timestamp.dt.strftime("%Y%m%d").astype(int))
    data = load(write(ints))
    assert_same_bars(data, daily)
    assert data.bars_per_year == 252
