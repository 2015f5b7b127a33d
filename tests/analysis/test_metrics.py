"""foxdqn.analysis.metrics on hand-computed series.

Every expected number is derived by hand in the comments and written out explicitly; the module
under test is never used to compute an expectation.
"""
import math

import numpy as np
import pytest

from foxdqn.analysis import metrics as M

BPY = 252.0

# Reference curve: equity [1, 1.1, 0.99, 1.2]
#   returns r = [1.1/1 - 1, 0.99/1.1 - 1, 1.2/0.99 - 1] = [0.1, -0.1, 21/99 = 0.212121...]
#   pnl       = [0.1, -0.11, 0.21]
EQ = np.array([1.0, 1.1, 0.99, 1.2])
R = [0.1, -0.1, 21 / 99]


def test_simple_returns_by_hand():
    np.testing.assert_allclose(M.simple_returns(EQ), R, rtol=0, atol=1e-15)


def test_sharpe_by_hand():
    # mean = (0.1 - 0.1 + 21/99) / 3 = 7/99
    mean = 7 / 99
    # deviations from the mean, in units of 1/99: 9.9-7 = 2.9, -9.9-7 = -16.9, 21-7 = 14
    # sample variance (ddof=1) = (2.9^2 + 16.9^2 + 14^2) / 99^2 / 2 = 245.01 / 9801
    std = math.sqrt(245.01) / 99
    expected = mean / std * math.sqrt(252)  # = 7 * sqrt(252 / 245.01)
    assert expected == pytest.approx(7.099150860568, rel=1e-12)
    assert M.sharpe_ratio(R, BPY) == pytest.approx(expected, rel=1e-12)


def test_sortino_by_hand():
    # downside deviation = sqrt(mean(min(r, 0)^2)) = sqrt((0 + 0.01 + 0) / 3) = sqrt(1/300)
    dd = math.sqrt(1 / 300)
    expected = (7 / 99) * math.sqrt(252) / dd  # = (7/99) * sqrt(75600)
    assert expected == pytest.approx(19.441230221025, rel=1e-12)
    assert M.sortino_ratio(R, BPY) == pytest.approx(expected, rel=1e-12)


def test_sortino_special_cases():
    assert M.sortino_ratio([0.01, 0.02, 0.0], BPY) == math.inf  # gains, no downside
    assert M.sortino_ratio([0.0, 0.0, 0.0], BPY) == 0.0  # flat
    assert M.sortino_ratio([], BPY) == 0.0
    # all losses: mean = -0.02, downside = sqrt((0.01^2 + 0.03^2)/2) = sqrt(0.0005)
    expected = -0.02 * math.sqrt(252) / math.sqrt(0.0005)
    assert M.sortino_ratio([-0.01, -0.03], BPY) == pytest.approx(expected, rel=1e-12)
    assert expected < 0


def test_max_drawdown_by_hand():
    # peaks 1, 2, 2, 3, 3 -> drawdowns 0, 0, 0.5, 0, 0.5
    assert M.max_drawdown([1, 2, 1, 3, 1.5]) == pytest.approx(0.5, abs=1e-15)
    # EQ: peak 1.1 then 0.99 -> 1 - 0.99/1.1 = 0.1
    assert M.max_drawdown(EQ) == pytest.approx(0.1, abs=1e-15)
    # a later, deeper fall from a later peak: peaks 1,4,4,5,5 -> 1 - 1/4 = 0.75, 1 - 2/5 = 0.6
    assert M.max_drawdown([1, 4, 1, 5, 2]) == pytest.approx(0.75, abs=1e-15)
    assert M.max_drawdown([1, 2, 3]) == 0.0
    assert M.max_drawdown([5.0]) == 0.0


def test_profit_factor_by_hand():
    # gains 0.1 + 0.21 = 0.31, losses 0.11 -> 2.8181...
    assert M.profit_factor([0.1, -0.11, 0.21]) == pytest.approx(0.31 / 0.11, rel=1e-12)
    assert M.profit_factor([0.1, -0.11, 0.21]) == pytest.approx(2.818181818181818, rel=1e-12)
    assert M.profit_factor([0.1, 0.0, 0.2]) == math.inf  # no losses
    assert M.profit_factor([-0.1, 0.0]) == 0.0  # no gains
    assert M.profit_factor([0.0, 0.0]) == 0.0


def test_hit_rate_counts_only_bars_with_exposure():
    pnl = [0.1, -0.11, 0.21, 0.05]
    exposure = [1.0, -1.0, 0.0, 0.5]
    # held bars 0, 1, 3 -> positive pnl on 0 and 3 -> 2/3 (bar 2 ignored although positive)
    assert M.hit_rate(pnl, exposure) == pytest.approx(2 / 3, rel=1e-15)
    assert M.hit_rate(pnl, [0.0] * 4) == 0.0


def test_turnover_and_trades_by_hand():
    # exposure [0.5, 0.5, -1] with an implicit 0 before: |0.5-0| + |0.5-0.5| + |-1-0.5| = 2.0
    # annualised: 2.0 * 252 / 3 bars = 168
    assert M.turnover([0.5, 0.5, -1.0], BPY) == pytest.approx(168.0, rel=1e-15)
    # changes 0->0.5 and 0.5->-1 -> 2 trades
    assert M.count_trades([0.5, 0.5, -1.0]) == 2
    # [0, 1, 1, 0, -1]: 0->0 no, 0->1, 1->1 no, 1->0, 0->-1 -> 3 trades, turnover 1+1+1 = 3
    assert M.count_trades([0, 1, 1, 0, -1]) == 3
    assert M.turnover([0, 1, 1, 0, -1], 5) == pytest.approx(3.0, rel=1e-15)
    assert M.count_trades([0.0, 0.0]) == 0


def test_performance_summary_by_hand():
    exposure = np.array([0.5, 0.5, -1.0])
    s = M.performance_summary(EQ, exposure, BPY)
    assert set(s) == {
        "total_return", "annualised_return", "sharpe", "sortino", "max_drawdown",
        "profit_factor", "hit_rate", "turnover", "num_trades", "bars",
    }
    assert all(type(v) is float for v in s.values())
    assert s["total_return"] == pytest.approx(0.2, rel=1e-12)
    # (1.2)^(252/3) - 1 = 1.2^84 - 1
    assert s["annualised_return"] == pytest.approx(1.2**84 - 1, rel=1e-10)
    assert s["annualised_return"] == pytest.approx(4479448.7388, rel=1e-9)
    assert s["sharpe"] == pytest.approx(7 * math.sqrt(252 / 245.01), rel=1e-12)
    assert s["sortino"] == pytest.approx((7 / 99) * math.sqrt(75600), rel=1e-12)
    assert s["max_drawdown"] == pytest.approx(0.1, abs=1e-15)
    assert s["profit_factor"] == pytest.approx(0.31 / 0.11, rel=1e-12)
    # all bars held; pnl > 0 on bars 0 and 2 -> 2/3
    assert s["hit_rate"] == pytest.approx(2 / 3, rel=1e-15)
    assert s["turnover"] == pytest.approx(168.0, rel=1e-15)
    assert s["num_trades"] == 2.0
    assert s["bars"] == 3.0
    # `trades` given by the environment wins over counting
    assert M.performance_summary(EQ, exposure, BPY, trades=7)["num_trades"] == 7.0


def test_annualised_return_small_and_overflow():
    # one year of 252 bars doubling -> exactly 100 %
    eq = np.concatenate([[1.0], np.full(251, 1.0), [2.0]])
    assert M.annualised_return(eq, 252) == pytest.approx(1.0, rel=1e-12)
    # 2x in 2 bars of minute data: 2^(525600/2) overflows float64 -> inf, no exception
    assert M.annualised_return([1.0, 1.5, 2.0], 525600) == math.inf
    # halving in 1 bar at 252 bars/yr -> 0.5^252 - 1 = -1 + 1.4e-76: never below -1
    v = M.annualised_return([1.0, 0.5], 252)
    assert -1.0 <= v < -0.999999


def test_flat_equity_edge_cases():
    s = M.performance_summary(np.ones(5), np.zeros(4), BPY)
    assert s["total_return"] == 0.0
    assert s["annualised_return"] == 0.0
    assert s["sharpe"] == 0.0
    assert s["sortino"] == 0.0
    assert s["max_drawdown"] == 0.0
    assert s["profit_factor"] == 0.0
    assert s["hit_rate"] == 0.0
    assert s["turnover"] == 0.0
    assert s["num_trades"] == 0.0


def test_no_losses_edge_cases():
    s = M.performance_summary([1.0, 1.1, 1.1, 1.3], [1.0, 1.0, 1.0], BPY)
    assert s["profit_factor"] == math.inf
    assert s["sortino"] == math.inf
    assert s["max_drawdown"] == 0.0
    assert s["hit_rate"] == pytest.approx(2 / 3)  # bar 1 has pnl 0: not a hit


def test_sharpe_zero_for_constant_growth_and_short_series():
    # constant 1 % growth: returns equal up to float rounding -> std treated as 0 -> Sharpe 0
    eq = 1.01 ** np.arange(50)
    assert M.sharpe_ratio(M.simple_returns(eq), BPY) == 0.0
    assert M.sharpe_ratio([0.05], BPY) == 0.0  # fewer than 2 returns
    assert M.sharpe_ratio([], BPY) == 0.0


@pytest.mark.parametrize(
    "equity, exposure, bpy, match",
    [
        ([1.0, 1.1, 1.2], [1.0], 252, "exposure must have len"),
        ([1.0], [], 252, "at least 2"),
        ([1.0, float("nan"), 1.2], [1.0, 1.0], 252, "non-finite.*index 1"),
        ([1.0, 1.1, 1.2], [1.0, float("inf")], 252, "exposure has a non-finite"),
        ([1.0, 0.0, 1.2], [1.0, 1.0], 252, r"must be > 0.*index 1"),
        ([[1.0, 1.1]], [1.0], 252, "1-D"),
        ([1.0, 1.1], [1.0], 0, "bars_per_year"),
        ([1.0, 1.1], [1.0], float("inf"), "bars_per_year"),
    ],
)
def test_bad_input_raises(equity, exposure, bpy, match):
    with pytest.raises(ValueError, match=match):
        M.performance_summary(equity, exposure, bpy)


def test_bad_trades_and_lengths_raise():
    with pytest.raises(ValueError, match="trades"):
        M.performance_summary([1.0, 1.1], [1.0], 252, trades=-1)
    with pytest.raises(ValueError, match="must match"):
        M.hit_rate([0.1, 0.2], [1.0])
    with pytest.raises(ValueError, match="non-finite"):
        M.sharpe_ratio([0.1, float("nan")], 252)
    with pytest.raises(ValueError, match="must be > 0"):
        M.max_drawdown([1.0, -1.0])
