"""The plots of a sweep report (foxdqn.report.tables): a metric against one swept hyperparameter, and
learning curves by setting with a band over seeds.

Like foxdqn.analysis.equity_plot, rendering uses Matplotlib's Agg canvas through the object-oriented API
(no ``pyplot``, no display, no global state); each PNG is written atomically
(:func:`foxdqn.io_atomic.write_bytes_atomic`).
"""
from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from foxdqn.io_atomic import write_bytes_atomic

__all__ = ["plot_metric_vs_param", "plot_learning_curves", "numeric_axis"]


def _figure(panels: int, width: float = 5.5):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * panels, 4.2), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, panels, squeeze=False)[0]


def _save(fig, path: str | os.PathLike[str]) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    write_bytes_atomic(path, buf.getvalue())


def numeric_axis(values: Sequence[str]) -> tuple[np.ndarray | None, bool]:
    """``(x, log)`` for hyperparameter values given as strings: ``x`` the floats when every value
    parses as a finite number (else None: a categorical axis), ``log`` True when they are all
    positive, span at least a factor 3 and are not all integers (learning rates, not n-step, batch
    sizes or periods: integer keys stay on a linear axis)."""
    try:
        x = np.asarray([float(v) for v in values], dtype=np.float64)
    except (TypeError, ValueError):
        return None, False
    if not np.isfinite(x).all():
        return None, False
    integers = all(str(v).strip().lstrip("+-").isdigit() for v in values)
    return x, bool(x.size and not integers and (x > 0).all() and x.max() >= 3 * x.min())


def plot_metric_vs_param(path: str | os.PathLike[str], param: str, values: Sequence[str],
                         panels: Mapping[str, Sequence[float]], title: str) -> None:
    """Write a PNG with one panel per metric: each job's value (a dot) against its value of the
    hyperparameter ``param``, and the mean over the jobs sharing that value (a line).

    Args:
        path: destination ``.png``.
        param: the hyperparameter's name (the x label).
        values: ``[J]`` the hyperparameter's value of each job, as written in its override; a
            numeric axis (log scale when positive, spanning a factor 3 and not all integers) when all are numbers,
            else one category per distinct value, in order of first appearance.
        panels: metric label -> ``[J]`` that metric of each job (NaN: a job without it).
        title: the figure's title.

    Raises:
        ValueError: no panel, a panel whose length is not ``J``, or no finite value at all.
        OSError: the file cannot be written.
    """
    if not panels:
        raise ValueError("no metric to plot")
    frame = pd.DataFrame({"x": list(values), **{k: np.asarray(v, dtype=np.float64) for k, v in panels.items()}})
    metrics = [k for k in panels if np.isfinite(frame[k]).any()]
    if not metrics:
        raise ValueError(f"no finite metric value to plot against {param}")
    x, log = numeric_axis(list(values))
    categories = list(dict.fromkeys(values))
    frame["pos"] = x if x is not None else [categories.index(v) for v in values]
    fig, axes = _figure(len(metrics))
    for ax, metric in zip(axes, metrics):
        ax.plot(frame["pos"], frame[metric], "o", alpha=0.6, label="job")
        means = frame.groupby("pos")[metric].mean()
        ax.plot(means.index, means.to_numpy(), "-", color="tab:red", label="mean at this value")
        if x is None:
            ax.set_xticks(range(len(categories)), categories, rotation=30 if len(categories) > 4 else 0)
        elif log:
            ax.set_xscale("log")
        ax.set_xlabel(param)
        ax.set_ylabel(metric)
        ax.grid(True, alpha=0.3)
    axes[0].legend(loc="best")
    fig.suptitle(title)
    _save(fig, path)


def plot_learning_curves(path: str | os.PathLike[str], curves: Mapping[str, pd.DataFrame], ylabel: str,
                         title: str) -> None:
    """Write a PNG with one learning curve per setting: the mean over its seeds against env steps
    and a band from the seeds' minimum to their maximum.

    Args:
        path: destination ``.png``.
        curves: setting label -> a DataFrame indexed by env step (int), one column per seed (the
            metric's value there, NaN where that seed has none); at most 10 settings are
            readable in one legend, the caller chooses which.
        ylabel: the metric's name.
        title: the figure's title.

    Raises:
        ValueError: no curve with a finite value.
        OSError: the file cannot be written.
    """
    drawn = {k: c.sort_index() for k, c in curves.items() if np.isfinite(c.to_numpy(dtype=np.float64)).any()}
    if not drawn:
        raise ValueError(f"no finite {ylabel} value in any learning curve")
    fig, (ax,) = _figure(1, width=8.0)
    for label, c in drawn.items():
        step = c.index.to_numpy(dtype=np.float64)
        lines = ax.plot(step, c.mean(axis=1, skipna=True).to_numpy(), "-o", markersize=3,
                        label=f"{label} ({c.shape[1]} seed{'s' if c.shape[1] != 1 else ''})")
        if c.shape[1] > 1:
            ax.fill_between(step, c.min(axis=1, skipna=True).to_numpy(), c.max(axis=1, skipna=True).to_numpy(),
                            color=lines[0].get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("env steps")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    ax.set_title(title)
    _save(fig, path)
