"""Validation during training and early stopping in a population (foxdqn.population.selection,
foxdqn.population.train): member p equals a population of one of its settings, bit for bit on CPU,
while the others stop at other times; the kept weights are the best validated ones."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from foxdqn.analysis.backtest import evaluate
from foxdqn.population.jobs import FINISHED, Member
from foxdqn.population.train import train_population
from foxdqn.run.checkpoint import load_checkpoint
from foxdqn.run.finish import Agent, evaluate_val
from foxdqn.step.build import build_action_mode, build_env, build_network
from test_population import TRADING, configs, market_for

CPU = torch.device("cpu")
BASE = [*TRADING, "logger=csv", "agent.total_env_steps=720", "agent.learning_starts=96", "log.interval_env_steps=120",
        "eval.interval_env_steps=48"]
EARLY = [*BASE, "early_stop.enabled=true", "early_stop.patience=2", "eval.gate.enabled=false"]  # test: the kept weights
# member 2 waits longer (its own patience): the three stop at three times (240, 336, 432 env steps)
MEMBERS = [["seed=0"], ["seed=1", "optim.lr=3e-3"], ["seed=2", "optim.lr=1e-4", "early_stop.patience=6"]]


def train(base, members, folder, jobs=None):
    """Train ``members`` (override lists on ``base``) as one population in ``folder/<job>``; their outcomes."""
    tcs = configs(base, members)
    market = market_for(tcs[0])
    jobs = jobs or list(range(len(members)))
    outcomes = train_population([Member(tc, market, folder / str(j), j, list(extra))
                                 for j, tc, extra in zip(jobs, tcs, members)])
    assert all(o.exit_code == FINISHED for o in outcomes), [o.message for o in outcomes]
    return outcomes


def metrics(folder):
    # (a member stopped before its first log row has no train/* column)
    return pd.read_csv(folder / "metrics.csv").drop(columns=["train/env_steps_per_s"], errors="ignore")


def weights(path):
    payload = load_checkpoint(path)
    return {f"{net}.{k}": v for net in ("online", "target") for k, v in payload[net].items()}, payload


def assert_same_run(a, b):
    """Two run folders of the same member: metrics (but the rate), summary's stop/selection/evaluated/
    counts/metrics and checkpoints equal bit for bit."""
    pd.testing.assert_frame_equal(metrics(a), metrics(b), check_exact=True)
    sa, sb = (json.loads((f / "eval" / "summary.json").read_text()) for f in (a, b))
    for key in ("stop", "selection", "evaluated", "env_steps", "updates", "metrics"):
        assert sa[key] == sb[key], key
    for name in ("last.pt", "best.pt"):
        assert (a / "checkpoints" / name).is_file() == (b / "checkpoints" / name).is_file(), name
        if (a / "checkpoints" / name).is_file():
            (wa, pa), (wb, pb) = weights(a / "checkpoints" / name), weights(b / "checkpoints" / name)
            assert (pa["env_steps"], pa["updates"]) == (pb["env_steps"], pb["updates"]), name
            for k in wa:
                assert torch.equal(wa[k], wb[k]), f"{name}: {k}"


@pytest.fixture(scope="module")
def early(tmp_path_factory):
    folder = tmp_path_factory.mktemp("early")
    return folder, train(EARLY, MEMBERS, folder)


@pytest.mark.slow
def test_early_stopped_members_equal_populations_of_one(early, tmp_path):
    folder, outcomes = early
    stops = [o.summary["stop"] for o in outcomes]
    assert all(s["reason"] == "early_stop_val" for s in stops), stops
    at = [s["at_env_steps"] for s in stops]
    assert len(set(at)) == 3 and max(at) < 720, at  # each member stopped at its own time, before the end
    for p, o in enumerate(outcomes):
        assert o.summary["env_steps"] == at[p] and o.summary["selection"]["weights"] == "best"
        assert o.summary["evaluated"]["env_steps"] == stops[p]["best_env_steps"] < at[p]
        rows = metrics(folder / str(p))
        assert rows["step"].max() == at[p]  # no row after its stop (train or val)
        assert rows["val/sharpe"].notna().sum() >= 3
        train(EARLY, [MEMBERS[p]], tmp_path / f"alone{p}", jobs=[p])
        assert_same_run(folder / str(p), tmp_path / f"alone{p}" / str(p))


def test_stopped_member_is_frozen_while_the_others_train(early):
    folder, outcomes = early
    first = min(range(3), key=lambda p: outcomes[p].summary["stop"]["at_env_steps"])
    last = max(range(3), key=lambda p: outcomes[p].summary["stop"]["at_env_steps"])
    stop_first = outcomes[first].summary["stop"]["at_env_steps"]
    rows = metrics(folder / str(last))
    assert rows["train/updates"].max() > outcomes[first].summary["updates"]  # trained on after `first` stopped
    assert load_checkpoint(folder / str(first) / "checkpoints" / "last.pt")["env_steps"] == stop_first


def single_network(cfg, market, path):
    """A single run's network loaded with checkpoint ``path``'s online weights, and its action mode."""
    gen = torch.Generator(device=CPU)
    gen.manual_seed(cfg.seed)
    env = build_env(cfg, market, "train", CPU, gen)
    mode = build_action_mode(cfg, env)
    net = build_network(cfg, env, mode.num_actions)
    net.load_state_dict(load_checkpoint(path)["online"])
    return net, mode


def test_kept_weights_are_the_best_validation_ones(early):
    folder, outcomes = early
    tcs = configs(EARLY, MEMBERS)
    market, last_tests = market_for(tcs[0]), []
    for p, (tc, o) in enumerate(zip(tcs, outcomes)):
        stop, run = o.summary["stop"], folder / str(p)
        val = metrics(run).dropna(subset=["val/sharpe"]).set_index("step")["val/sharpe"]
        counted = val[val.index > 96]  # validations after the first update
        assert stop["best_metric"] == counted.max() and stop["best_env_steps"] == counted.idxmax()
        net, mode = single_network(tc, market, run / "checkpoints" / "best.pt")
        assert load_checkpoint(run / "checkpoints" / "best.pt")["env_steps"] == stop["best_env_steps"]
        again = evaluate_val(Agent(tc, net, mode, CPU), market)["sharpe"]
        assert again == pytest.approx(stop["best_metric"], rel=1e-9, abs=1e-12)
        test = evaluate(tc, market, net, CPU, split="test", action_mode=mode)["metrics"]["agent"]["sharpe"]
        assert o.summary["metrics"]["agent"]["sharpe"] == pytest.approx(test, rel=1e-9, abs=1e-12)  # test: the best
        last, _ = single_network(tc, market, run / "checkpoints" / "last.pt")
        assert any(not torch.equal(a, b) for a, b in zip(net.parameters(), last.parameters()))  # trained on
        last_tests.append(evaluate(tc, market, last, CPU, split="test", action_mode=mode)["metrics"]["agent"]["sharpe"])
    # the last weights would have given other test values: the report is the kept weights'
    assert [o.summary["metrics"]["agent"]["sharpe"] for o in outcomes] != pytest.approx(last_tests)


@pytest.mark.slow
def test_validation_without_early_stopping_logs_every_member_and_keeps_the_last(tmp_path):
    outcomes = train(BASE, MEMBERS[:2], tmp_path / "val")
    alone = train(BASE, [MEMBERS[1]], tmp_path / "alone", jobs=[1])
    for p, o in enumerate(outcomes):
        rows = metrics(tmp_path / "val" / str(p))
        assert list(rows.dropna(subset=["val/sharpe"])["step"]) == list(range(48, 720, 48))  # not at the end
        assert o.summary["stop"]["reason"] == "completed" and o.summary["evaluated"]["checkpoint"] == "last"
        assert not (tmp_path / "val" / str(p) / "checkpoints" / "best.pt").exists()
    assert_same_run(tmp_path / "val" / "1", tmp_path / "alone" / "1")


def test_q_bound_stops_a_member_at_a_log_boundary_as_a_population_of_one(tmp_path):
    base = [*EARLY, "early_stop.q_bound=1e-6", "early_stop.q_patience=1", "early_stop.patience=100"]
    outcomes = train(base, MEMBERS[:2], tmp_path / "q")
    for o in outcomes:  # the first log interval with updates (96 collect-only env steps, a row every 120)
        assert o.summary["stop"]["reason"] == "early_stop_q" and o.summary["stop"]["at_env_steps"] == 120
        assert o.summary["stop"]["detail"].startswith("|mean max-Q| = ")
    train(base, [MEMBERS[1]], tmp_path / "alone", jobs=[1])
    assert_same_run(tmp_path / "q" / "1", tmp_path / "alone" / "1")
