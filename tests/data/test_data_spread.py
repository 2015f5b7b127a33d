"""Corwin & Schultz (2012) two-bar spread estimate, on hand-computed examples."""
import math

import numpy as np
import pytest

from foxdqn.data import DataConfig, market_data_from_frame
from foxdqn.data.spread import corwin_schultz, estimate_spread
from foxdqn.data.synthetic import make_synthetic_ohlcv


def two_bars(h1, l1, c1, h2, l2, c2):
    high, low, close = (np.array(v, dtype=np.float64) for v in ((h1, h2), (l1, l2), (c1, c2)))
    return corwin_schultz(high, low, close)


def test_identical_bars_give_the_whole_range_as_spread():
    # H=101, L=99 twice: beta = 2 r^2, gamma = r^2 with r = ln(101/99), so
    # alpha = r (2 - sqrt2)/(3 - 2 sqrt2) - r / sqrt(3 - 2 sqrt2) = r (3.41421 - 2.41421) = r, and
    # S = 2 (e^r - 1) / (1 + e^r) = 2 (101/99 - 1) / (1 + 101/99) = 2 * 2 / 200 = 0.02.
    spread = two_bars(101, 99, 100, 101, 99, 100)
    assert spread[0] == 0.0
    assert spread[1] == pytest.approx(0.02, rel=1e-12)


def test_hand_computed_general_pair():
    # Bar 1: H=102, L=100, C=101; bar 2: H=102.5, L=100.5 (no gap: L2 <= C1 <= H2).
    # beta  = ln(1.02)^2 + ln(102.5/100.5)^2 = 0.00039214 + 0.00038829 = 0.00078043
    # gamma = ln(102.5/100)^2                = 0.00060973
    # alpha = (sqrt(2 beta) - sqrt(beta)) / (3 - 2 sqrt2) - sqrt(gamma / (3 - 2 sqrt2))
    #       = (0.0395078 - 0.0279362) / 0.1715729 - 0.0596132 = 0.0674440 - 0.0596132 = 0.0078308
    # S     = 2 (e^alpha - 1) / (1 + e^alpha) = 0.0078308
    spread = two_bars(102, 100, 101, 102.5, 100.5, 101)
    assert spread[1] == pytest.approx(0.0078308, abs=1e-7)


def test_negative_estimate_is_set_to_zero():
    # Bar 2 moves well beyond bar 1's range: gamma dominates, alpha < 0 -> 0.
    beta = math.log(1.02) ** 2 + math.log(103 / 101) ** 2
    gamma = math.log(1.03) ** 2
    k = 3 - 2 * math.sqrt(2)
    assert (math.sqrt(2 * beta) - math.sqrt(beta)) / k - math.sqrt(gamma / k) < 0
    assert two_bars(102, 100, 101.5, 103, 101, 102)[1] == 0.0


@pytest.mark.parametrize("bar2", [
    (105, 103, 104),   # gapped up: low 103 > previous close 99 -> shifted down by 4 to (101, 99)
    (98, 96, 97),      # gapped down: high 98 < previous close 101 -> shifted up by 3 to (101, 99)
])
def test_overnight_gap_is_removed_before_estimating(bar2):
    close1 = 99 if bar2[1] > 100 else 101
    spread = two_bars(101, 99, close1, *bar2)
    assert spread[1] == pytest.approx(0.02, rel=1e-12)  # same as two identical (101, 99) bars


def test_smoothing_is_a_causal_rolling_mean():
    high = np.array([101, 101, 101, 103.0, 101])
    low = np.array([99, 99, 99, 101.0, 99])
    close = np.array([100, 100, 100, 102.0, 100])
    two_bar = corwin_schultz(high, low, close)
    smoothed = estimate_spread(high, low, close, window=2)
    assert two_bar[0] == 0.0 and two_bar[1] == pytest.approx(0.02)
    np.testing.assert_allclose(smoothed, [0.0, two_bar[1] / 2, (two_bar[1] + two_bar[2]) / 2,
                                          (two_bar[2] + two_bar[3]) / 2, (two_bar[3] + two_bar[4]) / 2])


def test_market_data_spread_is_the_smoothed_estimate():
    frame = make_synthetic_ohlcv(300, 0.0, 0.01, seed=9)
    data = market_data_from_frame(frame, DataConfig(spread_window=7), window=5, episode_length=5)
    expected = estimate_spread(frame.high.to_numpy(), frame.low.to_numpy(), frame.close.to_numpy(), 7)
    np.testing.assert_allclose(data.spread, expected, rtol=0, atol=1e-15)
    assert (data.spread >= 0).all() and data.spread[0] == 0.0
    start, end = data.splits["train"]
    assert data.median_spread == np.median(data.spread[start:end]) > 0
