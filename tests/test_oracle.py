"""The oracle beside the agent (foxdqn.analysis.backtest.oracle_policy): its rule, its net return on the
markets with a known answer, and where it is reported (docs/backtest.md#markets-with-a-known-answer)."""
import dataclasses
import json

import numpy as np
import pytest
import torch
from support import market_from_arrays

from foxdqn.config.compose import load_config
from foxdqn.data import load_market_data
from foxdqn.execution.orders import MARKET, NORMAL, factor
from foxdqn.execution.fills import ExecutionConfig
from foxdqn.envs.trading import TradingEnv
from foxdqn.analysis.backtest import evaluate, oracle_policy

CPU = torch.device("cpu")
# G_t per decision bar against c_t = s_t/2 + (0.3 + 0.3) bp = 1.6 bp at a spread of 2 bp (the defaults)
FUTURE = [2e-4, 1e-4, -1.5e-4, -1.7e-4, 0.0, 1.61e-4, -1.59e-4, 0.0]
WANT = [4, 4, 4, 0, 0, 4, 4]  # exposure index targeted: +1 above c, -1 below -c, else the one held


def flat_market(expected_future_return=None):
    """8 bars at price 1 with a 2 bp spread (window 1: every bar a decision bar but the last)."""
    n = len(FUTURE)
    ones = np.ones(n)
    market = market_from_arrays(ones, ones, ones, ones, np.full(n, 2e-4), np.zeros((n, 1), dtype=np.float32))
    return dataclasses.replace(market, expected_future_return=expected_future_return)


def test_oracle_trades_when_the_expected_return_pays_a_normal_market_order():
    env = TradingEnv(flat_market(), "train", num_envs=1, window=1, episode_length=8, execution=ExecutionConfig(),
                     device=CPU, dtype=torch.float64, generator=torch.Generator(), eval_mode=True)
    walk = env.run_policy(oracle_policy(np.array(FUTURE), CPU))
    exposure, order_type, urgency = factor(torch.as_tensor(walk["actions"]))
    assert exposure.tolist() == WANT
    assert (order_type == MARKET).all() and (urgency == NORMAL).all()
    assert walk["exposure"].tolist() == [1, 1, 1, -1, -1, 1, 1] and int(walk["trades"]) == 3


def test_oracle_is_reported_only_where_the_market_has_one():
    cfg = load_config(["device=cpu", "env.window=1"])
    for future, want in ((None, {"flat"}), (np.array(FUTURE), {"flat", "oracle"})):
        result = evaluate(cfg, flat_market(future), torch.nn.Identity(), CPU, split="train",
                          policies=("flat", "oracle"))
        assert set(result["metrics"]) == set(result["curves"]) == want


def oracle_on(name: str, *overrides: str) -> dict:
    cfg = load_config([f"data.name={name}", "device=cpu", *overrides])
    market = load_market_data(cfg.data, cfg.env.window, cfg.env.episode_length)
    return evaluate(cfg, market, torch.nn.Identity(), CPU, policies=("oracle",))["metrics"]["oracle"]


@pytest.mark.parametrize("phi", [0.2, -0.2])
def test_oracle_earns_after_costs_on_ar1(phi):
    """ar1_1h's test split (6,000 bars, 20 bp per bar, seed 0), default costs: measured +68.5 % (phi
    0.2, 1,165 trades) and +30.3 % (phi -0.2, 642 trades) on the CPU."""
    m = oracle_on("ar1_1h", f"data.synthetic.phi={phi}")
    assert m["total_return"] > 0.15 and m["sharpe"] > 1.0 and m["num_trades"] > 300


def test_oracle_is_flat_on_the_martingale():
    m = oracle_on("martingale_1h")
    assert m["total_return"] == 0 and m["num_trades"] == 0 and m["turnover"] == 0


def test_summary_and_table_have_the_oracle_on_a_generated_market(train_cli, tmp_path):
    """One smoke run on a 4,000-bar ar1_1h (the eurusd_1h smoke run of tests/test_train_cli.py checks
    that real data has no oracle)."""
    res = train_cli(["data.name=ar1_1h", "data.synthetic.bars=4000", "debug=smoke", "debug.max_env_steps=1024",
                     "log.progress=false", "device=cpu", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "eval" / "summary.json").read_text())
    assert list(summary["metrics"]) == ["agent", "buy_and_hold", "flat", "oracle"]
    assert summary["metrics"]["oracle"]["num_trades"] > 0 and summary["bars"] == 256  # debug.max_eval_bars
    assert summary["data"].startswith("ar1_1h (generated: ") and "phi=0.2" in summary["data"]
    header = (tmp_path / "run" / "eval" / "equity.csv").read_text().splitlines()[0]
    assert header == "timestamp,agent_equity,buy_and_hold_equity,flat_equity,oracle_equity,agent_exposure"
    columns = next(line for line in res.stdout.splitlines() if line.startswith("┃ metric"))
    assert [c.strip() for c in columns.split("┃")[1:-1]] == ["metric", "agent", "buy_and_hold", "flat", "oracle"]
