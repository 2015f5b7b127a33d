"""Action diversity from executed-action counts: entropies per component, top actions, collapse warning."""
import logging
import math

import numpy as np
import pytest

from foxdqn.execution.orders import compose
from foxdqn.logger.diversity import CollapseMonitor, action_diversity, entropy, normalised_entropy, top_actions


def _h(p):
    p = np.asarray(p, dtype=np.float64)
    p = p[p > 0] / p.sum()
    return float(-(p * np.log(p)).sum())


def test_component_entropies_follow_the_factored_layout():
    counts = np.zeros(45)
    counts[compose(4, 1, 2)] = 3.0  # +1.0 limit_maker aggressive
    counts[compose(0, 1, 0)] = 1.0  # -1.0 limit_maker patient
    d = action_diversity(counts, factored=True)
    assert d["action_entropy"] == pytest.approx(_h([3, 1]))
    assert d["exposure_entropy"] == pytest.approx(_h([3, 1]))
    assert d["order_type_entropy"] == 0.0
    assert d["urgency_entropy"] == pytest.approx(_h([3, 1]))
    assert d["exposure_entropy_norm"] == pytest.approx(_h([3, 1]) / math.log(5))
    assert d["urgency_entropy_norm"] == pytest.approx(_h([3, 1]) / math.log(3))
    assert d["action_entropy_norm"] == pytest.approx(_h([3, 1]) / math.log(45))


def test_independent_components_add_up_and_uniform_is_one():
    px, po, pu = np.array([1, 2, 3, 4, 5.]), np.array([1, 1, 2.]), np.array([5, 1, 1.])
    counts = (px[:, None, None] * po[None, :, None] * pu[None, None, :]).reshape(-1)
    d = action_diversity(counts, factored=True)
    assert d["exposure_entropy"] == pytest.approx(_h(px))
    assert d["order_type_entropy"] == pytest.approx(_h(po))
    assert d["urgency_entropy"] == pytest.approx(_h(pu))
    assert d["action_entropy"] == pytest.approx(_h(px) + _h(po) + _h(pu))
    u = action_diversity(np.full(45, 7.0), factored=True)
    for key in ("action", "exposure", "order_type", "urgency"):
        assert u[f"{key}_entropy_norm"] == pytest.approx(1.0)


def test_non_factored_counts_have_no_components_and_empty_is_nan():
    d = action_diversity(np.array([3.0, 1.0]), factored=False)
    assert set(d) == {"action_entropy", "action_entropy_norm"}
    assert d["action_entropy_norm"] == pytest.approx(_h([3, 1]) / math.log(2))
    assert entropy(np.zeros(4)) == 0.0 and math.isnan(normalised_entropy(np.zeros(4)))
    with pytest.raises(ValueError, match="45"):
        action_diversity(np.ones(2), factored=True)


def test_top_actions_named_and_shared():
    counts = np.zeros(45)
    counts[compose(4, 0, 1)] = 6
    counts[compose(2, 2, 0)] = 3
    counts[compose(1, 1, 2)] = 1
    top = top_actions(counts, 2, factored=True)
    assert top == [("+1.0 market normal", 0.6), ("+0.0 ioc patient", 0.3)]
    assert top_actions(np.array([0.0, 2.0, 0.0]), 3, factored=False) == [("1", 1.0)]


def test_collapse_warns_after_patience_once_per_episode(caplog):
    mon = CollapseMonitor(min_entropy=0.5, patience=3)
    with caplog.at_level(logging.WARNING, logger="foxdqn.logger.diversity"):
        fired = [mon.update(h, step) for step, h in enumerate([0.2, 0.1, 0.9, 0.3, 0.4, float("nan"), 0.1, 0.2, 0.1])]
    # low, low, reset, low, low, (nan: ignored), low -> 3rd low in a row warns; further lows do not
    assert fired == [False, False, False, False, False, False, True, False, False]
    assert mon.warnings == 1 and mon.collapsed
    assert sum("action collapse" in r.message for r in caplog.records) == 1
    assert [mon.update(h, 0) for h in (0.6, 0.1, 0.1, 0.1)] == [False, False, False, True]  # new episode
    assert mon.warnings == 2


def test_collapse_monitor_off_at_zero_threshold():
    mon = CollapseMonitor(min_entropy=0.0, patience=1)
    assert not any(mon.update(0.0, i) for i in range(5)) and mon.warnings == 0
