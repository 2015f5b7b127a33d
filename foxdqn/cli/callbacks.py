"""Hydra callbacks of ``python -m foxdqn.train`` (registered in conf/train.yaml under
``hydra.callbacks``): checks and settings that must happen before Hydra makes a folder or
starts a job, and the report after the last one.

* :class:`CheckOutputFolder`: the run (or sweep) folder can be made, else one line and exit 2;
  Hydra writes no ``.hydra/`` copy into a run folder that holds a run, or that a resume continues.
* :class:`CheckJobs`: every job of a ``--multirun`` of Hydra's basic sweeper is composed (Hydra's
  compose API, so ``--config-dir``, ``--config-name`` and ``hydra.searchpath`` count) and checked
  (:func:`foxdqn.config.schema.finalize`, :func:`foxdqn.job.check.preflight`) before the first one runs: a
  bad job ends the sweep with one line naming it, exit 2, and no sweep folder. Other sweepers
  (Optuna, ...) choose their jobs as they go; their jobs are checked one by one as they start.
* :class:`PlaceJobsOnGpus`: a ``--multirun`` with the joblib or Ray launcher on CUDA gets one GPU
  per job (:mod:`foxdqn.cli.placement`).
* :class:`SweepReport`: after the last job of a ``--multirun``, the sweep's report
  (:mod:`foxdqn.report.tables`).
"""
from __future__ import annotations

import itertools
import logging
import os
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from foxdqn.cli import placement
from foxdqn.config.compose import sweep_composer
from foxdqn.errors import FoxdqnError
from foxdqn.job.check import preflight
from foxdqn.job.failure import NEW_PARENTS
from foxdqn.run.folder import previous_outputs

_log = logging.getLogger(__name__)


def _fail(message: str) -> None:
    print(f"foxdqn: error: {message}", file=sys.stderr)
    sys.exit(2)


def check_output_parent(target: Path, key: str) -> None:
    """Exit 2 with one line unless the nearest existing ancestor of ``target`` is a writable folder
    (Hydra would otherwise fail to make it with a traceback); ``key`` is the setting to change."""
    target = Path(target).expanduser().absolute()
    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        _fail(f"output folder {target}: {probe} is a file, not a folder; choose another {key}")
    if not os.access(probe, os.W_OK | os.X_OK):
        _fail(f"output folder {target}: {probe} is not writable; choose another {key}")


#: The run folders of this process's single runs that existed before Hydra made them (resolved paths).
_EXISTED: set[Path] = set()


def existed_before(run_dir: Path) -> bool:
    """``run_dir`` existed before this call of ``python -m foxdqn.train`` started (a multirun's job
    folders and folders not seen by :class:`CheckOutputFolder` count as existing)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.RUN:
        return True
    return Path(run_dir).resolve() in _EXISTED


class CheckOutputFolder(Callback):
    """Before a run or a sweep: its output folder can be made (:func:`check_output_parent`); the
    folders above a run folder that Hydra is about to make are noted in :data:`NEW_PARENTS`.

    Before a single run into a folder that exists: when the folder holds a run
    (:func:`foxdqn.run.folder.previous_outputs`) or the call resumes (``resume`` set) and the folder
    has a ``.hydra/``, ``hydra.output_subdir`` is set to null for this call, so Hydra's copy of the
    config there stays the one of the call that started the run: a refused call changes nothing in
    another run's folder, and ``resume=auto`` of a run killed before its record reads the start."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        from omegaconf import read_write

        target = self._check(config, "hydra.run.dir")
        NEW_PARENTS.clear()
        parent = target.parent if target is not None else None
        while parent is not None and not parent.exists() and parent != parent.parent:
            NEW_PARENTS.append(parent)
            parent = parent.parent
        if target is None or not target.is_dir():
            return
        _EXISTED.add(target.resolve())
        resumes = OmegaConf.select(config, "resume", default=None) is not None
        if previous_outputs(target) or (resumes and (target / ".hydra").is_dir()):
            with read_write(config.hydra):
                config.hydra.output_subdir = None

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self._check(config, "hydra.sweep.dir")

    @staticmethod
    def _check(config: DictConfig, key: str) -> Path | None:
        try:
            target = OmegaConf.select(config, key)
        except Exception:  # noqa: BLE001 - an interpolation only Hydra's job context resolves
            return None
        if not target:
            return None
        check_output_parent(Path(str(target)), key)
        return Path(str(target)).expanduser().absolute()


def sweep_jobs(config: DictConfig) -> list[list[str]] | None:
    """The override lists of the jobs of a basic-sweeper multirun (``hydra.sweeper.params`` and
    the command line's ``a=1,2 b=x,y``, ``range(...)``, ``glob(...)``), or None for another sweeper
    or a sweep it cannot list (intervals)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType

    if not str(OmegaConf.select(config, "hydra.sweeper._target_", default="")).endswith("BasicSweeper"):
        return None
    params = OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}
    task = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)  # "a=${...}" stays as written
    given = [f"{k}={v}" for k, v in params.items()] + list(task)
    try:
        columns: dict[str, list[str]] = {}
        for o in OverridesParser.create().parse_overrides(given):
            key = o.get_key_element()
            if not o.is_sweep_override():
                columns[key] = [f"{key}={o.get_value_element_as_str()}"]
            elif o.value_type == ValueType.GLOB_CHOICE_SWEEP:  # head=glob(*): the group's options that match
                options = GlobalHydra.instance().config_loader().get_group_options(o.key_or_group)
                columns[key] = [f"{key}={v}" for v in o.value().filter(options)]
            elif o.is_discrete_sweep():
                columns[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
            else:
                return None
    except Exception:  # noqa: BLE001 - a syntax Hydra reports itself
        return None
    return [list(job) for job in itertools.product(*columns.values())]


class CheckJobs(Callback):
    """Before the first job of a basic-sweeper ``--multirun``: compose and check every job."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        jobs = sweep_jobs(config)
        hydra_overrides = OmegaConf.to_container(config.hydra.overrides.hydra, resolve=False)
        searchpath = [o for o in hydra_overrides if o.lstrip("+~").startswith("hydra.searchpath")]
        compose = sweep_composer(config.hydra.job.config_name)  # one compose per structure, shared with the launcher
        for job in jobs or []:
            plain = [o for o in job if not o.lstrip("+~").startswith(("hydra.", "hydra/"))]
            try:
                preflight(compose(searchpath + plain))
            except FoxdqnError as exc:
                _fail((f"job {' '.join(job)}: " if len(jobs) > 1 else "") + str(exc))


class PlaceJobsOnGpus(Callback):
    """Before a ``--multirun`` with ``hydra/launcher=joblib`` or ``ray`` whose run is on CUDA
    (``device`` not ``cpu``, and this process sees a GPU): one GPU per job (docs/usage.md#gpus-of-parallel-jobs).

    * joblib: exports the sweep's GPU ids as ``FOXDQN_SWEEP_GPUS`` (:data:`foxdqn.cli.placement.SWEEP_GPUS_ENV`)
      for the worker processes, which claim one each (:func:`foxdqn.cli.placement.place_sweep_job`), and
      sets ``hydra.launcher.n_jobs`` to the number of GPUs when it is the plugin's default, -1, and the
      command line does not name it.
    * Ray: sets ``hydra.launcher.ray.remote.num_gpus=1`` unless it is given (Ray then sets each job's
      ``CUDA_VISIBLE_DEVICES`` and starts a fresh worker process for each GPU task).

    Hydra 1.3 calls ``on_multirun_start`` with the composed config before the sweeper instantiates
    the launcher from it (``hydra._internal.hydra.Hydra.multirun``), so the launcher reads what is
    set here. A CPU sweep changes nothing and exports nothing.
    """

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        os.environ.pop(placement.SWEEP_GPUS_ENV, None)  # an outer process's value never reaches our workers
        kind = placement.launcher_kind(OmegaConf.select(config, "hydra.launcher._target_", default=None))
        if kind is None or OmegaConf.select(config, "device", default="auto") == "cpu":
            return
        gpus = placement.visible_gpus(os.environ, placement.gpu_count())
        if not gpus:
            return
        launcher = config.hydra.launcher
        if kind == "joblib":
            given = any(o.split("=", 1)[0].lstrip("+~") == "hydra.launcher.n_jobs"
                        for o in config.hydra.overrides.hydra)
            if launcher.n_jobs == -1 and not given:
                launcher.n_jobs = len(gpus)
            os.environ[placement.SWEEP_GPUS_ENV] = ",".join(gpus)
            _log.info("GPU placement: %d GPU(s) %s, n_jobs=%s, each joblib worker keeps one GPU",
                      len(gpus), ",".join(gpus), launcher.n_jobs)
        elif OmegaConf.select(launcher, "ray.remote.num_gpus", default=None) is None:
            with open_dict(launcher):
                launcher.ray.remote.num_gpus = 1
            _log.info("GPU placement: Ray gives each job one GPU (hydra.launcher.ray.remote.num_gpus=1)")


class SweepReport(Callback):
    """Hydra callback: at the end of a ``--multirun``, write and print the report of the jobs this
    multirun ran (:func:`foxdqn.report.tables.write_report`; a sweep folder reused from an earlier
    multirun does not mix its old jobs in, when the launcher runs the jobs in this process, like
    Hydra's basic launcher). A report that cannot be written is one warning line; the multirun's
    exit code stays that of its jobs. The report's module (pandas, plots) is imported at the end,
    not when Hydra instantiates the callback: a sweep of runs without market data never loads pandas
    before its last job ends."""

    def __init__(self) -> None:
        self.job_dirs: list[Path] = []

    def on_job_end(self, config, job_return=None, **kwargs) -> None:
        self.job_dirs.append(Path(str(config.hydra.runtime.output_dir)))

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if not sweep_dir.is_dir():
            return
        from foxdqn.report.tables import console_text, write_report

        try:
            report = write_report(sweep_dir, self.job_dirs or None)
        except Exception as exc:  # noqa: BLE001 - the jobs are done; their results stay in their folders
            print(f"foxdqn: warning: the sweep report was not written: {exc}", file=sys.stderr)
            return
        print(console_text(report))
