"""Built-in datasets: read from the installed gym-anytrading package, or generated (data.synthetic)."""
import numpy as np
import pandas as pd
import pytest

from foxdqn.data import BUILTIN_DATASETS, DataConfig, load_market_data
from foxdqn.data.builtin import builtin_path
from foxdqn.data.config import SyntheticConfig
from foxdqn.data.synthetic import make_ar1_ohlcv, make_martingale_ohlcv

EXPECTED = {
    # name: (rows, first timestamp, last timestamp, bars_per_year)
    "eurusd_1h": (6225, "2017-01-01 22:00", "2017-12-29 21:00", 252 * 24),
    "googl_1d": (2335, "2009-05-22", "2018-08-29", 252),
    "martingale_1h": (6225, "2017-01-02 00:00", "2017-09-18 08:00", 252 * 24),
    "ar1_1h": (40_000, "2017-01-02 00:00", "2021-07-26 15:00", 252 * 24),
    "regime_1h": (40_000, "2017-01-02 00:00", "2021-07-26 15:00", 252 * 24),
    "trend_1h": (40_000, "2017-01-02 00:00", "2021-07-26 15:00", 252 * 24),
}
GENERATED = ("martingale_1h", "ar1_1h", "regime_1h", "trend_1h")


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


def test_generated_markets_carry_the_oracle_inputs_files_do_not(builtin):
    name, data = builtin
    n = len(data.timestamps)
    for array in (data.expected_return, data.expected_future_return):
        if name in GENERATED:
            assert array.shape == (n,) and array.dtype == np.float64 and np.isfinite(array).all()
        else:
            assert array is None
    if name == "martingale_1h":
        assert not data.expected_return.any() and not data.expected_future_return.any()
    elif name in GENERATED:
        assert (data.expected_return != 0).mean() > 0.99
        assert "; bars=40000, seed=0, vol_per_bar=0.002" in data.source


def test_martingale_1h_bars_are_unchanged():
    """The bars of every run on martingale_1h so far: 6,225 bars of make_martingale_ohlcv (10 bp, 64
    steps, seed 0, from 2017-01-02), pinned by value."""
    data = load_market_data(DataConfig(name="martingale_1h"), window=32, episode_length=256)
    frame = make_martingale_ohlcv(6225, vol_per_bar=1e-3, substeps=64, seed=0, freq="1h", start="2017-01-02")
    for column in ("open", "high", "low", "close", "volume"):
        assert (getattr(data, column) == frame[column].to_numpy()).all()
    assert data.close[-1] == pytest.approx(1.1139562705095127, rel=1e-12)
    assert data.close.sum() == pytest.approx(6904.7139784218225, rel=1e-12)
    assert data.high.max() == pytest.approx(1.168142716745428, rel=1e-12)
    assert data.volume.sum() == pytest.approx(6513956.398391381, rel=1e-12)


def test_generated_defaults_as_documented():
    """docs/configuration.md (data.synthetic.*) and docs/backtest.md state these defaults."""
    params = {name: dict(BUILTIN_DATASETS[name].parameters) for name in GENERATED}
    assert params == {
        "martingale_1h": {"bars": 6225, "seed": 0, "vol_per_bar": 1e-3},
        "ar1_1h": {"bars": 40_000, "seed": 0, "vol_per_bar": 2e-3, "phi": 0.2},
        "regime_1h": {"bars": 40_000, "seed": 0, "vol_per_bar": 2e-3, "phi": 0.2, "regime_length": 500},
        "trend_1h": {"bars": 40_000, "seed": 0, "vol_per_bar": 2e-3, "drift": 2e-4, "regime_length": 500},
    }


def test_data_synthetic_sets_the_parameters():
    cfg = DataConfig(name="ar1_1h", synthetic=SyntheticConfig(bars=3000, seed=3, phi=-0.1, vol_per_bar=1e-3))
    data = load_market_data(cfg, window=32, episode_length=256)
    want = make_ar1_ohlcv(3000, phi=-0.1, vol_per_bar=1e-3, substeps=64, seed=3, start="2017-01-02")
    assert (data.close == want.bars["close"].to_numpy()).all() and len(data.close) == 3000
    assert (data.expected_future_return == want.expected_future_return).all()
    assert data.source.endswith("; bars=3000, seed=3, vol_per_bar=0.001, phi=-0.1)")


@pytest.mark.parametrize("name, synthetic, needle", [
    ("ar1_1h", {"phi": 1.0}, "data.synthetic.phi must be a number in (-1, 1)"),
    ("regime_1h", {"phi": -1.5}, "data.synthetic.phi must be a number in (-1, 1)"),
    ("ar1_1h", {"bars": 0}, "data.synthetic.bars must be an integer >= 1"),
    ("ar1_1h", {"bars": True}, "data.synthetic.bars must be an integer >= 1"),
    ("ar1_1h", {"seed": -1}, "data.synthetic.seed must be an integer >= 0"),
    ("trend_1h", {"vol_per_bar": 0.0}, "data.synthetic.vol_per_bar must be a number > 0"),
    ("trend_1h", {"regime_length": 0.5}, "data.synthetic.regime_length must be a number >= 1"),
    ("trend_1h", {"drift": -1e-4}, "data.synthetic.drift must be a number >= 0"),
    ("regime_1h", {"drift": float("nan")}, "data.synthetic.drift must be a number >= 0"),
    ("martingale_1h", {"phi": 0.1}, "data.synthetic.phi is not a parameter of data.name=martingale_1h (its "
                                    "parameters: bars, seed, vol_per_bar)"),
    ("ar1_1h", {"regime_length": 10}, "data.synthetic.regime_length is not a parameter of data.name=ar1_1h"),
    ("trend_1h", {"phi": 0.1}, "data.synthetic.phi is not a parameter of data.name=trend_1h"),
    ("eurusd_1h", {"seed": 1}, "data.synthetic.seed is set, but data.name=eurusd_1h is read from a file"),
    (None, {"bars": 100}, "data.synthetic.bars is set, but the bars are read from data.path"),
])
def test_bad_synthetic_settings_name_the_key(name, synthetic, needle):
    from foxdqn.errors import ConfigError

    cfg = DataConfig(name=name, path=None if name else "bars.csv", synthetic=SyntheticConfig(**synthetic))
    with pytest.raises(ConfigError) as info:
        cfg.validate()
    assert needle in str(info.value) and "\n" not in str(info.value)
