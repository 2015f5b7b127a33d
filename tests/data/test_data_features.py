"""Features: definitions, causality, training-split normalisation, warm-up handling."""
import numpy as np
import pandas as pd
import pytest

from foxdqn.data import DataConfig, SplitConfig, market_data_from_frame
from foxdqn.data.synthetic import make_synthetic_ohlcv

VOL_WINDOW, VOLUME_WINDOW = 8, 6


def build(frame, clip=10.0, split=None, window=5, episode_length=5):
    cfg = DataConfig(vol_window=VOL_WINDOW, volume_window=VOLUME_WINDOW, spread_window=4, clip=clip,
                     split=split or SplitConfig())
    return market_data_from_frame(frame, cfg, window=window, episode_length=episode_length)


def column(data, name):
    return data.features[:, data.feature_names.index(name)]


def test_feature_order_shapes_and_dtypes():
    frame = make_synthetic_ohlcv(200, 0.0, 0.01, seed=3)
    data = build(frame)
    assert data.feature_names == ["log_return", "range", "close_loc", "volatility", "volume_z"]
    assert data.features.shape == (200, 5) and data.features.dtype == np.float32
    assert data.spread.dtype == np.float64 and data.volatility.dtype == np.float64


def test_raw_definitions_on_a_hand_built_frame():
    """With train stats known, undo the normalisation and compare with the formulas."""
    frame = pd.DataFrame({
        "timestamp": pd.date_range("2021-01-04", periods=40, freq="1h"),
        "open": 100.0, "high": 102.0, "low": 98.0, "close": 101.0, "volume": 10.0,
    })
    frame.loc[10, ["open", "high", "low", "close"]] = [101.0, 101.0, 101.0, 101.0]  # high == low
    frame.loc[11, ["open", "high", "low", "close"]] = [101.0, 104.0, 100.0, 100.0]  # close at the low
    data = build(frame, clip=1e9)
    from foxdqn.data.features import raw_features
    raw, names = raw_features(data.open, data.high, data.low, data.close, data.volume, data.splits["train"],
                              VOL_WINDOW, VOLUME_WINDOW)
    cl = raw[:, names.index("close_loc")]
    assert cl[0] == pytest.approx(2 * (101 - 98) / 4 - 1) and cl[10] == 0.0 and cl[11] == -1.0
    rng = raw[:, names.index("range")]
    assert rng[0] == pytest.approx(np.log(102 / 98)) and rng[10] == 0.0
    ret = raw[:, names.index("log_return")]
    assert np.isnan(ret[0]) and ret[11] == pytest.approx(np.log(100 / 101)) and ret[12] == pytest.approx(np.log(101 / 100))
    assert "volume_z" not in names  # constant volume


def test_volatility_and_volume_z_match_their_definitions():
    frame = make_synthetic_ohlcv(120, 0.0, 0.02, seed=5)
    data = build(frame, clip=1e9)
    returns = np.log(frame.close.to_numpy()[1:] / frame.close.to_numpy()[:-1])
    t = 50
    expected_vol = np.std(returns[t - VOL_WINDOW:t], ddof=1)  # returns of rows t-7 .. t
    assert data.volatility[t] == pytest.approx(expected_vol, rel=1e-10)
    v = frame.volume.to_numpy()[t - VOLUME_WINDOW + 1:t + 1]
    expected_z = (v[-1] - v.mean()) / v.std(ddof=1)
    start, end = data.splits["train"]
    from foxdqn.data.features import volume_zscore
    z = volume_zscore(frame.volume.to_numpy(), VOLUME_WINDOW)
    assert z[t] == pytest.approx(expected_z, rel=1e-10)
    defined = z[start:end][~np.isnan(z[start:end])]
    assert column(data, "volume_z")[t] == pytest.approx((expected_z - defined.mean()) / defined.std(), rel=1e-5)
    # The raw volatility is 0 before two returns exist, then a partial-window estimate.
    assert data.volatility[0] == 0.0 and data.volatility[1] == 0.0
    assert data.volatility[3] == pytest.approx(np.std(returns[:3], ddof=1), rel=1e-10)


def test_warmup_rows_are_zero_after_normalisation():
    data = build(make_synthetic_ohlcv(200, 0.0, 0.01, seed=2))
    assert column(data, "log_return")[0] == 0.0
    np.testing.assert_array_equal(column(data, "volatility")[:VOL_WINDOW], 0.0)
    assert column(data, "volatility")[VOL_WINDOW] != 0.0
    np.testing.assert_array_equal(column(data, "volume_z")[:VOLUME_WINDOW - 1], 0.0)
    assert column(data, "volume_z")[VOLUME_WINDOW - 1] != 0.0


def test_normalisation_uses_training_rows_only():
    # Test split 3x as volatile as the training split: its features must not be re-standardised.
    frame = make_synthetic_ohlcv(3000, 0.0, 0.01, seed=7)
    calm = make_synthetic_ohlcv(3000, 0.0, 0.03, seed=8)
    tail = 2550  # test split starts at round(0.85 * 3000) = 2550
    steps = np.log(calm.close.to_numpy()[tail:] / calm.close.to_numpy()[tail - 1:-1])
    close = frame.close.to_numpy().copy()
    close[tail:] = close[tail - 1] * np.exp(np.cumsum(steps))
    frame = frame.assign(close=close, open=np.r_[100.0, close[:-1]])
    frame = frame.assign(high=np.maximum(frame.open, frame.close) * 1.001, low=np.minimum(frame.open, frame.close) * 0.999)
    data = build(frame, clip=1e9)

    start, end = data.splits["train"]
    warm = max(VOL_WINDOW, VOLUME_WINDOW)
    train = data.features[warm:end]
    np.testing.assert_allclose(train.mean(axis=0), 0.0, atol=0.02)
    np.testing.assert_allclose(train.std(axis=0), 1.0, atol=0.02)
    test_start, test_end = data.splits["test"]
    test_returns = column(data, "log_return")[test_start:test_end]
    assert 2.5 < test_returns.std() < 3.5


def test_clip_bounds_normalised_features():
    frame = make_synthetic_ohlcv(300, 0.0, 0.01, seed=4)
    frame.loc[250, "close"] = frame.loc[250, "high"] = frame.loc[249, "close"] * 1.5  # a huge jump in test
    data = build(frame, clip=3.0)
    assert np.abs(data.features).max() == pytest.approx(3.0)
    assert column(data, "log_return")[250] == pytest.approx(3.0)


@pytest.mark.parametrize("cut", [2560, 2700, 2998])
def test_features_are_causal(cut):
    """Changing bars after ``cut`` (all inside the test split) leaves rows <= cut untouched."""
    frame = make_synthetic_ohlcv(3000, 0.0, 0.01, seed=11)
    altered = frame.copy()
    rows = altered.index > cut
    for key in ("open", "high", "low", "close"):
        altered.loc[rows, key] *= 1.37
    altered.loc[rows, "high"] *= 1.05
    altered.loc[rows, "volume"] *= 9.0
    before, after = build(frame), build(altered)
    assert before.splits == after.splits and cut >= before.splits["test"][0]
    keep = slice(0, cut + 1)
    np.testing.assert_array_equal(before.features[keep], after.features[keep])
    np.testing.assert_array_equal(before.spread[keep], after.spread[keep])
    np.testing.assert_array_equal(before.volatility[keep], after.volatility[keep])
    assert before.median_spread == after.median_spread and before.median_volatility == after.median_volatility
    # ... while the altered rows do change (the comparison above is not vacuous).
    assert not np.array_equal(before.features[cut + 1], after.features[cut + 1])
    assert not np.array_equal(before.spread[cut + 1:], after.spread[cut + 1:])
    assert not np.array_equal(before.volatility[cut + 1:], after.volatility[cut + 1:])
