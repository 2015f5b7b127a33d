"""The deployment gate (eval.gate, foxdqn.analysis.gate) in a population: each member's choice and
evaluation equal its population of one's, and the ensemble is gated too."""
from __future__ import annotations

import math

from test_population import TRADING, configs, market_for, run

from foxdqn.analysis.backtest import POLICIES
from foxdqn.population.ensemble import ensemble_walks
from foxdqn.population.evaluate import member_gated_walks

GATED = [*TRADING, "eval.gate.enabled=true", "eval.gate.margins=[0.5,3]"]
MEMBERS = [["seed=5"], ["seed=6", "loss.reward_scale=10"], ["seed=7"]]


def same(a, b):
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def test_gated_members_equal_runs_of_one_member():
    together = run(configs(GATED, MEMBERS))
    market = market_for(together.cfg)
    results, gates = member_gated_walks(together, market, "test", POLICIES)
    assert len(results) == len(gates) == 3
    for p, extra in enumerate(MEMBERS):
        [alone], [gate] = member_gated_walks(run(configs(GATED, [extra])), market, "test", POLICIES)
        assert gates[p]["chosen"] == gate["chosen"]
        assert [c["switch_margin"] for c in gates[p]["candidates"]] == [None, 3.0, 0.5, 0.0]
        for mine, its in zip(gates[p]["candidates"], gate["candidates"]):
            assert mine["val"] == its["val"] and mine["test"] == its["test"]
            assert same(mine["psr_best_over"], its["psr_best_over"])
        for k, v in alone["metrics"]["agent"].items():
            assert same(results[p]["metrics"]["agent"][k], v), k
        assert list(results[p]["curves"]) == ["agent", "buy_and_hold", "flat"]  # POLICIES, no oracle on these bars


def test_the_ensemble_is_gated_too():
    s = run(configs(GATED, [MEMBERS[0], MEMBERS[2]]))  # one setting: seeds only
    entry = ensemble_walks(s, market_for(s.cfg), [0, 1], "mean")[0]
    gate = entry["gate"]
    assert gate["candidates"][0]["policy"] == "flat" and len(gate["candidates"]) == 4
    chosen = next(c for c in gate["candidates"] if c["switch_margin"] == gate["switch_margin"])
    assert entry["metrics"]["total_return"] == chosen["test"]["total_return"]
    assert entry["metrics"]["num_trades"] == chosen["test"]["num_trades"]
