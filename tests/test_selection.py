"""Selection never sees the test split; a ruined agent is reported over the whole split."""
import numpy as np
import pytest
import torch

from foxdqn.data import load_market_data
from foxdqn.analysis.backtest import evaluate
from foxdqn.config.compose import load_config

from support import train_run as train


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    cfg = load_config(["debug=smoke", "device=cpu", "log.progress=false", "logger=csv",
                       "eval.gate.enabled=false"])  # the agent as trained is evaluated (the gate: tests/analysis/test_gate.py)
    market = load_market_data(cfg.data, cfg.env.window, cfg.env.episode_length)
    run_dir = tmp_path_factory.mktemp("run")
    return cfg, market, train(cfg, market, run_dir), run_dir


def test_the_selected_value_is_the_validation_metric_of_the_evaluated_weights(smoke_run):
    cfg, market, summary, run_dir = smoke_run
    sel = summary["selection"]
    assert sel == {"split": "val", "metric": "sharpe", "value": sel["value"], "weights": "last",
                   "trades": sel["trades"], "excluded": None}
    from foxdqn.run.checkpoint import load_checkpoint
    from foxdqn.step.build import build_action_mode, build_env, build_network

    env = build_env(cfg, market, "train", torch.device("cpu"), torch.Generator())
    mode = build_action_mode(cfg, env)
    online = build_network(cfg, env, mode.num_actions)  # a single run's network (python -m foxdqn.evaluate's)
    online.load_state_dict(load_checkpoint(run_dir / "checkpoints" / "last.pt", map_location="cpu")["online"])
    val = evaluate(cfg, market, online, torch.device("cpu"), split="val", action_mode=mode)
    test = evaluate(cfg, market, online, torch.device("cpu"), split="test", action_mode=mode)
    assert sel["value"] == pytest.approx(val["metrics"]["agent"]["sharpe"])
    assert sel["trades"] == val["metrics"]["agent"]["num_trades"] > 0  # the kept weights' trades on val
    assert sel["value"] != pytest.approx(test["metrics"]["agent"]["sharpe"])
    assert summary["metrics"]["agent"]["sharpe"] == pytest.approx(test["metrics"]["agent"]["sharpe"])


def test_the_task_function_returns_the_selection_not_a_test_metric(smoke_run):
    from foxdqn.job.run import objective

    _, _, summary, _ = smoke_run
    rigged = {**summary, "metrics": {**summary["metrics"], "agent": {**summary["metrics"]["agent"], "sharpe": 1e9}}}
    assert objective(rigged) == objective(summary) == summary["selection"]["value"]
    drawdown = {**summary, "selection": {**summary["selection"], "metric": "max_drawdown", "value": 0.25}}
    assert objective(drawdown) == -0.25  # a sweeper maximises: lower-is-better metrics are negated


def test_a_ruined_agent_is_carried_to_the_end_of_the_split():
    cfg = load_config(["debug=smoke", "device=cpu", "env.execution.taker_fee_bps=3000",
                       "env.execution.maker_fee_bps=3000"])
    market = load_market_data(cfg.data, cfg.env.window, cfg.env.episode_length)

    class FlipFlop(torch.nn.Module):
        """Alternates +1 and -1 market orders: 30 % fees ruin it within a few bars."""
        calls = 0

        def forward(self, obs):
            self.calls += 1
            q = torch.zeros(obs.shape[0], 45)
            q[:, 36 if self.calls % 2 else 0] = 1.0
            return q

    result = evaluate(cfg, market, FlipFlop(), torch.device("cpu"), split="test")
    agent, bh = result["curves"]["agent"], result["curves"]["buy_and_hold"]
    assert agent["equity"].size == bh["equity"].size and agent["exposure"].size == bh["exposure"].size
    assert agent["equity"][-1] == pytest.approx(1e-6, rel=1e-3)  # ruined, then flat at the floor
    assert np.all(agent["exposure"][-10:] == 0)
    assert result["metrics"]["agent"]["total_return"] == pytest.approx(-1.0, abs=1e-5)


def test_final_metrics_and_hparams_reach_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_config(["debug=smoke", "device=cpu", "log.progress=false"])
    summary = train(cfg, load_market_data(cfg.data, cfg.env.window, cfg.env.episode_length), tmp_path)
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "eval/test/sharpe" in tags and "eval/val_selection" in tags and "train/loss" in tags
    (event,) = acc.Scalars("eval/test/sharpe")
    assert event.step == summary["env_steps"] and event.value == pytest.approx(summary["metrics"]["agent"]["sharpe"])
    assert list((tmp_path / "tb").rglob("events.out.tfevents.*"))  # the HParams row is written beside them
