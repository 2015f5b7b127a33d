"""``python -m foxdqn.train [+experiment=NAME] [overrides] [--multirun ...]``.

Hydra parses the command line and composes ``conf/train.yaml`` (:func:`foxdqn.compose.conf_folder`;
``--config-dir DIR`` and ``hydra.searchpath=[file://DIR]`` add a folder of the user's own, and
``--config-name`` picks a primary config there: docs/configuration.md).
The task function validates the config and the data once, before any work; trains; evaluates on
the test split and prints where the outputs are. A ``--multirun`` checks every job first
(:class:`foxdqn.hydra_callbacks.CheckJobs`); a job of a joblib sweep on CUDA first takes a GPU of
its own (:mod:`foxdqn.placement`). Bad input (an unknown key, a wrong type, an invalid value, a
bad data file) ends with one line on stderr, exit code 2 and no run folder; a halt raised by an
on-device guard ends with exit code 3 after the last good weights are saved; SIGINT/SIGTERM with a
checkpoint and exit code 130/143. docs/usage.md lists every outcome.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path


def _fail(message: str, code: int = 2) -> None:
    print(f"foxdqn: error: {message}", file=sys.stderr)
    sys.exit(code)


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

from foxdqn.config import TrainConfig, finalize  # noqa: E402
from foxdqn.compose import conf_folder  # noqa: E402
from foxdqn.errors import ConfigError, FoxdqnError, HaltError  # noqa: E402
from foxdqn.population.jobs import COLLECTOR, Member  # noqa: E402
from foxdqn.timings import mark  # noqa: E402


def preflight(tc: TrainConfig):
    """What can be checked before any work, beyond the config itself (a resume's checkpoint is
    checked by :func:`foxdqn.resume.resolve_resume`): the data loads and is valid, a Gymnasium env exists with a Discrete action space
    that the encoder can read, the replay memory fits, for ``logger=mlflow`` mlflow is installed
    and its store opens, for ``logger=wandb`` wandb is installed (and logged in when online), for
    ``search.pruner=median`` optuna is installed, and the Prometheus port (``logger.prometheus.port``) can be bound now.
    Returns the market data (None for envs other than trading).

    Raises:
        FoxdqnError: ConfigError or DataError, naming the key, file or row.
    """
    from foxdqn.replay.buffer import replay_bytes

    if tc.logger.mlflow:
        from foxdqn.monitor.mlflow_log import check_store

        try:
            check_store(tc.logger.mlflow_uri)
        except ImportError as exc:
            raise ConfigError(str(exc)) from None
        except ValueError as exc:
            raise ConfigError(f"logger.mlflow_uri: the MLflow store {exc}") from None
    if tc.logger.wandb:
        from foxdqn.monitor.wandb_log import check

        try:
            check(str(tc.logger.wandb_mode))
        except (ImportError, PermissionError) as exc:
            raise ConfigError(str(exc)) from None
    if tc.search.pruner == "median":
        try:
            import optuna  # noqa: F401
        except ImportError:
            raise ConfigError("search.pruner=median needs optuna: pip install 'foxdqn[sweep]' (or pip install "
                              "optuna)") from None
    if tc.logger.prometheus.port is not None:  # a port in use fails here, before any folder is made
        from foxdqn.monitor.prometheus_log import probe

        try:
            probe(tc.logger.prometheus.port, tc.logger.prometheus.addr)
        except OSError as exc:
            raise tc.logger.prometheus.bind_error(exc) from None
    mark("preflight")
    market = market_data(tc)
    mark("data_load")
    itemsize = 4
    if tc.env.name == "gym":  # unknown id / non-Discrete actions fail here
        import math

        from foxdqn.envs.gym_adapter import describe
        from foxdqn.step.build import check_encoder

        spaces = describe(tc.env)
        check_encoder(tc.model.encoder, spaces["obs_shape"], tc.env.id)
        obs_dim, itemsize = math.prod(spaces["obs_shape"]), spaces["obs_dtype"].itemsize
    else:
        obs_dim, itemsize = replay_row(tc, market)
    need, free = replay_bytes(tc.replay.capacity, obs_dim, itemsize, tc.regime.enabled), available_bytes(tc.device)
    if replays_that_fit(need, free) == 0:
        raise ConfigError(f"replay.capacity={tc.replay.capacity} needs {need / 2**30:.1f} GiB for stored states "
                          f"of {obs_dim} values, more than the {free / 2**30:.1f} GiB free; lower replay.capacity")
    return market


#: the share of the device's free memory the replays may take (the precheck's rule, foxdqn.population too)
REPLAY_SHARE = 0.8


def replays_that_fit(need: int, free: int | None) -> int | None:
    """How many replays of ``need`` bytes fit in :data:`REPLAY_SHARE` of ``free`` bytes (None:
    the free memory is unknown)."""
    return None if free is None else int(REPLAY_SHARE * free // max(need, 1))


def replay_row(tc: TrainConfig, market) -> tuple[int, int]:
    """(values, bytes per value) of one stored obs / next_obs row of a device env's replay: the
    trading env's state code (:mod:`foxdqn.ops.trading_code`: 4 values of its code dtype,
    docs/design/replay.md#windowed-trading-replay), else the float32 observation."""
    if tc.env.name == "trading":
        from foxdqn.ops.trading_code import CODE_WIDTH, state_code_dtype
        from foxdqn.step.build import ENV_DTYPES

        from foxdqn.data.augment import training_bars

        dtype = ENV_DTYPES[tc.env.dtype]
        num_bars = training_bars(tc.data, market) if market is not None else 0  # data.augment: paths × train bars
        return CODE_WIDTH, state_code_dtype(dtype, num_bars).itemsize
    return {"cartpole": 4, "bitflip": 2 * tc.env.n_bits}[tc.env.name], 4  # the float32 observation


def available_bytes(device: str) -> int | None:
    """Free memory of the run's device (CUDA: free GPU memory; CPU: MemAvailable on Linux)."""
    import torch

    if str(device).startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        return int(torch.cuda.mem_get_info(None if str(device) in ("cuda", "auto") else torch.device(str(device)))[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def market_data(tc: TrainConfig):
    """The run's market data (None for envs other than trading), loaded once per process and data
    setting: a multirun's precheck and its jobs share the load."""
    if tc.env.name != "trading":
        return None
    from foxdqn.data import load_market_data

    key = (repr(tc.data), tc.env.window, tc.env.episode_length)
    if key not in _MARKETS:
        _MARKETS.clear()  # one dataset at a time: a sweep over files does not pile them up
        _MARKETS[key] = load_market_data(tc.data, tc.env.window, tc.env.episode_length)
    return _MARKETS[key]


_MARKETS: dict = {}

#: True once a task function has started: a Hydra/OmegaConf error before it is bad input (one line,
#: exit 2), after it a bug (its traceback).
_TASK_STARTED = False


@hydra.main(version_base="1.3", config_path=str(conf_folder()), config_name="train")
def _run(cfg: DictConfig) -> float | None:
    global _TASK_STARTED
    _TASK_STARTED = True
    mark("compose")  # Hydra composed the config and made the run folder
    _place_on_gpu()  # first: finalize() below initialises CUDA (torch.cuda.is_available())
    from foxdqn.resume import given_keys, resolve_resume

    from foxdqn.hydra_callbacks import existed_before

    hydra_dir = Path(HydraConfig.get().runtime.output_dir)
    run_dir, payload, run_id = hydra_dir, None, None
    try:
        tc = finalize(cfg)
        if tc.resume is not None:  # the run's own settings, from its start record
            tc, run_dir, payload, run_id = resolve_resume(tc, hydra_dir, given_keys(HydraConfig.get().overrides.task),
                                                          existed=existed_before(hydra_dir))
        mark("validate")
        market = preflight(tc)
        mark("preflight")
    except FoxdqnError as exc:
        _remove_if_unused(hydra_dir)
        return _job_failed(str(exc), 2)
    if COLLECTOR.active:  # hydra/launcher=population trains the checked job later, in a group
        job = HydraConfig.get()
        COLLECTOR.add(Member(tc, market, run_dir, int(job.job.num), [str(o) for o in job.overrides.task], payload,
                             run_id))
        return None
    return _train(tc, market, run_dir, payload, run_id)


def _place_on_gpu() -> None:
    """A job of a joblib sweep on GPUs takes its worker process's GPU (``CUDA_VISIBLE_DEVICES``,
    :func:`foxdqn.placement.place_sweep_job`) and logs one line naming it; a job of a Ray sweep that
    asked Ray for GPUs (``hydra.launcher.ray.remote.num_gpus``) logs the GPUs Ray gave it; anything
    else is left as it is. A slot folder that cannot be used costs a warning: the job then sees
    every GPU."""
    import logging

    from hydra.types import RunMode

    from foxdqn.placement import launcher_kind, place_sweep_job

    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return
    from foxdqn.fast_exit import exit_worker_without_teardown

    exit_worker_without_teardown()  # a joblib worker ends without Python's teardown (nanobind's leak lines)
    log = logging.getLogger("foxdqn.placement")
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


def _train(tc: TrainConfig, market, run_dir: Path, payload: dict | None, run_id: str | None = None) -> float:
    """Open the run folder (its start record first), build, train and report one run.

    ``payload``/``run_id``: what :func:`foxdqn.resume.resolve_resume` continues (None, None: a new
    run). A new run whose build fails (bad input, out of memory, an unwritable file) leaves no folder.
    """
    from foxdqn.loop import Interrupted, prepare, run_prepared
    from foxdqn.results_table import print_summary
    from foxdqn.run_folder import RunFolder, previous_outputs

    folder = None
    # a new run (else: a resume, or a killed run started over in its folder); a run folder of another run is refused
    new = payload is None and run_id is None and (tc.resume is None or not previous_outputs(run_dir))
    _settle_heap()
    try:
        folder = RunFolder(run_dir).open(resume=not new, config=tc, run_id=run_id)
        if not new and payload is None:  # a run killed before its first checkpoint: its partial outputs go
            from foxdqn.resume import start_over

            start_over(run_dir)
        try:
            run = prepare(tc, market, run_dir, payload, folder.run_id)
        except Exception:  # (a signal during the build keeps the record: resume=auto starts the run over)
            if new:  # no training step ran: nothing to continue, nothing left behind
                folder.discard()
                _remove_new_parents()
                folder = None
            raise
        summary = run_prepared(run)
    except FoxdqnError as exc:
        _release(folder)
        if folder is None:
            _remove_if_unused(run_dir)
        return _job_failed(str(exc), 2)
    except HaltError as exc:
        _release(folder, finished=True)  # HALTED marks the end
        return _job_failed(f"training halted: {exc}", HaltError.exit_code)
    except Interrupted as exc:
        _release(folder)  # INCOMPLETE stays: resume=auto continues
        _fail(str(exc), code=exc.exit_code)
    except OSError as exc:  # the output folder failed under the run (disk full, file too large, removed, read-only)
        _release(folder)
        _fail(f"writing the run's outputs failed: {exc.filename or run_dir}: {exc.strerror or exc}")
    except (MemoryError, RuntimeError) as exc:  # allocation failures: a size setting is too large
        _release(folder)
        if isinstance(exc, MemoryError) or "allocate" in str(exc) or "out of memory" in str(exc):
            _fail("out of memory: reduce replay.capacity, env.num_envs, model.hidden or agent.batch_size"
                  + (" (no folder was left)" if folder is None else f"; {run_dir} keeps the run")
                  + f" ({str(exc).splitlines()[0][:120]})")
        raise
    folder.finish()
    print_summary(summary, run_dir)
    _write_timings(run_dir, summary)
    return objective(summary)


def _write_timings(run_dir: Path, summary: dict) -> None:
    """``timings.json`` (foxdqn.timings: wall seconds per phase since process start, or since the
    previous job of this process) and one log line; the clock then restarts for the next job."""
    import logging

    from foxdqn.io_atomic import write_json_atomic
    from foxdqn.timings import CLOCK, format_line

    mark("summary")
    times = CLOCK.as_dict(training_wall_s=summary.get("wall_time_s"), device=summary.get("device"),
                          graph=summary.get("graph"), env_steps=summary.get("env_steps"))
    try:
        write_json_atomic(run_dir / "timings.json", times)
    except OSError as exc:  # the run itself is complete: a lost breakdown is a warning
        logging.getLogger(__name__).warning("timings.json not written: %s", exc)
    from foxdqn.monitor.detail import DETAIL

    logging.getLogger(__name__).info("start-up breakdown: %s (timings.json)", format_line(times), extra=DETAIL)
    CLOCK.restart()


def _settle_heap() -> None:
    """Collect, then freeze every object alive now (``gc.freeze``: the cyclic collector skips them
    from then on; reference counting still frees them). ``torch.cuda.graph`` runs ``gc.collect()``
    before each capture, which otherwise walks the ~400k objects of the imported modules (0.15 s
    on a 2-core CPU, per capture). Objects a job creates later stay collectable: the next job's
    call collects them before it freezes. (``torch._dynamo`` is not imported: the run neither
    compiles nor builds a ``torch.optim`` optimizer, foxdqn/ops/library.py.)"""
    import gc

    gc.collect()
    gc.freeze()


def objective(summary: dict) -> float:
    """The value a run returns to a Hydra sweeper (Optuna, ...): the validation metric of the weights
    the run kept (``summary["selection"]``, docs/backtest.md), never a test-split number, signed so
    that higher is better (a lower-is-better metric such as max drawdown is negated); NaN for a run
    the search must not count (``selection.excluded``: it never trades on val with
    ``search.exclude_no_trades``, or it was pruned; foxdqn.search), which Optuna records as a failed
    trial."""
    from foxdqn.early_stop import LOWER_IS_BETTER

    if summary["selection"].get("excluded"):
        return float("nan")
    value = float(summary["selection"]["value"])
    return -value if summary["selection"]["metric"] in LOWER_IS_BETTER else value


def _remove_if_unused(run_dir: Path) -> None:
    """Remove the folder Hydra made for this job when it holds only Hydra's ``.hydra/`` and log, and
    the empty folders Hydra made above it (a run refused before any work leaves nothing behind)."""
    from foxdqn.run_folder import only_hydra_files

    if only_hydra_files(run_dir):
        shutil.rmtree(run_dir, ignore_errors=True)
        _remove_new_parents()


def _remove_new_parents() -> None:
    """Remove the empty folders Hydra made above this call's run folder (deepest first)."""
    from foxdqn.hydra_callbacks import NEW_PARENTS

    for parent in NEW_PARENTS:
        if parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()


#: (exit code, message) of the jobs of this process's multirun that failed; main() exits with the worst.
_FAILED_JOBS: list[tuple[int, str]] = []


def _job_failed(message: str, code: int, job: int | None = None) -> float:
    """A single run ends here (one line, exit ``code``); a multirun job reports it, returns NaN to
    the sweeper and lets the other jobs run (main() exits with ``code`` at the end). ``job``: the
    multirun job's number, for a caller whose job is not Hydra's current one (the population
    launcher's); None: Hydra's current job."""
    from hydra.types import RunMode

    if job is None and HydraConfig.get().mode != RunMode.MULTIRUN:
        _fail(message, code)
    job = HydraConfig.get().job.num if job is None else job
    print(f"foxdqn: error: job {job}: {message}", file=sys.stderr)
    _FAILED_JOBS.append((code, f"job {job}: {message}"))
    return float("nan")


def _release(folder, finished: bool = False) -> None:
    if folder is not None:
        folder.finish() if finished else folder.release()


def main() -> None:
    """The console entry point: Hydra's ``main`` with errors of composition (before any task runs)
    turned into one line and exit code 2."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from foxdqn.compose import composition_error
    from hydra_plugins.foxdqn_population.population_launcher import register

    register()  # hydra/launcher=population, also where Hydra's plugin scan misses it (an editable install)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _outside_training)
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing a multi-line report and exit 1
    mark("imports")
    try:
        _run()
    except (HydraException, OmegaConfBaseException) as exc:
        if _TASK_STARTED:
            raise
        _fail(composition_error(exc))
    except ValueError as exc:  # Optuna's study.best_trial when no trial counted (hydra-optuna-sweeper's end)
        if not (_TASK_STARTED and "No trials are completed yet" in str(exc)):
            raise
        _fail("no trial of the search counted: every trial was pruned, failed or never traded on val "
              "(search.exclude_no_trades); each job's folder has its results (python -m foxdqn.report DIR)", 1)
    if _FAILED_JOBS:  # a multirun whose jobs did not all finish
        print(f"foxdqn: error: {len(_FAILED_JOBS)} job(s) of the multirun failed (see above and report.md)",
              file=sys.stderr)
        sys.exit(max(code for code, _ in _FAILED_JOBS))


if __name__ == "__main__":  # python -m foxdqn.train: run the imported module's main, so that the launchers
    from foxdqn.fast_exit import run_as_program  # (which import foxdqn.train) and main() share one _FAILED_JOBS;
    from foxdqn.train import main as _main  # then exit without the interpreter's ~1 s teardown (foxdqn.fast_exit)

    run_as_program(_main)
