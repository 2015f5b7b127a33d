"""Chronological splits (fractions and dates), bars per year, and configuration errors."""
import numpy as np
import pandas as pd
import pytest

from foxdqn.data import DataConfig, SplitConfig, market_data_from_frame
from foxdqn.data.frequency import infer_bars_per_year
from foxdqn.data.synthetic import make_synthetic_ohlcv
from foxdqn.errors import ConfigError, DataError


def build(frame, **cfg):
    return market_data_from_frame(frame, DataConfig(**cfg), window=5, episode_length=5, source="bars.csv")


@pytest.fixture
def hourly():
    return make_synthetic_ohlcv(100, 0.0, 0.01, seed=0)  # 2020-01-01 00:00 .. 2020-01-05 03:00


def test_split_by_fractions(hourly):
    data = build(hourly, split=SplitConfig(train=0.6, val=0.25, test=0.15))
    assert data.splits == {"train": (0, 60), "val": (60, 85), "test": (85, 100)}
    assert data.split_timestamps("val")[0] == pd.Timestamp("2020-01-03 12:00")


def test_default_split_is_70_15_15(hourly):
    assert build(hourly).splits == {"train": (0, 70), "val": (70, 85), "test": (85, 100)}


def test_split_by_dates_wins_over_fractions(hourly):
    split = SplitConfig(train=0.1, val=0.1, test=0.8, val_start="2020-01-03", test_start="2020-01-04 06:30")
    data = build(hourly, split=split)
    # val starts at the first bar at/after 2020-01-03 00:00 (row 48), test at/after 06:30 on the 4th (07:00, row 79)
    assert data.splits == {"train": (0, 48), "val": (48, 79), "test": (79, 100)}
    assert data.split_timestamps("test")[0] == pd.Timestamp("2020-01-04 07:00")
    assert data.split_timestamps("train")[-1] < pd.Timestamp("2020-01-03") <= data.split_timestamps("val")[0]


def test_split_dates_for_timezone_aware_data(hourly):
    frame = hourly.assign(timestamp=hourly.timestamp.dt.tz_localize("America/New_York"))
    data = build(frame, split=SplitConfig(val_start="2020-01-03", test_start="2020-01-04T07:00:00-05:00"))
    assert data.splits["val"] == (48, 79)


@pytest.mark.parametrize("split, field", [
    (SplitConfig(train=0.0, val=0.5, test=0.5), "data.split.train"),
    (SplitConfig(train=0.7, val=-0.1, test=0.4), "data.split.val"),
    (SplitConfig(train=0.7, val=0.15, test=float("nan")), "data.split.test"),
    (SplitConfig(train=0.7, val=0.2, test=0.2), "must sum to 1"),
    (SplitConfig(val_start="2020-01-03"), "data.split.test_start must be set together"),
    (SplitConfig(val_start="2020-01-04", test_start="2020-01-03"), "data.split.val_start (2020-01-04) must be earlier"),
    (SplitConfig(val_start="03/2020/31", test_start="2020-01-04"), "data.split.val_start must be an ISO date"),
])
def test_bad_split_settings_raise_config_error(split, field, hourly):
    with pytest.raises(ConfigError) as info:
        build(hourly, split=split)
    assert field in str(info.value), str(info.value)


@pytest.mark.parametrize("val_start, test_start, field", [
    ("2019-12-31", "2020-01-03", "data.split.val_start=2019-12-31 is outside the data"),
    ("2020-01-01 00:00", "2020-01-03", "data.split.val_start=2020-01-01 00:00 is outside"),
    ("2020-01-02", "2020-01-06", "data.split.test_start=2020-01-06 is outside"),
])
def test_split_dates_outside_the_data_raise_data_error(val_start, test_start, field, hourly):
    with pytest.raises(DataError) as info:
        build(hourly, split=SplitConfig(val_start=val_start, test_start=test_start))
    message = str(info.value)
    assert message.startswith("bars.csv: ") and field in message, message
    assert "2020-01-01 00:00:00 to 2020-01-05 03:00:00" in message, message


@pytest.mark.parametrize("settings, field", [
    ({"vol_window": 1}, "data.vol_window must be an integer >= 2"),
    ({"volume_window": 2.5}, "data.volume_window"),
    ({"spread_window": 0}, "data.spread_window must be an integer >= 1"),
    ({"clip": 0.0}, "data.clip"),
    ({"clip": float("inf")}, "data.clip"),
    ({"bars_per_year": -5.0}, "data.bars_per_year"),
    ({"name": "sp500"}, "built-ins are: ar1_1h, eurusd_1h, googl_1d, martingale_1h, regime_1h, trend_1h"),
    ({"name": None}, "data.name and data.path are both unset"),
    ({"path": ""}, "data.path"),
    ({"timestamp_column": ""}, "data.timestamp_column"),
    ({"on_gaps": "drop"}, "data.on_gaps must be one of error | warn | ignore, got 'drop'"),
    ({"on_frequency_change": "ignore"}, "data.on_frequency_change must be one of error | warn, got 'ignore'"),
    ({"max_gap_bars": 0.5}, "data.max_gap_bars must be a finite number >= 1"),
    ({"max_gap_bars": float("nan")}, "data.max_gap_bars"),
    ({"time_unit": "h"}, "data.time_unit must be one of s | ms | us | ns or null"),
])
def test_bad_data_settings_name_the_field(settings, field):
    with pytest.raises(ConfigError) as info:
        DataConfig(**settings).validate()
    assert field in str(info.value), str(info.value)


def test_default_config_is_valid():
    DataConfig().validate()
    DataConfig(name=None, path="x.csv", split=SplitConfig(val_start="2020-01-01", test_start="2020-02-01")).validate()


@pytest.mark.parametrize("window, episode_length, field", [(0, 5, "window"), (5, 0, "episode_length"), (2.0, 5, "window")])
def test_bad_window_or_episode_length(window, episode_length, field, hourly):
    with pytest.raises(ConfigError, match=f"^{field} must be an integer >= 1"):
        market_data_from_frame(hourly, DataConfig(), window=window, episode_length=episode_length)


@pytest.mark.parametrize("timestamps, expected", [
    (pd.date_range("2020-01-01", periods=500, freq="1h"), 252 * 24),
    (pd.date_range("2020-01-06", periods=500, freq="15min"), 252 * 96),
    (pd.bdate_range("2020-01-01", periods=300), 252),
    (pd.date_range("2020-01-01", periods=300, freq="D"), 252),
    (pd.date_range("2020-01-03", periods=100, freq="W-FRI"), 365.25 / 7),
])
def test_bars_per_year_rule(timestamps, expected):
    assert infer_bars_per_year(pd.DatetimeIndex(timestamps)) == pytest.approx(expected)


def test_bars_per_year_counts_bars_per_calendar_date():
    # A 6.5-hour session of hourly bars (09:30 .. 15:30, 7 bars) on business days only.
    days = pd.bdate_range("2021-03-01", periods=40)
    stamps = pd.DatetimeIndex([d + pd.Timedelta(hours=9.5 + h) for d in days for h in range(7)])
    assert infer_bars_per_year(stamps) == 252 * 7


def test_bars_per_year_override(hourly):
    assert build(hourly).bars_per_year == 252 * 24
    assert build(hourly, bars_per_year=8766.0).bars_per_year == 8766.0
    assert np.isfinite(build(hourly).features).all()
