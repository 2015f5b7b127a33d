"""The run's output folder: one run at a time, never mistaken for a finished one.

:meth:`RunFolder.open`, before any training:

1. checks that the folder can be written (creating it if needed): an unwritable folder, a path
   under a file, or a full disk ends the run with one line naming the path (exit 2);
2. takes an exclusive lock, ``.lock`` (``fcntl.flock``, released by the OS when the process dies,
   so a killed run leaves no stale lock): a second run into the same folder while the first is
   running is refused;
3. refuses a folder that already holds another run's outputs (``checkpoints/``, ``metrics.csv``,
   ``eval/summary.json`` or an ``INCOMPLETE`` marker) unless the run resumes it;
4. removes the hidden temporary files of atomic writes (foxdqn.io_atomic) that a process killed
   mid-write left (the files they were replacing are whole);
5. writes ``INCOMPLETE`` (start time, pid), which :meth:`RunFolder.finish` removes once
   ``eval/summary.json`` is written. A folder with ``INCOMPLETE`` and no live lock is a run that
   was killed or interrupted: ``resume=auto`` continues it.

Hydra writes its own ``.hydra/`` copy of the config into the folder before the run starts; that
is all a refused run leaves changed.
"""
from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path

from foxdqn.errors import ConfigError

MARKER = "INCOMPLETE"
LOCK = ".lock"
_OUTPUTS = ("checkpoints", "metrics.csv", "eval/summary.json", MARKER)


class RunFolderError(ConfigError):
    """The output folder cannot be used (unwritable, locked by another run, holds another run)."""


def only_hydra_files(path: Path) -> bool:
    """``path`` is a folder holding nothing but what Hydra writes for a job (``.hydra/`` and its log):
    a folder made for a call that did no work, safe to remove."""
    return path.is_dir() and all(p.name == ".hydra" or p.suffix == ".log" for p in path.iterdir())


def previous_outputs(path: Path) -> list[str]:
    """Names of the run outputs already in ``path`` (empty for a new folder)."""
    return [name for name in _OUTPUTS if (path / name).exists()]


class RunFolder:
    """Lock, marker and checks of one run folder (see the module docstring).

    Args:
        path: the run folder (Hydra's ``runtime.output_dir``).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None

    def open(self, resume: bool = False, after_kill: str = "resume=auto continues it") -> "RunFolder":
        """Check, lock and mark the folder.

        Args:
            resume: the run continues the one in this folder (its outputs are expected).
            after_kill: what the marker tells a reader to do when the run was killed.

        Raises:
            RunFolderError: one line naming the folder and what is wrong.
        """
        import fcntl

        path = self.path
        if path.exists() and not path.is_dir():
            raise RunFolderError(f"output folder {path}: exists and is not a folder")
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / f".write-test-{os.getpid()}"
            probe.write_bytes(b"0" * 4096)
            probe.unlink()
        except OSError as exc:
            raise RunFolderError(f"output folder {path}: cannot be written ({exc.strerror or exc}); choose another "
                                 "hydra.run.dir") from None
        fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise RunFolderError(f"output folder {path}: another run is writing into it (lock {path / LOCK}); "
                                 "wait for it or choose another hydra.run.dir") from None
        self._lock_fd = fd
        for stale in path.rglob(".*.tmp*"):  # a writer killed mid-write (kill -9) left its temporary file
            if stale.is_file():
                stale.unlink()
        found = previous_outputs(path)
        if found and not resume:
            self.release()
            hint = ("; or continue that run with resume=auto" if MARKER in found
                    else " (that run has finished)")
            raise RunFolderError(f"output folder {path}: already holds a run ({', '.join(found)}); choose another "
                                 f"hydra.run.dir{hint}")
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        (path / MARKER).write_text(f"started {stamp} pid {os.getpid()}; removed when eval/summary.json is "
                                   "written. Present without a running process: the run was killed or "
                                   f"interrupted ({after_kill}).\n")
        return self

    def finish(self) -> None:
        """The run is complete (its summary is written): remove the marker and release the lock."""
        try:
            (self.path / MARKER).unlink()
        except FileNotFoundError:
            pass
        self.release()

    def release(self) -> None:
        """Release the lock (keeps the marker: the run did not finish)."""
        if self._lock_fd is not None:
            import fcntl

            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None
