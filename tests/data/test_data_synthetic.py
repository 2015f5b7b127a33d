"""The martingale bar generator (foxdqn.data.synthetic.make_martingale_ohlcv)."""
import numpy as np
import pytest

from foxdqn.data.synthetic import make_martingale_ohlcv


def test_bars_are_cut_from_one_path():
    df = make_martingale_ohlcv(500, vol_per_bar=2e-3, substeps=16, seed=3)
    assert list(df.columns) == ["timestamp", "open", "high", "low", "close", "volume"] and len(df) == 500
    assert df["open"].iloc[0] == 1.1
    assert (df["open"].to_numpy()[1:] == df["close"].to_numpy()[:-1]).all()
    assert (df["high"] >= df[["open", "close"]].max(axis=1)).all()
    assert (df["low"] <= df[["open", "close"]].min(axis=1)).all()
    r = np.log(df["close"] / df["open"])
    assert r.std() == pytest.approx(2e-3, rel=0.1)


def test_the_price_is_a_martingale_not_a_geometric_walk_with_drift():
    # E[close/open] = 1 exactly; a plain geometric walk would give exp(vol^2/2) = 1.00125 at 5 % per bar
    df = make_martingale_ohlcv(200_000, vol_per_bar=0.05, substeps=4, seed=4)
    gross = (df["close"] / df["open"]).to_numpy()
    se = gross.std() / np.sqrt(gross.size)
    assert abs(gross.mean() - 1.0) < 3 * se and 1.00125 - 1.0 > 8 * se


def test_one_substep_bars_and_bad_arguments():
    df = make_martingale_ohlcv(10, substeps=1)
    assert np.allclose(df["high"], df[["open", "close"]].max(axis=1))
    for kwargs in ({"n": 0}, {"n": 5, "substeps": 0}, {"n": 5, "vol_per_bar": -1.0}, {"n": 5, "price0": 0.0}):
        with pytest.raises(ValueError, match="make_martingale_ohlcv"):
            make_martingale_ohlcv(**kwargs)
