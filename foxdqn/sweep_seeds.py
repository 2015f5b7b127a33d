"""Results of a multirun aggregated over seeds: ``multirun/.../seeds.md`` and ``seeds.json``.

Jobs whose overrides differ only in ``seed=`` are one *setting*. For each setting, over its seeds:

* mean, std (ddof=1; 0 for one seed), min and max of the agent's test metrics (``total_return``,
  ``sharpe``, ``max_drawdown``, ``num_trades``; ``mean_return`` for episodic envs) and of the
  validation value the run was selected on (``selection.value``);
* the same statistics a single run reports, for the *seed ensemble*: the per-bar returns of the
  seeds' test equity curves (``eval/equity.csv``) averaged bar by bar, i.e. one portfolio holding
  every seed's agent with equal weight. Its probabilistic Sharpe ratio against 0 and against
  buy-and-hold and its block-bootstrap 95 % Sharpe interval (foxdqn.significance) account for
  the seeds trading the same bars, which a mean of per-seed statistics would not;
* buy-and-hold's test Sharpe and total return on the same bars (the same for every seed).

Written by the Hydra callback :class:`SeedsReport` at the end of every ``--multirun`` (train.yaml
registers it) and printed; ``python -m foxdqn.sweep_seeds DIR`` rebuilds it for a sweep folder.
Settings are sorted by their mean validation value, best first; the test split never orders them.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from foxdqn.io_atomic import read_json, write_json_atomic, write_text_atomic

TRADING_METRICS = ("total_return", "sharpe", "max_drawdown", "num_trades")
EPISODIC_METRICS = ("mean_return",)


def _overrides(job: Path) -> list[str]:
    from omegaconf import OmegaConf

    path = job / ".hydra" / "overrides.yaml"
    return [str(o) for o in OmegaConf.load(path)] if path.is_file() else []


def load_jobs(sweep_dir: Path, job_dirs: list[Path] | None = None) -> list[dict[str, Any]]:
    """The finished jobs (with an ``eval/summary.json``) among ``job_dirs`` (default: every job
    folder under ``sweep_dir``), in folder order."""
    candidates = job_dirs if job_dirs is not None else [p.parent.parent for p in Path(sweep_dir).glob("*/eval/summary.json")]
    jobs = []
    for job in sorted((Path(j) for j in candidates), key=lambda p: str(p)):
        summary_path = job / "eval" / "summary.json"
        if not summary_path.is_file():
            continue
        overrides = _overrides(job)
        jobs.append({"dir": job, "summary": read_json(summary_path), "overrides": overrides,
                     "setting": " ".join(o for o in overrides if not o.lstrip("+").startswith("seed=")) or "(defaults)"})
    return jobs


def _stats(values: list[float]) -> dict[str, float]:
    a = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if a.size == 0:
        return {"mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan}
    return {"mean": float(a.mean()), "std": float(a.std(ddof=1)) if a.size > 1 else 0.0,
            "min": float(a.min()), "max": float(a.max())}


def _ensemble(jobs: list[dict]) -> dict[str, float] | None:
    """Significance of the equal-weight ensemble of the seeds' test equity curves (None if unavailable)."""
    import pandas as pd

    from foxdqn.evaluate import significance

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
    from foxdqn.metrics import sharpe_ratio

    return {"total_return": float(equity[-1] - 1.0), "sharpe": sharpe_ratio(returns, bars_per_year),
            **significance(equity, bars_per_year, bench)}


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
            entry["ensemble"] = _ensemble(group)
        out.append(entry)
    key = [e["selection"]["mean"] for e in out]
    lower = out and out[0]["selection_metric"] == "max_drawdown"
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
    trading = "buy_and_hold" in settings[0]
    lines = [f"| {first_column} | seeds | val " + str(settings[0]["selection_metric"]) + " | " +
             ("test return | test Sharpe | max drawdown | trades | ensemble Sharpe [95 % interval] | "
              "ensemble PSR > 0 | ensemble PSR > B&H (active return) | B&H return, Sharpe |" if trading else "test mean return |"),
             "|---|---|---|" + ("---|" * 8 if trading else "---|")]
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
            row.append(f"{bh['total_return'] * 100:+.2f} %, {bh['sharpe']:+.2f}" if bh.get("sharpe") is not None
                       else "n/a")
        else:
            row.append(_fmt(e["test"]["mean_return"]))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def failed_jobs(job_dirs: list[Path]) -> dict[str, str]:
    """Job folder name -> why it has no summary (the ``HALTED`` reason, or "no eval/summary.json")."""
    out = {}
    for job in job_dirs:
        job = Path(job)
        if not (job / "eval" / "summary.json").is_file():
            halted = job / "HALTED"
            out[job.name] = f"halted: {halted.read_text().strip()}" if halted.is_file() else "no eval/summary.json"
    return out


def write_report(sweep_dir: Path, job_dirs: list[Path] | None = None) -> list[dict]:
    """Aggregate the jobs of ``sweep_dir`` (``job_dirs``: those of this multirun only; default every
    job folder in it) and write ``seeds.json`` and ``seeds.md`` into it (atomically). Jobs without a
    summary (halted, failed) are listed under the table."""
    sweep_dir = Path(sweep_dir)
    settings = summarise(load_jobs(sweep_dir, job_dirs))
    failed = failed_jobs(job_dirs) if job_dirs is not None else {}
    notes = "".join(f"\n- job {name}: {why}" for name, why in sorted(failed.items()))
    write_json_atomic(sweep_dir / "seeds.json", settings)
    write_text_atomic(sweep_dir / "seeds.md", f"# Seeds of {sweep_dir}\n\nmean ± std [min, max] over seeds; "
                      "sorted by the validation value (the test split orders nothing).\n\n" + to_markdown(settings)
                      + (f"\nJobs without results:{notes}\n" if notes else ""))
    return settings


try:
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover - hydra is a dependency
    Callback = object


class SeedsReport(Callback):
    """Hydra callback: at the end of a ``--multirun``, write and print the seeds report of the jobs
    this multirun ran (a sweep folder reused from an earlier multirun does not mix its old jobs in,
    when the launcher runs the jobs in this process, like Hydra's basic launcher)."""

    def __init__(self) -> None:
        self.job_dirs: list[Path] = []

    def on_job_end(self, config, job_return=None, **kwargs) -> None:
        self.job_dirs.append(Path(str(config.hydra.runtime.output_dir)))

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if not sweep_dir.is_dir():
            return
        settings = write_report(sweep_dir, self.job_dirs or None)
        failed = failed_jobs(self.job_dirs)
        text = to_markdown(settings) if settings else ""
        if failed:
            text += f"{len(failed)} of {len(self.job_dirs)} jobs without results: " + \
                "; ".join(f"{k} ({v})" for k, v in sorted(failed.items())) + "\n"
        print(text + f"seeds report: {sweep_dir / 'seeds.md'}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        helping = bool(argv) and argv[0] in ("-h", "--help")
        print("usage: python -m foxdqn.sweep_seeds MULTIRUN_DIR  (writes seeds.md and seeds.json there)",
              file=sys.stdout if helping else sys.stderr)
        return 0 if helping else 2
    sweep_dir = Path(argv[0])
    if not (sweep_dir / "multirun.yaml").is_file():
        print(f"foxdqn: error: {sweep_dir}: not a multirun folder (Hydra writes multirun.yaml into the sweep "
              "folder, hydra.sweep.dir)", file=sys.stderr)
        return 2
    settings = write_report(sweep_dir)
    print(to_markdown(settings) + f"seeds report: {sweep_dir / 'seeds.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
