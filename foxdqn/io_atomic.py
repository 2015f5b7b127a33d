"""Atomic file writes: a reader sees either the old file or the complete new one, never a torn one.

Every writer here follows the same protocol:

1. write the content to a fresh temporary file **in the destination's directory** (same file
   system, so the final rename is atomic); its name is ``.<name>.<random>.tmp<suffix>`` and its
   permissions those of the file it replaces, else ``0666`` minus the process umask;
2. flush and ``os.fsync`` the temporary file;
3. ``os.replace`` it onto the destination (atomic on POSIX and Windows);
4. best-effort ``fsync`` of the directory so the rename itself survives a power cut (POSIX only;
   errors there are ignored).

On any error the temporary file is removed and an ``OSError`` naming the destination is raised
(the same errno: a full disk is ``ENOSPC``, a file above the size limit ``EFBIG``); the destination
is left untouched. Parent directories are created when missing.

JSON convention (:func:`write_json_atomic`): the output is *strict* JSON (RFC 8259, readable by
any parser), so non-finite floats are written as the strings ``"nan"``, ``"inf"`` and ``"-inf"``
(not as the non-standard tokens ``NaN``/``Infinity`` and not as ``null``, which would lose the
distinction between "missing" and "not a number"). :func:`read_json` turns exactly those three
strings back into floats wherever they appear as values.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "deferred_sync",
    "write_bytes_atomic",
    "write_text_atomic",
    "write_json_atomic",
    "read_json",
    "json_safe",
]


def _read_umask() -> int:
    # os.umask can only be read by setting it; done once at import (single-threaded then).
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()

_NONFINITE_TO_STR = {math.inf: "inf", -math.inf: "-inf"}
_STR_TO_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _fsync_dir(directory: Path) -> None:
    if os.name != "posix":
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


#: Inside :func:`deferred_sync`: the writes skip their fsyncs (one ``os.sync`` at its end).
_DEFERRED: list[bool] = []


@contextlib.contextmanager
def deferred_sync():
    """Many atomic writes at once (a population's P run folders): inside the block the writes keep
    their atomic rename (a reader sees the old file or the whole new one) but skip the two fsyncs
    of each file (their cost: docs/bench.md#other-costs); at the end of the block one ``os.sync()``
    makes them all durable. A power cut inside the block can lose files written in it; a crash of
    the process cannot tear one."""
    _DEFERRED.append(True)
    try:
        yield
    finally:
        _DEFERRED.pop()
        if not _DEFERRED and hasattr(os, "sync"):
            os.sync()


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Atomically replace ``path`` with ``data``.

    Args:
        path: destination file. Its parent directory is created if missing.
        data: the complete new content.

    Raises:
        OSError: the directory cannot be created or written, the disk is full, the file would pass
            the size limit, or the rename fails; its ``filename`` is ``path`` (the destination is
            then unchanged and no temporary file is left behind).
    """
    dest = Path(path)
    try:
        _write(dest, data)
    except OSError as exc:
        if exc.filename == str(dest):
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), str(dest)) from exc


def _write(dest: Path, data: bytes) -> None:
    directory = dest.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(
        prefix=f".{dest.name}.", suffix=".tmp" + dest.suffix, dir=directory
    )
    try:
        with os.fdopen(fd, "wb") as f:
            # mkstemp creates the file 0600; give it the mode a plain open() would have (0666
            # minus the umask), or keep the mode of the file being replaced.
            try:
                mode = dest.stat().st_mode & 0o7777
            except FileNotFoundError:
                mode = 0o666 & ~_UMASK
            os.chmod(tmp_name, mode)
            f.write(data)
            f.flush()
            if not _DEFERRED:
                os.fsync(f.fileno())
        os.replace(tmp_name, dest)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    if not _DEFERRED:
        _fsync_dir(directory)


def write_text_atomic(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Atomically replace ``path`` with ``text`` encoded as ``encoding`` (default UTF-8).

    Newlines are written as given (no platform translation). Raises ``OSError`` like
    :func:`write_bytes_atomic` and ``UnicodeEncodeError`` if ``text`` cannot be encoded.
    """
    write_bytes_atomic(path, text.encode(encoding))


def json_safe(obj: Any) -> Any:
    """Return a copy of ``obj`` that :func:`json.dumps` accepts with ``allow_nan=False``.

    * float NaN / +inf / -inf become the strings ``"nan"`` / ``"inf"`` / ``"-inf"``;
    * NumPy scalars become Python scalars and NumPy arrays nested lists (then the rule above);
    * tuples become lists; mappings are copied with their keys unchanged;
    * ``os.PathLike`` objects become strings.

    Other types are returned unchanged (``json.dumps`` will reject unsupported ones with
    ``TypeError``).
    """
    if isinstance(obj, float):  # includes numpy.float64 (a float subclass)
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return _NONFINITE_TO_STR[obj]
        return float(obj)
    if isinstance(obj, (str, bool, int)) or obj is None:
        return obj
    if isinstance(obj, Mapping):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    # NumPy without importing it: scalars have .item(), arrays have .tolist().
    tolist = getattr(obj, "tolist", None)
    if callable(tolist) and type(obj).__module__.startswith("numpy"):
        return json_safe(tolist())
    return obj


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Atomically write ``obj`` as strict JSON (indent 2, UTF-8, trailing newline) to ``path``.

    Non-finite floats are written as the strings ``"nan"``, ``"inf"``, ``"-inf"`` (see the module
    docstring); NumPy scalars/arrays are converted to Python values first (:func:`json_safe`).

    Raises:
        TypeError: ``obj`` contains a value JSON cannot represent (e.g. a set or a tensor).
        OSError: the file cannot be written (the destination is then unchanged).
    """
    text = json.dumps(json_safe(obj), indent=2, allow_nan=False, ensure_ascii=False)
    write_text_atomic(path, text + "\n")


def _restore_nonfinite(obj: Any) -> Any:
    if isinstance(obj, str):
        return _STR_TO_NONFINITE.get(obj, obj)
    if isinstance(obj, list):
        return [_restore_nonfinite(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _restore_nonfinite(v) for k, v in obj.items()}
    return obj


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file written by :func:`write_json_atomic`.

    The string values ``"nan"``, ``"inf"`` and ``"-inf"`` are turned back into floats (keys are
    left alone). Raises ``OSError`` if the file cannot be read and ``json.JSONDecodeError``
    (a ``ValueError``) if it is not valid JSON.
    """
    with open(path, encoding="utf-8") as f:
        return _restore_nonfinite(json.load(f))
