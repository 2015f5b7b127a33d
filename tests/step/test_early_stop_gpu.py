"""Early stopping and action diversity with the iteration captured as a CUDA graph (H200 runs).

The controls run on the host at log / eval boundaries; here they drive a graph-mode training run
and the Q-divergence stop reads the flag that the Triton Q monitor writes from the graph replay.
"""
import json

import pytest
import torch

import foxdqn.run.loop as loop
import foxdqn.run.finish as finish
from foxdqn.run.checkpoint import load_checkpoint

from support import small_state

pytestmark = pytest.mark.gpu

BASE = ["logger=csv", "graph=on", "early_stop.enabled=true"]


def _train(tmp_path, overrides, experiment=None):
    extra = [f"+experiment={experiment}"] if experiment else []
    s, market = small_state([*extra, *BASE, *overrides], device="cuda")
    return loop.train(s.cfg, market, tmp_path)


def test_val_stop_in_graph_mode_evaluates_best(tmp_path, monkeypatch):
    values = iter([1.0, 3.0, 2.0, 2.5, 9.0, 9.0])
    fake_val = lambda agent, market: {"sharpe": next(values)}  # noqa: E731
    monkeypatch.setattr(loop, "evaluate_val", fake_val)  # validation during training
    monkeypatch.setattr(finish, "evaluate_val", fake_val)  # the selection at the end
    seen = {}
    real_evaluate = finish.evaluate

    def spy(cfg, market, online, device, split="test", action_mode=None):
        seen["weights"] = {k: v.detach().cpu().clone() for k, v in online.state_dict().items()}
        return real_evaluate(cfg, market, online, device, split=split, action_mode=action_mode)

    monkeypatch.setattr(finish, "evaluate", spy)
    summary = _train(tmp_path, ["eval.interval_env_steps=512", "early_stop.patience=2", "diversity.min_entropy=1.0",
                                "diversity.patience=1"])
    assert summary["graph"] is True and summary["device"].startswith("cuda")
    assert summary["stop"]["reason"] == "early_stop_val" and summary["stop"]["at_env_steps"] == 2048
    assert summary["evaluated"] == {"checkpoint": "best", "env_steps": 1024, "metric": "sharpe", "value": 3.0}
    best = load_checkpoint(tmp_path / "checkpoints" / "best.pt")
    assert all(torch.equal(seen["weights"][k], v) for k, v in best["online"].items())
    assert summary["diversity"]["collapse_warnings"] == 1
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "train/exposure_entropy_norm" in header and "train/action_entropy" in header


def test_q_stops_in_graph_mode(tmp_path):
    summary = _train(tmp_path / "bound", ["eval.interval_env_steps=4096", "early_stop.q_bound=1e-9",
                                          "early_stop.q_patience=2"])
    assert summary["graph"] is True
    assert summary["stop"]["reason"] == "early_stop_q" and summary["stop"]["at_env_steps"] == 2048
    summary = _train(tmp_path / "div", ["eval.interval_env_steps=4096", "guard.q_divergence=1e-9",
                                        "early_stop.on_q_divergence=true"])
    assert summary["stop"]["reason"] == "early_stop_q" and "q_divergence" in summary["stop"]["detail"]
    assert not (tmp_path / "div" / "HALTED").exists()
    assert json.loads((tmp_path / "div" / "eval" / "summary.json").read_text())["stop"]["reason"] == "early_stop_q"


@pytest.mark.parametrize("experiment", ["eurusd_branching", "cartpole_dqn"])
def test_experiment_with_controls_runs_in_graph_mode(tmp_path, experiment):
    summary = _train(tmp_path, ["eval.interval_env_steps=1024", "early_stop.patience=10"], experiment)
    assert summary["graph"] is True
    assert summary["stop"]["reason"] == "completed"
    assert summary["stop"]["at_env_steps"] == summary["env_steps"] >= 4096  # cartpole_dqn: 16 envs x 16 steps per iteration
    assert summary["stop"]["metric"] == ("mean_return" if experiment == "cartpole_dqn" else "sharpe")
    assert summary["evaluated"]["checkpoint"] == "best"
    assert summary["evaluated"]["env_steps"] == summary["stop"]["best_env_steps"]
    assert (tmp_path / "checkpoints" / "best.pt").is_file()
