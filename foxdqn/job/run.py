"""One job from its run folder's start record to its summary (:func:`run_job`), and the value a
Hydra sweeper reads from it (:func:`objective`).

Every job trains as a population of one (:func:`foxdqn.population.train.train_population`)."""
from __future__ import annotations

from pathlib import Path

from foxdqn.analysis.results_table import print_summary
from foxdqn.config.schema import TrainConfig
from foxdqn.io_atomic import write_json_atomic
from foxdqn.job.failure import fail, job_failed, remove_if_unused
from foxdqn.timings import CLOCK, format_line, mark


def run_job(tc: TrainConfig, market, run_dir: Path, payload: dict | None = None,
            run_id: str | None = None) -> float:
    """Train one run as a population of one (:func:`foxdqn.population.train.train_population`,
    ``alone``; :func:`foxdqn.job.member.job_member`): open its run folder (its start record first),
    build, train and report it; return its :func:`objective` (NaN for a multirun job that failed,
    after its line). Exit codes as docs/usage.md#failure-behaviour says: 0; 2 bad input (a new run
    whose build fails leaves no folder); 3 a guard halt; 128 + signal interrupted (``resume=auto``
    continues).

    ``payload``/``run_id``: what :func:`foxdqn.run.resume.resolve_resume` continues (None, None: a new
    run).
    """
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
