"""``python -m foxdqn.train --multirun ... hydra/launcher=population`` end to end with the real
trainer (CPU, smoke sizes): folders, metrics, a halted member, the multirun's exit code."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import torch

from foxdqn.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def test_population_multirun_from_the_command_line(tmp_path):
    sweep = tmp_path / "s"
    cmd = [sys.executable, "-m", "foxdqn.train", "--multirun", "+experiment=cartpole_cleanrl", "debug=smoke",
           "device=cpu", "log.progress=false", "logger=csv", "seed=0,1", "debug.inject_nan_at_step=null,5",
           "hydra/launcher=population", f"hydra.sweep.dir={sweep}"]
    res = subprocess.run(cmd, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 3, res.stderr[-3000:]  # python -m: the launcher's failures reach main()
    assert "foxdqn: error: 2 job(s) of the multirun failed" in res.stderr
    jobs = {}
    for job in sorted(p for p in sweep.iterdir() if p.name.isdigit()):
        overrides = (job / ".hydra" / "overrides.yaml").read_text()
        jobs[job.name] = ("inject_nan_at_step=5" in overrides, job)
    assert len(jobs) == 4 and sum(faulty for faulty, _ in jobs.values()) == 2
    total = None
    for name, (faulty, job) in sorted(jobs.items(), key=lambda kv: kv[1][0]):  # the finished members first
        metrics = pd.read_csv(job / "metrics.csv")
        ckpt = load_checkpoint(job / "checkpoints" / "last.pt")
        if faulty:
            assert (job / "HALTED").read_text().startswith("non-finite loss or gradient norm")
            assert not (job / "eval").exists()
            assert ckpt["updates"] == 5  # the weights before update 5: counts of the halt, not of the run
            assert ckpt["env_steps"] < total and metrics["train/updates"].max() <= 5
            assert metrics["step"].max() < total  # its rows stopped after the halt
        else:
            assert f"job {name}: trained in" in (job / "train.log").read_text()
            summary = json.loads((job / "eval" / "summary.json").read_text())
            assert summary["population"]["size"] == 4 and summary["updates"] == ckpt["updates"] > 5
            total = summary["env_steps"]
            last = metrics.iloc[-1]
            assert last["step"] == total
            assert metrics["train/episodes"].sum() > 0 and math.isfinite(last["train/loss"])  # real values on CPU
            assert math.isfinite(last["train/episode_return"]) and last["train/reward_per_step"] > 0
