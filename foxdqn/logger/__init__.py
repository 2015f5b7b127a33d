"""Host-side monitoring: progress display, CSV and TensorBoard metric logs, a Prometheus endpoint.

Nothing here touches device tensors: callers pass Python numbers (read from the device once per
log interval); tensors are rejected with ``TypeError``.

* :class:`MetricsLogger` - one ``log(step, metrics)`` call fans out to ``run_dir/metrics.csv``
  (:class:`~foxdqn.logger.csv_log.CsvLogger`), ``run_dir/tb/``
  (:class:`~foxdqn.logger.tensorboard_log.TensorBoardLogger`) and any other sink given
  (:class:`~foxdqn.logger.mlflow_log.MlflowLogger`, a member's rows of a Prometheus endpoint:
  :meth:`foxdqn.logger.prometheus_log.PrometheusExporter.rows`).
* :class:`~foxdqn.logger.progress.TrainProgress` - progress bar / plain progress lines.
"""
from __future__ import annotations

import io
import numbers
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from foxdqn.io_atomic import write_text_atomic
from foxdqn.logger.csv_log import CsvLogger
from foxdqn.logger.progress import TrainProgress
from foxdqn.logger.tensorboard_log import TensorBoardLogger  # tensorboard itself is imported by its constructor

__all__ = ["MetricsLogger", "CsvLogger", "TrainProgress", "TensorBoardLogger"]

STEP_COLUMN = "step"
"""Name of the CSV column holding ``step`` (always the first column)."""


def truncate_after(path: Path, step: int) -> None:
    """Keep the header and the rows of CSV ``path`` whose ``step`` is at most ``step`` (atomic; no file: no-op)."""
    import csv

    if not path.is_file():
        return
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows:
        return
    column = rows[0].index(STEP_COLUMN) if STEP_COLUMN in rows[0] else 0
    kept = [rows[0]] + [r for r in rows[1:] if r and int(float(r[column])) <= step]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(kept)
    write_text_atomic(path, out.getvalue())


class MetricsLogger:
    """Log metric dicts to ``run_dir/metrics.csv`` and (optionally) TensorBoard ``run_dir/tb/``.

    Args:
        run_dir: the run's output directory (created if missing).
        tensorboard: also write TensorBoard event files under ``run_dir/tb``.
        resume_after: a resumed run's checkpoint step: the CSV rows (and TensorBoard events) logged
            after it are dropped.
        sinks: more objects with ``log(step, metrics)`` (e.g. an MLflow run, a member's rows of a
            Prometheus endpoint), given every row; the logger does not close them.

    Usage::

        with MetricsLogger(run_dir) as logger:
            logger.log(env_steps, {"train/loss": 0.12, "train/epsilon": 0.3})

    Raises:
        OSError: the directory or files cannot be created.
    """

    def __init__(self, run_dir: str | os.PathLike[str], tensorboard: bool = True, resume_after: int | None = None,
                 sinks: Sequence[Any] = ()) -> None:
        self.sinks = list(sinks)
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resume_after is not None:  # a resumed run: drop the rows logged after its checkpoint
            truncate_after(self.run_dir / "metrics.csv", resume_after)
        self.csv = CsvLogger(self.run_dir / "metrics.csv")
        self.tb: Any = None
        if tensorboard:
            try:
                self.tb = TensorBoardLogger(self.run_dir / "tb",
                                            purge_step=None if resume_after is None else resume_after + 1)
            except BaseException:
                self.csv.close()
                raise

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Write one row ``{"step": step, **metrics}`` to the CSV and each numeric value to
        TensorBoard at ``global_step=step``, and give it to every sink.

        Args:
            step: x value of the row (e.g. environment steps), an integer.
            metrics: name -> Python number (or string / ``None``: CSV only). Names like
                ``"train/loss"`` group the TensorBoard plots. Must not contain ``"step"``.

        Raises:
            ValueError: ``metrics`` contains the key ``"step"``.
            TypeError: ``step`` is not an integer, a name is not a string or a value is a tensor.
            RuntimeError: the logger is closed.
        """
        if STEP_COLUMN in metrics:
            raise ValueError(
                f"metrics must not contain the key {STEP_COLUMN!r}: pass it as the step argument"
            )
        if isinstance(step, bool) or not isinstance(step, numbers.Integral):
            raise TypeError(f"step must be an integer, got {step!r}")
        step = int(step)
        self.csv.log({STEP_COLUMN: step, **metrics})
        if self.tb is not None:
            self.tb.log(step, metrics)
        for sink in self.sinks:
            sink.log(step, metrics)

    def flush(self) -> None:
        """Flush TensorBoard (the CSV is flushed on every row)."""
        if self.tb is not None:
            self.tb.flush()

    def close(self) -> None:
        """Close the CSV and TensorBoard files (idempotent)."""
        try:
            self.csv.close()
        finally:
            if self.tb is not None:
                self.tb.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
