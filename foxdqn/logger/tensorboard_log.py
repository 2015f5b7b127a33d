"""Scalar logging to TensorBoard through :class:`torch.utils.tensorboard.SummaryWriter`.

Host side only: values must be Python (or NumPy) numbers; tensors are rejected with
``TypeError`` so that logging never forces a device synchronisation. Keys are TensorBoard tags;
use ``"<group>/<name>"`` (e.g. ``"train/loss"``, ``"eval/sharpe"``) so TensorBoard groups them.
"""
from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["TensorBoardLogger"]


class TensorBoardLogger:
    """Write scalars to a TensorBoard event file in ``logdir``.

    Args:
        logdir: directory for the ``events.out.tfevents.*`` file (created if missing).
        flush_secs: the writer flushes pending events at least this often (seconds).

    Raises:
        OSError: ``logdir`` cannot be created.
    """

    def __init__(self, logdir: str | os.PathLike[str], flush_secs: int = 30, purge_step: int | None = None) -> None:
        # start-up: tensorboard is a slow import (docs/bench.md#other-costs), needed only here
        from torch.utils.tensorboard import SummaryWriter

        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        # purge_step (a resumed run): TensorBoard drops the events at or after it written before the crash
        self._writer: Any = SummaryWriter(log_dir=str(self.logdir), flush_secs=flush_secs, purge_step=purge_step)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Add one scalar per numeric entry of ``metrics`` at ``global_step=step``.

        Args:
            step: the x value (e.g. environment steps), a non-negative integer.
            metrics: tag -> number (int, float, bool or NumPy scalar; NaN/inf are logged as is).
                ``None`` and string values are skipped (they have no scalar plot).

        Raises:
            RuntimeError: the logger is closed.
            TypeError: ``step`` is not an integer, a tag is not a string or a value is a tensor
                or another non-scalar object.
        """
        if self._writer is None:
            raise RuntimeError(f"TensorBoardLogger({self.logdir}) is closed")
        if isinstance(step, bool) or not isinstance(step, numbers.Integral):
            raise TypeError(f"step must be an integer, got {step!r}")
        for tag, value in metrics.items():
            if not isinstance(tag, str):
                raise TypeError(f"TensorBoard tags must be str, got {tag!r}")
            if value is None or isinstance(value, str):
                continue
            if type(value).__module__.split(".")[0] == "torch":
                raise TypeError(
                    f"{tag}: got a {type(value).__name__}; log host values, never tensors"
                )
            try:
                v = float(value)
            except (TypeError, ValueError):
                raise TypeError(f"{tag}: value {value!r} is not a number") from None
            self._writer.add_scalar(tag, v, global_step=int(step))

    def log_hparams(self, hparams: Mapping[str, Any], metrics: Mapping[str, Any], step: int) -> None:
        """One row of TensorBoard's HParams tab (``SummaryWriter.add_hparams``) in this run's folder;
        ``metrics`` are also written as scalars at ``step`` (once: do not :meth:`log` them too).

        Args:
            hparams: name -> bool, int, float or str (other values are turned into strings).
            metrics: name -> number; non-finite and non-numeric values are left out.
            step: the x value of the metrics (e.g. the run's last env step).
        """
        import math

        if self._writer is None:
            raise RuntimeError(f"TensorBoardLogger({self.logdir}) is closed")
        hp = {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in hparams.items()}
        mt = {k: float(v) for k, v in metrics.items()
              if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v))}
        self._writer.add_hparams(hp, mt, run_name=".", global_step=int(step))

    def flush(self) -> None:
        """Write pending events to disk now."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file (idempotent)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> TensorBoardLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
