"""Built-in datasets read from the installed gym-anytrading package."""
import numpy as np
import pandas as pd
import pytest

from foxdqn.data import BUILTIN_DATASETS, DataConfig, load_market_data
from foxdqn.data.builtin import builtin_path

EXPECTED = {
    # name: (rows, first timestamp, last timestamp, bars_per_year)
    "eurusd_1h": (6225, "2017-01-01 22:00", "2017-12-29 21:00", 252 * 24),
    "googl_1d": (2335, "2009-05-22", "2018-08-29", 252),
    "martingale_1h": (6225, "2017-01-02 00:00", "2017-09-18 08:00", 252 * 24),
}


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def builtin(request):
    return request.param, load_market_data(DataConfig(name=request.param), window=32, episode_length=256)


def test_builtins_listed():
    assert sorted(BUILTIN_DATASETS) == sorted(EXPECTED)


def test_builtin_read_in_place_from_gym_anytrading():
    for name in ("eurusd_1h", "googl_1d"):
        path = builtin_path(name)
        assert "gym_anytrading" in path.parts and path.is_file()


def test_builtin_rows_and_range(builtin):
    name, data = builtin
    rows, first, last, bars_per_year = EXPECTED[name]
    assert len(data.timestamps) == rows
    assert data.timestamps[0] == pd.Timestamp(first)
    assert data.timestamps[-1] == pd.Timestamp(last)
    assert data.bars_per_year == bars_per_year
    assert data.source.startswith(name)
    for array in (data.open, data.high, data.low, data.close, data.volume, data.spread, data.volatility):
        assert array.shape == (rows,) and array.dtype == np.float64 and np.isfinite(array).all()


def test_builtin_splits_contiguous_and_covering(builtin):
    _, data = builtin
    n = len(data.timestamps)
    assert list(data.splits) == ["train", "val", "test"]
    bounds = [data.splits[name] for name in ("train", "val", "test")]
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert all(start < end for start, end in bounds)
    assert bounds[0][1] == round(0.70 * n) and bounds[1][1] == round(0.85 * n)
    assert len(data.split_timestamps("val")) == bounds[1][1] - bounds[1][0]
    assert data.split_timestamps("test")[0] == data.timestamps[bounds[2][0]]


def test_builtin_features_and_medians(builtin):
    _, data = builtin
    n = len(data.timestamps)
    assert data.features.dtype == np.float32 and data.features.shape == (n, len(data.feature_names))
    assert np.isfinite(data.features).all() and np.abs(data.features).max() <= 10.0
    start, end = data.splits["train"]
    assert data.median_spread == pytest.approx(np.median(data.spread[start:end]))
    assert data.median_volatility == pytest.approx(np.median(data.volatility[start:end]))
    assert 0 < data.median_spread < 0.05 and 0 < data.median_volatility < 0.1


def test_the_bundled_eurusd_file_given_as_data_path_reads_day_first_like_the_builtin():
    """The file's ``13.01.2017 ...`` timestamps are day first: inferred when month first does not
    read every row, so data.path=<that file> gives the built-in's bars."""
    import numpy as np

    from foxdqn.data import DataConfig, load_market_data
    from foxdqn.data.builtin import builtin_path

    mine = load_market_data(DataConfig(path=str(builtin_path("eurusd_1h"))), window=8)
    builtin = load_market_data(DataConfig(name="eurusd_1h"), window=8)
    assert (mine.timestamps == builtin.timestamps).all() and np.array_equal(mine.close, builtin.close)
