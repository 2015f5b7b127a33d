"""The run's output folder: one run at a time, never mistaken for a finished one, never mixed with another.

:meth:`RunFolder.open`, before any training:

1. checks that the folder can be written (creating it if needed) and that its disk has
   :data:`MIN_FREE_BYTES` free: an unwritable folder, a path under a file, or a (nearly) full disk
   ends the run with one line naming the path (exit 2);
2. takes an exclusive lock, ``.lock`` (``fcntl.flock``, released by the OS when the process dies,
   so a killed run leaves no stale lock): a second run into the same folder while the first is
   running is refused;
3. refuses a folder that already holds another run's outputs (``config.yaml``, ``checkpoints/``,
   ``metrics.csv``, ``eval/summary.json`` or an ``INCOMPLETE`` marker) unless the run resumes it;
4. (once the run is allowed in) removes the hidden temporary files of atomic writes
   (foxdqn.io_atomic: ``.<name>.<8 random characters>.tmp<suffix>``, nothing else) that a process
   killed mid-write left (the files they were replacing are whole);
5. writes the start record, ``config.yaml``: the resolved config under a first line naming the
   run's id (``# foxdqn run <32 hex digits>``, :func:`read_record`), atomically. The record is the
   truth a resume continues from (foxdqn.run.resume), and every checkpoint carries the id, so a
   checkpoint of another run is never continued here;
6. writes ``INCOMPLETE`` (start time, pid), which :meth:`RunFolder.finish` removes once
   ``eval/summary.json`` is written. A folder with ``INCOMPLETE`` and no live lock is a run that
   was killed or interrupted: ``resume=auto`` continues it.

A refused run changes nothing in the folder: ``python -m foxdqn.train`` keeps Hydra from writing
its ``.hydra/`` copy into a folder that holds a run (:class:`foxdqn.cli.callbacks.CheckOutputFolder`).
:meth:`RunFolder.discard` removes a new run's folder whose build failed (no training step ran).
"""
from __future__ import annotations

import datetime as _dt
import os
import re
import shutil
import uuid
from pathlib import Path

from foxdqn.errors import ConfigError
from foxdqn.io_atomic import write_text_atomic

MARKER = "INCOMPLETE"
LOCK = ".lock"
RECORD = "config.yaml"
_OUTPUTS = (RECORD, "checkpoints", "metrics.csv", "eval/summary.json", MARKER)
#: What the disk of a run folder must have free at the start (checkpoints, logs, the report).
MIN_FREE_BYTES = 32 * 2**20
#: The name of a temporary file of foxdqn.io_atomic (tempfile.mkstemp's 8 random characters).
_TEMP_NAME = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp(?P<suffix>(\.[^.]+)?)$")
_RECORD_LINE = re.compile(r"# foxdqn run ([0-9a-f]{32})(?: sha256 ([0-9a-f]{64}))?\b")


class RunFolderError(ConfigError):
    """The output folder cannot be used (unwritable, locked by another run, holds another run)."""


def only_hydra_files(path: Path) -> bool:
    """``path`` is a folder holding nothing but what Hydra writes for a job (``.hydra/`` and its log):
    a folder made for a call that did no work, safe to remove."""
    return path.is_dir() and all(p.name == ".hydra" or p.suffix == ".log" for p in path.iterdir())


def previous_outputs(path: Path) -> list[str]:
    """Names of the run outputs already in ``path`` (empty for a new folder)."""
    return [name for name in _OUTPUTS if (path / name).exists()]


def new_run_id() -> str:
    """A fresh run id: 32 lowercase hex digits (a random UUID)."""
    return uuid.uuid4().hex


def record_text(config, run_id: str) -> str:
    """The text of the start record ``config.yaml`` of the resolved config ``config``
    (:class:`foxdqn.config.schema.TrainConfig`): the id line, then the config as YAML (its plain values,
    :func:`foxdqn.config.schema.to_plain`, in the schema's order: :func:`foxdqn.config.yaml_text.config_yaml`)."""
    import hashlib

    from foxdqn.config.yaml_text import config_yaml  # start-up: torch, off the path of foxdqn.evaluate --help

    body = config_yaml(config)
    return (f"# foxdqn run {run_id} sha256 {hashlib.sha256(body.encode()).hexdigest()}: the resolved config this run "
            "started with (resume continues it from here; an edit makes a resume refuse it)\n" + body)


def read_record(path: Path) -> tuple[str | None, dict] | None:
    """The start record of the run folder ``path``: (run id, or None for a folder written before run
    ids; the config as plain dicts), or None when there is no ``config.yaml``.

    Raises:
        ConfigError: ``config.yaml`` cannot be read, is not a YAML mapping, or was edited after the
            run wrote it (its body no longer matches the SHA-256 in its first line; names the file).
    """
    import hashlib

    import yaml

    file = Path(path) / RECORD
    if not file.is_file():
        return None
    try:
        text = file.read_text(encoding="utf-8")
        values = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"run folder {path}: its {RECORD} cannot be read ({type(exc).__name__}); it is the "
                          "record a resume continues from") from None
    if not isinstance(values, dict):
        raise ConfigError(f"run folder {path}: its {RECORD} is not a config (a YAML mapping)")
    match = _RECORD_LINE.match(text)
    if match and match.group(2):
        body = text.split("\n", 1)[1] if "\n" in text else ""
        if hashlib.sha256(body.encode()).hexdigest() != match.group(2):
            raise ConfigError(f"run folder {path}: its {RECORD} was edited after the run started (its contents no longer "
                              "match the SHA-256 in its first line); a resume continues the config the run started "
                              "with: restore the file, or start a new run with the settings you want")
    return (match.group(1) if match else None), values


class RunFolder:
    """Lock, marker and checks of one run folder (see the module docstring).

    Args:
        path: the run folder (Hydra's ``runtime.output_dir``).
        key: the setting that chooses the folder, which the refusals tell the user to change
            (a multirun job's: ``hydra.sweep.dir`` or ``hydra.sweep.subdir``).
    """

    def __init__(self, path: str | os.PathLike[str], key: str = "hydra.run.dir") -> None:
        self.path = Path(path)
        self.key = key  # the setting that chooses this folder, named in the refusals
        self._lock_fd: int | None = None
        self.run_id: str | None = None

    def open(self, resume: bool = False, after_kill: str = "resume=auto continues it", config=None,
             run_id: str | None = None) -> "RunFolder":
        """Check, lock and mark the folder; write the start record.

        Args:
            resume: the run continues the one in this folder (its outputs are expected).
            after_kill: what the marker tells a reader to do when the run was killed.
            config: the resolved :class:`~foxdqn.config.schema.TrainConfig`, written as the start record
                ``config.yaml`` (:func:`record_text`; None: no record, e.g. a test's bare folder).
            run_id: the run's id (None: a new one, :func:`new_run_id`); :attr:`run_id` after.

        Raises:
            RunFolderError: one line naming the folder and what is wrong.
            OSError: the record or the marker cannot be written (names the path).
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
                                 f"{self.key}") from None
        free = shutil.disk_usage(path).free
        if free < MIN_FREE_BYTES:
            raise RunFolderError(f"output folder {path}: its disk has {free / 2**20:.1f} MiB free, a run needs at least "
                                 f"{MIN_FREE_BYTES // 2**20} MiB (checkpoints, logs, the report); free some space or "
                                 f"choose another {self.key}")
        fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise RunFolderError(f"output folder {path}: another run is writing into it (lock {path / LOCK}); "
                                 f"wait for it or choose another {self.key}") from None
        self._lock_fd = fd
        found = previous_outputs(path)
        if found and not resume:
            self.release()
            hint = ("; or continue that run with resume=auto" if MARKER in found
                    else " (that run has finished)")
            raise RunFolderError(f"output folder {path}: already holds a run ({', '.join(found)}); choose another "
                                 f"{self.key}{hint}")
        for stale in path.rglob(".*.tmp*"):  # a writer killed mid-write (kill -9) left its temporary file
            parts = _TEMP_NAME.match(stale.name)
            if parts and stale.is_file() and Path(parts["name"]).suffix == parts["suffix"]:
                stale.unlink()
        self.run_id = run_id or new_run_id()
        if config is not None:
            write_text_atomic(path / RECORD, record_text(config, self.run_id))
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

    def discard(self) -> None:
        """Remove the folder of a new run whose build failed before any training step: everything in
        it is this run's (:meth:`open` refused a folder holding another run) or Hydra's copy of this
        call's config. Releases the lock first."""
        self.release()
        shutil.rmtree(self.path, ignore_errors=True)

    def release(self) -> None:
        """Release the lock (keeps the marker: the run did not finish)."""
        if self._lock_fd is not None:
            import fcntl

            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None
