"""The synthetic bar generators (foxdqn.data.synthetic): the martingale and the markets with a known answer."""
import numpy as np
import pandas as pd
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


# ------------------------------------------------------------------ markets with a known answer

from foxdqn.data.synthetic import make_ar1_ohlcv, make_regime_ohlcv, make_trend_ohlcv  # noqa: E402

GENERATORS = {
    "ar1": lambda n, **kw: make_ar1_ohlcv(n, phi=-0.3, **kw),
    "regime": lambda n, **kw: make_regime_ohlcv(n, phi=0.6, regime_length=3, **kw),
    "trend": lambda n, **kw: make_trend_ohlcv(n, drift=1e-3, regime_length=5, **kw),
}


def log_returns(market) -> np.ndarray:
    bars = market.bars
    return np.log(bars["close"].to_numpy() / bars["open"].to_numpy())


def slope(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of y on x (with an intercept)."""
    return float(np.cov(x, y)[0, 1] / np.var(x, ddof=1))


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_bars_cut_from_one_path_and_same_seed_same_market(kind):
    m = GENERATORS[kind](500, vol_per_bar=2e-3, substeps=16, seed=3)
    df = m.bars
    assert list(df.columns) == ["timestamp", "open", "high", "low", "close", "volume"] and len(df) == 500
    assert df["open"].iloc[0] == 1.1 and df["timestamp"].iloc[1] - df["timestamp"].iloc[0] == pd.Timedelta("1h")
    assert (df["open"].to_numpy()[1:] == df["close"].to_numpy()[:-1]).all()
    assert (df["high"] >= df[["open", "close"]].max(axis=1)).all()
    assert (df["low"] <= df[["open", "close"]].min(axis=1)).all()
    assert (df["high"] > df[["open", "close"]].max(axis=1)).mean() > 0.5  # the wicks come from the path
    for a in (m.expected_return, m.expected_future_return):
        assert a.shape == (500,) and a.dtype == np.float64 and np.isfinite(a).all()
    assert m.regime.shape == (500,) and m.regime.dtype == np.int8 and set(np.unique(m.regime)) <= {-1, 1}
    again = GENERATORS[kind](500, vol_per_bar=2e-3, substeps=16, seed=3)
    pd.testing.assert_frame_equal(again.bars, df)
    assert (again.expected_future_return == m.expected_future_return).all() and (again.regime == m.regime).all()
    other = GENERATORS[kind](500, vol_per_bar=2e-3, substeps=16, seed=4)
    assert not np.allclose(other.bars["close"], df["close"])


@pytest.mark.parametrize("phi", [-0.3, 0.2])
def test_ar1_returns_have_lag1_autocorrelation_phi_and_the_stationary_vol(phi):
    m = make_ar1_ohlcv(200_000, phi=phi, vol_per_bar=2e-3, substeps=4, seed=1)
    r = log_returns(m)
    assert np.corrcoef(r[:-1], r[1:])[0, 1] == pytest.approx(phi, abs=0.01)  # SE 1/sqrt(n) = 0.002
    assert r.std() == pytest.approx(2e-3, rel=0.02)
    assert (m.regime == 1).all()
    assert np.allclose(m.expected_return, phi * (r + 0.5 * (2e-3) ** 2 * (1 - phi ** 2)))  # phi * x_t


def test_ar1_with_phi_0_is_a_martingale():
    # E[close/open] = 1: the -s^2/2 term; a geometric walk would give exp(vol^2/2) = 1.00125 at 5 % per bar
    gross = np.exp(log_returns(make_ar1_ohlcv(200_000, phi=0.0, vol_per_bar=0.05, substeps=4, seed=4)))
    se = gross.std() / np.sqrt(gross.size)
    assert abs(gross.mean() - 1.0) < 3 * se and 1.00125 - 1.0 > 8 * se


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_expected_returns_are_the_conditional_means(kind):
    """Regressed on m_t, the next bar's log return has slope 1; regressed on G_t, the sum of the
    next 12 bars' log returns has slope 1 (these processes forget in a few bars), in each regime
    of the regime market (there G_t / m_t is 1.82 in one regime, 0.45 in the other)."""
    m = GENERATORS[kind](200_000, vol_per_bar=2e-3, substeps=2, seed=2)
    r = log_returns(m)
    assert slope(m.expected_return[:-1], r[1:]) == pytest.approx(1.0, abs=0.05)  # SE 0.005 .. 0.012
    ahead = np.convolve(r, np.ones(12), mode="valid")[1:]  # ahead[t] = r[t+1] + ... + r[t+12]
    future, regime = m.expected_future_return[:ahead.size], m.regime[:ahead.size]
    if kind == "regime":
        for sign in (1, -1):
            assert slope(future[regime == sign], ahead[regime == sign]) == pytest.approx(1.0, abs=0.25)  # SE 0.06
    else:
        assert slope(future, ahead) == pytest.approx(1.0, abs=0.08)  # SE 0.015 (ar1), 0.02 (trend)


def test_regimes_persist_and_set_the_sign_of_the_autocorrelation():
    m = make_regime_ohlcv(200_000, phi=0.25, regime_length=50, vol_per_bar=2e-3, substeps=2, seed=5)
    starts = np.flatnonzero(np.diff(m.regime)) + 1
    lengths = np.diff(np.concatenate([[0], starts, [m.regime.size]]))
    assert lengths.mean() == pytest.approx(50, rel=0.05)  # ~4,000 regimes of geometric length
    r = log_returns(m)
    for sign in (1, -1):
        same = (m.regime[1:] == sign) & (m.regime[:-1] == sign)
        assert np.corrcoef(r[:-1][same], r[1:][same])[0, 1] == pytest.approx(sign * 0.25, abs=0.015)
    assert (m.regime == 1).mean() == pytest.approx(0.5, abs=0.05)


def test_trend_drift_has_the_segment_sign():
    m = make_trend_ohlcv(100_000, drift=3e-4, regime_length=400, vol_per_bar=2e-3, substeps=2, seed=6)
    r = log_returns(m)
    for sign in (1, -1):
        inside = r[m.regime == sign]
        assert inside.mean() == pytest.approx(sign * 3e-4 - 0.5 * (2e-3) ** 2, abs=3 * 2e-3 / np.sqrt(inside.size))
    assert np.sign(m.expected_return).tolist() == m.regime.tolist()


@pytest.mark.parametrize("call, needle", [
    (lambda: make_ar1_ohlcv(10, phi=1.0), "phi"),
    (lambda: make_ar1_ohlcv(0), "n >= 1"),
    (lambda: make_regime_ohlcv(10, phi=-1.2), "phi"),
    (lambda: make_regime_ohlcv(10, regime_length=0.5), "regime_length"),
    (lambda: make_trend_ohlcv(10, drift=-1e-4), "drift"),
    (lambda: make_trend_ohlcv(10, vol_per_bar=float("nan")), "vol_per_bar"),
    (lambda: make_trend_ohlcv(10, regime_length=float("inf")), "regime_length"),
])
def test_bad_arguments_name_the_function_and_argument(call, needle):
    with pytest.raises(ValueError, match=needle):
        call()
