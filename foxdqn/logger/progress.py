"""Training progress display: a ``rich`` progress bar on a terminal, plain lines otherwise.

Three modes, chosen when :class:`TrainProgress` is created:

* **rich** (the stream is an interactive terminal, or a Jupyter notebook): a live display that
  fits an 80-column terminal, on up to three lines::

      train ━━━━━━━━━━━━━━━━━━━━  43% 4,300/10,000 env steps
      12,345 steps/s, 0:00:03 elapsed, 0:00:04 left
      eps=0.1 loss=0.0123 ep_ret=1.5

  (the last: the ``fields`` of the last :meth:`TrainProgress.update`, wrapped at the terminal's
  width when they are longer);
* **plain** (the stream is not a terminal: CI logs, ``nohup``, redirected output): one line
  per :meth:`~TrainProgress.update` call, but at most one every ``plain_interval_s`` seconds
  (default 10 s). The first update is always printed, and so is the final state: the update
  that reaches ``total`` and, on close, the last update if it was throttled. A line looks like::

      [train] 120,000/1,000,000 env steps (12.0%) | 41,237 steps/s | 0:00:03 elapsed, ETA 0:00:21 | loss=0.0123

  steps/s there is the rate since the previous printed line; the ETA uses the rate since the start;
* **disabled** (``enabled=False``): every method is a no-op (tests, quiet runs).

Host side only: ``update`` receives a Python ``int`` and a dict of Python floats; it never
touches device tensors (the caller reads them at its log interval).
"""
from __future__ import annotations

import math
import numbers
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.text import Text

__all__ = ["TrainProgress", "format_fields"]


def _fmt_value(v: Any) -> str:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, numbers.Integral):
        return str(int(v))
    if isinstance(v, numbers.Real):
        f = float(v)
        return f"{f:.4g}" if math.isfinite(f) else str(f)
    return str(v)


def format_fields(fields: Mapping[str, Any]) -> str:
    """``{"epsilon": 0.1, "loss": 0.01234567}`` -> ``"epsilon=0.1 loss=0.01235"`` (4 significant
    digits for floats, in the order given)."""
    return " ".join(f"{k}={_fmt_value(v)}" for k, v in fields.items())


def _fmt_duration(seconds: float) -> str:
    s = int(max(seconds, 0.0))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class TrainProgress:
    """Progress of a training run measured in environment steps (context manager).

    Args:
        total: total environment steps of the run (> 0).
        enabled: ``False`` makes every method a no-op.
        description: label shown before the bar / at the start of plain lines.
        plain_interval_s: minimum seconds between two plain lines (plain mode only, >= 0).
        file: output stream; default ``sys.stderr`` (stdout stays free for results).
        force_terminal: ``True``/``False`` overrides the terminal detection of ``file``
            (``None``: detect, as ``rich.console.Console`` does).
        initial: env steps already done (a resumed run); rates and the ETA count from there.

    Usage::

        with TrainProgress(total=1_000_000) as progress:
            ...
            progress.update(env_steps, {"epsilon": eps, "loss": loss, "return": mean_ret})

    Raises:
        ValueError: ``total`` is not a positive integer or ``plain_interval_s`` is negative.
    """

    def __init__(
        self,
        total: int,
        *,
        enabled: bool = True,
        description: str = "train",
        plain_interval_s: float = 10.0,
        file: TextIO | None = None,
        force_terminal: bool | None = None,
        initial: int = 0,
    ) -> None:
        if isinstance(total, bool) or not isinstance(total, numbers.Integral) or total <= 0:
            raise ValueError(f"total must be a positive integer (env steps), got {total!r}")
        if not (plain_interval_s >= 0.0):
            raise ValueError(f"plain_interval_s must be >= 0 seconds, got {plain_interval_s!r}")
        self.total = int(total)
        self.enabled = bool(enabled)
        self.description = description
        self.plain_interval_s = float(plain_interval_s)
        self._file: TextIO = file if file is not None else sys.stderr
        self._started = False
        self._progress: Any = None
        self._task: Any = None
        # plain-mode state
        self._t0 = 0.0
        self._last_print_t = 0.0
        self._printed_any = False
        self._first_steps = int(initial)  # a resumed run starts past 0: the ETA uses the rate since then
        self._last_print_steps = int(initial)
        self._pending: tuple[int, dict[str, Any]] | None = None  # last throttled update

        self.mode = "disabled"
        if self.enabled:
            console = Console(file=self._file, force_terminal=force_terminal)
            self._console = console
            self.mode = "rich" if (console.is_terminal or console.is_jupyter) else "plain"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> TrainProgress:
        """Start the display (called by ``__enter__``); idempotent."""
        if self._started or self.mode == "disabled":
            self._started = True
            return self
        self._started = True
        self._t0 = time.monotonic()
        self._last_print_t = self._t0
        if self.mode == "rich":
            self._progress = _LinesProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(bar_width=20),
                TextColumn("{task.percentage:>3.0f}%"),
                TextColumn("{task.completed:,.0f}/{task.total:,.0f} env steps"),
                console=self._console,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.description, total=self.total, info="",
                                                 completed=self._first_steps)
            self._route_logging(self._progress.console)
        return self

    def _route_logging(self, console: Any) -> None:
        """Send the root logger's console handlers through the live display while it runs, so a
        log line is printed above the bar instead of onto it (restored by :meth:`close`)."""
        import logging

        class _ToConsole:
            def write(self, text: str) -> int:
                console.print(text.rstrip("\n"), markup=False, highlight=False, soft_wrap=True)
                return len(text)

            def flush(self) -> None:
                pass

        self._rerouted = []
        for handler in logging.getLogger().handlers:
            if type(handler) is logging.StreamHandler and getattr(handler.stream, "isatty", lambda: False)():
                self._rerouted.append((handler, handler.setStream(_ToConsole())))

    def close(self) -> None:
        """Stop the display; in plain mode print the last update if it was throttled.
        Idempotent."""
        if not self._started:
            return
        self._started = False
        if self.mode == "rich" and self._progress is not None:
            for handler, stream in getattr(self, "_rerouted", []):
                handler.setStream(stream)
            self._rerouted = []
            self._progress.stop()
            self._progress = None
        elif self.mode == "plain" and self._pending is not None:
            steps, fields = self._pending
            self._print_line(steps, fields, time.monotonic())

    def __enter__(self) -> TrainProgress:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ updates
    def update(self, env_steps: int, fields: Mapping[str, Any] | None = None) -> None:
        """Report progress.

        Args:
            env_steps: environment steps completed so far (absolute, not an increment).
            fields: values for the text field, e.g. ``{"epsilon": 0.1, "loss": 0.012,
                "return": 1.5}`` (Python numbers; shown with 4 significant digits).

        Raises:
            RuntimeError: the progress is enabled but not started (use it as a context manager
                or call :meth:`start`).
        """
        if self.mode == "disabled":
            return
        if not self._started:
            raise RuntimeError(
                "TrainProgress is not started: use `with TrainProgress(...)` or call .start()"
            )
        fields = dict(fields or {})
        steps = int(env_steps)
        if self.mode == "rich":
            self._progress.update(self._task, completed=steps, info=format_fields(fields))
            return
        now = time.monotonic()
        due = (
            not self._printed_any
            or steps >= self.total
            or now - self._last_print_t >= self.plain_interval_s
        )
        if due:
            self._print_line(steps, fields, now)
        else:
            self._pending = (steps, fields)

    def _print_line(self, steps: int, fields: dict[str, Any], now: float) -> None:
        dt = now - self._last_print_t
        rate = (steps - self._last_print_steps) / dt if dt > 0 else 0.0
        pct = 100.0 * steps / self.total
        elapsed = now - self._t0
        overall = (steps - self._first_steps) / elapsed if elapsed > 0 and steps > self._first_steps else 0.0
        eta = _fmt_duration((self.total - steps) / overall) if overall > 0 else "?"
        parts = [
            f"[{self.description}] {steps:,}/{self.total:,} env steps ({pct:.1f}%)",
            f"{rate:,.0f} steps/s",
            f"{_fmt_duration(elapsed)} elapsed, ETA {eta}",
        ]
        text = format_fields(fields)
        if text:
            parts.append(text)
        print(" | ".join(parts), file=self._file, flush=True)
        self._printed_any = True
        self._last_print_t = now
        self._last_print_steps = steps
        self._pending = None


class _LinesProgress(Progress):
    """rich's Progress with the bar on one line and, below it, the rate and times, then the text
    field: each part short enough for an 80-column terminal (rich's one-row table cut the row to
    ``env steps 4,3… 0:…`` there)."""

    def get_renderables(self):
        yield self.make_tasks_table(self.tasks)
        for task in self.tasks:
            speed = task.finished_speed or task.speed
            left = task.time_remaining
            yield Text(f"{'?' if speed is None else f'{speed:,.0f}'} steps/s, "
                       f"{_fmt_duration(task.finished_time or task.elapsed or 0.0)} elapsed, "
                       f"{'?' if left is None else _fmt_duration(left)} left", style="progress.data.speed")
            if task.fields.get("info"):
                yield Text(task.fields["info"])
