"""Interrupt and resume with the CUDA graph on: the state restored before capture, the run completes."""
import signal

import pandas as pd
import pytest
import torch

from foxdqn.run.checkpoint import load_checkpoint
from foxdqn.run.loop import Interrupted, train
from foxdqn.config.compose import load_config
from foxdqn.job.check import market_data

from support import interrupt_at

pytestmark = pytest.mark.gpu


def test_graph_run_interrupted_and_resumed(tmp_path, monkeypatch):
    cfg = load_config(["debug=smoke", "device=cuda", "graph=on", "log.progress=false", "logger=csv",
                       "log.interval_env_steps=256", "checkpoint.every_env_steps=512", "checkpoint.save_replay=true"])
    market = market_data(cfg)
    whole = train(cfg, market, tmp_path / "whole")
    interrupt_at(monkeypatch, 30, signal.SIGINT)
    with pytest.raises(Interrupted):
        train(cfg, market, tmp_path / "cut")
    monkeypatch.undo()
    payload = load_checkpoint(tmp_path / "cut" / "checkpoints" / "last.pt", map_location="cuda")
    resumed = train(cfg, market, tmp_path / "cut", resume=payload)
    assert resumed["env_steps"] == whole["env_steps"] and resumed["updates"] == whole["updates"]
    steps = pd.read_csv(tmp_path / "cut" / "metrics.csv")["step"]
    assert list(steps) == sorted(set(steps))
    a = load_checkpoint(tmp_path / "whole" / "checkpoints" / "last.pt")["online"]
    b = load_checkpoint(tmp_path / "cut" / "checkpoints" / "last.pt")["online"]
    for key in a:  # same updates on the same data; the graph may round differently from run to run
        torch.testing.assert_close(a[key], b[key], rtol=1e-3, atol=1e-4)
