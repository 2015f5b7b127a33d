"""kill -9 at 30 random moments of a run's life, each followed by the same command with
resume=auto (a retry loop): every run ends with the uninterrupted run's results. A file of its own
so that pytest-xdist (--dist loadfile) runs it beside the other resume tests."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from foxdqn.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_30_kill_9_at_random_moments_then_resume_auto_end_in_the_uninterrupted_results(tmp_path):
    """SIGKILL 30 times at random moments of the run's whole life (start-up, training, a checkpoint
    write, the evaluation, after the summary), each time followed by the same command line with
    resume=auto (a retry loop): every run ends with the results of the run that was never killed
    (summary metrics, final weights, metrics.csv rows), holds no partial file, and a killed run is
    never mistaken for a finished one."""
    args = [sys.executable, "-m", "foxdqn.train", "debug=smoke", "log.progress=false", "device=cpu", "logger=csv",
            "checkpoint.every_env_steps=512", "checkpoint.save_replay=true", "log.interval_env_steps=256",
            "resume=auto"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    ref = subprocess.run([*args, f"hydra.run.dir={tmp_path / 'ref'}"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr[-2000:]
    duration = time.monotonic() - t0
    rng = __import__("random").Random(0)
    runs = [tmp_path / "run0"]

    def finished(run_dir):
        return (run_dir / "eval" / "summary.json").is_file() and not (run_dir / "INCOMPLETE").exists()

    kills = 0
    while kills < 30:
        run_dir = runs[-1]
        proc = subprocess.Popen([*args, f"hydra.run.dir={run_dir}"], cwd=tmp_path, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            proc.wait(timeout=rng.uniform(0.05, duration))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
        else:
            assert proc.returncode == 0, proc.stderr.read()[-2000:]
        if finished(run_dir):  # it ended (or was killed after its end): the next kills hit a new run
            runs.append(tmp_path / f"run{len(runs)}")
            continue
        if (run_dir / "metrics.csv").exists():  # the run had opened its folder
            assert (run_dir / "INCOMPLETE").exists()  # a killed run is never mistaken for a finished one
        assert all(p.name.startswith(".") for p in run_dir.rglob("*.tmp*"))  # only a killed writer's hidden file
        ckpt = run_dir / "checkpoints" / "last.pt"
        if ckpt.exists():
            assert load_checkpoint(ckpt)["env_steps"] > 0  # whole: its SHA-256 matches
    reference = _results(tmp_path / "ref")
    for run_dir in runs:
        if not finished(run_dir) and run_dir.exists():
            res = subprocess.run([*args, f"hydra.run.dir={run_dir}"], cwd=tmp_path, env=env, capture_output=True,
                                 text=True, timeout=600)
            assert res.returncode == 0, res.stderr[-2000:]
        if not run_dir.exists():  # killed before Hydra made the folder; the last run may not have started
            continue
        assert not list(run_dir.rglob("*.tmp*"))  # the resumed run removed what the killed writers left
        mine = _results(run_dir)
        assert mine["metrics"] == reference["metrics"], run_dir
        assert mine["rows"].equals(reference["rows"]), run_dir
        for key, value in reference["online"].items():
            assert torch.equal(mine["online"][key], value), (run_dir, key)


def _results(run_dir: Path) -> dict:
    """What a run computed: summary metrics, final weights, metrics.csv without its timing column."""
    rows = pd.read_csv(run_dir / "metrics.csv")
    return {"metrics": json.loads((run_dir / "eval" / "summary.json").read_text())["metrics"],
            "online": load_checkpoint(run_dir / "checkpoints" / "last.pt")["online"],
            "rows": rows.drop(columns=[c for c in rows.columns if c.endswith("per_s")]).reset_index(drop=True)}


