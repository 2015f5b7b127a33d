"""Bar spacing: a frequency change part-way through is refused, a long gap is reported (foxdqn.data.calendar)."""
import logging

import pandas as pd
import pytest

from foxdqn.data import DataConfig, SplitConfig, load_market_data, market_data_from_frame
from foxdqn.data.calendar import check_spacing
from foxdqn.data.synthetic import make_synthetic_ohlcv, write_csv
from foxdqn.errors import DataError

HOUR, DAY = pd.Timedelta(hours=1), pd.Timedelta(days=1)


def stamps(*pieces) -> pd.DatetimeIndex:
    """Runs of ``(bars, spacing)`` from 2020-01-06: each bar lies one ``spacing`` after the bar before it,
    so ``stamps((3, HOUR), (2, DAY))`` is 00:00, 01:00, 02:00, then 1 day, 2 days after 02:00."""
    out = [pd.Timestamp("2020-01-06") - pieces[0][1]]
    for bars, step in pieces:
        out += [out[-1] + (i + 1) * step for i in range(bars)]
    return pd.DatetimeIndex(out[1:])


def frame(timestamps: pd.DatetimeIndex) -> pd.DataFrame:
    return make_synthetic_ohlcv(len(timestamps), vol=0.01, seed=3).assign(timestamp=timestamps)


def build(timestamps, **cfg):
    return market_data_from_frame(frame(timestamps), DataConfig(**cfg), window=5, episode_length=5,
                                  source="bars.csv")


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("foxdqn")]


def error_of(timestamps, **cfg) -> str:
    with pytest.raises(DataError) as info:
        build(timestamps, **cfg)
    message = str(info.value)
    assert "\n" not in message and message.startswith("bars.csv: "), message
    return message


# --- gaps -------------------------------------------------------------------------------------

GAP = stamps((200, HOUR), (1, pd.Timedelta(hours=300)), (199, HOUR))  # 12.5 days missing after row 200


def test_long_gap_in_hourly_bars_is_a_warning_by_default(caplog):
    with caplog.at_level(logging.WARNING):
        data = build(GAP)
    assert len(data.timestamps) == 400
    lines = warnings_of(caplog)
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("bars.csv: column 'timestamp' has 1 gap(s) longer than 73h"), line
    assert "2020-01-14 07:00:00 -> 2020-01-26 19:00:00 (12.5 days, data rows 200-201)" in line, line
    assert "median spacing 1h or 73h for a weekend" in line, line
    assert "data.on_gaps=error" in line and "\n" not in line


def test_long_gap_with_on_gaps_error_is_refused():
    message = error_of(GAP, on_gaps="error")
    assert "1 gap(s) longer than 73h" in message and "12.5 days" in message and "data.on_gaps" in message


def test_on_gaps_ignore_and_max_gap_bars_silence_the_gap(caplog):
    with caplog.at_level(logging.WARNING):
        build(GAP, on_gaps="ignore")
        build(GAP, max_gap_bars=301)
    assert warnings_of(caplog) == []


def test_gap_message_lists_three_and_counts_the_rest():
    many = stamps(*[(40, HOUR) if i % 2 == 0 else (1, 4 * DAY) for i in range(11)])
    message = error_of(many, on_gaps="error")
    assert "has 5 gap(s)" in message and "... (2 more)" in message, message


@pytest.mark.parametrize("timestamps", [
    # FX hourly: Friday 21:00 -> Sunday 22:00 (49 h) every week
    pd.DatetimeIndex([t for t in pd.date_range("2020-01-05 22:00", periods=24 * 7 * 8, freq="h")
                      if not (t.day_of_week == 4 and t.hour >= 22 or t.day_of_week == 5
                              or t.day_of_week == 6 and t.hour < 22)]),
    # stock hourly: a 7-bar session (09:30 .. 15:30) on business days
    pd.DatetimeIndex([d + pd.Timedelta(hours=9.5 + h) for d in pd.bdate_range("2021-03-01", periods=60)
                      for h in range(7)]),
    # daily business days with a 5-day market closure (the bars of 29 and 30 October 2012 missing)
    pd.DatetimeIndex([d for d in pd.bdate_range("2012-06-01", periods=200)
                      if d not in (pd.Timestamp("2012-10-29"), pd.Timestamp("2012-10-30"))]),
    # weekly bars
    pd.date_range("2015-01-02", periods=200, freq="W-FRI"),
], ids=["fx_hourly_weekends", "stock_hourly_sessions", "daily_closure", "weekly"])
def test_regular_trading_calendars_are_clean(timestamps, caplog):
    assert check_spacing(timestamps, "x.csv", "t", on_gaps="error") == []
    with caplog.at_level(logging.WARNING):
        build(timestamps, on_gaps="error")
    assert warnings_of(caplog) == []


def test_gap_threshold_is_strictly_more_than_max_gap_bars_or_the_calendar():
    daily = [stamps((50, DAY), (1, gap), (49, DAY)) for gap in (5 * DAY, 5 * DAY + HOUR)]
    assert check_spacing(daily[0], "x.csv", "t") == []
    assert "1 gap(s) longer than 5 days" in check_spacing(daily[1], "x.csv", "t")[0]
    hourly = [stamps((50, HOUR), (1, gap), (49, HOUR)) for gap in (73 * HOUR, 74 * HOUR)]
    assert check_spacing(hourly[0], "x.csv", "t") == []
    assert len(check_spacing(hourly[1], "x.csv", "t")) == 1
    assert len(check_spacing(hourly[0], "x.csv", "t", max_gap_bars=80)) == 0
    # Below 3.5 bars the calendar's weekend (3.5 days for daily bars) is the threshold.
    assert "longer than 84h" in check_spacing(daily[1], "x.csv", "t", max_gap_bars=2)[0]
    # Intraday bars: a weekend is up to 3 days + one bar; a 4-day (holiday) weekend is reported.
    session = pd.DatetimeIndex([d + pd.Timedelta(hours=9.5 + h) for d in pd.bdate_range("2021-03-01", periods=60)
                                if d != pd.Timestamp("2021-04-02") for h in range(7)])
    assert "2021-04-01 15:30:00 -> 2021-04-05 09:30:00 (90h" in check_spacing(session, "x.csv", "t")[0]


# --- frequency change -------------------------------------------------------------------------

@pytest.mark.parametrize("later, median", [(4 * HOUR, "4h"), (DAY, "1 day")])
def test_hourly_bars_turning_slower_half_way_are_refused(later, median):
    message = error_of(stamps((300, HOUR), (300, later)))
    assert "the bar frequency changes part-way through" in message, message
    assert f"median spacing 1h over the first third (data rows 1..200, 2020-01-06 00:00:00 .. " in message, message
    assert f"but {median} over the last third" in message and "data.on_frequency_change=warn" in message, message


def test_a_change_inside_the_test_split_only_is_refused():
    # Daily bars from 85 %: the last third is still mostly hourly, the test split is daily.
    message = error_of(stamps((510, HOUR), (90, DAY)))
    assert "over the train split (data rows 1..420" in message and "over the test split" in message, message


def test_frequency_change_as_a_warning_loads_the_data(caplog):
    with caplog.at_level(logging.WARNING):
        data = build(stamps((300, HOUR), (300, DAY)), on_frequency_change="warn")
    assert len(data.timestamps) == 600
    lines = warnings_of(caplog)
    assert len(lines) == 1 and "bar frequency changes" in lines[0] and "on_frequency_change=warn" in lines[0], lines


def test_factor_1_5_is_allowed_and_small_parts_are_not_compared():
    assert check_spacing(stamps((60, 2 * HOUR), (60, 3 * HOUR)), "x.csv", "t") == []  # factor 1.5
    with pytest.raises(DataError, match="a factor of 1.6 > 1.5"):
        check_spacing(stamps((60, 5 * HOUR), (60, 8 * HOUR)), "x.csv", "t")
    # 40 bars: the splits of 70/15/15 give val and test 5 spacings each, too few to compare.
    few = stamps((34, HOUR), (6, DAY))
    splits = {"train": (0, 28), "val": (28, 34), "test": (34, 40)}
    assert len(check_spacing(few, "x.csv", "t", splits=splits, on_gaps="ignore")) == 0


def test_split_by_dates_is_compared_too():
    # 4-hourly bars from row 541: the last third is still mostly hourly, the test split is not.
    timestamps = stamps((540, HOUR), (60, 4 * HOUR))
    split = SplitConfig(val_start=str(timestamps[400]), test_start=str(timestamps[540]))
    message = error_of(timestamps, split=split)
    assert "1h over the train split (data rows 1..400" in message, message
    assert "4h over the test split (data rows 541..600" in message, message


# --- built-in datasets --------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["eurusd_1h", "googl_1d", "martingale_1h"])
def test_builtin_datasets_have_no_spacing_problem(name, caplog):
    with caplog.at_level(logging.WARNING):
        data = load_market_data(DataConfig(name=name, on_gaps="error"), window=32, episode_length=256)
    assert warnings_of(caplog) == []
    assert check_spacing(data.timestamps, name, "t", on_gaps="error", splits=data.splits) == []


# --- end to end -----------------------------------------------------------------------------------

def test_cli_refuses_hourly_bars_turning_daily_with_one_line_and_exit_2(train_cli, tmp_path):
    timestamps = stamps((700, HOUR), (700, DAY))
    csv = write_csv(make_synthetic_ohlcv(len(timestamps), seed=4).assign(timestamp=timestamps),
                    tmp_path / "mixed bars.csv")
    res = train_cli([f"data.path={csv}", "debug=smoke", "device=cpu", f"hydra.run.dir={tmp_path / 'run'}"],
                    cwd=tmp_path)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr
    assert str(csv) in lines[0] and "bar frequency changes" in lines[0], lines[0]
    assert not (tmp_path / "run").exists()
