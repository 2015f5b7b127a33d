"""GPU placement of parallel sweep jobs (foxdqn.cli.placement, foxdqn.cli.callbacks.PlaceJobsOnGpus;
docs/usage.md#gpus-of-parallel-jobs), without GPUs: the choice over simulated arrivals and departures
on 1, 2, 4 and 8 GPUs, real flock claims from several spawned processes, the GPU ids a sweep sees, and
the launcher settings of a composed config with a mocked GPU count. The end-to-end joblib sweeps are
in tests/test_sweeps.py."""
from __future__ import annotations

import multiprocessing
import os
import random
import tempfile
from collections import Counter

import pytest
from omegaconf import OmegaConf

from foxdqn.cli import placement
from foxdqn.cli.placement import Claim, choose_gpu, claim_gpu, place_sweep_job, visible_gpus

JOBLIB = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
RAY = "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"


# ---------------------------------------------------------------------------------------------
# choose_gpu
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("holders, expected", [([0], 0), ([3], 0), ([0, 0], 0), ([1, 0], 1), ([1, 1], 0),
                                               ([2, 1, 1, 2], 1), ([1, 1, 1, 1, 1, 1, 1, 0], 7),
                                               ([2, 2, 1, 2, 1, 2, 2, 2], 2)])
def test_choose_gpu_takes_the_least_loaded_lowest_index_on_ties(holders, expected):
    assert choose_gpu(holders) == expected


@pytest.mark.parametrize("holders", [[], [0, -1]])
def test_choose_gpu_refuses_no_gpus_and_negative_counts(holders):
    with pytest.raises(ValueError, match="choose_gpu"):
        choose_gpu(holders)


def simulate(n_gpus: int, n_workers: int, rng: random.Random, events: int = 200) -> list[list[int]]:
    """Workers arrive (claim a GPU by choose_gpu) and leave in a random order, at most ``n_workers``
    at once: every arrival's holder counts before it, the GPU it got, and the counts after."""
    holders, running, seen = [0] * n_gpus, [], []
    for _ in range(events):
        if len(running) < n_workers and (not running or rng.random() < 0.6):
            before = list(holders)
            gpu = choose_gpu(before)
            holders[gpu] += 1
            running.append(gpu)
            seen.append([before, gpu, list(holders)])
        else:
            holders[running.pop(rng.randrange(len(running)))] -= 1
    return seen


@pytest.mark.parametrize("n_gpus", [1, 2, 4, 8])
@pytest.mark.parametrize("n_workers", range(1, 13))
def test_arrivals_never_share_a_gpu_while_another_is_idle(n_gpus, n_workers):
    for trial in range(20):
        for before, gpu, after in simulate(n_gpus, n_workers, random.Random(1000 * n_gpus + 10 * n_workers + trial)):
            assert before[gpu] == min(before)  # never onto a busier GPU, so never onto a used one while one is idle
            assert gpu == before.index(min(before))
            if n_workers <= n_gpus:
                assert max(after) <= 1, (before, gpu)  # n_jobs <= GPUs: one worker per GPU, always


@pytest.mark.parametrize("n_gpus", [1, 2, 4, 8])
@pytest.mark.parametrize("n_workers", range(1, 13))
def test_workers_that_all_start_are_balanced_within_one(n_gpus, n_workers):
    holders = [0] * n_gpus
    for _ in range(n_workers):
        holders[choose_gpu(holders)] += 1
    assert sum(holders) == n_workers
    assert max(holders) - min(holders) <= 1
    assert holders == sorted(holders, reverse=True)  # the extra workers go to the lowest indices


# ---------------------------------------------------------------------------------------------
# visible_gpus
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env, count, expected", [
    ({}, 0, []),
    ({}, 1, ["0"]),
    ({}, 4, ["0", "1", "2", "3"]),
    ({"CUDA_VISIBLE_DEVICES": "3,5"}, 2, ["3", "5"]),
    ({"CUDA_VISIBLE_DEVICES": " 3, 5 "}, 2, ["3", "5"]),
    ({"CUDA_VISIBLE_DEVICES": "3,5"}, 1, ["3"]),  # CUDA uses only the entries it can (torch's count)
    ({"CUDA_VISIBLE_DEVICES": "3,,5"}, 2, ["3"]),  # CUDA stops at the first bad entry
    ({"CUDA_VISIBLE_DEVICES": ""}, 0, []),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, 0, []),
    ({"CUDA_VISIBLE_DEVICES": "GPU-8f2a,GPU-11c0"}, 2, ["GPU-8f2a", "GPU-11c0"]),
])
def test_visible_gpus_honours_the_parents_cuda_visible_devices(env, count, expected):
    assert visible_gpus(env, count) == expected


# ---------------------------------------------------------------------------------------------
# claim_gpu with real flock locks
# ---------------------------------------------------------------------------------------------
def test_claims_in_one_process_balance_and_a_release_frees_the_gpu(tmp_path):
    claims = [claim_gpu(tmp_path, ["0", "1"]) for _ in range(3)]
    assert [c.gpu for c in claims] == ["0", "1", "0"]
    assert [c.holders for c in claims] == [(0, 0), (1, 0), (1, 1)]
    claims[1].release()
    again = claim_gpu(tmp_path, ["0", "1"])
    assert (again.gpu, again.holders) == ("1", (2, 0))
    assert again.slot == claims[1].slot  # the freed slot file is reused: the folder does not grow
    for c in (*claims, again):
        c.release()
        c.release()  # a second release does nothing
    assert not any(c.held for c in (*claims, again))
    assert claim_gpu(tmp_path, ["0", "1"]).holders == (0, 0)


def test_ids_that_look_alike_get_slot_files_of_their_own(tmp_path):
    ids = ["0", "0.1", "MIG-a.b/1", "MIG-a.b/10"]
    claims = [claim_gpu(tmp_path, ids) for _ in ids]
    assert [c.gpu for c in claims] == ids
    assert len({c.slot for c in claims}) == len(ids)
    assert all(c.slot.parent == tmp_path for c in claims)


def test_a_claim_waits_while_another_process_chooses(tmp_path):
    """Counting and taking happen under choose.lock: two workers starting together cannot both
    count the same idle GPU."""
    import fcntl
    import threading

    got = []
    fd = os.open(tmp_path / "choose.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another chooser (a separate open file: flock conflicts in one process too)
    worker = threading.Thread(target=lambda: got.append(claim_gpu(tmp_path, ["0", "1"])))
    worker.start()
    worker.join(0.5)
    assert worker.is_alive() and not got
    os.close(fd)
    worker.join(30)
    assert [c.gpu for c in got] == ["0"]


def test_claim_gpu_refuses_an_empty_gpu_list(tmp_path):
    with pytest.raises(ValueError, match="no GPUs"):
        claim_gpu(tmp_path, [])


def _claim_in_a_worker(slot_dir, gpus, results, barrier):
    """A spawned process: place_worker twice (the second call must return the first claim), report
    what CUDA_VISIBLE_DEVICES became, then hold the claim until every process has claimed."""
    first = placement.place_worker(gpus, slot_dir)
    second = placement.place_worker(gpus, slot_dir)
    results.put((os.environ.get("CUDA_VISIBLE_DEVICES"), first.gpu, second is first, str(first.slot)))
    barrier.wait(timeout=60)


def run_workers(slot_dir, gpus, n):
    ctx = multiprocessing.get_context("spawn")
    results, barrier = ctx.Queue(), ctx.Barrier(n)
    procs = [ctx.Process(target=_claim_in_a_worker, args=(str(slot_dir), gpus, results, barrier)) for _ in range(n)]
    for p in procs:
        p.start()
    out = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for env_value, gpu, same, _ in out:
        assert env_value == gpu and same  # the process's CUDA_VISIBLE_DEVICES is its claim, kept
    return out


@pytest.mark.parametrize("n_workers, expected", [(2, {"3": 1, "5": 1}), (4, {"3": 2, "5": 2}), (3, {"3": 2, "5": 1})])
def test_spawned_workers_claim_distinct_gpus(tmp_path, n_workers, expected):
    out = run_workers(tmp_path, ["3", "5"], n_workers)
    assert Counter(gpu for _, gpu, _, _ in out) == expected
    assert len({slot for *_, slot in out}) == n_workers  # one slot file per holder
    # the workers have exited: the OS released their locks, nothing is stale
    assert claim_gpu(tmp_path, ["3", "5"]).holders == (0, 0)


# ---------------------------------------------------------------------------------------------
# place_sweep_job: only a joblib job of a sweep the parent placed
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def fresh_worker(monkeypatch, tmp_path):
    """This process as a worker without a claim, its slot folder under tmp_path; the environment and
    the module state are restored afterwards."""
    monkeypatch.setattr(placement, "_WORKER_CLAIM", None)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "unchanged")
    yield
    if placement._WORKER_CLAIM is not None:
        placement._WORKER_CLAIM.release()


@pytest.mark.parametrize("target, env", [(JOBLIB, {}), (JOBLIB, {placement.SWEEP_GPUS_ENV: ""}),
                                         (RAY, {placement.SWEEP_GPUS_ENV: "0,1"}),
                                         ("hydra._internal.core_plugins.basic_launcher.BasicLauncher",
                                          {placement.SWEEP_GPUS_ENV: "0,1"})])
def test_other_jobs_are_left_alone(fresh_worker, tmp_path, target, env):
    assert place_sweep_job(target, env) is None
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "unchanged"
    assert placement._WORKER_CLAIM is None
    assert not any(tmp_path.iterdir())


def test_a_joblib_job_of_a_placed_sweep_takes_and_keeps_a_gpu(fresh_worker, tmp_path):
    rival = claim_gpu(placement.default_slot_dir(), ["3", "5"])  # another sweep's worker holds GPU 3
    claim = place_sweep_job(JOBLIB, {placement.SWEEP_GPUS_ENV: "3,5"})
    assert isinstance(claim, Claim) and claim.gpu == "5" and claim.holders == (1, 0)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"
    assert claim.slot.parent == tmp_path / f"foxdqn-gpu-slots-{os.getuid()}"
    rival.release()
    assert place_sweep_job(JOBLIB, {placement.SWEEP_GPUS_ENV: "3,5"}) is claim  # the worker's later jobs


@pytest.fixture
def job_of(monkeypatch):
    """Make this process look like job 7 of a multirun with the given launcher options (Hydra's
    job config); Hydra's state is restored afterwards."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import open_dict

    saved = HydraConfig.instance().cfg

    def make(overrides, mode=RunMode.MULTIRUN):
        cfg = composed(overrides)
        with open_dict(cfg):
            cfg.hydra.mode, cfg.hydra.job.num = mode, 7
        HydraConfig.instance().set_config(cfg)

    yield make
    HydraConfig.instance().cfg = saved


def test_the_task_function_places_a_joblib_job_and_logs_it(fresh_worker, job_of, monkeypatch, caplog):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    from foxdqn.train import _place_on_gpu

    monkeypatch.setenv(placement.SWEEP_GPUS_ENV, "3,5")
    job_of(["hydra/launcher=joblib"])
    with caplog.at_level("INFO", logger="foxdqn.cli.placement"):
        _place_on_gpu()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    assert [r.getMessage() for r in caplog.records] == [
        f"job 7: GPU 3 (CUDA_VISIBLE_DEVICES=3, held by worker process {os.getpid()} for all its jobs)"]


@pytest.mark.parametrize("overrides, single_run", [(["hydra/launcher=joblib"], True), ([], False)])
def test_the_task_function_leaves_single_runs_and_the_basic_launcher_alone(fresh_worker, job_of, monkeypatch,
                                                                         caplog, overrides, single_run):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    from hydra.types import RunMode

    from foxdqn.train import _place_on_gpu

    monkeypatch.setenv(placement.SWEEP_GPUS_ENV, "3,5")
    job_of(overrides, RunMode.RUN if single_run else RunMode.MULTIRUN)
    with caplog.at_level("INFO", logger="foxdqn.cli.placement"):
        _place_on_gpu()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "unchanged" and not caplog.records


def test_an_unusable_slot_folder_costs_a_warning_not_the_job(fresh_worker, job_of, monkeypatch, tmp_path, caplog):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    from foxdqn.train import _place_on_gpu

    (tmp_path / "file").write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "file"))  # the slot folder would be under a file
    monkeypatch.setenv(placement.SWEEP_GPUS_ENV, "3,5")
    job_of(["hydra/launcher=joblib"])
    with caplog.at_level("INFO", logger="foxdqn.cli.placement"):
        _place_on_gpu()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "unchanged"
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "job 7: no GPU placement" in caplog.records[0].getMessage()


def test_importing_what_a_job_process_loads_asks_nothing_of_cuda():
    """A joblib worker unpickles the task function and Hydra's callbacks (importing foxdqn) before
    the task function places it on a GPU: no import may initialise CUDA, or CUDA_VISIBLE_DEVICES
    set afterwards would be ignored (foxdqn.cli.placement, point 5)."""
    import subprocess
    import sys
    from pathlib import Path

    code = """
import torch, torch.cuda
def boom(*args, **kwargs):
    raise AssertionError("CUDA queried at import")
for name in ("is_available", "device_count", "init", "_lazy_init", "mem_get_info", "current_device"):
    setattr(torch.cuda, name, boom)
if hasattr(torch._C, "_cuda_getDeviceCount"):  # a CUDA build; setting it on a CPU build would make torch
    torch._C._cuda_getDeviceCount = boom           # believe CUDA is compiled in (torch.cuda._is_compiled)
import foxdqn.cli.placement, foxdqn.train, foxdqn.cli.callbacks, foxdqn.report.tables, foxdqn.population.train, foxdqn.analysis.backtest
"""
    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, "-c", code], cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]


# ---------------------------------------------------------------------------------------------
# the sweep's process: launcher settings (PlaceJobsOnGpus) on a composed config
# ---------------------------------------------------------------------------------------------
def composed(overrides: list[str]):
    """conf/train.yaml with Hydra's own part, as ``--multirun`` composes it (compose API)."""
    from hydra import compose, initialize_config_dir

    from foxdqn.config.compose import conf_folder

    with initialize_config_dir(str(conf_folder()), version_base="1.3"):
        return compose("train", overrides=overrides, return_hydra_config=True)


@pytest.fixture
def sweep_process(monkeypatch):
    """The sweep's process with a mocked GPU count (set ``.count``) and no inherited GPU settings."""
    from foxdqn.cli.callbacks import PlaceJobsOnGpus

    class Sweep:
        count = 0

        def start(self, config):
            PlaceJobsOnGpus().on_multirun_start(config=config)
            return config

    sweep = Sweep()
    monkeypatch.setattr(placement, "gpu_count", lambda: sweep.count)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv(placement.SWEEP_GPUS_ENV, "stale")  # an outer value must not survive
    return sweep


@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_joblib_n_jobs_defaults_to_the_gpu_count(sweep_process, count):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep_process.count = count
    cfg = sweep_process.start(composed(["hydra/launcher=joblib"]))
    assert cfg.hydra.launcher.n_jobs == count
    assert os.environ[placement.SWEEP_GPUS_ENV] == ",".join(str(i) for i in range(count))


def test_joblib_sees_the_parents_cuda_visible_devices(sweep_process, monkeypatch):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    sweep_process.count = 2
    cfg = sweep_process.start(composed(["hydra/launcher=joblib", "device=cuda"]))
    assert cfg.hydra.launcher.n_jobs == 2
    assert os.environ[placement.SWEEP_GPUS_ENV] == "3,5"


@pytest.mark.parametrize("given", ["hydra.launcher.n_jobs=3", "hydra.launcher.n_jobs=-1", "++hydra.launcher.n_jobs=12"])
def test_the_users_n_jobs_wins(sweep_process, given):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep_process.count = 4
    cfg = sweep_process.start(composed(["hydra/launcher=joblib", given]))
    assert cfg.hydra.launcher.n_jobs == int(given.rsplit("=", 1)[1])
    assert os.environ[placement.SWEEP_GPUS_ENV] == "0,1,2,3"  # the workers still take a GPU each


@pytest.mark.parametrize("overrides, count", [(["hydra/launcher=joblib", "device=cpu"], 4),
                                              (["hydra/launcher=joblib"], 0),
                                              ([], 4)])
def test_cpu_runs_and_other_launchers_keep_the_plugins_settings(sweep_process, overrides, count):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep_process.count = count
    before = composed(overrides)
    cfg = sweep_process.start(composed(overrides))
    assert cfg.hydra.launcher == before.hydra.launcher
    assert placement.SWEEP_GPUS_ENV not in os.environ


def ray_config(device: str, remote: dict):
    """The shape of hydra-ray-launcher's ``hydra/launcher=ray`` config (without the plugin)."""
    return OmegaConf.create({"device": device, "hydra": {"launcher": {"_target_": RAY, "ray": {
        "init": {"address": None}, "remote": remote}}, "overrides": {"hydra": ["hydra/launcher=ray"]}}})


@pytest.mark.parametrize("device, remote, count, expected", [("auto", {}, 2, 1), ("cuda", {}, 8, 1),
                                                             ("auto", {"num_gpus": 0.5}, 2, 0.5),
                                                             ("cpu", {}, 2, None), ("auto", {}, 0, None)])
def test_ray_asks_for_one_gpu_per_job(sweep_process, device, remote, count, expected):
    sweep_process.count = count
    cfg = sweep_process.start(ray_config(device, remote))
    assert cfg.hydra.launcher.ray.remote.get("num_gpus") == expected
    assert placement.SWEEP_GPUS_ENV not in os.environ  # Ray sets CUDA_VISIBLE_DEVICES itself


@pytest.mark.parametrize("overrides, count, expected", [
    (["hydra/launcher=ray"], 2, 1),
    (["hydra/launcher=ray", "+hydra.launcher.ray.remote.num_gpus=0.25"], 2, 0.25),
    (["hydra/launcher=ray", "device=cpu"], 2, None),
])
def test_ray_composed_with_the_plugin(sweep_process, overrides, count, expected):
    from foxdqn.errors import ConfigError

    try:
        base = composed(overrides)
    except Exception as exc:  # noqa: BLE001 - the plugin is optional (pip install 'foxdqn[ray]')
        if "Could not find 'hydra/launcher/ray'" in str(exc) or isinstance(exc, ConfigError):
            pytest.skip("hydra-ray-launcher is not installed")
        raise
    sweep_process.count = count
    cfg = sweep_process.start(base)
    assert cfg.hydra.launcher.ray.remote.get("num_gpus") == expected
    assert OmegaConf.to_container(cfg.hydra.launcher.ray.remote, resolve=True) == ({} if expected is None else
                                                                                  {"num_gpus": expected})
