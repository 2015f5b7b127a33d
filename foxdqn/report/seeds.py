"""Results of a multirun aggregated over seeds (the settings table of ``report.md``, foxdqn.report.tables).

Jobs whose overrides differ only in ``seed=`` are one *setting*. For each setting, over its seeds:

* mean, std (ddof=1; 0 for one seed), min and max of the agent's test metrics (``total_return``,
  ``sharpe``, ``max_drawdown``, ``num_trades``; ``mean_return`` for episodic envs) and of the
  validation value the run was selected on (``selection.value``);
* the same statistics a single run reports, for the *seed ensemble*: the per-bar returns of the
  seeds' test equity curves (``eval/equity.csv``) averaged bar by bar, i.e. one portfolio holding
  every seed's agent with equal weight. Its probabilistic Sharpe ratio against 0 and against
  buy-and-hold and its block-bootstrap 95 % Sharpe interval (foxdqn.analysis.significance) account for
  the seeds trading the same bars, which a mean of per-seed statistics would not;
* buy-and-hold's test Sharpe and total return on the same bars (the same for every seed);
* where the seeds trained as one population, the *ensemble policy*: the seeds acting as one agent
  (argmax of their mean Q, or their vote: ``eval.ensemble``, foxdqn.population.ensemble), walked
  once through the test split; its ``ensemble_policy`` entry in every seed's summary.json.

Settings are sorted by their mean validation value, best first; the test split never orders them.
The job folders are read here too (:func:`find_job_dirs`, :func:`read_job`). foxdqn.report.tables writes
these tables into a sweep folder's ``report.md`` / ``report.json`` (its ``settings``).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from foxdqn.analysis.metrics import LOWER_IS_BETTER
from foxdqn.io_atomic import read_json

TRADING_METRICS = ("total_return", "sharpe", "max_drawdown", "num_trades")
EPISODIC_METRICS = ("mean_return",)


def _overrides(job: Path) -> list[str]:
    """The job's ``.hydra/overrides.yaml``, a boolean written as YAML and the command line write it
    (``true``: Hydra's sweepers write the values they parsed back with Python's ``True``). Read with
    PyYAML's C loader where there is one (a sweep report reads hundreds: OmegaConf's loader took 2.5
    ms a file on a 2-core CPU).

    Raises:
        ValueError: the file holds a scalar, not Hydra's list of overrides.
        yaml.YAMLError: it is not YAML.
    """
    import yaml

    path = job / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return []
    doc = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    if doc is not None and not isinstance(doc, (list, dict)):
        raise ValueError(f"a YAML list of overrides was expected, got a {type(doc).__name__}")
    out = []
    for o in doc or []:
        key, sep, value = str(o).partition("=")
        out.append(f"{key}={value.lower()}" if sep and value in ("True", "False") else str(o))
    return out


def _job_order(path: Path) -> tuple:
    return (0, int(path.name), "") if path.name.isdigit() else (1, 0, path.name)


def find_job_dirs(sweep_dir: Path) -> list[Path]:
    """The job folders of a sweep folder: its sub-folders holding ``.hydra/overrides.yaml`` or
    ``eval/summary.json``, numbered ones in number order (``2`` before ``10``), then by name."""
    sweep_dir = Path(sweep_dir)
    found = {p.parent.parent for pattern in ("*/.hydra/overrides.yaml", "*/eval/summary.json")
             for p in sweep_dir.glob(pattern)}
    return sorted((p for p in found if p.is_dir()), key=_job_order)


def _no_results(job: Path) -> str:
    if (job / "HALTED").is_file():
        return f"halted: {(job / 'HALTED').read_text(errors='replace').strip()}"
    if (job / "INCOMPLETE").is_file():
        return "no eval/summary.json (INCOMPLETE: failed, killed or still running)"
    return "no eval/summary.json"


def read_job(job: Path) -> dict[str, Any]:
    """One job folder as a dict: ``dir``, ``overrides`` (``.hydra/overrides.yaml``, a list of
    ``key=value`` strings), ``setting`` (the overrides without ``seed=``, joined by spaces, or
    ``"(defaults)"``), ``summary`` (``eval/summary.json``; None without a usable one) and
    ``problem`` (None, or why there is no summary: halted, unfinished, unreadable). Never raises
    for a bad job folder."""
    job = Path(job)
    try:
        overrides = _overrides(job)
    except Exception as exc:  # noqa: BLE001 - a broken overrides.yaml is one job's problem
        overrides, problem = [], f"unreadable .hydra/overrides.yaml: {str(exc).splitlines()[0][:120]}"
    else:
        problem = None
    out = {"dir": job, "overrides": overrides, "summary": None, "problem": problem,
           "setting": " ".join(o for o in overrides if not o.lstrip("+~").startswith("seed=")) or "(defaults)"}
    path = job / "eval" / "summary.json"
    if not path.is_file():
        out["problem"] = problem or _no_results(job)
        return out
    try:
        summary = read_json(path)
    except (OSError, ValueError) as exc:
        out["problem"] = f"unreadable eval/summary.json: {str(exc).splitlines()[0][:120]}"
        return out
    metrics = summary.get("metrics") if isinstance(summary, dict) else None
    if not isinstance(metrics, dict) or not isinstance(metrics.get("agent"), dict):
        out["problem"] = "eval/summary.json without metrics.agent"
        return out
    out["summary"] = summary
    return out


def load_jobs(sweep_dir: Path, job_dirs: list[Path] | None = None) -> list[dict[str, Any]]:
    """The finished jobs (a usable ``eval/summary.json``) among ``job_dirs`` (default: every job
    folder of ``sweep_dir``, :func:`find_job_dirs`), as :func:`read_job` dicts, in job order."""
    candidates = job_dirs if job_dirs is not None else find_job_dirs(sweep_dir)
    jobs = [read_job(j) for j in sorted((Path(j) for j in candidates), key=_job_order)]
    return [j for j in jobs if j["summary"] is not None]


def _stats(values: list[float]) -> dict[str, float]:
    a = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if a.size == 0:
        return {"mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan}
    return {"mean": float(a.mean()), "std": float(a.std(ddof=1)) if a.size > 1 else 0.0,
            "min": float(a.min()), "max": float(a.max())}


def _ensemble(jobs: list[dict]) -> dict[str, float] | None:
    """Significance of the equal-weight ensemble of the seeds' test equity curves (None if unavailable)."""
    import pandas as pd

    from foxdqn.analysis.backtest import significance

    curves = []
    for job in jobs:
        path = job["dir"] / "eval" / "equity.csv"
        if not path.is_file():
            return None
        curves.append(pd.read_csv(path))
    if len({len(c) for c in curves}) != 1 or len(curves[0]) < 3:
        return None
    returns = np.mean([c["agent_equity"].to_numpy()[1:] / c["agent_equity"].to_numpy()[:-1] - 1 for c in curves],
                      axis=0)
    equity = np.concatenate([[1.0], np.cumprod(1.0 + returns)])
    bench = curves[0]["buy_and_hold_equity"].to_numpy(dtype=np.float64)
    bars_per_year = float(jobs[0]["summary"]["bars_per_year"])
    from foxdqn.analysis.metrics import sharpe_ratio

    return {"total_return": float(equity[-1] - 1.0), "sharpe": sharpe_ratio(returns, bars_per_year),
            **significance(equity, bars_per_year, bench)}


def _ensemble_policy(jobs: list[dict]) -> dict[str, Any] | None:
    """The seeds' ensemble policy (``rule``, ``members``, and its test ``total_return``, ``sharpe``,
    ``max_drawdown``, ``num_trades``, ``psr_vs_zero``), when every seed's summary holds the same
    ``ensemble_policy`` entry (they trained as one population); else None."""
    entries = [j["summary"].get("ensemble_policy") for j in jobs]
    first = entries[0]
    if not first or any(e != first for e in entries):
        return None
    metrics = first.get("metrics", {})
    return {"rule": first.get("rule"), "members": first.get("members"),
            **{k: metrics.get(k) for k in (*TRADING_METRICS, "psr_vs_zero")}}


def summarise(jobs: list[dict]) -> list[dict[str, Any]]:
    """One entry per setting (see the module docstring), sorted by mean validation value, best first."""
    settings: dict[str, list[dict]] = {}
    for job in jobs:
        settings.setdefault(job["setting"], []).append(job)
    out = []
    for setting, group in settings.items():
        agent = [j["summary"]["metrics"]["agent"] for j in group]
        trading = "split" in group[0]["summary"]
        names = TRADING_METRICS if trading else EPISODIC_METRICS
        sel = [j["summary"].get("selection", {}) for j in group]
        entry = {
            "setting": setting,
            "seeds": len(group),
            "jobs": [j["dir"].name for j in group],
            "selection_metric": sel[0].get("metric"),
            "selection": _stats([s.get("value", math.nan) for s in sel]),
            "test": {name: _stats([a.get(name, math.nan) for a in agent]) for name in names},
        }
        if trading:
            bh = group[0]["summary"]["metrics"].get("buy_and_hold", {})
            entry["buy_and_hold"] = {"total_return": bh.get("total_return"), "sharpe": bh.get("sharpe")}
            try:
                entry["ensemble"] = _ensemble(group)
            except (KeyError, ValueError, OSError):  # a broken equity.csv: no ensemble, still a report
                entry["ensemble"] = None
            entry["ensemble_policy"] = _ensemble_policy(group)
        out.append(entry)
    key = [e["selection"]["mean"] for e in out]
    lower = bool(out) and out[0]["selection_metric"] in LOWER_IS_BETTER
    order = sorted(range(len(out)), key=lambda i: (math.isnan(key[i]), key[i] if lower else -key[i]))
    return [out[i] for i in order]


def _fmt(stats: dict[str, float], pct: bool = False) -> str:
    if stats is None or math.isnan(stats["mean"]):
        return "n/a"
    k, unit = (100.0, " %") if pct else (1.0, "")
    return f"{stats['mean'] * k:+.3g} ± {stats['std'] * k:.2g}{unit} [{stats['min'] * k:+.3g}, {stats['max'] * k:+.3g}]"


def to_markdown(settings: list[dict], first_column: str = "setting") -> str:
    """The seeds table as markdown (one row per entry, named by its ``setting``; mean ± std
    [min, max] over seeds); ``first_column`` heads the names' column."""
    if not settings:
        return "No finished job (eval/summary.json) in this sweep.\n"
    trading = [e for e in settings if "buy_and_hold" in e]  # a folder of both kinds: a table of each
    episodic = [e for e in settings if "buy_and_hold" not in e]
    return "\n".join(_table(kind, first_column) for kind in (trading, episodic) if kind)


def _table(settings: list[dict], first_column: str) -> str:
    """:func:`to_markdown`'s table of settings of one kind (trading, or episodic envs)."""
    trading = "buy_and_hold" in settings[0]
    lines = [f"| {first_column} | seeds | val " + str(settings[0]["selection_metric"]) + " | " +
             ("test return | test Sharpe | max drawdown | trades | ensemble Sharpe [95 % interval] | "
              "ensemble PSR > 0 | ensemble PSR > B&H (active return) | ensemble policy return, trades | "
              "B&H return, Sharpe |" if trading else "test mean return |"),
             "|---|---|---|" + ("---|" * 9 if trading else "---|")]
    for e in settings:
        row = [e["setting"], str(e["seeds"]), _fmt(e["selection"])]
        if trading:
            t, ens, bh = e["test"], e.get("ensemble"), e["buy_and_hold"]
            row += [_fmt(t["total_return"], pct=True), _fmt(t["sharpe"]), _fmt(t["max_drawdown"], pct=True),
                    _fmt(t["num_trades"])]
            if ens:
                row += [f"{ens['sharpe']:+.2f} [{ens['sharpe_ci95_low']:+.2f}, {ens['sharpe_ci95_high']:+.2f}]",
                        f"{ens['psr_vs_zero']:.3f}", f"{ens.get('psr_vs_buy_and_hold', math.nan):.3f}"]
            else:
                row += ["n/a"] * 3
            pol = e.get("ensemble_policy")
            row.append(f"{pol['total_return'] * 100:+.2f} %, {pol['num_trades']:g} ({pol['rule']})"
                       if pol and pol.get("total_return") is not None else "n/a")
            row.append(f"{bh['total_return'] * 100:+.2f} %, {bh['sharpe']:+.2f}" if bh.get("sharpe") is not None
                       else "n/a")
        else:
            row.append(_fmt(e["test"]["mean_return"]))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"
