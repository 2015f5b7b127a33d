"""Hydra launchers and sweepers of docs/usage.md#launchers-and-hyperparameter-search, end to end on CPU in smoke mode:
joblib (parallel jobs), submitit_local, the Optuna search hparams_search=eurusd_optuna, and the
one-line message of a launcher whose plugin is not installed."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ["debug=smoke", "debug.max_env_steps=1024", "device=cpu"]


def run(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "foxdqn.train", "--multirun", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def complete_jobs(sweep: Path) -> list[dict]:
    """The summaries of the sweep's job folders; each job folder must hold a complete run."""
    out = []
    for job in sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit()):
        for rel in ("config.yaml", "metrics.csv", "checkpoints/last.pt", "eval/summary.json"):
            assert (job / rel).is_file(), job / rel
        assert not (job / "INCOMPLETE").exists()
        out.append(json.loads((job / "eval" / "summary.json").read_text()))
    return out


@pytest.mark.parametrize("launcher", [["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
                                      ["hydra/launcher=submitit_local"]], ids=["joblib", "submitit_local"])
def test_launcher_runs_complete_jobs(tmp_path, launcher):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher" if "joblib" in launcher[0]
                        else "hydra_plugins.hydra_submitit_launcher")
    seeds = "seed=0,1" if "joblib" in launcher[0] else "seed=0"
    res = run([*launcher, seeds, *SMOKE, f"hydra.sweep.dir={tmp_path / 's'}"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    summaries = complete_jobs(tmp_path / "s")
    assert len(summaries) == (2 if "joblib" in launcher[0] else 1)
    seeds_run = sorted(OmegaConf.load(job / "config.yaml").seed for job in (tmp_path / "s").iterdir() if job.name.isdigit())
    assert seeds_run == list(range(len(summaries)))
    assert (tmp_path / "s" / "report.md").is_file()


def test_optuna_search_maximises_the_validation_metric(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    res = run(["hparams_search=eurusd_optuna", "hydra.sweeper.n_trials=2", *SMOKE,
               f"hydra.sweep.dir={tmp_path / 's'}"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    summaries = complete_jobs(tmp_path / "s")
    assert len(summaries) == 2
    result = OmegaConf.load(tmp_path / "s" / "optimization_results.yaml")
    values = [s["selection"]["value"] for s in summaries]
    assert all(s["selection"]["split"] == "val" for s in summaries)
    assert math.isclose(result.best_value, max(values))  # the objective is the validation metric
    assert set(result.best_params) == {"optim.lr", "agent.gamma", "replay.n_step", "replay.alpha",
                                       "objective.cql_alpha"}
    config = OmegaConf.load(tmp_path / "s" / "0" / "config.yaml")
    assert config.replay.name == "per" and config.objective.cql_alpha > 0


def test_a_launcher_without_its_plugin_names_the_extra(tmp_path):
    res = run(["hydra/launcher=ray", *SMOKE, f"hydra.sweep.dir={tmp_path / 's'}"], cwd=tmp_path)
    if "Could not find" not in res.stderr and res.returncode == 0:
        pytest.skip("hydra-ray-launcher is installed here")
    assert res.returncode == 2
    assert res.stderr.strip() == ("foxdqn: error: hydra/launcher=ray needs the Hydra plugin hydra-ray-launcher, not "
                                  "installed: pip install 'foxdqn[ray]' (or pip install hydra-ray-launcher)")
    assert not (tmp_path / "s").exists()
