"""Walk-forward results of a sweep (foxdqn.report.walk_forward) from hand-made fold folders, and in the report."""
import json

import numpy as np
import pandas as pd
import pytest
from support import fake_job

from foxdqn.report import tables as report
from foxdqn.analysis.metrics import max_drawdown
from foxdqn.report.seeds import load_jobs
from foxdqn.report.walk_forward import chain, walk_forward


def _fold_job(root, num, seed, fold, folds, returns, bh, lr="1e-3"):
    job = fake_job(root, str(num), [f"optim.lr={lr}", f"seed={seed}", f"data.split.fold={fold}"], 0.0,
                   returns=np.asarray(returns), bh_returns=np.asarray(bh), trades=3.0)
    (job / "config.yaml").write_text(f"data:\n  split:\n    folds: {folds}\n    fold: {fold}\nseed: {seed}\n")
    return job


def test_chain_continues_each_fold_from_the_previous_end():
    a = pd.DataFrame({"timestamp": [0, 1, 2], "agent_equity": [1.0, 1.1, 1.21], "buy_and_hold_equity": [1.0, 0.9, 0.9]})
    b = pd.DataFrame({"timestamp": [3, 4], "agent_equity": [100.0, 50.0], "buy_and_hold_equity": [1.0, 2.0]})
    c = chain([a, b])
    assert c["fold"].tolist() == [0, 0, 0, 1] and c["timestamp"].tolist() == [0, 1, 2, 4]
    np.testing.assert_allclose(c["agent_equity"], [1.0, 1.1, 1.21, 0.605])  # b halves: 1.21 / 2
    np.testing.assert_allclose(c["buy_and_hold_equity"], [1.0, 0.9, 0.9, 1.8])


def test_walk_forward_chains_every_seed_and_averages_the_folds(tmp_path):
    r = {(0, 0): [0.01, 0.012], (0, 1): [-0.02, 0.01], (1, 0): [0.002, 0.0], (1, 1): [0.01, -0.01]}
    bh = [0.001, 0.001]
    num = 0
    for seed in (0, 1):
        for fold in (0, 1):
            _fold_job(tmp_path, num, seed, fold, 2, r[seed, fold], bh)
            num += 1
    _fold_job(tmp_path, num, 2, 0, 2, [0.05, 0.05], bh)  # seed 2 lacks fold 1: no concatenated curve
    fake_job(tmp_path, "9", ["optim.lr=1e-3", "seed=0"], 0.0, returns=np.array([0.001, 0.0]), bh_returns=np.array([0.0, 0.001]))  # no folds
    entries, curves = walk_forward(load_jobs(tmp_path))
    (entry,) = entries
    assert entry["setting"] == "optim.lr=1e-3" and entry["folds"] == 2
    assert [f["seeds"] for f in entry["per_fold"]] == [3, 2]
    assert entry["per_fold"][1]["total_return"] == pytest.approx(np.mean([0.98 * 1.01 - 1, 1.01 * 0.99 - 1]))
    seeds = {s["seed"]: s for s in entry["seeds"]}
    assert sorted(seeds) == ["0", "1"]
    equity0 = np.cumprod([1.0, 1.01, 1.012, 0.98, 1.01])
    assert seeds["0"]["total_return"] == pytest.approx(equity0[-1] - 1)
    assert seeds["0"]["max_drawdown"] == pytest.approx(max_drawdown(equity0))
    assert seeds["0"]["num_trades"] == 6 and seeds["0"]["bars"] == 4
    assert seeds["0"]["buy_and_hold_return"] == pytest.approx(1.001 ** 4 - 1)
    assert entry["mean"]["total_return"] == pytest.approx(np.mean([s["total_return"] for s in seeds.values()]))
    assert len(curves) == 10 and set(curves["seed"]) == {"0", "1"}


def test_the_report_has_the_walk_forward_section_and_csv(tmp_path):
    for num, fold in enumerate((0, 1, 2)):
        _fold_job(tmp_path, num, 0, fold, 3, [0.01, -0.005, 0.002], [0.0, 0.001, 0.0])
    (tmp_path / "multirun.yaml").write_text("hydra: {}\n")
    out = report.write_report(tmp_path, plots=False)
    assert out["walk_forward"][0]["folds"] == 3
    text = (tmp_path / "report.md").read_text()
    assert "## Walk-forward" in text and "| **concatenated** | 1 |" in text and "| 2 | 1 |" in text
    curve = pd.read_csv(tmp_path / "walk_forward.csv")
    assert len(curve) == 10 and curve["agent_equity"].iloc[-1] == pytest.approx((1.01 * 0.995 * 1.002) ** 3)
    assert json.loads((tmp_path / "report.json").read_text())["walk_forward"][0]["setting"] == "optim.lr=1e-3"
