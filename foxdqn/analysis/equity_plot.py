"""Equity-curve plot of an evaluation (agent vs. baselines) with the agent's drawdown.

Rendering uses Matplotlib's Agg canvas through the object-oriented API
(:class:`matplotlib.figure.Figure` + :class:`~matplotlib.backends.backend_agg.FigureCanvasAgg`)
and never imports ``matplotlib.pyplot``: no display is needed, the process-wide backend is not
switched, no figure is registered in pyplot's global figure manager (nothing to close, nothing
leaks) and no ``rcParams`` are changed.
"""
from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from foxdqn.io_atomic import write_bytes_atomic

__all__ = ["plot_equity", "AGENT_KEY"]

AGENT_KEY = "agent"
"""Name of the curve whose drawdown is drawn (the first curve when no curve has this name)."""


def _curve(name: str, values: Any, n: int | None) -> np.ndarray:
    try:
        a = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"curve {name!r}: cannot be converted to float64 ({e})") from None
    if a.ndim != 1 or a.size < 2:
        raise ValueError(f"curve {name!r} must be 1-D with at least 2 points, got shape {a.shape}")
    if n is not None and a.size != n:
        raise ValueError(f"curve {name!r} has {a.size} points, expected {n} (like the others)")
    return a


def plot_equity(
    path: str | os.PathLike[str],
    timestamps: Sequence[Any] | np.ndarray | None,
    curves: Mapping[str, np.ndarray],
    title: str,
) -> None:
    """Write a PNG with the equity curves (top) and the agent's drawdown (bottom).

    Top panel: one line per entry of ``curves`` (e.g. ``"agent"``, ``"buy_and_hold"``,
    ``"flat"``), each **normalised to start at 1.0** so curves with different initial equity
    compare directly. The y axis is logarithmic (equal vertical distances = equal percentage
    moves) and labelled "equity (x initial, log scale)"; if any normalised value is <= 0 or
    non-finite it falls back to a linear axis labelled "equity (x initial, linear scale)".

    Bottom panel: drawdown of the agent curve (key ``"agent"``, else the first curve) in percent
    below its running peak, drawn as a filled area going down from 0.

    The file is written atomically (temporary file in the same directory, fsync,
    ``os.replace``); the parent directory is created if missing.

    Args:
        path: destination ``.png`` file.
        timestamps: x values, one per curve point (``[S+1]``): datetimes (``numpy.datetime64``,
            pandas ``DatetimeIndex``, ``datetime``) or numbers. ``None`` plots against the bar
            index ``0..S``.
        curves: name -> ``[S+1]`` equity curve (float); all curves must have the same length.
        title: figure title.

    Raises:
        ValueError: ``curves`` is empty, a curve is not 1-D, has fewer than 2 points or a length
            different from the others or from ``timestamps``.
        OSError: the file cannot be written.
    """
    if not curves:
        raise ValueError("curves is empty: pass at least one equity curve")
    n: int | None = None
    arrays: dict[str, np.ndarray] = {}
    for name, values in curves.items():
        a = _curve(str(name), values, n)
        n = a.size
        arrays[str(name)] = a
    assert n is not None
    if timestamps is None:
        x: Any = np.arange(n)
        xlabel = "bar"
    else:
        x = np.asarray(timestamps)
        if x.ndim != 1 or x.size != n:
            raise ValueError(
                f"timestamps must be 1-D with {n} entries (one per curve point), "
                f"got shape {x.shape}"
            )
        xlabel = "time"

    # Normalise to 1.0 at the start (a non-positive or non-finite start leaves the curve as is).
    normed: dict[str, np.ndarray] = {}
    for name, a in arrays.items():
        start = a[0]
        normed[name] = a / start if np.isfinite(start) and start > 0 else a.copy()
    all_vals = np.concatenate(list(normed.values()))
    log_scale = bool(np.all(np.isfinite(all_vals)) and np.all(all_vals > 0))

    agent_name = AGENT_KEY if AGENT_KEY in normed else next(iter(normed))
    agent = normed[agent_name]
    with np.errstate(divide="ignore", invalid="ignore"):
        peak = np.fmax.accumulate(agent)
        drawdown_pct = np.where(peak > 0, (agent / peak - 1.0) * 100.0, np.nan)

    # Imported here so that importing foxdqn.analysis.equity_plot stays cheap.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, NullFormatter

    # fixed margins, not layout="constrained" (which measured every text extent again: half the
    # plot's time); the ylabels and the rotated dates fit these at this size
    fig = Figure(figsize=(11, 6.5), dpi=100)
    fig.subplots_adjust(left=0.075, right=0.985, top=0.93, bottom=0.09, hspace=0.06)
    FigureCanvasAgg(fig)
    ax, ax_dd = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    for name, a in normed.items():
        lw = 1.6 if name == agent_name else 1.1
        ax.plot(x, a, label=name, linewidth=lw, zorder=3 if name == agent_name else 2)
    if log_scale:
        ax.set_yscale("log")
        # Plain numbers ("0.9", "10") instead of the default 9x10^-1 notation; minor ticks are
        # labelled only when the curves span less than ~1.5 decades (else they would crowd).
        plain = FuncFormatter(lambda v, _pos: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        span = float(np.log10(all_vals.max() / all_vals.min()))
        ax.yaxis.set_minor_formatter(plain if span < 1.5 else NullFormatter())
        ax.set_ylabel("equity (x initial, log scale)")
    else:
        ax.set_ylabel("equity (x initial, linear scale)")
    ax.set_title(title, loc="left")
    ax.grid(True, which="major", alpha=0.3)
    # above the axes, beside the title: never over a curve, and no search for the emptiest corner
    # (Matplotlib's loc="best" tests every curve point: a third of the plot's time on a test split)
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncols=len(normed), frameon=False, borderaxespad=0.2)

    ax_dd.fill_between(x, drawdown_pct, 0.0, color="tab:red", alpha=0.35, linewidth=0)
    ax_dd.plot(x, drawdown_pct, color="tab:red", linewidth=0.8)
    ax_dd.set_ylabel(f"{agent_name} drawdown (%)")
    ax_dd.set_xlabel(xlabel)
    ax_dd.grid(True, alpha=0.3)
    if xlabel == "time":
        fig.autofmt_xdate(bottom=0.14)

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    write_bytes_atomic(Path(path), buf.getvalue())
