"""bench.learnability: the table's rows and targets from hand-made summaries, then one smoke run on the CPU
(eurusd_dqn, martingale_1h and ar1_1h at φ = +0.2 with 4,000 bars, 2 seeds, debug=smoke)."""
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from bench.learnability import MARKETS, experiment_lines, main, market_row, to_markdown


def _job(tmp_path: Path, name: str, agent: float, trades: int, oracle: float | None = None,
         bh: float = -0.03) -> dict:
    metrics = {"agent": {"total_return": agent, "num_trades": trades, "sharpe": 0.0, "max_drawdown": 0.1},
               "buy_and_hold": {"total_return": bh, "sharpe": -1.0}, "flat": {"total_return": 0.0}}
    if oracle is not None:
        metrics["oracle"] = {"total_return": oracle}
    summary = {"split": "test", "bars_per_year": 6048, "selection": {"metric": "sharpe", "value": 0.0},
               "metrics": metrics}
    return {"dir": tmp_path / name, "setting": "(defaults)", "summary": summary}  # no equity.csv: no ensemble


def test_no_edge_target(tmp_path):
    martingale = MARKETS["martingale_1h"]
    ok = market_row("e", martingale, [_job(tmp_path, "0", -0.01, 40, 0.0), _job(tmp_path, "1", -0.02, 60, 0.0),
                                      _job(tmp_path, "2", 0.0, 500, 0.0)], expected=3)
    assert ok["return_mean"] == pytest.approx(-0.01) and ok["return_std"] == pytest.approx(0.01)
    assert ok["median_trades"] == 60 and ok["oracle_return"] == 0.0 and ok["flat_return"] == 0.0
    assert ok["buy_and_hold_return"] == pytest.approx(-0.03)
    assert ok["captured"] is None and ok["ensemble_psr"] is None  # the oracle earned 0; no equity curves
    assert ok["met"] is True
    lost = market_row("e", martingale, [_job(tmp_path, "0", -0.03, 10, 0.0), _job(tmp_path, "1", -0.015, 10, 0.0)], 2)
    assert lost["return_mean"] == pytest.approx(-0.0225) and lost["met"] is False and "<" in lost["why"]
    busy = market_row("e", martingale, [_job(tmp_path, "0", 0.01, 90, 0.0), _job(tmp_path, "1", 0.01, 120, 0.0)], 2)
    assert busy["median_trades"] == 105 and busy["met"] is False and "105 > 100" in busy["why"]
    short = market_row("e", martingale, [_job(tmp_path, "0", 0.0, 0, 0.0)], expected=2)  # a seed failed
    assert short["met"] is False and "1 of 2 seeds without results" in short["why"]


def test_ensemble_psr_from_the_equity_curves(tmp_path):
    def job(name, agent_equity):
        j = _job(tmp_path, name, agent_equity[-1] - 1, 3, 0.0)
        (j["dir"] / "eval").mkdir(parents=True)
        pd.DataFrame({"agent_equity": agent_equity, "buy_and_hold_equity": np.linspace(1, 0.97, len(agent_equity))}
                     ).to_csv(j["dir"] / "eval" / "equity.csv", index=False)
        return j

    rng = np.random.default_rng(0)
    up = [job(str(i), np.cumprod(np.r_[1.0, 1 + 0.001 + 0.001 * rng.standard_normal(199)])) for i in range(2)]
    row = market_row("e", MARKETS["martingale_1h"], up, 2)
    assert row["ensemble_psr"] > 0.99  # +1 bp per bar with 1 bp noise, 200 bars
    flat = [job(f"f{i}", np.ones(200)) for i in range(2)]  # never traded: no variance, no PSR (not NaN)
    assert market_row("e", MARKETS["martingale_1h"], flat, 2)["ensemble_psr"] is None


def test_edge_target_is_half_the_oracle(tmp_path):
    up, down = MARKETS["ar1_1h_phi+0.2"], MARKETS["ar1_1h_phi-0.2"]
    assert up.target == down.target == "edge" and "data.synthetic.phi=-0.2" in down.overrides
    met = market_row("e", up, [_job(tmp_path, "0", 0.30, 900, 0.60), _job(tmp_path, "1", 0.34, 800, 0.60)], 2)
    assert met["captured"] == pytest.approx(0.32 / 0.60) and met["met"] is True
    missed = market_row("e", down, [_job(tmp_path, "0", 0.05, 100, 0.30), _job(tmp_path, "1", 0.15, 80, 0.30)], 2)
    assert missed["captured"] == pytest.approx(1 / 3) and missed["met"] is False
    barren = market_row("e", up, [_job(tmp_path, "0", 0.05, 10, -0.01)], 1)  # the oracle lost: nothing to capture
    assert barren["captured"] is None and barren["met"] is None


def test_markets_without_a_target_and_real_data(tmp_path):
    trend = market_row("e", MARKETS["trend_1h"], [_job(tmp_path, "0", 0.5, 10, 2.0)], 1)
    assert trend["captured"] == pytest.approx(0.25) and trend["target"] is None and trend["met"] is None
    # a real market: no oracle even if a summary carried one, and "—" in the table's oracle column
    real = market_row("e", MARKETS["eurusd_1h"], [_job(tmp_path, "0", 0.01, 10, 0.9)], 1)
    assert real["oracle_return"] is None and real["captured"] is None and real["met"] is None
    cells = [c.strip() for c in to_markdown([real]).splitlines()[2].split("|")[1:-1]]
    assert cells[:3] == ["e", "eurusd_1h", "1"] and cells[5] == "—" and cells[-1] == "—"


def test_summary_line_counts_judged_markets(tmp_path):
    rows = [market_row("a", MARKETS["martingale_1h"], [_job(tmp_path, "0", 0.0, 5, 0.0)], 1),
            market_row("a", MARKETS["ar1_1h_phi+0.2"], [_job(tmp_path, "0", 0.1, 5, 0.6)], 1),
            market_row("a", MARKETS["eurusd_1h"], [_job(tmp_path, "0", 0.1, 5)], 1),
            market_row("b", MARKETS["martingale_1h"], [], 1)]
    assert experiment_lines(rows) == [
        "- a: 1 of 2 targets met (martingale_1h met; ar1_1h_phi+0.2 not met)",
        "- b: 0 of 1 targets met (martingale_1h not met)"]
    md = to_markdown(rows)
    assert md.count("\n| a |") == 3 and "| b | martingale_1h | 0 of 1 | — |" in md


@pytest.mark.slow
def test_smoke_run(tmp_path, monkeypatch, cli):
    """Two markets, 2 seeds, debug=smoke: one population per market, one row per market, oracle beside it.
    bench.common.run_multirun's ``python -m foxdqn.train --multirun ...`` runs in a child of conftest's
    cli server (the same command and working folder) instead of a fresh interpreter each."""
    import bench.common

    def run(cmd, **kwargs):
        assert cmd[:3] == [sys.executable, "-m", "foxdqn.train"] and kwargs == {"capture_output": True, "text": True}
        return cli("foxdqn.train", cmd[3:], cwd=Path.cwd(), timeout=600)

    monkeypatch.setattr(bench.common, "subprocess", SimpleNamespace(run=run))
    rc = main(["--experiments", "eurusd_dqn", "--markets", "martingale_1h,ar1_1h_phi+0.2", "--seeds", "2",
               "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "results"), "--tag", "t",
               "--", "debug=smoke", "data.synthetic.bars=4000", "eval.gate.enabled=false"])  # the gate's rows: above
    assert rc == 0
    (md,) = (tmp_path / "results").glob("*_learnability-t.md")
    data = json.loads(md.with_suffix(".json").read_text())
    rows = data["rows"]
    assert [(r["experiment"], r["market"], r["seeds"], r["rc"]) for r in rows] == [
        ("eurusd_dqn", "martingale_1h", 2, 0), ("eurusd_dqn", "ar1_1h_phi+0.2", 2, 0)]
    for r, name in zip(rows, ("martingale_1h", "ar1_1h")):
        summaries = [json.loads(p.read_text()) for p in sorted(Path(r["sweep_dir"]).glob("*/eval/summary.json"))]
        assert len(summaries) == 2
        assert all(s["population"]["size"] == 2 for s in summaries)  # the seeds trained as one population
        assert all(name in (Path(r["sweep_dir"]) / job / ".hydra" / "overrides.yaml").read_text() for job in "01")
        returns = [s["metrics"]["agent"]["total_return"] for s in summaries]
        assert r["return_mean"] == pytest.approx(sum(returns) / 2)
        assert r["oracle_return"] == pytest.approx(summaries[0]["metrics"]["oracle"]["total_return"])
        assert 0 <= r["ensemble_psr"] <= 1
        policy = summaries[0]["ensemble_policy"]  # the two seeds as one agent (eval.ensemble=mean)
        assert policy == summaries[1]["ensemble_policy"] and policy["rule"] == "mean" and policy["members"] == [0, 1]
        assert r["policy_return"] == pytest.approx(policy["metrics"]["total_return"])
        assert policy["val_metrics"]["bars"] > 0 and policy["metrics"]["bars"] == summaries[0]["metrics"]["agent"]["bars"]
    assert rows[0]["oracle_return"] == 0.0  # the oracle never trades on the martingale
    assert rows[0]["met"] is ((rows[0]["return_mean"] >= -0.02) and rows[0]["median_trades"] <= 100)
    assert rows[1]["target"] == "edge" and (rows[1]["met"] is None) == (rows[1]["oracle_return"] <= 0)
    text = md.read_text()
    assert "| eurusd_dqn | martingale_1h | 2 |" in text and "| eurusd_dqn | ar1_1h_phi+0.2 | 2 |" in text
    assert "- eurusd_dqn: " in text and "targets met" in text and not math.isnan(data["meta"]["wall_s"])
    # a second run into the same --out is refused before anything trains
    assert main(["--experiments", "eurusd_dqn", "--markets", "martingale_1h", "--out", str(tmp_path / "runs"),
                 "--results", str(tmp_path / "results")]) == 2


def test_the_ensemble_policy_gets_its_own_columns_and_verdict(tmp_path):
    def job(name, agent, trades):
        j = _job(tmp_path, name, agent, trades, 0.0)
        j["summary"]["ensemble_policy"] = {"rule": "mean", "members": [0, 1], "split": "test",
                                           "metrics": {"total_return": -0.001, "num_trades": 12}}
        return j

    row = market_row("e", MARKETS["martingale_1h"], [job("0", -0.05, 400), job("1", -0.04, 300)], 2)
    assert row["met"] is False  # the seeds one by one lose 4.5 % in 350 trades
    assert row["policy_return"] == -0.001 and row["policy_trades"] == 12 and row["policy_met"] is True
    assert "-0.10 %, 12" in to_markdown([row]) and to_markdown([row]).splitlines()[0].count("|") == 15
    short = market_row("e", MARKETS["martingale_1h"], [job("0", -0.05, 400)], 2)  # a seed halted or failed
    assert short["policy_return"] == -0.001 and short["policy_met"] is False
    plain = market_row("e", MARKETS["martingale_1h"], [_job(tmp_path, "2", 0.0, 0, 0.0)], 1)
    assert plain["policy_return"] is None and plain["policy_met"] is None


def test_issue_34_options_go_to_every_run_and_train_as_one_population(tmp_path, monkeypatch):
    """The options of docs/bench.md#learnability reach every multirun's command, compose, and a
    population supports them (the margin and data.augment: the seeds still train as one)."""
    import bench.learnability as lb
    from foxdqn.config.compose import load_config
    from foxdqn.population.grouping import batch_refusal

    extra = ["action.switch_margin=2", "data.augment.method=block_bootstrap", "data.augment.block_length=50",
             "data.augment.paths=32"]
    calls = []
    monkeypatch.setattr(lb, "run_multirun", lambda e, s, sweep, over: calls.append(over) or {"rc": 0, "wall_s": 0.0})
    assert main(["--experiments", "eurusd_dqn", "--markets", "martingale_1h,ar1_1h_phi-0.2", "--seeds", "1",
                 "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "results"), "--", *extra]) == 0
    assert len(calls) == 2 and all(c[-4:] == extra for c in calls)
    cfg = load_config(["+experiment=eurusd_dqn", *[c for c in calls[1] if not c.startswith("hydra/")]])
    assert cfg.action.switch_margin == 2.0 and cfg.data.augment.method == "block_bootstrap"
    assert cfg.data.synthetic.phi == -0.2 and cfg.data.augment.paths == 32
    assert batch_refusal(cfg) is None


def test_gated_rows_carry_the_seeds_as_trained(tmp_path):
    """Behind eval.gate, each summary's gate entry gives the seed as trained (its last candidate): the
    row holds both, each judged by the target, and the gate's table says how many seeds stayed flat."""
    def gated(name, agent, trades, trained, trained_trades, chosen):
        j = _job(tmp_path, name, agent, trades, 0.0)
        j["summary"]["gate"] = {"chosen": chosen, "candidates": [
            {"policy": "flat", "switch_margin": None, "test": {"total_return": 0.0, "num_trades": 0}},
            {"policy": "agent", "switch_margin": 0.0, "test": {"total_return": trained, "num_trades": trained_trades}}]}
        return j

    row = market_row("e", MARKETS["martingale_1h"], [gated("0", 0.0, 0, -0.06, 400, "flat"),
                                                     gated("1", -0.01, 30, -0.01, 30, "switch_margin=0")], 2)
    assert row["met"] is True and row["gate_flat"] == 1
    assert row["ungated_return"] == pytest.approx(-0.035) and row["ungated_trades"] == 215 and row["ungated_met"] is False
    text = to_markdown([row])
    assert "Deployment gate" in text and "| e | martingale_1h | 1 of 2 | +0.00 %" not in text
    assert "| e | martingale_1h | 1 of 2 | −0.50 %".replace("−", "-") in text and "-3.50 %, 215, not met" in text
    plain = market_row("e", MARKETS["martingale_1h"], [_job(tmp_path, "0", 0.0, 0, 0.0)], 1)
    assert "gate_flat" not in plain and "Deployment gate" not in to_markdown([plain])
