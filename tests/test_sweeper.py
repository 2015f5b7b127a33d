"""The basic sweeper under ``python -m foxdqn.train`` (hydra_plugins/foxdqn_population/sweeper.py):
each batch is composed by Hydra once per structure before it launches, the rest left to foxdqn's
check of every job."""
import os
import subprocess
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from foxdqn.config.compose import conf_folder

ROOT = Path(__file__).resolve().parents[1]


class _Loader:
    """Hydra's config loader as the sweeper calls it: composes each job and records its overrides."""

    def __init__(self):
        self.composed = []

    def load_sweep_config(self, master_config, sweep_overrides):
        self.composed.append(list(sweep_overrides))
        return compose("train", overrides=list(sweep_overrides))


def test_a_batch_is_composed_once_per_structure():
    from types import SimpleNamespace

    from hydra_plugins.foxdqn_population.sweeper import sweeper_class

    batch = [["seed=0", "optim.lr=0.001"], ["seed=1", "optim.lr=0.001"], ["seed=0", "optim.lr=0.0003"],
             ["seed=0", "head=q"], ["seed=1", "head=q"], ["seed=2", "+experiment=cartpole_cleanrl"]]
    with initialize_config_dir(str(conf_folder()), version_base="1.3"):
        sweeper = sweeper_class()(max_batch_size=None)
        loader = _Loader()
        sweeper.hydra_context, sweeper.config = SimpleNamespace(config_loader=loader), OmegaConf.create({})
        sweeper.validate_batch_is_legal(batch)
    # the second and third jobs change values of the first; head=q is a group (a structure of its own), and
    # seed=1 head=q changes a value of seed=0 head=q; an added experiment is another structure
    assert loader.composed == [batch[0], batch[3], batch[5]] and sweeper.composed == 3


def test_the_multirun_runs_it(tmp_path):
    """python -m foxdqn.train's multirun instantiates it for hydra/sweeper=basic (Hydra's default);
    a search file's sweeper is untouched: tests/test_sweeps.py::test_optuna_search_maximises_the_validation_metric."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "foxdqn.train", "--multirun", "+experiment=cartpole_cleanrl", "debug=smoke",
           "device=cpu", "log.progress=false", "seed=0,1", "hydra/launcher=population",
           f"hydra.sweep.dir={tmp_path / 's'}"]
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    multirun = OmegaConf.load(tmp_path / "s" / "multirun.yaml")
    assert multirun.hydra.sweeper._target_ == "hydra_plugins.foxdqn_population.sweeper.FoxdqnBasicSweeper"
    assert sorted(p.name for p in (tmp_path / "s").iterdir() if p.name.isdigit()) == ["0", "1"]
