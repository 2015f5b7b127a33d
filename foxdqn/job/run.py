"""One job from its run folder's start record to its summary (:func:`run_job`), and the value a
Hydra sweeper reads from it (:func:`objective`).

A job trains as a population of one (:func:`foxdqn.population.train.train_population`) whenever
the population supports its settings (:func:`trains_as_population`); the single-run loop
(:mod:`foxdqn.run.loop`) remains for the settings it refuses (:func:`foxdqn.population.grouping.batch_refusal`)
and to continue a checkpoint that loop wrote."""
from __future__ import annotations

from pathlib import Path

from foxdqn.analysis.results_table import print_summary
from foxdqn.config.schema import TrainConfig
from foxdqn.errors import FoxdqnError, HaltError
from foxdqn.io_atomic import write_json_atomic
from foxdqn.job.failure import fail, job_failed, remove_if_unused, remove_new_parents
from foxdqn.run.folder import RunFolder, previous_outputs
from foxdqn.timings import CLOCK, format_line, mark


def run_job(tc: TrainConfig, market, run_dir: Path, payload: dict | None = None,
            run_id: str | None = None) -> float:
    """Open the run folder (its start record first), build, train and report one run; return its
    :func:`objective` (NaN for a multirun job that failed, after its line).

    ``payload``/``run_id``: what :func:`foxdqn.run.resume.resolve_resume` continues (None, None: a new
    run). A new run whose build fails (bad input, out of memory, an unwritable file) leaves no folder.
    """
    if trains_as_population(tc, payload):
        return _run_as_population(tc, market, run_dir, payload, run_id)
    # start-up: foxdqn.train imports this module; the training loop (the step's Triton ops, the
    # loggers) is imported here, off the path of --help
    from foxdqn.run.loop import Interrupted, prepare, run_prepared

    folder = None
    # a new run (else: a resume, or a killed run started over in its folder); a run folder of another run is refused
    new = payload is None and run_id is None and (tc.resume is None or not previous_outputs(run_dir))
    settle_heap()
    try:
        folder = RunFolder(run_dir).open(resume=not new, config=tc, run_id=run_id)
        if not new and payload is None:  # a run killed before its first checkpoint: its partial outputs go
            from foxdqn.run.resume import start_over  # start-up: checkpoints and the loggers, off --help's path

            start_over(run_dir)
        try:
            run = prepare(tc, market, run_dir, payload, folder.run_id)
        except Exception:  # (a signal during the build keeps the record: resume=auto starts the run over)
            if new:  # no training step ran: nothing to continue, nothing left behind
                folder.discard()
                remove_new_parents()
                folder = None
            raise
        summary = run_prepared(run)
    except FoxdqnError as exc:
        _release(folder)
        if folder is None:
            remove_if_unused(run_dir)
        return job_failed(str(exc), 2)
    except HaltError as exc:
        _release(folder, finished=True)  # HALTED marks the end
        return job_failed(f"training halted: {exc}", HaltError.exit_code)
    except Interrupted as exc:
        _release(folder)  # INCOMPLETE stays: resume=auto continues
        fail(str(exc), code=exc.exit_code)
    except OSError as exc:  # the output folder failed under the run (disk full, file too large, removed, read-only)
        _release(folder)
        fail(f"writing the run's outputs failed: {exc.filename or run_dir}: {exc.strerror or exc}")
    except (MemoryError, RuntimeError) as exc:  # allocation failures: a size setting is too large
        _release(folder)
        _out_of_memory(tc, run_dir, exc, left=folder is not None)
        raise
    folder.finish()
    print_summary(summary, run_dir)
    write_timings(run_dir, summary)
    return objective(summary)


def trains_as_population(tc: TrainConfig, payload: dict | None) -> bool:
    """``tc`` trains as a population of one: the population supports its settings and it does not
    continue a single-run loop's checkpoint (``payload`` of format foxdqn.run.checkpoint); a
    population member's checkpoint always does."""
    from foxdqn.population.checkpoint import is_member_state
    from foxdqn.population.grouping import batch_refusal

    if is_member_state(payload):
        return True
    return payload is None and batch_refusal(tc) is None


def _run_as_population(tc: TrainConfig, market, run_dir: Path, payload: dict | None, run_id: str | None) -> float:
    """:func:`run_job` through the population trainer, P = 1 (:func:`foxdqn.job.member.job_member`):
    the same folder, outputs, lines and exit codes as the single-run loop's (0; 2 bad input; 3 a
    guard halt; 128 + signal interrupted, ``resume=auto`` continues)."""
    from foxdqn.errors import StoppedBySignal
    from foxdqn.job.member import job_member
    from foxdqn.population.jobs import BAD_INPUT, FINISHED
    from foxdqn.population.train import train_population

    settle_heap()
    try:
        [outcome] = train_population([job_member(tc, market, run_dir, payload, run_id)], alone=True)
    except StoppedBySignal as exc:  # INCOMPLETE stays: resume=auto continues
        fail(str(exc), code=exc.exit_code)
    except OSError as exc:  # the output folder failed under the run (disk full, file too large, removed, read-only)
        fail(f"writing the run's outputs failed: {exc.filename or run_dir}: {exc.strerror or exc}")
    except (MemoryError, RuntimeError) as exc:  # allocation failures: a size setting is too large
        _out_of_memory(tc, run_dir, exc, left=(run_dir / "INCOMPLETE").exists())
        raise
    if outcome.exit_code == BAD_INPUT:
        remove_if_unused(run_dir)
        return job_failed(outcome.message, BAD_INPUT)
    if outcome.exit_code != FINISHED:
        return job_failed(outcome.message, outcome.exit_code)
    print_summary(outcome.summary, run_dir)
    write_timings(run_dir, outcome.summary)
    return objective(outcome.summary)


def write_timings(run_dir: Path, summary: dict) -> None:
    """``timings.json`` (foxdqn.timings: wall seconds per phase since process start, or since the
    previous job of this process) and one log line; the clock then restarts for the next job."""
    import logging

    mark("summary")
    times = CLOCK.as_dict(training_wall_s=summary.get("wall_time_s"), device=summary.get("device"),
                          graph=summary.get("graph"), env_steps=summary.get("env_steps"))
    try:
        write_json_atomic(run_dir / "timings.json", times)
    except OSError as exc:  # the run itself is complete: a lost breakdown is a warning
        logging.getLogger(__name__).warning("timings.json not written: %s", exc)
    from foxdqn.logger.detail import DETAIL  # start-up: foxdqn.logger imports rich, off --help's path

    logging.getLogger(__name__).info("start-up breakdown: %s (timings.json)", format_line(times), extra=DETAIL)
    CLOCK.restart()


def settle_heap() -> None:
    """Collect, then freeze every object alive now (``gc.freeze``: the cyclic collector skips them
    from then on; reference counting still frees them). ``torch.cuda.graph`` runs ``gc.collect()``
    before each capture, which otherwise walks the ~400k objects of the imported modules at every
    capture (docs/bench.md#other-costs). Objects a job creates later stay collectable: the next job's
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
    ``search.exclude_no_trades``, or it was pruned; foxdqn.run.search), which Optuna records as a failed
    trial."""
    from foxdqn.analysis.metrics import LOWER_IS_BETTER

    if summary["selection"].get("excluded"):
        return float("nan")
    value = float(summary["selection"]["value"])
    return -value if summary["selection"]["metric"] in LOWER_IS_BETTER else value




def _out_of_memory(tc: TrainConfig, run_dir: Path, exc: BaseException, left: bool) -> None:
    """One line and exit 2 when ``exc`` is an allocation failure (``left``: the run folder stays,
    else none was left); otherwise return (the caller re-raises it: a bug)."""
    if isinstance(exc, MemoryError) or "allocate" in str(exc) or "out of memory" in str(exc):
        paths = "data.augment.paths, " if str(tc.data.augment.method) != "none" else ""
        fail(f"out of memory: reduce {paths}replay.capacity, env.num_envs, model.hidden or agent.batch_size"
             + (f"; {run_dir} keeps the run" if left else " (no folder was left)")
             + f" ({str(exc).splitlines()[0][:120]})")


def _release(folder, finished: bool = False) -> None:
    if folder is not None:
        folder.finish() if finished else folder.release()
