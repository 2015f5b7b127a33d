"""``hydra/launcher=population``: a multirun's jobs trained in this process, as populations.

Registered in Hydra's ConfigStore as ``hydra/launcher/population`` when this module is imported:
by Hydra's plugin scan of the ``hydra_plugins`` namespace package, and by ``python -m foxdqn.train``
(:func:`register`, for installs the scan cannot list). It imports only Hydra at import time (every
Hydra application in the environment scans it); foxdqn is imported when a multirun launches.
docs/usage.md#a-sweep-in-one-process-hydralauncherpopulation.
"""
# No `from __future__ import annotations` here: Hydra's plugin scan runs this module before it is in
# sys.modules, where dataclasses cannot resolve string annotations.
import importlib
import logging
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import (JobReturn, JobStatus, configure_log, env_override, filter_overrides, run_job,
                              setup_globals)
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)


@dataclass
class PopulationLauncherConf:
    """``hydra/launcher=population``'s settings.

    Attributes:
        max_members: the most members one population holds (a larger group of equal settings is
            split in job order); null: no limit.
        n_jobs: populations trained at once, each in a worker process on a GPU of its own; null:
            the number of GPUs the sweep sees when the run is on CUDA (1 on CPU); 1: all in this
            process, one after another.
    """

    _target_: str = "hydra_plugins.foxdqn_population.population_launcher.PopulationLauncher"
    max_members: Optional[int] = None
    n_jobs: Optional[int] = None


ConfigStore.instance().store(group="hydra/launcher", name="population", node=PopulationLauncherConf,
                             provider="foxdqn")


def register() -> None:
    """Register :class:`PopulationLauncher` with Hydra's plugins (``python -m foxdqn.train`` calls
    this before Hydra starts). Hydra finds plugins by listing the ``hydra_plugins`` folders with
    pkgutil, which cannot list a package that an editable install (``pip install -e``, setuptools
    >= 64) serves through an import hook: there the scan misses this module although it imports.
    Registering twice is harmless."""
    from hydra.core.plugins import Plugins

    Plugins.instance().register(PopulationLauncher)  # the module's class now (a scan may have re-run this module)


class PopulationLauncher(Launcher):
    """Hydra launcher that trains the jobs of each ``launch()`` in this process, grouped into
    populations (foxdqn.population): jobs whose configs differ only in the seed and scalar
    hyperparameters (foxdqn.population.grouping.MEMBER_KEYS) train together as the members of one
    population, one captured iteration for all of them.

    Why a launcher and not a sweeper: a sweeper chooses the jobs, a launcher runs the jobs it is
    given. As a launcher it composes with every sweeper: Hydra's basic sweeper hands it the lists
    and ranges of a ``--multirun`` (all jobs in one call unless ``hydra.sweeper.max_batch_size`` is
    set), and Optuna's sweeper hands it each batch of ``hydra.sweeper.n_jobs`` trials (Optuna calls
    ``launch()`` once per batch, so a batch becomes one population). A population sweeper would
    replace those sweepers instead of working with them.

    ``launch(job_overrides, initial_job_idx)`` does, for the jobs of that call:

    1. like Hydra's basic launcher, a job is composed and run through ``run_job`` (its folder,
       its ``.hydra/`` files and its log), with foxdqn's task function in collection mode
       (foxdqn.population.jobs.COLLECTOR): the job is validated and preflighted as in any run
       (a refused job returns NaN and is reported as today), then recorded instead of trained.
       A job that differs from one composed so only in values of plain keys (``seed=3``,
       ``optim.lr=1e-3``: :meth:`foxdqn.config.compose.JobComposer.value_changes`) is derived from it
       instead, without Hydra (:class:`_Derived`): its config from the multirun's composer (shared
       with the check of every job), the same checks, its folder and ``.hydra/`` files written
       directly, its callbacks run with a small config naming its folder; so the host's cost per
       job does not grow with a Hydra composition per job;
    2. the recorded jobs are grouped (foxdqn.population.grouping.plan, ``max_members``); a group
       of one, or a job the population trainer does not support (grouping.batch_refusal), trains
       alone (foxdqn.job.run.run_job: a population of one, as foxdqn.train trains a single run), a larger group by
       ``foxdqn.population.train.train_population``, with one log line per group;
    3. each job's ``JobReturn`` gets its value: foxdqn.train.objective of its summary, or NaN and
       an entry in foxdqn.train's failed jobs (so ``python -m foxdqn.train`` exits with the worst
       code). Returns them in job order.

    While a job trains its Hydra config is the current one (HydraConfig) and its log file gets the
    log lines; while a population trains, the first member's config is current and every member's
    log file gets the population's lines. ``on_job_start`` callbacks run as the job is composed;
    ``on_job_end`` of a job that trains later runs after it has trained, with its value (so the
    sweep report sees finished folders). ``hydra.job.chdir=true`` applies to a job trained alone;
    a population trains in the launching folder.

    With several GPUs (``n_jobs``, default: one per GPU the sweep sees on CUDA) and several
    populations, step 2 trains the populations in worker processes, one per GPU
    (foxdqn.population.worker; ``CUDA_VISIBLE_DEVICES`` set to its GPU, the populations dealt out
    by member count, largest first, to the least-loaded worker); the jobs that train alone then
    run in this process.

    Args:
        max_members: the most members of one population (None: no limit).
        n_jobs: populations trained at once, one GPU each (None: one per visible GPU on CUDA).
    """

    def __init__(self, max_members: Optional[int] = None, n_jobs: Optional[int] = None) -> None:
        super().__init__()
        self.max_members, self.n_jobs = max_members, n_jobs
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Keep the multirun's context. A ``max_members`` below 1 ends the multirun with one line and
        exit code 2 before any job folder is made."""
        for key, value in (("max_members", self.max_members), ("n_jobs", self.n_jobs)):
            if value is not None and value < 1:
                print(f"foxdqn: error: hydra.launcher.{key}={value} must be >= 1 (or null: "
                      f"{'no limit' if key == 'max_members' else 'one per GPU'})", file=sys.stderr)
                sys.exit(2)
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Run the jobs ``job_overrides`` (numbered from ``initial_job_idx``) as the class docstring
        says; returns their JobReturns in job order."""
        from foxdqn.job.memory import memory_cap
        from foxdqn.population.grouping import plan
        from foxdqn.population.jobs import COLLECTOR
        from foxdqn.timings import CLOCK

        setup_globals()
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        log.info(f"Checking {len(job_overrides)} jobs, then training them in populations in this process")
        callbacks = _JobEndAfterTraining(self.hydra_context.callbacks, COLLECTOR)
        context = HydraContext(config_loader=self.hydra_context.config_loader, callbacks=callbacks)
        jobs: Dict[int, Tuple[DictConfig, JobReturn]] = {}
        derived = _Derived(self.config, callbacks, self.task_function)
        started = time.perf_counter()
        with COLLECTOR.collecting():
            try:
                for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
                    log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")  # every job, as Hydra's launchers
                    job = derived.collect(idx, list(overrides))
                    if job is not None:
                        jobs[idx] = job
                        continue
                    sweep_config = self._compose(idx, list(overrides))
                    jobs[idx] = sweep_config, run_job(hydra_context=context, task_function=self.task_function,
                                                      config=sweep_config, job_dir_key="hydra.sweep.dir",
                                                      job_subdir_key="hydra.sweep.subdir")
                    derived.learn(idx, list(overrides), sweep_config)
                    configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
            except BaseException:
                derived.wait(check=False)  # no folder is left half written behind the error
                raise
            derived.wait()  # every job folder holds its .hydra/ files before any is opened
        if derived.count:
            log.info(f"{len(job_overrides)} jobs checked in {time.perf_counter() - started:.1f} s: {derived.count} "
                     f"derived from the {len(job_overrides) - derived.count} Hydra composed")
        CLOCK.mark("compose")  # every job composed and checked
        _refuse_shared_folders(COLLECTOR.members)
        groups = plan(COLLECTOR.members, self.max_members, cap=memory_cap)
        populations = [g for g in groups if len(g) > 1]
        gpus = self._worker_gpus(populations)
        if len(gpus) > 1:
            self._train_in_workers(populations, gpus, jobs)
            for member in (m for g in populations for m in g):
                callbacks.release(member.job_num, jobs[member.job_num][1])
            groups = [g for g in groups if len(g) == 1]
        trained = len(populations) if len(gpus) > 1 else 0  # populations this process (or its workers) trained
        for group in groups:
            if len(group) == 1 and not _continues_population(group[0]):
                self._train_alone(group[0], *jobs[group[0].job_num])
            else:
                self._train_population(group, jobs)
                trained += 1
            for member in group:
                callbacks.release(member.job_num, jobs[member.job_num][1])
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        if trained:  # every job trained alone: each wrote its own timings.json, as a single run
            _write_timings(Path(str(self.config.hydra.sweep.dir)), len(jobs), trained)
        return [ret for _, ret in (jobs[idx] for idx in sorted(jobs))]

    def _compose(self, idx: int, overrides: List[str]) -> DictConfig:
        """Job ``idx``'s whole config through Hydra (``load_sweep_config``; the one the sweeper's check
        composed for these overrides when there is one: :func:`~hydra_plugins.foxdqn_population.sweeper.take_composed`),
        numbered."""
        from hydra_plugins.foxdqn_population.sweeper import take_composed

        sweep_config = take_composed(self.config, overrides)
        if sweep_config is None:
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = idx
            sweep_config.hydra.job.num = idx
        return sweep_config

    def _full(self, config: DictConfig) -> DictConfig:
        """``config`` itself, or for a derived job's small config (:func:`_is_light`) its whole
        config composed now through Hydra, with its folder as ``hydra.runtime.output_dir`` (a job
        that trains alone, or a population's first member, whose config becomes Hydra's current)."""
        if not _is_light(config):
            return config
        full = self._compose(int(config.hydra.job.num), list(config.hydra.overrides.task))
        with open_dict(full):
            full.hydra.runtime.output_dir = str(config.hydra.runtime.output_dir)
        return full

    def _worker_gpus(self, populations: List[Any]) -> List[str]:
        """The GPUs of the worker processes (one each): none (train here) unless the run is on CUDA,
        there are two or more populations and ``n_jobs`` allows two or more."""
        from foxdqn.cli.placement import gpu_count, visible_gpus

        from foxdqn.step.build import resolve_device

        if len(populations) < 2 or self.n_jobs == 1:
            return []
        if resolve_device(str(populations[0][0].tc.device)).type != "cuda":
            if self.n_jobs is not None:
                log.info(f"hydra.launcher.n_jobs={self.n_jobs}: worker processes are for GPUs; on CPU the "
                         f"{len(populations)} populations train one after another in this process")
            return []
        ids = visible_gpus(os.environ, gpu_count())
        return ids[:min(self.n_jobs or len(ids), len(ids), len(populations))]

    def _train_in_workers(self, populations: List[Any], gpus: List[str],
                          jobs: Dict[int, Tuple[DictConfig, JobReturn]]) -> None:
        """Deal ``populations`` out to one worker process per GPU (largest first, to the worker with
        the fewest members), wait for all, then set every member's JobReturn."""
        import pickle
        import shutil
        import subprocess

        from foxdqn.io_atomic import write_bytes_atomic

        share = deal(populations, len(gpus))
        folder = Path(str(self.config.hydra.sweep.dir)) / ".population-workers"
        folder.mkdir(parents=True, exist_ok=True)
        procs = []
        for k, (gpu, mine) in enumerate(zip(gpus, share)):
            src, out = folder / f"{k}.in", folder / f"{k}.out"
            write_bytes_atomic(src, pickle.dumps(mine))
            log.info(f"worker {k} on GPU {gpu}: populations of jobs "
                     + "; ".join(", ".join(str(m.job_num) for m in g) for g in mine))
            procs.append(subprocess.Popen([sys.executable, "-m", "foxdqn.population.worker", str(src), str(out)],
                                          env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu}))
        codes = [p.wait() for p in procs]
        for k, (mine, code) in enumerate(zip(share, codes)):
            out = folder / f"{k}.out"
            results = pickle.loads(out.read_bytes()) if out.is_file() else []
            for i, group in enumerate(mine):
                result = results[i] if i < len(results) else f"worker {k} exited with code {code} before this population ended"
                for j, member in enumerate(group):
                    config, ret = jobs[member.job_num]
                    if isinstance(result, str):
                        _set_result(ret, lambda result=result: _raise(RuntimeError(result)))
                        continue
                    with _as_job(config, logs=False):
                        _set_result(ret, lambda member=member, outcome=result[j]: _member_value(member, outcome))
        shutil.rmtree(folder, ignore_errors=True)

    def _train_alone(self, member: Any, config: DictConfig, ret: JobReturn) -> None:
        """One job alone (foxdqn.job.run.run_job: a population of one), as the basic launcher would run it."""
        from foxdqn.population.grouping import batch_refusal
        from foxdqn.timings import CLOCK
        from foxdqn.job.run import run_job

        why = batch_refusal(member.tc)
        with _as_job(self._full(config)):
            log.info(f"job {member.job_num} trains alone" + (f" ({why})" if why else ""))
            # this job's timings.json counts from here, not from the launcher's start or an earlier group;
            # the sweep's own breakdown (timings.json of the sweep) goes on after it, the job as one phase
            CLOCK.mark("launcher")
            sweep = (CLOCK.start, CLOCK.origin, dict(CLOCK.phases), CLOCK.last)
            CLOCK.restart("population launcher: this job's training")
            try:
                _set_result(ret, lambda: run_job(member.tc, member.market, member.run_dir, member.payload,
                                                   member.run_id))
            finally:
                CLOCK.start, CLOCK.origin, CLOCK.phases, CLOCK.last = sweep
                CLOCK.mark("jobs_alone")

    def _train_population(self, group: List[Any], jobs: Dict[int, Tuple[DictConfig, JobReturn]]) -> None:
        """``train_population(group)``, then each member's value (or failure) into its JobReturn. A
        trainer that raises fails every member's JobReturn with its exception (the sweeper raises
        it, as for a job of the basic launcher); the other groups still train."""
        configs = [jobs[m.job_num][0] for m in group]
        configs[0] = self._full(configs[0])  # Hydra's current config while the population trains
        with _as_population(configs):
            log.info(f"population of {len(group)} members (jobs {', '.join(str(m.job_num) for m in group)})")
            from foxdqn.errors import StoppedBySignal
            from foxdqn.job.failure import fail

            try:
                train_population = importlib.import_module("foxdqn.population.train").train_population
                outcomes = list(train_population(list(group)))
                if len(outcomes) != len(group):
                    raise RuntimeError(f"train_population returned {len(outcomes)} outcomes for {len(group)} members")
            except StoppedBySignal as exc:  # every member's checkpoint is written: the sweep ends here
                fail(str(exc), exc.exit_code)
            except Exception as exc:  # noqa: BLE001 - a bug: reported through the JobReturns, like run_job
                for m in group:
                    _set_result(jobs[m.job_num][1], lambda exc=exc: _raise(exc))
                return
        for member, outcome in zip(group, outcomes):
            config, ret = jobs[member.job_num]
            with _as_job(config, logs=False):
                _set_result(ret, lambda member=member, outcome=outcome: _member_value(member, outcome))


def _refuse_shared_folders(members: List[Any]) -> None:
    """Exit 2 with one line, before any job trains, when two jobs would write into one output
    folder (a ``hydra.sweep.subdir`` that is not unique per job, e.g. ``${seed}`` with a seed
    listed twice, or two jobs resuming one run): each would otherwise find the other's lock."""
    first: Dict[Path, int] = {}
    for member in members:
        folder = Path(member.run_dir).resolve()
        if folder in first:
            print(f"foxdqn: error: jobs #{first[folder]} and #{member.job_num} would write into one output folder "
                  f"{folder}: give each job a folder of its own (hydra.sweep.subdir; Hydra's default "
                  f"${{hydra.job.num}} is one per job), or resume each run once", file=sys.stderr)
            sys.exit(2)
        first[folder] = member.job_num


def _write_timings(sweep_dir: Path, jobs: int, populations: int) -> None:
    """The sweep's ``timings.json``: wall seconds per phase of this process (foxdqn.timings; its
    origin says where the clock began: process start, or the last job that trained alone), with
    the number of jobs and of populations, and one log line."""
    from foxdqn.io_atomic import write_json_atomic
    from foxdqn.timings import CLOCK, format_line

    CLOCK.mark("summary")
    times = CLOCK.as_dict(jobs=jobs, populations=populations)
    try:
        write_json_atomic(sweep_dir / "timings.json", times)
    except OSError as exc:  # the jobs are complete: a lost breakdown is a warning
        log.warning(f"timings.json not written: {exc}")
    log.info(f"sweep breakdown: {format_line(times)} ({sweep_dir / 'timings.json'})")


def _continues_population(member: Any) -> bool:
    """``member`` resumes from a population member's checkpoint (a population of one continues it)."""
    from foxdqn.population.checkpoint import is_member_state

    return is_member_state(member.payload)


def deal(populations: List[Any], workers: int) -> List[List[Any]]:
    """``populations`` (lists of members) dealt out to ``workers`` lists: largest first, each to the
    worker holding the fewest members so far (the first such worker on ties)."""
    share: List[List[Any]] = [[] for _ in range(workers)]
    for group in sorted(populations, key=len, reverse=True):
        min(share, key=lambda mine: sum(len(g) for g in mine)).append(group)
    return share


def _member_value(member: Any, outcome: Any) -> float:
    """What the task function would have returned for ``member``: the objective of its summary, or
    NaN after the job's failure line. A member's results are not printed one table per job: the
    sweep's report prints one table at the end (foxdqn.cli.callbacks.SweepReport)."""
    from foxdqn.population.jobs import BAD_INPUT, FINISHED
    from foxdqn.job.failure import job_failed, remove_if_unused
    from foxdqn.job.run import objective

    if outcome.exit_code == FINISHED:
        return objective(outcome.summary)
    if outcome.exit_code == BAD_INPUT:
        remove_if_unused(member.run_dir)  # nothing written yet: no folder left behind, as foxdqn.train
    return job_failed(outcome.message, outcome.exit_code, job=member.job_num)


def _raise(exc: BaseException) -> None:
    raise exc


def _set_result(ret: JobReturn, value: Callable[[], Any]) -> None:
    """``ret``'s value from ``value()``; an exception becomes a failed JobReturn (Hydra's run_job)."""
    try:
        ret.return_value = value()
        ret.status = JobStatus.COMPLETED
    except Exception as exc:  # noqa: BLE001 - the sweeper raises it when it reads the value
        ret.return_value = exc
        ret.status = JobStatus.FAILED


@contextmanager
def _as_job(config: DictConfig, logs: bool = True) -> Iterator[None]:
    """``config`` (a job's, after run_job) as the current Hydra config, with (``logs``) its job
    logging, its ``hydra.job.env_set`` and, for ``hydra.job.chdir=true``, its folder as the working
    folder, as during Hydra's run_job."""
    if _is_light(config):  # a derived job's small config: nothing of Hydra's to set (its results need none)
        yield
        return
    saved, cwd = HydraConfig.instance().cfg, os.getcwd()
    HydraConfig.instance().set_config(config)
    try:
        if logs:
            configure_log(config.hydra.job_logging, config.hydra.verbose)
        if config.hydra.job.chdir:
            os.chdir(config.hydra.runtime.output_dir)
        with env_override(dict(config.hydra.job.env_set)):
            yield
    finally:
        os.chdir(cwd)
        HydraConfig.instance().cfg = saved


@contextmanager
def _as_population(configs: List[DictConfig]) -> Iterator[None]:
    """The first member's config current (:func:`_as_job`, in the launching folder) and every
    member's log file receiving the log lines: each log file the first member's logging writes
    inside its job folder gets a twin in every other member's job folder. A line about one member
    (a log record with ``foxdqn_job``, e.g. its final line) goes to that member's file only: one
    handler (:class:`_Twins`) holds the twins and picks the member's by its job number, so a line
    about one member costs the same at any P, and the writes grow with P, not P²."""
    first, *others = configs
    saved, root, routers, filtered = HydraConfig.instance().cfg, logging.getLogger(), [], []
    HydraConfig.instance().set_config(first)
    try:
        configure_log(first.hydra.job_logging, first.hydra.verbose)
        first_dir = Path(os.path.abspath(str(first.hydra.runtime.output_dir)))
        for handler in list(root.handlers):
            if not isinstance(handler, logging.FileHandler):
                continue
            try:
                rel = Path(handler.baseFilename).relative_to(first_dir)
            except ValueError:  # a log file outside the job folder is the same file for every member
                continue
            own = _OneJob(int(first.hydra.job.num))
            handler.addFilter(own)
            filtered.append((handler, own))  # the filter comes off at the end: the handler stays Hydra's
            router = _Twins(handler)
            routers.append(router)  # before the files open: a failure below still closes those opened
            for other in others:
                router.add(int(other.hydra.job.num), Path(str(other.hydra.runtime.output_dir)) / rel)
            root.addHandler(router)
        with env_override(dict(first.hydra.job.env_set)):
            yield
    finally:
        for router in routers:
            root.removeHandler(router)
            router.close()
        for handler, own in filtered:
            handler.removeFilter(own)
        HydraConfig.instance().cfg = saved


class _OneJob(logging.Filter):
    """Passes a log record about job ``job`` (its ``foxdqn_job``) or about no job in particular."""

    def __init__(self, job: int) -> None:
        super().__init__()
        self.job = job

    def filter(self, record: logging.LogRecord) -> bool:
        mine = getattr(record, "foxdqn_job", None)
        return mine is None or mine == self.job


class _Twins(logging.Handler):
    """The other members' twins of one of the first member's log files (``model``: its level,
    formatter and filters): a record about no job in particular goes to every twin; one about job
    N (its ``foxdqn_job``) to job N's twin only (none: a job of another population), found by its
    number, not by asking every twin's filter."""

    def __init__(self, model: logging.FileHandler) -> None:
        super().__init__(level=model.level)
        self.model, self.files = model, {}

    def add(self, job: int, path: Path) -> None:
        """Job ``job``'s twin: the file ``path``, appended to."""
        twin = logging.FileHandler(path, mode="a", encoding=self.model.encoding)
        twin.setLevel(self.model.level)
        twin.setFormatter(self.model.formatter)
        for f in self.model.filters:
            if not isinstance(f, _OneJob):
                twin.addFilter(f)
        self.files[job] = twin

    def handle(self, record: logging.LogRecord) -> bool:
        job = getattr(record, "foxdqn_job", None)
        if job is None:
            for twin in self.files.values():
                twin.handle(record)
            return True
        twin = self.files.get(job)
        return bool(twin is not None and twin.handle(record))

    def emit(self, record: logging.LogRecord) -> None:  # handle() writes through the twins
        raise NotImplementedError

    def close(self) -> None:
        for twin in self.files.values():
            twin.close()
        super().close()


class _JobEndAfterTraining:
    """The callbacks ``run_job`` gets while the launcher collects: ``on_job_start`` as always;
    ``on_job_end`` of a job whose task function handed it over (``collector`` grew) is held until
    the job has trained (:meth:`release`), others (a refused job, a failed one) run at once."""

    def __init__(self, callbacks: Any, collector: Any) -> None:
        self._callbacks, self._collector = callbacks, collector
        self._before = 0
        self._held: Dict[int, Tuple[DictConfig, Dict[str, Any]]] = {}

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._before = len(self._collector.members)
        self._callbacks.on_job_start(config=config, **kwargs)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if len(self._collector.members) > self._before:
            self._held[int(config.hydra.job.num)] = config, kwargs
        else:
            self._callbacks.on_job_end(config=config, job_return=job_return, **kwargs)

    def release(self, job_num: int, job_return: JobReturn) -> None:
        """Run the held ``on_job_end`` of job ``job_num`` with its final ``job_return``."""
        config, kwargs = self._held.pop(job_num)
        if _is_light(config):  # a derived job: its small config names its folder; Hydra's current stays
            self._callbacks.on_job_end(config=config, job_return=job_return, **kwargs)
            return
        saved = HydraConfig.instance().cfg
        HydraConfig.instance().set_config(config)
        try:
            self._callbacks.on_job_end(config=config, job_return=job_return, **kwargs)
        finally:
            HydraConfig.instance().cfg = saved


def _is_light(config: DictConfig) -> bool:
    """``config`` is a derived job's small config (:class:`_Derived`), not Hydra's whole one."""
    return "job_logging" not in config.hydra


class _Derived:
    """Jobs of a multirun collected without Hydra's per-job composition and ``run_job``.

    After a job composed through Hydra has been collected (:meth:`learn`: a job to train, no
    resume, the default ``hydra.sweep.subdir``), a later job whose overrides differ from its
    overrides only in values of plain keys (:meth:`foxdqn.config.compose.JobComposer.value_changes`) is
    collected by :meth:`collect`, as ``run_job`` and foxdqn's task function would, minus the
    composition: its config from the multirun's composer (:func:`foxdqn.config.compose.sweep_composer`,
    which the check of every job filled), ``foxdqn.train.preflight``, its folder
    ``<sweep dir>/<job number>`` with ``.hydra/config.yaml`` (its config as composed, before foxdqn's caps),
    ``overrides.yaml`` and ``hydra.yaml`` (the first job's, with this job's number, folder and
    overrides), the callbacks' ``on_job_start`` and ``on_job_end`` with a small config (the job's
    folder, number and overrides under ``hydra``), and a :class:`~foxdqn.population.jobs.Member`.
    A job this cannot take (bad input included) returns None: the caller runs it through Hydra, which
    reports it as usual. Writing the YAML with libyaml from plain values keeps a job's host cost to
    milliseconds; the files are written on a background thread (:class:`foxdqn.io_pool.IOQueue`)
    while the next jobs are collected, and :meth:`wait` (the launcher, before any job trains)
    waits for them.
    """

    def __init__(self, config: DictConfig, callbacks: Any, task_function: Any) -> None:
        from omegaconf import OmegaConf

        from foxdqn.config.compose import sweep_composer
        from foxdqn.io_pool import IOQueue

        self.composer = sweep_composer(str(config.hydra.job.config_name))
        self.callbacks, self.task_function = callbacks, task_function
        hydra_overrides = OmegaConf.to_container(config.hydra.overrides.hydra, resolve=False)
        self.searchpath = [o for o in hydra_overrides if o.lstrip("+~").startswith("hydra.searchpath")]
        node = config.hydra.sweep._get_node("subdir")
        self.default_subdir = node is not None and node._value() == "${hydra.job.num}"
        # (overrides, config, hydra.yaml, the folder of its job folder, the sweep folder, the first
        # folder resolved) of each base job
        self.bases: List[Tuple[List[str], DictConfig, Any, Path, Optional[Path], Path]] = []
        self.count = 0
        self.writes = IOQueue()  # the jobs' .hydra/ files, written while the next jobs are collected

    def learn(self, idx: int, overrides: List[str], sweep_config: DictConfig) -> None:
        """Job ``idx``, just run through Hydra, becomes a base when it was collected to train."""
        import yaml

        from foxdqn.population.jobs import COLLECTOR

        added = COLLECTOR.members[-1] if COLLECTOR.members else None
        if not self.default_subdir or added is None or added.job_num != idx or added.payload is not None:
            return
        hydra_file = Path(added.run_dir) / ".hydra" / "hydra.yaml"
        if not hydra_file.is_file():
            return
        doc = yaml.load(hydra_file.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        parent = Path(added.run_dir).parent
        self.bases.append((list(overrides), sweep_config, _HydraYaml(doc), parent, added.sweep_dir, parent.resolve()))

    def collect(self, idx: int, overrides: List[str]) -> Optional[Tuple[DictConfig, JobReturn]]:
        """Collect job ``idx`` without Hydra, or None (see the class docstring)."""
        from omegaconf import OmegaConf

        from foxdqn.errors import FoxdqnError
        from foxdqn.population.jobs import COLLECTOR, Member
        from foxdqn.job.check import preflight

        base = next((b for b in self.bases if self.composer.value_changes(overrides, b[0], b[1]) is not None), None)
        if base is None:
            return None
        plain = [o for o in overrides if not o.lstrip("+~").startswith(("hydra.", "hydra/"))]
        try:
            tc = self.composer(self.searchpath + plain)
            if tc.resume is not None:
                return None
            market = preflight(tc)
        except FoxdqnError:
            return None
        run_dir = base[3] / str(idx)
        texts = self._job_files(base[5] / str(idx), self.composer.raw(self.searchpath + plain), overrides, base[2], idx)
        self.writes.submit(_write_texts, run_dir / ".hydra", texts)  # the file system's waits off this thread
        light = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(run_dir)},
                                            "job": {"num": idx, "id": str(idx)},
                                            "overrides": {"task": list(overrides)}}})
        self.callbacks.on_job_start(config=light, task_function=self.task_function)
        COLLECTOR.add(Member(tc, market, run_dir, idx, list(overrides), sweep_dir=base[4]))
        ret = JobReturn(overrides=list(overrides), hydra_cfg=light, working_dir=os.getcwd(),
                        task_name=base[2].task_name, status=JobStatus.COMPLETED)
        ret.return_value = None
        self.callbacks.on_job_end(config=light, job_return=ret)
        self.count += 1
        return light, ret

    def wait(self, check: bool = True) -> None:
        """Every collected job's ``.hydra/`` files are written (``check``: the first failure is raised)."""
        self.writes.wait(check)

    @staticmethod
    def _job_files(run_dir: Path, raw: Any, overrides: List[str], hydra_yaml: "_HydraYaml", idx: int) -> Dict[str, str]:
        """The texts of the job's ``.hydra/`` files as Hydra's run_job writes them: ``config.yaml``
        (``raw``, the job's config as composed, before foxdqn's caps and checks), ``hydra.yaml``
        (``run_dir``: the job's folder, resolved) and ``overrides.yaml``."""
        import yaml

        from foxdqn.config.yaml_text import config_yaml

        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        return {"config.yaml": config_yaml(raw), "hydra.yaml": hydra_yaml.render(idx, overrides, run_dir),
                "overrides.yaml": yaml.dump(list(overrides), Dumper=dumper)}


def _write_texts(folder: Path, texts: Dict[str, str]) -> None:
    """``folder`` (made with its parents) with one file per (name, text) of ``texts``: plain writes, as Hydra's."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (folder / name).write_text(text)


class _HydraYaml:
    """A base job's ``.hydra/hydra.yaml`` as a text template: the job's number, id, folder,
    overrides and ``override_dirname`` (Hydra's rule) filled in per job without dumping the whole
    document again."""

    _FIELDS = ("num", "id", "output_dir", "task", "override_dirname")

    def __init__(self, doc: Dict[str, Any]) -> None:
        import copy

        import yaml

        self.dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        doc = copy.deepcopy(doc)
        job = doc["hydra"]["job"]
        self.task_name = str(job["name"])
        self.dirname = dict(job["config"]["override_dirname"])
        job["num"], job["id"], job["override_dirname"] = (f"FOXDQNSLOT{f}X" for f in ("num", "id", "override_dirname"))
        doc["hydra"]["runtime"]["output_dir"] = "FOXDQNSLOToutput_dirX"
        doc["hydra"]["overrides"]["task"] = "FOXDQNSLOTtaskX"
        self.text = yaml.dump(doc, Dumper=self.dumper, sort_keys=False)

    def render(self, idx: int, overrides: List[str], run_dir: Path) -> str:
        """The hydra.yaml of job ``idx`` with ``overrides`` in folder ``run_dir``."""
        import yaml
        from hydra._internal.config_loader_impl import get_overrides_dirname

        from foxdqn.config.compose import parsed_override

        dirname = get_overrides_dirname(overrides=[parsed_override(o) for o in overrides],
                                        kv_sep=self.dirname["kv_sep"], item_sep=self.dirname["item_sep"],
                                        exclude_keys=list(self.dirname["exclude_keys"]))
        values = {"num": idx, "id": str(idx), "output_dir": str(run_dir), "task": list(overrides),
                  "override_dirname": dirname}
        text = self.text
        for field in self._FIELDS:
            scalar = yaml.dump(values[field], Dumper=self.dumper, default_flow_style=True, width=1 << 30)
            text = text.replace(f"FOXDQNSLOT{field}X", scalar.rstrip("\n").removesuffix("\n...").removesuffix("..."))
        return text
