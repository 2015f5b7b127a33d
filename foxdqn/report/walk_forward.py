"""Walk-forward results of a sweep: each seed's folds chained into one out-of-sample curve.

A walk-forward sweep trains one job per fold (``data.split.folds=K 'data.split.fold=range(K)'``,
:mod:`foxdqn.data.splits`): fold k trains on every bar before its validation block and tests on
block k of the test split. Here the jobs of one setting and seed (their overrides equal but for
``seed=`` and ``data.split.fold=``) are put in fold order and their test equity curves
(``eval/equity.csv``) chained: the concatenated curve multiplies fold k+1's per-bar returns onto
fold k's end, for the agent and for buy-and-hold alike. Each fold's walk starts flat on its
block's first bar, so the K − 1 bar-to-bar moves from one block into the next are not traded.

:func:`walk_forward` gives, per setting, every fold's test metrics (mean over seeds) and the
concatenated curve's total return, Sharpe, Sortino, max drawdown and PSR against 0 per seed (and
their mean); a seed whose K folds did not all finish has no concatenated curve. foxdqn.report.tables
writes it into ``report.json`` (``walk_forward``), ``report.md`` and ``walk_forward.csv`` (the
chained curves). docs/backtest.md#walk-forward.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

FOLD_KEY = "data.split.fold"


def _fold(job: dict) -> tuple[int, int] | None:
    """(folds, fold) of a finished job from its start record (``config.yaml``), None without
    walk-forward (folds 1) or a readable record."""
    from foxdqn.errors import ConfigError
    from foxdqn.run.folder import read_record

    try:
        record = read_record(job["dir"])
    except ConfigError:
        return None
    split = (((record or (None, {}))[1].get("data") or {}).get("split") or {})
    folds, fold = split.get("folds", 1), split.get("fold", 0)
    return (int(folds), int(fold)) if isinstance(folds, int) and folds > 1 else None


def _key(job: dict) -> tuple[str, str]:
    """(the setting without seed and fold, the seed) of a job, from its overrides."""
    rest, seed = [], "(default)"
    for o in job["overrides"]:
        key = o.lstrip("+~").split("=", 1)[0]
        if key == "seed":
            seed = o.split("=", 1)[1]
        elif key != FOLD_KEY:
            rest.append(o)
    return " ".join(rest) or "(defaults)", seed


def chain(curves: list[pd.DataFrame]) -> pd.DataFrame:
    """The fold curves (``eval/equity.csv`` frames, fold order) chained into one: ``fold``,
    ``timestamp``, ``agent_equity`` and ``buy_and_hold_equity``, each equity starting at 1 and
    continuing from the previous fold's last value."""
    parts, level = [], {"agent_equity": 1.0, "buy_and_hold_equity": 1.0}
    for k, c in enumerate(curves):
        part = pd.DataFrame({"fold": k, "timestamp": c["timestamp"].to_numpy()})
        for col in level:
            eq = c[col].to_numpy(dtype=np.float64)
            part[col] = level[col] * eq / eq[0]
            level[col] = float(part[col].iloc[-1])
        parts.append(part if k == 0 else part.iloc[1:])  # the first row repeats the previous fold's end
    return pd.concat(parts, ignore_index=True)


def _curve_metrics(equity: np.ndarray, bars_per_year: float) -> dict[str, float]:
    from foxdqn.analysis.metrics import max_drawdown, sharpe_ratio, simple_returns, sortino_ratio
    from foxdqn.analysis.significance import probabilistic_sharpe_ratio

    r = simple_returns(equity)
    return {"total_return": float(equity[-1] / equity[0] - 1.0), "sharpe": sharpe_ratio(r, bars_per_year),
            "sortino": sortino_ratio(r, bars_per_year), "max_drawdown": max_drawdown(equity),
            "psr_vs_zero": probabilistic_sharpe_ratio(r), "bars": int(r.size)}


def _mean(values: list[float]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def walk_forward(jobs: list[dict]) -> tuple[list[dict[str, Any]], pd.DataFrame]:
    """The walk-forward entries of a sweep's finished trading jobs (foxdqn.report.seeds.read_job
    dicts with a ``summary``) and the chained curves.

    Returns:
        ``entries``: one per setting with walk-forward jobs: ``setting``, ``folds`` (K), ``per_fold``
        (K dicts: ``fold``, ``seeds`` finished, mean test ``total_return``, ``sharpe``,
        ``num_trades``, ``buy_and_hold_return``), ``seeds`` (per seed with all K folds: ``seed``
        and the concatenated curve's ``total_return``, ``sharpe``, ``sortino``, ``max_drawdown``,
        ``psr_vs_zero``, ``bars``, ``num_trades`` (summed over folds) and
        ``buy_and_hold_return``), ``mean`` (those metrics' means over the seeds);
        ``curves``: the chained curves, columns ``setting``, ``seed`` and :func:`chain`'s.
    """
    groups: dict[str, dict[str, dict[int, dict]]] = {}
    folds_of: dict[str, int] = {}
    for job in jobs:
        if job.get("summary") is None or "split" not in job["summary"]:
            continue
        fold = _fold(job)
        if fold is None:
            continue
        setting, seed = _key(job)
        folds_of[setting] = fold[0]
        groups.setdefault(setting, {}).setdefault(seed, {})[fold[1]] = job
    entries, curves = [], []
    for setting, seeds in groups.items():
        k_folds = folds_of[setting]
        per_fold = []
        for k in range(k_folds):
            done = [s[k]["summary"]["metrics"] for s in seeds.values() if k in s]
            per_fold.append({"fold": k, "seeds": len(done),
                             **{m: _mean([d["agent"].get(m) for d in done]) for m in ("total_return", "sharpe",
                                                                                       "num_trades")},
                             "buy_and_hold_return": _mean([d.get("buy_and_hold", {}).get("total_return")
                                                           for d in done])})
        rows = []
        for seed, by_fold in seeds.items():
            if sorted(by_fold) != list(range(k_folds)):
                continue
            try:
                parts = [pd.read_csv(by_fold[k]["dir"] / "eval" / "equity.csv") for k in range(k_folds)]
                curve = chain(parts)
            except (OSError, KeyError, ValueError, IndexError):  # a missing or broken equity.csv: no curve
                continue
            bars_per_year = float(by_fold[0]["summary"]["bars_per_year"])
            row = {"seed": seed, **_curve_metrics(curve["agent_equity"].to_numpy(), bars_per_year),
                   "num_trades": float(sum(by_fold[k]["summary"]["metrics"]["agent"].get("num_trades", 0.0)
                                           for k in range(k_folds))),
                   "buy_and_hold_return": float(curve["buy_and_hold_equity"].iloc[-1] - 1.0)}
            rows.append(row)
            curves.append(curve.assign(setting=setting, seed=seed))
        names = ("total_return", "sharpe", "sortino", "max_drawdown", "psr_vs_zero", "num_trades",
                 "buy_and_hold_return")
        entries.append({"setting": setting, "folds": k_folds, "per_fold": per_fold, "seeds": rows,
                        "mean": {m: _mean([r[m] for r in rows]) for m in names}})
    frame = (pd.concat(curves, ignore_index=True)[["setting", "seed", "fold", "timestamp", "agent_equity",
                                                   "buy_and_hold_equity"]] if curves else pd.DataFrame())
    return entries, frame


def to_markdown(entries: list[dict[str, Any]]) -> str:
    """The walk-forward section of report.md: per setting, a table of its folds and one row of the
    concatenated out-of-sample curve (means over seeds; returns in percent)."""
    def pct(v: float) -> str:
        return "n/a" if v is None or not math.isfinite(v) else f"{v * 100:+.2f} %"

    def num(v: float) -> str:
        return "n/a" if v is None or not math.isfinite(v) else f"{v:.3g}"

    out = []
    for e in entries:
        m = e["mean"]
        out += [f"### {e['setting']}: {e['folds']} folds, {len(e['seeds'])} seed(s) with every fold", "",
                "| fold | seeds | test return | test Sharpe | trades | buy-and-hold return |", "|---|---|---|---|---|---|"]
        out += [f"| {f['fold']} | {f['seeds']} | {pct(f['total_return'])} | {num(f['sharpe'])} | {num(f['num_trades'])} | "
                f"{pct(f['buy_and_hold_return'])} |" for f in e["per_fold"]]
        out += [f"| **concatenated** | {len(e['seeds'])} | {pct(m['total_return'])} | {num(m['sharpe'])} | "
                f"{num(m['num_trades'])} | {pct(m['buy_and_hold_return'])} |", "",
                f"Concatenated curve (mean over seeds): Sortino {num(m['sortino'])}, max drawdown "
                f"{pct(m['max_drawdown']).lstrip('+')}, PSR > 0 {m['psr_vs_zero']:.3f}.", ""]
    return "\n".join(out)
