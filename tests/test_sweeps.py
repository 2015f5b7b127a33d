"""Hydra launchers and sweepers of docs/usage.md#launchers-and-hyperparameter-search, end to end on CPU in smoke mode:
joblib (parallel jobs; with mocked GPUs, one GPU per worker process), submitit_local, the Optuna search
hparams_search=eurusd_optuna, and the one-line message of a launcher whose plugin is not installed."""
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ["debug=smoke", "debug.max_env_steps=1024", "device=cpu"]


@pytest.fixture
def run(train_cli):
    """``python -m foxdqn.train --multirun ARGS`` in ``cwd`` (conftest's ``train_cli``)."""
    return lambda args, cwd: train_cli(["--multirun", *args], cwd=cwd, timeout=600)


def complete_jobs(sweep: Path) -> list[dict]:
    """The summaries of the sweep's job folders; each job folder must hold a complete run."""
    out = []
    for job in sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit()):
        for rel in ("config.yaml", "metrics.csv", "checkpoints/last.pt", "eval/summary.json"):
            assert (job / rel).is_file(), job / rel
        assert not (job / "INCOMPLETE").exists()
        out.append(json.loads((job / "eval" / "summary.json").read_text()))
    return out


@pytest.mark.parametrize("launcher", [["hydra/launcher=joblib"], ["hydra/launcher=submitit_local"]],
                         ids=["joblib", "submitit_local"])
@pytest.mark.slow
def test_launcher_runs_complete_jobs(run, tmp_path, launcher):
    """A sweep's jobs run to complete job folders and the sweep ends with its report. joblib: two
    jobs on the CPU while the sweep's process sees two mocked GPUs (run_with_gpus), no n_jobs given:
    with device=cpu the plugin's n_jobs (-1) stays and no job takes a GPU
    (docs/usage.md#gpus-of-parallel-jobs; the CUDA case is the test below)."""
    joblib = "joblib" in launcher[0]
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher" if joblib else "hydra_plugins.hydra_submitit_launcher")
    args = [*launcher, "seed=0,1" if joblib else "seed=0", *SMOKE, f"hydra.sweep.dir={tmp_path / 's'}"]
    res = run_with_gpus(2, args, cwd=tmp_path) if joblib else run(args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    summaries = complete_jobs(tmp_path / "s")
    assert len(summaries) == (2 if joblib else 1)
    seeds_run = sorted(OmegaConf.load(job / "config.yaml").seed for job in (tmp_path / "s").iterdir() if job.name.isdigit())
    assert seeds_run == list(range(len(summaries)))
    assert (tmp_path / "s" / "report.md").is_file()
    # the sweep ends with its report: no worker's teardown noise after it (Triton's nanobind leak lines)
    assert "nanobind" not in res.stderr + res.stdout
    assert res.stdout.rstrip().splitlines()[-1] == f"report: {tmp_path / 's' / 'report.md'}"
    if joblib:  # device=cpu with GPUs present: nothing placed
        assert "Joblib.Parallel(n_jobs=-1," in res.stdout
        assert not any(PLACED.findall((tmp_path / "s" / str(job) / "train.log").read_text()) for job in (0, 1))
        assert "GPU placement" not in res.stdout + res.stderr
        assert list(tmp_path.glob("foxdqn-gpu-slots-*")) == []


PLACED = re.compile(r"job (\d+): GPU (\S+) \(CUDA_VISIBLE_DEVICES=(\S+), held by worker process (\d+) ")


def run_with_gpus(n_gpus: int, args, cwd):
    """``python -m foxdqn.train --multirun ARGS`` (its exit without the interpreter's teardown
    included) in a process of its own whose sweep process sees
    ``n_gpus`` mocked GPUs (foxdqn.cli.placement.gpu_count); the jobs still run on the CPU, as there
    is no CUDA here. The GPU slot folder goes under ``cwd`` (TMPDIR), and loky counts 2 CPUs."""
    from foxdqn.cli.placement import SWEEP_GPUS_ENV

    code = (f"import sys, foxdqn.cli.placement as p; p.gpu_count = lambda: {n_gpus}; from foxdqn.train import main; "
            "from foxdqn.cli.fast_exit import run_as_program; "
            "sys.argv = ['foxdqn.train', '--multirun', *sys.argv[1:]]; run_as_program(main)")  # as python -m runs it
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(cwd), "LOKY_MAX_CPU_COUNT": "2"}
    for name in ("CUDA_VISIBLE_DEVICES", SWEEP_GPUS_ENV):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_joblib_jobs_take_a_gpu_each_on_cuda(tmp_path):
    """Two mocked GPUs, three jobs, no n_jobs given: on a CUDA run (device=auto) n_jobs becomes 2 and
    each worker process takes a GPU of its own, its later job staying on it
    (docs/usage.md#gpus-of-parallel-jobs). With device=cpu nothing is placed:
    test_launcher_runs_complete_jobs[joblib]."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    jobs = 3
    res = run_with_gpus(2, ["hydra/launcher=joblib", f"seed={','.join(map(str, range(jobs)))}", "debug=smoke",
                            "debug.max_env_steps=1024", "device=auto", f"hydra.sweep.dir={tmp_path / 's'}"],
                        cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(complete_jobs(tmp_path / "s")) == jobs
    placed = {}
    for job in range(jobs):
        found = PLACED.findall((tmp_path / "s" / str(job) / "train.log").read_text())
        placed[job] = found[0][1:] if found else None
        assert len(found) <= 1
    slots = list(tmp_path.glob("foxdqn-gpu-slots-*"))
    assert "Joblib.Parallel(n_jobs=2," in res.stdout
    assert all(placed.values()), placed
    by_worker = {}
    for gpu, visible, pid in placed.values():
        assert gpu == visible
        assert by_worker.setdefault(pid, gpu) == gpu, placed  # a worker's later job stays on its GPU
    used = set(by_worker.values())
    assert used == ({"0", "1"} if len(by_worker) > 1 else {"0"}), placed  # two workers: two GPUs
    assert len(slots) == 1 and {p.name for p in slots[0].glob("gpu-*")} == {f"gpu-{g}.0.lock" for g in used}


@pytest.mark.slow
def test_optuna_search_maximises_the_validation_metric(run, tmp_path):
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
    assert set(result.best_params) == {"optim.lr", "agent.gamma", "replay.n_step", "target.tau"}
    config = OmegaConf.load(tmp_path / "s" / "0" / "config.yaml")
    assert config.replay.name == "uniform" and config.objective.cql_alpha == 0  # the experiment's own, not PER + CQL
    assert config.search.pruner == "median" and config.eval.interval_env_steps == 512  # capped by debug
    # the median pruner's records: every trial finished (2 trials < n_startup_trials: none pruned)
    states = [json.loads(p.read_text())["state"] for p in sorted((tmp_path / "s" / ".pruning").glob("*.json"))]
    assert states == ["complete", "complete"]
    assert all(s["selection"]["trades"] == s["selection"]["trades"] // 1 >= 0 for s in summaries)


def test_ray_runs_the_jobs_on_a_local_ray_instance_one_gpu_each(tmp_path):
    """hydra/launcher=ray for real (the published hydra-ray-launcher on a local Ray instance started by
    the launcher, 2 CPUs and 2 GPUs declared to Ray): with two mocked GPUs on a CUDA run
    (device=auto), PlaceJobsOnGpus asks Ray for one GPU per job, and Ray gives the two jobs, running
    at the same time, different GPUs (CUDA_VISIBLE_DEVICES). The jobs train on the CPU (no CUDA)."""
    import re

    pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="hydra-ray-launcher (pip install 'foxdqn[ray]')")
    pytest.importorskip("ray", reason="ray (pip install 'foxdqn[ray]')")
    import shutil
    import tempfile

    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    try:
        res = run_with_gpus(2, ["hydra/launcher=ray", "seed=0,1", "debug=smoke", "debug.max_env_steps=1024",
                                "device=auto", "+hydra.launcher.ray.init.num_cpus=2",
                                "+hydra.launcher.ray.init.num_gpus=2", "+hydra.launcher.ray.init.include_dashboard=false",
                                f"+hydra.launcher.ray.init._temp_dir={ray_tmp}", f"hydra.sweep.dir={tmp_path / 's'}"],
                            cwd=tmp_path)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Ray gives each job one GPU (hydra.launcher.ray.remote.num_gpus=1)" in res.stdout + res.stderr
    assert len(complete_jobs(tmp_path / "s")) == 2 and (tmp_path / "s" / "report.md").is_file()
    line = re.compile(r"job (\d+): GPU (\S+) \(CUDA_VISIBLE_DEVICES=(\S+), set by Ray in worker process (\d+)\)")
    placed = [line.findall((tmp_path / "s" / str(job) / "train.log").read_text()) for job in (0, 1)]
    assert [len(p) for p in placed] == [1, 1], placed
    assert sorted(p[0][1] for p in placed) == ["0", "1"]  # one GPU each, not the same one
    assert placed[0][0][3] != placed[1][0][3]  # in two worker processes


@pytest.mark.slow
def test_submitit_slurm_writes_the_sbatch_script_the_docs_describe(cli, tmp_path):
    """hydra/launcher=submitit_slurm, as docs/usage.md shows it, up to the cluster: a stand-in
    ``sbatch`` on PATH (and an ``srun`` that is never called) keeps the script submitit generates and refuses the job (no Slurm here), so
    the sweep stops there. The script asks for the partition, GPUs, CPUs and time given, and runs
    the job through submitit under srun."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text('#!/bin/sh\ncp "$1" "$(dirname "$0")/submitted.sh"\necho "no Slurm here" >&2\nexit 1\n')
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")  # submitit looks for it to tell it is on Slurm
    for name in ("sbatch", "srun"):
        (bin_dir / name).chmod(0o755)
    res = cli("foxdqn.train", ["--multirun", "hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu",
                               "hydra.launcher.gpus_per_node=1", "hydra.launcher.cpus_per_task=4",
                               "hydra.launcher.timeout_min=120", "seed=0,1", *SMOKE, f"hydra.sweep.dir={tmp_path / 's'}"],
              cwd=tmp_path, timeout=600, environ={"PATH": f"{bin_dir}:{os.environ['PATH']}"})  # read as it runs
    assert res.returncode != 0 and "no Slurm here" in res.stderr  # the stand-in refused it: nothing ran
    script = (bin_dir / "submitted.sh").read_text()
    for line in ("#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=1", "#SBATCH --cpus-per-task=4",
                 "#SBATCH --time=120", "#SBATCH --array=0-1%", f"#SBATCH --output={tmp_path / 's' / '.submitit'}"):
        assert line in script, (line, script)
    assert "srun" in script and "-m submitit.core._submit" in script
    assert not list((tmp_path / "s").glob("[0-9]*/eval"))  # no job ran here


def test_a_launcher_without_its_plugin_names_the_extra(run, tmp_path):
    try:
        import hydra_plugins.hydra_ray_launcher  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("hydra-ray-launcher is installed here (the Ray test above runs it)")
    res = run(["hydra/launcher=ray", *SMOKE, f"hydra.sweep.dir={tmp_path / 's'}"], cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip() == ("foxdqn: error: hydra/launcher=ray needs the Hydra plugin hydra-ray-launcher, not "
                                  "installed: pip install 'foxdqn[ray]' (or pip install hydra-ray-launcher)")
    assert not (tmp_path / "s").exists()


def test_the_median_pruner_stops_a_job_below_the_finished_jobs_median(tmp_path):
    """foxdqn.run.search.MedianTrialPruner: Optuna's MedianPruner over the sweep folder's job files."""
    pytest.importorskip("optuna")
    from foxdqn.config.schema import SearchConfig
    from foxdqn.run.search import MedianTrialPruner

    search = SearchConfig(pruner="median", n_startup_trials=2, n_warmup_steps=0)
    for job, values in enumerate([[1.0, 2.0], [0.5, 1.5]]):
        p = MedianTrialPruner(tmp_path, job, search)
        assert not any([p.report(256, values[0]), p.report(512, values[1])])  # too few finished jobs to prune
        p.finish(pruned=False)
    low = MedianTrialPruner(tmp_path, 2, search)
    assert low.report(256, 0.1)  # below the median (0.75) of the two finished jobs at step 256
    low.finish(pruned=True)
    high = MedianTrialPruner(tmp_path, 3, search)
    assert not high.report(256, 0.9) and not high.report(512, 1.8)  # the pruned job does not count
    states = {p.stem: json.loads(p.read_text())["state"] for p in (tmp_path / ".pruning").glob("*.json")}
    assert states == {"0": "complete", "1": "complete", "2": "pruned", "3": "running"}
    for job, drawdown in enumerate([0.1, 0.2]):  # max drawdown: lower is better
        done = MedianTrialPruner(tmp_path / "dd", job, search, lower_is_better=True)
        done.report(256, drawdown)
        done.finish(pruned=False)
    assert not MedianTrialPruner(tmp_path / "dd", 2, search, lower_is_better=True).report(256, 0.12)
    assert MedianTrialPruner(tmp_path / "dd", 3, search, lower_is_better=True).report(256, 0.3)


def test_a_run_the_search_must_not_count_returns_nan():
    """The objective of a never-trading or pruned run is NaN (Optuna: a failed trial, never the best)."""
    from foxdqn.config.compose import load_config
    from foxdqn.run.search import excluded
    from foxdqn.job.run import objective

    cfg = load_config(["debug=smoke"])
    assert excluded(cfg, {"trades": 0}, "completed") == "never trades on val"
    assert excluded(cfg, {"trades": 3}, "pruned") == "pruned"
    assert excluded(cfg, {"trades": 3}, "completed") is None
    assert excluded(load_config(["debug=smoke", "search.exclude_no_trades=false"]), {"trades": 0}, "completed") is None
    assert excluded(load_config(["+experiment=cartpole_dqn"]), {"trades": None}, "completed") is None
    summary = {"selection": {"metric": "sharpe", "value": 0.0, "excluded": "never trades on val"}}
    assert math.isnan(objective(summary))
    assert objective({"selection": {"metric": "max_drawdown", "value": 0.2, "excluded": None}}) == -0.2


@pytest.mark.slow
def test_a_pruned_run_stops_at_its_validation_and_says_so(tmp_path, monkeypatch):
    """The loop feeds its validation to the pruner; a job below the finished jobs' median stops there,
    is evaluated as usual, and its summary says pruned (NaN to the sweeper)."""
    pytest.importorskip("optuna")
    from foxdqn.run import search
    from foxdqn.config.compose import load_config
    from foxdqn.io_atomic import write_json_atomic
    from foxdqn.job.check import market_data
    from foxdqn.job.run import objective

    from support import train_run as train

    cfg = load_config(["debug=smoke", "debug.max_env_steps=2048", "device=cpu", "log.progress=false", "logger=csv",
                       "eval.interval_env_steps=512", "search.pruner=median", "search.n_startup_trials=1"])
    sweep = tmp_path / "sweep"
    write_json_atomic(sweep / search.PRUNING_FOLDER / "0.json",  # a finished job far above anything smoke reaches
                      {"state": "complete", "intermediate": {str(s): 1e9 for s in (512, 1024, 1536)}})
    monkeypatch.setattr(search, "member_pruner", lambda m: search.MedianTrialPruner(sweep, 1, m.tc.search))
    summary = train(cfg, market_data(cfg), tmp_path / "run")
    assert summary["stop"]["reason"] == "pruned" and summary["stop"]["at_env_steps"] == 1024  # the first after warm-up
    assert summary["env_steps"] == 1024 and summary["selection"]["excluded"] == "pruned"
    assert math.isnan(objective(summary))
    assert json.loads((sweep / search.PRUNING_FOLDER / "1.json").read_text())["state"] == "pruned"


def test_a_job_run_in_its_own_folder_prunes_against_the_sweep_folder(run, tmp_path):
    """With ``hydra.job.chdir=true`` and a relative sweep folder the job's pruning file is still
    ``<sweep folder>/.pruning/<job>.json`` (foxdqn.run.search.sweep_folder), where the finished
    jobs are: a job below them is pruned."""
    pytest.importorskip("optuna")
    from foxdqn.io_atomic import write_json_atomic
    from foxdqn.run.search import PRUNING_FOLDER

    write_json_atomic(tmp_path / "s" / PRUNING_FOLDER / "99.json",  # a finished job far above the run
                      {"state": "complete", "intermediate": {str(500 * k): 1e9 for k in range(1, 9)}})
    res = run(["+experiment=cartpole_cleanrl", "debug=smoke", "device=cpu", "log.progress=false", "logger=csv",
               "seed=0", "eval.interval_env_steps=500", "search.pruner=median", "search.n_startup_trials=1",
               "hydra.job.chdir=true", "hydra.sweep.dir=s"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "s" / "0" / "eval" / "summary.json").read_text())
    assert summary["stop"]["reason"] == "pruned" and summary["stop"]["at_env_steps"] == 1000
    assert json.loads((tmp_path / "s" / PRUNING_FOLDER / "0.json").read_text())["state"] == "pruned"
    assert not (tmp_path / "s" / "0" / "s").exists()
