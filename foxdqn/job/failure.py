"""How a job that cannot run, or fails, ends: a single run with one line on stderr and its exit
code (:func:`fail`); a job of a multirun with its line, a NaN for the sweeper and its code noted in
:data:`FAILED_JOBS` (:func:`job_failed`), so that ``foxdqn.train`` exits with the worst code after
the other jobs ran. A job refused before any work leaves no folder (:func:`remove_if_unused`).
docs/usage.md lists the exit codes."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from foxdqn.run.folder import only_hydra_files


def fail(message: str, code: int = 2) -> None:
    """``foxdqn: error: <message>`` on stderr, then exit with ``code``.

    Raises:
        SystemExit: always."""
    print(f"foxdqn: error: {message}", file=sys.stderr)
    sys.exit(code)


#: Folders above the run folder that did not exist before Hydra made it (deepest first), noted by
#: foxdqn.cli.callbacks before Hydra makes the folder: a run refused before any work removes them
#: again when they are empty (:func:`remove_new_parents`).
NEW_PARENTS: list[Path] = []


def remove_if_unused(run_dir: Path) -> None:
    """Remove the folder Hydra made for this job when it holds only Hydra's ``.hydra/`` and log, and
    the empty folders Hydra made above it (a run refused before any work leaves nothing behind)."""
    if only_hydra_files(run_dir):
        shutil.rmtree(run_dir, ignore_errors=True)
        remove_new_parents()


def remove_new_parents() -> None:
    """Remove the empty folders Hydra made above this call's run folder (deepest first)."""
    for parent in NEW_PARENTS:
        if parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()


#: (exit code, message) of the jobs of this process's multirun that failed; foxdqn.train exits with the worst.
FAILED_JOBS: list[tuple[int, str]] = []


def job_failed(message: str, code: int, job: int | None = None) -> float:
    """A single run ends here (one line, exit ``code``); a multirun job reports it, returns NaN to
    the sweeper and lets the other jobs run (``foxdqn.train`` exits with ``code`` at the end).
    ``job``: the multirun job's number, for a caller whose job is not Hydra's current one (the
    population launcher's); None: Hydra's current job.

    Raises:
        SystemExit: for a single run (``job`` None outside a multirun)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if job is None and HydraConfig.get().mode != RunMode.MULTIRUN:
        fail(message, code)
    job = HydraConfig.get().job.num if job is None else job
    print(f"foxdqn: error: job {job}: {message}", file=sys.stderr)
    FAILED_JOBS.append((code, f"job {job}: {message}"))
    return float("nan")
