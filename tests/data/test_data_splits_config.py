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


def test_walk_forward_folds_cut_the_test_split_into_blocks(hourly):
    """100 rows, 70/15/15: the test split [85, 100) in 3 blocks of 5 rows; fold k validates on the 15
    rows before its block, trains on everything before, and keeps no row after its block."""
    plain = build(hourly)
    expected = [{"train": (0, 70), "val": (70, 85), "test": (85, 90)},
                {"train": (0, 75), "val": (75, 90), "test": (90, 95)},
                {"train": (0, 80), "val": (80, 95), "test": (95, 100)}]
    for k, rows in enumerate(expected):
        data = build(hourly, split=SplitConfig(folds=3, fold=k))
        assert data.splits == rows
        assert len(data.close) == len(data.timestamps) == rows["test"][1]  # the future is not even loaded
        np.testing.assert_array_equal(data.close, plain.close[:rows["test"][1]])
        assert data.timestamps[-1] == plain.timestamps[rows["test"][1] - 1]
    assert [build(hourly, split=SplitConfig(folds=4, fold=k)).splits["test"] for k in range(4)] == \
        [(85, 89), (89, 93), (93, 96), (96, 100)]  # 15 rows in 4 blocks: 85 + round(15 k / 4), nothing lost


def test_walk_forward_with_split_dates(hourly):
    split = dict(val_start="2020-01-03", test_start="2020-01-04 06:30")  # val [48, 79), test [79, 100)
    rows = build(hourly, split=SplitConfig(**split, folds=3, fold=1)).splits
    assert rows == {"train": (0, 55), "val": (55, 86), "test": (86, 93)}


def test_walk_forward_fold_settings_are_checked(hourly):
    for kwargs, message in (({"folds": 0}, "data.split.folds must be an integer >= 1"),
                            ({"folds": 2, "fold": 2}, "data.split.fold must be an integer from 0 to"),
                            ({"folds": 3, "fold": -1}, "data.split.fold must be an integer from 0 to"),
                            ({"folds": True}, "data.split.folds must be an integer >= 1")):
        with pytest.raises(ConfigError, match=message):
            build(hourly, split=SplitConfig(**kwargs))
    with pytest.raises(DataError, match="the test split has 1 rows"):  # 15 test rows in 10 blocks: one of 1 row
        build(hourly, split=SplitConfig(folds=10, fold=1))


def test_walk_forward_truncates_a_generated_market_with_its_oracle():
    from foxdqn.data import load_market_data
    from foxdqn.data.config import SyntheticConfig

    cfg = DataConfig(name="ar1_1h", synthetic=SyntheticConfig(bars=3000), split=SplitConfig(folds=2, fold=0))
    full = load_market_data(DataConfig(name="ar1_1h", synthetic=SyntheticConfig(bars=3000)), window=8,
                            episode_length=16)
    fold = load_market_data(cfg, window=8, episode_length=16)
    end = fold.splits["test"][1]
    assert end < len(full.close) and len(fold.expected_future_return) == len(fold.expected_return) == end
    np.testing.assert_array_equal(fold.expected_future_return, full.expected_future_return[:end])
