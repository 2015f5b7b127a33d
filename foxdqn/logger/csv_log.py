"""Append-only CSV log of metric rows (``metrics.csv``), crash-safe and with a growing header.

* The header is the union of the keys seen so far, in order of first appearance.
* When a row brings a new key, the file (small: one row per log interval) is rewritten
  atomically with the widened header; earlier rows get an empty cell in the new columns.
* Every row is flushed to the OS as soon as it is written, so a crash of the process keeps
  everything logged so far.
* If the file already exists (a resumed run), its header is read and rows are appended to it.

Cell formatting: floats (Python and NumPy) are written with ``repr(float(v))`` - the shortest
string that round-trips exactly (``0.1``, ``1e-05``, ``nan``, ``inf``); integers (Python and
NumPy) with ``str(int(v))``; booleans as ``True``/``False``; ``None`` as an empty cell; strings
as they are; anything else with ``str``. Tensors are rejected (``TypeError``): the monitor is
host-side and must receive Python numbers, never device tensors (which would force a sync).
"""
from __future__ import annotations

import csv
import io
import numbers
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from foxdqn.io_atomic import write_text_atomic

__all__ = ["CsvLogger", "format_cell"]


def format_cell(value: Any) -> str:
    """Format one CSV cell (see the module docstring for the rules).

    Raises:
        TypeError: ``value`` is a tensor (``torch.Tensor``-like object).
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if type(value).__module__.split(".")[0] == "torch":
        raise TypeError(
            f"got a {type(value).__name__}; log host values (call .item() once, outside the hot "
            "loop) - the monitor never touches tensors"
        )
    if isinstance(value, bool) or (
        type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")
    ):
        return str(bool(value))
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return repr(float(value))
    return str(value)


class CsvLogger:
    """Append metric rows (dicts) to a CSV file.

    Args:
        path: the CSV file (e.g. ``run_dir/metrics.csv``). Its parent directory is created.
            An existing non-empty file is continued: its header becomes the initial header.

    Usage::

        with CsvLogger(run_dir / "metrics.csv") as log:
            log.log({"step": 1000, "train/loss": 0.25})

    Raises:
        OSError: the file cannot be opened or written.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fieldnames: list[str] = []
        if self.path.exists() and self.path.stat().st_size > 0:
            with open(self.path, newline="", encoding="utf-8") as f:
                header = next(csv.reader(f), [])
            self._fieldnames = list(header)
        self._file: io.TextIOWrapper | None = open(self.path, "a", newline="", encoding="utf-8")

    @property
    def fieldnames(self) -> list[str]:
        """The current header (a copy)."""
        return list(self._fieldnames)

    def log(self, row: Mapping[str, Any]) -> None:
        """Append one row.

        Args:
            row: column name (``str``) -> value (formatted by :func:`format_cell`). Columns of
                the header missing from ``row`` are left empty. A new column widens the header
                (the file is rewritten once, atomically).

        Raises:
            RuntimeError: the logger is closed.
            TypeError: a key is not a string or a value is a tensor.
            OSError: the file cannot be written.
        """
        if self._file is None:
            raise RuntimeError(f"CsvLogger({self.path}) is closed")
        for k in row:
            if not isinstance(k, str):
                raise TypeError(f"CSV column names must be str, got {k!r}")
        cells = {k: format_cell(v) for k, v in row.items()}
        new_keys = [k for k in cells if k not in self._fieldnames]
        if new_keys:
            self._widen(self._fieldnames + new_keys)
        line = io.StringIO()
        csv.writer(line, lineterminator="\n").writerow(
            [cells.get(k, "") for k in self._fieldnames]
        )
        try:
            self._file.write(line.getvalue())
            self._file.flush()
        except OSError as exc:  # a full disk, a file above the size limit: name the file
            raise OSError(exc.errno, exc.strerror or str(exc), str(self.path)) from exc

    def _widen(self, fieldnames: list[str]) -> None:
        assert self._file is not None
        self._file.flush()
        rows: list[dict[str, str]] = []
        if self._fieldnames:
            with open(self.path, newline="", encoding="utf-8") as f:
                reader = csv.reader(f)
                next(reader, None)  # old header
                for values in reader:
                    rows.append(dict(zip(self._fieldnames, values)))
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(fieldnames)
        for r in rows:
            writer.writerow([r.get(k, "") for k in fieldnames])
        self._file.close()
        self._file = None
        try:
            write_text_atomic(self.path, out.getvalue())
            self._fieldnames = list(fieldnames)
        finally:
            # Reopen in every case so that a failed rewrite leaves a usable (old) logger.
            self._file = open(self.path, "a", newline="", encoding="utf-8")

    def close(self) -> None:
        """Flush and close the file (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> CsvLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
