"""``python -m foxdqn.train [+experiment=NAME] [overrides] [--multirun ...]``.

Hydra parses the command line and composes ``conf/train.yaml`` (:func:`foxdqn.config.compose.conf_folder`;
``--config-dir DIR`` and ``hydra.searchpath=[file://DIR]`` add a folder of the user's own, and
``--config-name`` picks a primary config there: docs/configuration.md).
The task function validates the config, checks the data and everything else before any work
(:func:`foxdqn.job.check.preflight`) and hands the job over: to :func:`foxdqn.job.run.run_job`, or
to the population launcher's collection (``hydra/launcher=population``). A ``--multirun`` checks
every job first (:class:`foxdqn.cli.callbacks.CheckJobs`); a job of a joblib sweep on CUDA first
takes a GPU of its own (:mod:`foxdqn.cli.placement`). Bad input (an unknown key, a wrong type, an
invalid value, a bad data file) ends with one line on stderr, exit code 2 and no run folder; a
halt raised by an on-device guard ends with exit code 3 after the last good weights are saved;
SIGINT/SIGTERM with a checkpoint and exit code 130/143 (:mod:`foxdqn.job.failure`). docs/usage.md
lists every outcome.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path


def _outside_training(signum, frame) -> None:
    """SIGINT/SIGTERM outside the training loop (start-up, evaluation): one line, then the process
    ends at once with 128 + signal (``os._exit`` after flushing stdout and stderr). Not
    ``sys.exit``: a SystemExit raised by a handler inside an import can be swallowed or leave
    half-imported modules failing with another message and exit status. Nothing needs cleaning up:
    files are written atomically, the folder's lock goes with the process, and ``resume=auto``
    continues or starts over what was interrupted. The training loop installs its own handlers
    (stop after the iteration, with a checkpoint)."""
    message = (f"foxdqn: error: interrupted by {signal.Signals(signum).name} outside training; checkpoints "
               "already written are kept\n")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        os.write(2, message.encode())
    except OSError:
        pass
    os._exit(128 + signum)


if __name__ == "__main__":  # python -m foxdqn.train: from here on a signal gets its one line, imports included
    for _sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(_sig, _outside_training)

import hydra  # noqa: E402 - after the signal handlers: these imports take seconds
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from foxdqn.cli.callbacks import existed_before  # noqa: E402
from foxdqn.cli.fast_exit import exit_worker_without_teardown  # noqa: E402
from foxdqn.cli.placement import launcher_kind, place_sweep_job  # noqa: E402
from foxdqn.config.compose import conf_folder  # noqa: E402
from foxdqn.config.schema import composition_error, finalize, validate  # noqa: E402
from foxdqn.errors import FoxdqnError  # noqa: E402
from foxdqn.job.check import preflight  # noqa: E402
from foxdqn.job.failure import FAILED_JOBS, fail, job_failed, remove_if_unused  # noqa: E402
from foxdqn.job.run import run_job  # noqa: E402
from foxdqn.population.jobs import COLLECTOR, Member  # noqa: E402
from foxdqn.run.search import sweep_folder  # noqa: E402
from foxdqn.timings import mark  # noqa: E402


#: True once a task function has started: a Hydra/OmegaConf error before it is bad input (one line,
#: exit 2), after it a bug (its traceback).
_TASK_STARTED = False


@hydra.main(version_base="1.3", config_path=str(conf_folder()), config_name="train")
def _run(cfg: DictConfig) -> float | None:
    global _TASK_STARTED
    _TASK_STARTED = True
    mark("compose")  # Hydra composed the config and made the run folder
    _place_on_gpu()  # first: finalize() below initialises CUDA (torch.cuda.is_available())
    from foxdqn.run.resume import given_keys, resolve_resume  # start-up: checkpoints and the loggers, off --help's path

    hydra_dir = Path(HydraConfig.get().runtime.output_dir)
    run_dir, payload, run_id = hydra_dir, None, None
    try:
        resuming = cfg.get("resume") is not None  # a resume's composed config is not the run's: checked after
        tc = finalize(cfg, warn=not resuming, check=not resuming)
        if tc.resume is not None:  # the run's own settings, from its start record
            composed = tc
            tc, run_dir, payload, run_id = resolve_resume(tc, hydra_dir, given_keys(HydraConfig.get().overrides.task),
                                                          existed=existed_before(hydra_dir))
            if tc is composed:  # no run there: this call's config starts, checked and warned about as any start
                tc = finalize(cfg)
            else:
                validate(tc)  # the run's config with the keys this call may change
        mark("validate")
        market = preflight(tc)
        mark("preflight")
    except FoxdqnError as exc:
        remove_if_unused(hydra_dir)
        return job_failed(str(exc), 2)
    if COLLECTOR.active:  # hydra/launcher=population trains the checked job later, in a group
        job = HydraConfig.get()
        COLLECTOR.add(Member(tc, market, run_dir, int(job.job.num), [str(o) for o in job.overrides.task], payload,
                             run_id, sweep_dir=sweep_folder(job)))
        return None
    return run_job(tc, market, run_dir, payload, run_id)


def _place_on_gpu() -> None:
    """A job of a joblib sweep on GPUs takes its worker process's GPU (``CUDA_VISIBLE_DEVICES``,
    :func:`foxdqn.cli.placement.place_sweep_job`) and logs one line naming it; a job of a Ray sweep that
    asked Ray for GPUs (``hydra.launcher.ray.remote.num_gpus``) logs the GPUs Ray gave it; anything
    else is left as it is. A slot folder that cannot be used costs a warning: the job then sees
    every GPU."""
    import logging

    from hydra.types import RunMode

    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return
    exit_worker_without_teardown()  # a joblib worker ends without Python's teardown (nanobind's leak lines)
    log = logging.getLogger("foxdqn.cli.placement")
    try:
        claim = place_sweep_job(OmegaConf.select(hc, "launcher._target_", default=None))
    except OSError as exc:
        log.warning("job %s: no GPU placement, the job sees every GPU of the sweep: %s", hc.job.num, exc)
        return
    if claim is not None:
        log.info("job %s: GPU %s (CUDA_VISIBLE_DEVICES=%s, held by worker process %d for all its jobs)",
                 hc.job.num, claim.gpu, claim.gpu, os.getpid())
    elif launcher_kind(OmegaConf.select(hc, "launcher._target_", default=None)) == "ray" and _ray_gpus():
        log.info("job %s: GPU %s (CUDA_VISIBLE_DEVICES=%s, set by Ray in worker process %d)", hc.job.num,
                 ",".join(_ray_gpus()), os.environ.get("CUDA_VISIBLE_DEVICES"), os.getpid())


def _ray_gpus() -> list[str]:
    """The GPU ids Ray gave this task (``ray.get_gpu_ids()``), [] outside a Ray worker."""
    try:
        import ray
    except ImportError:
        return []
    return [str(g) for g in ray.get_gpu_ids()] if ray.is_initialized() else []


def main() -> None:
    """The console entry point: Hydra's ``main`` with errors of composition (before any task runs)
    turned into one line and exit code 2."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from foxdqn.device.triton_key import start as start_triton_key
    from hydra_plugins.foxdqn_population.population_launcher import register
    from hydra_plugins.foxdqn_population.sweeper import register as register_sweeper

    register()  # hydra/launcher=population, also where Hydra's plugin scan misses it (an editable install)
    register_sweeper()  # hydra/sweeper=basic (the default) checks each batch once per structure
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _outside_training)
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing a multi-line report and exit 1
    mark("imports")
    start_triton_key()  # Triton's first launch hashes its install: done in the background while Hydra composes
    try:
        _run()
    except (HydraException, OmegaConfBaseException) as exc:
        if _TASK_STARTED:
            raise
        fail(composition_error(exc))
    except ValueError as exc:  # Optuna's study.best_trial when no trial counted (hydra-optuna-sweeper's end)
        if not (_TASK_STARTED and "No trials are completed yet" in str(exc)):
            raise
        fail("no trial of the search counted: every trial was pruned, failed or never traded on val "
              "(search.exclude_no_trades); each job's folder has its results (python -m foxdqn.report DIR)", 1)
    if FAILED_JOBS:  # a multirun whose jobs did not all finish
        print(f"foxdqn: error: {len(FAILED_JOBS)} job(s) of the multirun failed (see above and report.md)",
              file=sys.stderr)
        sys.exit(max(code for code, _ in FAILED_JOBS))


if __name__ == "__main__":  # python -m foxdqn.train: run main, then exit without the interpreter's
    from foxdqn.cli.fast_exit import run_as_program  # teardown (foxdqn.cli.fast_exit)
    from foxdqn.train import main as _main  # (the imported module's: one Hydra task function per process)

    run_as_program(_main)
