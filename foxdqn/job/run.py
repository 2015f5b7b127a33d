"""One job from its run folder's start record to its summary (:func:`run_job`), and the value a
Hydra sweeper reads from it (:func:`objective`)."""
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
        if isinstance(exc, MemoryError) or "allocate" in str(exc) or "out of memory" in str(exc):
            paths = "data.augment.paths, " if str(tc.data.augment.method) != "none" else ""
            fail(f"out of memory: reduce {paths}replay.capacity, env.num_envs, model.hidden or agent.batch_size"
                 + (" (no folder was left)" if folder is None else f"; {run_dir} keeps the run")
                 + f" ({str(exc).splitlines()[0][:120]})")
        raise
    folder.finish()
    print_summary(summary, run_dir)
    write_timings(run_dir, summary)
    return objective(summary)


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




def _release(folder, finished: bool = False) -> None:
    if folder is not None:
        folder.finish() if finished else folder.release()
