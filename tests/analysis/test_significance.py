"""Probabilistic Sharpe ratio and the block-bootstrap Sharpe interval (foxdqn.analysis.significance)."""
import math

import numpy as np
import pytest

from foxdqn.analysis.metrics import sharpe_ratio
from foxdqn.analysis.significance import (default_block, per_bar_sharpe, probabilistic_sharpe_ratio,
                                 sharpe_confidence_interval)


def _phi(z):
    return 0.5 * math.erfc(-z / math.sqrt(2))


def test_psr_matches_the_formula_written_out():
    rng = np.random.default_rng(0)
    r = rng.standard_t(5, 500) * 1e-3 + 2e-4
    c = r - r.mean()
    m2 = np.mean(c ** 2)
    skew, kurt = np.mean(c ** 3) / m2 ** 1.5, np.mean(c ** 4) / m2 ** 2
    sr = r.mean() / r.std(ddof=1)
    for bench in (0.0, 0.05, -0.02):
        z = (sr - bench) * math.sqrt(499) / math.sqrt(1 - skew * sr + (kurt - 1) / 4 * sr ** 2)
        assert probabilistic_sharpe_ratio(r, bench) == pytest.approx(_phi(z), rel=1e-12)


def test_psr_is_calibrated_on_a_series_with_no_edge():
    # on zero-mean normal returns PSR(0) is uniform: about 5 % of samples exceed 0.95
    rng = np.random.default_rng(1)
    psr = np.array([probabilistic_sharpe_ratio(rng.normal(0, 1e-3, 300)) for _ in range(2000)])
    assert 0.03 < np.mean(psr > 0.95) < 0.07
    assert 0.45 < np.mean(psr) < 0.55


def test_psr_rises_with_the_edge_and_the_sample():
    rng = np.random.default_rng(2)
    z = rng.normal(0, 1, 4000)
    assert probabilistic_sharpe_ratio(1e-3 * (z[:200] + 0.1)) < probabilistic_sharpe_ratio(1e-3 * (z + 0.1))
    assert probabilistic_sharpe_ratio(1e-3 * (z + 0.3)) > 0.999
    assert probabilistic_sharpe_ratio(1e-3 * (z - 0.3)) < 0.001


def test_flat_and_short_series_are_undefined():
    assert math.isnan(probabilistic_sharpe_ratio(np.zeros(100)))
    assert math.isnan(probabilistic_sharpe_ratio(np.array([0.01, 0.02])))
    assert math.isnan(per_bar_sharpe(np.zeros(10)))
    assert sharpe_confidence_interval(np.zeros(100), 252) == (0.0, 0.0)
    with pytest.raises(ValueError, match="returns"):
        probabilistic_sharpe_ratio(np.array([0.1, np.nan, 0.2]))
    with pytest.raises(ValueError, match="benchmark"):
        probabilistic_sharpe_ratio(np.ones(5), float("inf"))


def test_interval_contains_the_estimate_and_covers_the_truth():
    rng = np.random.default_rng(3)
    covered, n = 0, 200
    for i in range(n):
        r = rng.normal(5e-4, 1e-2, 400)
        low, high = sharpe_confidence_interval(r, 252, resamples=300, seed=i)
        assert low < sharpe_ratio(r, 252) < high
        covered += low <= 5e-4 / 1e-2 * math.sqrt(252) <= high
    assert 0.88 <= covered / n <= 0.99  # nominal 95 %


def test_interval_is_deterministic_and_widens_with_serial_dependence():
    rng = np.random.default_rng(4)
    iid = rng.normal(0, 1e-2, 600)
    assert sharpe_confidence_interval(iid, 252, seed=7) == sharpe_confidence_interval(iid, 252, seed=7)
    # an AR(1) series with the same marginal spread: blocks keep the dependence, so the interval is wider
    ar = np.zeros(600)
    for t in range(1, 600):
        ar[t] = 0.8 * ar[t - 1] + rng.normal(0, 1e-2)
    w_iid = np.diff(sharpe_confidence_interval(iid, 252, block=1))[0]
    w_ar = np.diff(sharpe_confidence_interval(ar, 252, block=20))[0]
    assert w_ar > 1.5 * w_iid


def test_bad_arguments():
    r = np.random.default_rng(5).normal(0, 1, 50)
    for kwargs, needle in (({"level": 1.0}, "level"), ({"block": 0}, "block"), ({"resamples": 5}, "resamples")):
        with pytest.raises(ValueError, match=needle):
            sharpe_confidence_interval(r, 252, **kwargs)
    assert default_block(1) == 1 and default_block(1000) == 10 and default_block(933) == 10
