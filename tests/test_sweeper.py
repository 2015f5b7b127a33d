"""The basic sweeper under ``python -m foxdqn.train`` (hydra_plugins/foxdqn_population/sweeper.py):
each batch is composed by Hydra once per structure before it launches, the rest left to foxdqn's
check of every job."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
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


#: host time per extra job of a population sweep on a 2-core CPU (issue 33): at most this many seconds
HOST_S_PER_EXTRA_JOB = 0.1


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """Population multiruns of 2 and 34 ``cartpole_cleanrl`` seeds (smoke sizes, 640 env steps each):
    seeds → (sweep folder, wall seconds from the command to the process's end)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = {}
    for seeds in (2, 34):
        folder = tmp_path_factory.mktemp(f"sweep{seeds}")
        cmd = [sys.executable, "-m", "foxdqn.train", "--multirun", "+experiment=cartpole_cleanrl", "debug=smoke",
               "device=cpu", "log.progress=false", "logger=csv", f"seed=range(0,{seeds})", "hydra/launcher=population",
               "agent.total_env_steps=640", "agent.learning_starts=320", f"hydra.sweep.dir={folder / 's'}"]
        start = time.perf_counter()
        res = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
        wall = time.perf_counter() - start
        assert res.returncode == 0, res.stderr[-2000:]
        out[seeds] = folder / "s", wall
    return out


def test_the_multirun_runs_it(sweeps):
    """python -m foxdqn.train's multirun instantiates it for hydra/sweeper=basic (Hydra's default);
    a search file's sweeper is untouched: tests/test_sweeps.py::test_optuna_search_maximises_the_validation_metric."""
    folder = sweeps[2][0]
    multirun = OmegaConf.load(folder / "multirun.yaml")
    assert multirun.hydra.sweeper._target_ == "hydra_plugins.foxdqn_population.sweeper.FoxdqnBasicSweeper"
    assert sorted(p.name for p in folder.iterdir() if p.name.isdigit()) == ["0", "1"]


def test_host_time_per_extra_job_is_small(sweeps):
    """Issue 33's host cost: the wall time outside training (start-up, composition and checks, build,
    evaluation, P run folders) grows by at most HOST_S_PER_EXTRA_JOB per extra job, from 2 to 34 jobs
    (one composition per structure, the others derived: about 0.05 s a job on a 2-core CPU, against
    0.3-0.6 s for a Hydra composition of each). The jobs' own training (the sweep's ``training``
    phase, timings.json) is left out, and so are the interpreter's start and the imports, which no
    job count changes (on 2 busy cores they vary by 0.6 s between two processes: 0.02 s a job here)."""
    host = {}
    for seeds, (folder, wall) in sweeps.items():
        timings = json.loads((folder / "timings.json").read_text())
        assert timings["jobs"] == seeds
        host[seeds] = wall - sum(timings["phases"][k] for k in ("training", "interpreter", "imports"))
        assert len([p for p in folder.iterdir() if (p / "eval" / "summary.json").is_file()]) == seeds
    per_job = (host[34] - host[2]) / 32
    assert per_job <= HOST_S_PER_EXTRA_JOB, f"{per_job:.3f} s of host time per extra job ({host})"


def test_the_launcher_takes_each_composed_job_once_and_only_from_its_own_multirun():
    """The sweeper's check hands the jobs it composed to the population launcher (take_composed): the
    same master config and overrides get that config once; another master config, a job the check
    derived (not composed) or a second take gets None (the launcher composes it then)."""
    from types import SimpleNamespace

    from hydra_plugins.foxdqn_population.sweeper import sweeper_class, take_composed

    batch = [["seed=0"], ["seed=1"], ["seed=3", "head=q"]]
    master = OmegaConf.create({})
    with initialize_config_dir(str(conf_folder()), version_base="1.3"):
        sweeper = sweeper_class()(max_batch_size=None)
        sweeper.hydra_context, sweeper.config = SimpleNamespace(config_loader=_Loader()), master
        sweeper.validate_batch_is_legal(batch)
    assert take_composed(OmegaConf.create({}), ["seed=0"]) is None  # another multirun's master config
    first = take_composed(master, ["seed=0"])
    assert first is not None and first.seed == 0
    assert take_composed(master, ["seed=0"]) is None  # taken once
    assert take_composed(master, ["seed=1"]) is None  # derived from seed=0's config, never composed
    other = take_composed(master, ["seed=3", "head=q"])
    assert other is not None and other.seed == 3 and other.head.name == "q"
