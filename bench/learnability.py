"""Learnability: does each trading agent find an edge that is there and keep its money where there is none?

Usage::

    python -m bench.learnability [--experiments a,b,...] [--markets m1,m2,...] [--seeds 5] [--parallel N]
                                 [--out DIR] [--results DIR] [--tag T] [-- extra overrides...]

For every experiment (default: bench.trading_seeds.TRADING) and market (default: every one of
:data:`MARKETS`), one ``python -m foxdqn.train --multirun +experiment=E seed=0,...,S-1
hydra/launcher=population <the market's overrides> [extra overrides]`` (bench.common.run_multirun)
into ``OUT/E/MARKET``: the seeds of an experiment that a population supports train as one
population in one process, the others one after another in the same launcher. ``--parallel``
(default 2 on CUDA, 1 on CPU) such multiruns run at a time. The extra overrides after ``--`` go to
every run (``data.synthetic.*`` keys are refused on the real markets: pass them only with
``--markets`` of generated ones); issue 34's options are such overrides (``action.switch_margin=M``,
``data.augment.method=block_bootstrap``; docs/bench.md#learnability has the commands).

Then each job's ``eval/summary.json`` (the test split) is read and one table is written,
``RESULTS/<date>_<gpu>_learnability[-tag].md`` and ``.json`` (the GPU name and torch/triton versions
of bench.common.tags): one row per (experiment, market) with the agent's test total return (mean ±
std over seeds), its median number of trades, the oracle's, buy-and-hold's and flat's test total
returns (the oracle only on a generated market, docs/backtest.md#the-oracle), the fraction of the
oracle's return the agent captured (mean agent return / oracle return, where the oracle's is > 0),
the seed ensemble's probabilistic Sharpe ratio against 0 (foxdqn.report.seeds.summarise) and whether
the market's target (:data:`TARGETS`) is met; then one line per experiment: how many targets it
met. Runs behind the deployment gate (``eval.gate``, on by default for trading) get a second table:
the seeds and the ensemble policy with the gate and as trained, from the same runs
(:func:`ungated`, bench.gate_rows). Returns are fractions in the ``.json`` and percent in the ``.md``.
Docs: docs/bench.md#learnability.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import RESULTS, run_multirun, tags
from bench.gate_rows import as_trained, finite as _finite
from bench.trading_seeds import TRADING

#: The no-edge target (``martingale_1h``): a mean test loss of at most this fraction ...
NO_EDGE_MAX_LOSS = 0.02
#: ... and at most this many trades, the median over seeds.
NO_EDGE_MAX_TRADES = 100
#: The edge target (``ar1_1h`` with |φ| ≥ :data:`EDGE_MIN_PHI`): the agents' mean test return at
#: least this fraction of the oracle's (net of costs, on the same bars).
EDGE_MIN_CAPTURE = 0.5
EDGE_MIN_PHI = 0.2

#: Target name -> how the .md states it.
TARGETS = {
    "no_edge": f"mean return ≥ −{NO_EDGE_MAX_LOSS * 100:g} % and median trades ≤ {NO_EDGE_MAX_TRADES}",
    "edge": f"mean return ≥ {EDGE_MIN_CAPTURE:g} × the oracle's",
}


@dataclass(frozen=True)
class Market:
    """One market of the bench: its label (the sweep folder's name), the overrides that choose it,
    whether it is generated (so its summaries carry the oracle) and its target (a key of
    :data:`TARGETS`, or None: no target, the row is there to be read)."""

    label: str
    overrides: tuple[str, ...]
    generated: bool
    target: str | None = None


def _ar1(phi: float) -> Market:
    return Market(f"ar1_1h_phi{phi:+g}", ("data.name=ar1_1h", f"data.synthetic.phi={phi:g}"), True,
                  "edge" if abs(phi) >= EDGE_MIN_PHI else None)


#: The markets, in table order (docs/backtest.md#markets-with-a-known-answer; the real ones are files).
MARKETS: dict[str, Market] = {m.label: m for m in (
    Market("martingale_1h", ("data.name=martingale_1h",), True, "no_edge"),
    _ar1(0.2),
    _ar1(-0.2),
    Market("regime_1h", ("data.name=regime_1h",), True),
    Market("trend_1h", ("data.name=trend_1h",), True),
    Market("eurusd_1h", ("data.name=eurusd_1h",), False),
    Market("googl_1d", ("data.name=googl_1d",), False),
)}


def _total_return(summary: dict, policy: str) -> float | None:
    return _finite(((summary.get("metrics") or {}).get(policy) or {}).get("total_return"))


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def market_row(experiment: str, market: Market, jobs: list[dict[str, Any]], expected: int) -> dict[str, Any]:
    """The table's row for one (experiment, market) multirun.

    Args:
        experiment: the experiment's name.
        market: the market it trained and was tested on.
        jobs: the multirun's finished jobs (foxdqn.report.seeds.read_job dicts with a ``summary``;
            a job's ``dir`` is where its ``eval/equity.csv`` is read for the ensemble).
        expected: the number of seeds the multirun ran.

    Returns a dict: ``experiment``, ``market``, ``seeds`` (finished), ``expected``,
    ``return_mean``, ``return_std`` (the agent's test total return over seeds, fractions; std with
    ddof 1, 0 for one seed), ``median_trades``, ``oracle_return`` (None on a market without an
    oracle), ``buy_and_hold_return``, ``flat_return`` (means over the seeds' summaries, which see
    the same bars), ``captured`` (return_mean / oracle_return where the oracle's is > 0, else
    None), ``ensemble_psr`` (the seed ensemble's PSR against 0, foxdqn.report.seeds.summarise; None
    without equity curves or where the ensemble's returns have no variance, as when no seed
    trades), ``target`` (a key of :data:`TARGETS` or None), ``met`` (True, False,
    or None where the market has no target or the oracle earned nothing) and ``why`` (the numbers
    that decided ``met``); ``policy_return``, ``policy_trades`` and ``policy_met``: the seeds'
    ensemble policy (one agent acting on their mean Q or vote, foxdqn.population.ensemble; None
    where the seeds did not train as one population) and the same target applied to it. Returns
    of no finished seed are None.
    """
    from foxdqn.report.seeds import summarise

    summaries = [j["summary"] for j in jobs]
    entry = summarise([{**j, "setting": market.label} for j in jobs])[0] if jobs else None
    stats = entry["test"]["total_return"] if entry else None
    oracle = _mean([_total_return(s, "oracle") for s in summaries]) if market.generated else None
    trades = [t for t in (s["metrics"]["agent"].get("num_trades") for s in summaries) if t is not None]
    row: dict[str, Any] = {
        "experiment": experiment, "market": market.label, "seeds": len(jobs), "expected": expected,
        "return_mean": stats["mean"] if stats and math.isfinite(stats["mean"]) else None,
        "return_std": stats["std"] if stats and math.isfinite(stats["std"]) else None,
        "median_trades": statistics.median(trades) if trades else None,
        "oracle_return": oracle,
        "buy_and_hold_return": _mean([_total_return(s, "buy_and_hold") for s in summaries]),
        "flat_return": _mean([_total_return(s, "flat") for s in summaries]),
        "ensemble_psr": _finite(((entry or {}).get("ensemble") or {}).get("psr_vs_zero")),
        "target": market.target,
    }
    row["captured"] = (row["return_mean"] / oracle if row["return_mean"] is not None and oracle is not None
                       and oracle > 0 else None)
    row["met"], row["why"] = verdict(row)
    policy = (entry or {}).get("ensemble_policy") or {}
    row["policy_return"] = _finite(policy.get("total_return"))
    row["policy_trades"] = _finite(policy.get("num_trades"))
    row["policy_met"], _ = (verdict({**row, "return_mean": row["policy_return"],  # missing seeds: not met
                                     "median_trades": row["policy_trades"]})
                            if row["policy_return"] is not None else (None, ""))
    row.update(ungated(row, summaries))
    return row


def ungated(row: dict[str, Any], summaries: list[dict]) -> dict[str, Any]:
    """Behind the deployment gate: the seeds and the ensemble policy as trained
    (:func:`bench.gate_rows.as_trained`) with the row's target applied to them (``ungated_met``,
    ``ungated_policy_met``). Empty without the gate."""
    out = as_trained(summaries)
    if not out:
        return out
    out["ungated_met"], _ = verdict({**row, "return_mean": out["ungated_return"], "median_trades": out["ungated_trades"]})
    if "ungated_policy_return" in out:
        out["ungated_policy_met"], _ = verdict({**row, "return_mean": out["ungated_policy_return"],
                                               "median_trades": out["ungated_policy_trades"]})
    return out


def verdict(row: dict[str, Any]) -> tuple[bool | None, str]:
    """Whether ``row`` (:func:`market_row`'s keys) meets its market's target, and why.

    ``no_edge``: mean test return ≥ −:data:`NO_EDGE_MAX_LOSS` and median trades ≤
    :data:`NO_EDGE_MAX_TRADES`. ``edge``: mean test return ≥ :data:`EDGE_MIN_CAPTURE` × the
    oracle's, judged only where the oracle's return is > 0 (None otherwise). A row with a seed
    that has no results (failed, halted) does not meet its target. None where there is no target.
    """
    target = row["target"]
    if target is None:
        return None, ""
    if row["seeds"] < row["expected"] or row["return_mean"] is None:
        return False, f"{row['expected'] - row['seeds']} of {row['expected']} seeds without results"
    mean = row["return_mean"]
    if target == "no_edge":
        trades = row["median_trades"]
        loss_ok = mean >= -NO_EDGE_MAX_LOSS
        trades_ok = trades is not None and trades <= NO_EDGE_MAX_TRADES
        return loss_ok and trades_ok, (f"mean {_pct(mean)} {'≥' if loss_ok else '<'} −{NO_EDGE_MAX_LOSS * 100:g} %, "
                                       f"median trades {_num(trades)} {'≤' if trades_ok else '>'} {NO_EDGE_MAX_TRADES}")
    if target == "edge":
        oracle = row["oracle_return"]
        if oracle is None or oracle <= 0:
            return None, "the oracle earned nothing here: no target"
        ok = mean >= EDGE_MIN_CAPTURE * oracle
        return ok, f"mean {_pct(mean)} {'≥' if ok else '<'} {EDGE_MIN_CAPTURE:g} × oracle {_pct(oracle)}"
    raise ValueError(f"unknown target {target!r}")


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v * 100:+.2f} %"


def _num(v: float | None) -> str:
    return "—" if v is None else f"{v:g}"


def experiment_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per experiment (in ``rows``' order): how many of its markets' targets it met, and
    each judged market's verdict."""
    out = []
    for name in dict.fromkeys(r["experiment"] for r in rows):
        judged = [r for r in rows if r["experiment"] == name and r["met"] is not None]
        met = sum(bool(r["met"]) for r in judged)
        detail = "; ".join(f"{r['market']} {'met' if r['met'] else 'not met'}" for r in judged)
        out.append(f"- {name}: {met} of {len(judged)} targets met" + (f" ({detail})" if detail else ""))
    return out


def to_markdown(rows: list[dict[str, Any]]) -> str:
    """The table (one row per (experiment, market), returns in percent; "—": no such number) and
    the per-experiment lines, as markdown."""
    lines = ["| experiment | market | seeds | test return, mean ± std | median trades | oracle | buy-and-hold | flat | "
             "captured (mean / oracle) | ensemble PSR > 0 | ensemble policy return, trades | target | met | "
             "ensemble policy met |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ret = "—" if r["return_mean"] is None else f"{r['return_mean'] * 100:+.2f} ± {r['return_std'] * 100:.2f} %"
        seeds = str(r["seeds"]) if r["seeds"] == r["expected"] else f"{r['seeds']} of {r['expected']}"
        met = "—" if r["met"] is None else ("**met**" if r["met"] else "not met")
        lines.append("| " + " | ".join([
            r["experiment"], r["market"], seeds, ret, _num(r["median_trades"]), _pct(r["oracle_return"]),
            _pct(r["buy_and_hold_return"]), _pct(r["flat_return"]),
            "—" if r["captured"] is None else f"{r['captured'] * 100:.0f} %",
            "—" if r["ensemble_psr"] is None else f"{r['ensemble_psr']:.3f}",
            "—" if r.get("policy_return") is None else f"{_pct(r['policy_return'])}, {_num(r['policy_trades'])}",
            TARGETS[r["target"]] if r["target"] else "—",
            met + (f" ({r['why']})" if r["why"] else ""),
            "—" if r.get("policy_met") is None else ("**met**" if r["policy_met"] else "not met")]) + " |")
    text = "\n".join(lines) + "\n\n" + "\n".join(experiment_lines(rows)) + "\n"
    if any("gate_flat" in r for r in rows):
        text += "\n" + gate_markdown(rows)
    return text


def gate_markdown(rows: list[dict[str, Any]]) -> str:
    """Behind the deployment gate: the rows above as trained (without the gate) beside the gated
    ones (:func:`ungated`), as markdown."""
    def met(v):
        return "—" if v is None else ("**met**" if v else "not met")

    lines = ["Deployment gate (`eval.gate`): the seeds and the ensemble policy with the gate (the table above) "
             "and as trained, without it (the gate's last candidate, from the same runs).", "",
             "| experiment | market | seeds flat | gated: return, trades, met | as trained: return, trades, met | "
             "ensemble gated | ensemble as trained |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "gate_flat" not in r:
            continue
        gated = f"{_pct(r['return_mean'])}, {_num(r['median_trades'])}, {met(r['met'])}"
        trained = f"{_pct(r['ungated_return'])}, {_num(r['ungated_trades'])}, {met(r['ungated_met'])}"
        eg = ("—" if r.get("policy_return") is None else
              f"{_pct(r['policy_return'])}, {_num(r['policy_trades'])}, {met(r['policy_met'])}"
              + (" (flat)" if r.get("gate_policy_flat") else ""))
        et = ("—" if r.get("ungated_policy_return") is None else
              f"{_pct(r['ungated_policy_return'])}, {_num(r['ungated_policy_trades'])}, {met(r['ungated_policy_met'])}")
        lines.append(f"| {r['experiment']} | {r['market']} | {r['gate_flat']} of {r['seeds']} | {gated} | {trained} | "
                     f"{eg} | {et} |")
    return "\n".join(lines) + "\n"


def run_pair(experiment: str, market: Market, seeds: int, out: Path, extra: list[str]) -> dict[str, Any]:
    """Train ``experiment`` on ``market`` over ``seeds`` seeds (one multirun into
    ``out/experiment/market``) and return its :func:`market_row` with ``rc``, ``wall_s``,
    ``sweep_dir`` and ``problems`` (each job without results: folder and why)."""
    from foxdqn.report.seeds import find_job_dirs, read_job

    sweep = out / experiment / market.label
    run = run_multirun(experiment, seeds, sweep, ["hydra/launcher=population", *market.overrides, *extra])
    jobs = [read_job(d) for d in find_job_dirs(sweep)]
    row = market_row(experiment, market, [j for j in jobs if j["summary"]], seeds)
    return {**row, **run, "sweep_dir": str(sweep),
            "problems": [f"{j['dir'].name}: {j['problem']}" for j in jobs if not j["summary"]]}


def _default_parallel() -> int:
    import torch

    return 2 if torch.cuda.is_available() else 1


def main(argv: list[str] | None = None) -> int:
    """Run the bench (the module docstring); returns 0 when every multirun exited 0, 1 otherwise,
    2 after one error line for bad arguments or an ``--out`` that already holds a pair's folder.
    Targets that are not met do not change the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experiments", default=",".join(TRADING))
    p.add_argument("--markets", default=",".join(MARKETS), help=f"of {', '.join(MARKETS)}")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--parallel", type=int, default=None, help="multiruns at a time (default 2 on CUDA, 1 on CPU)")
    p.add_argument("--out", default="multirun/learnability")
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--tag", default="")
    args = p.parse_args(argv)
    names = [e for e in args.experiments.split(",") if e]
    markets = [m for m in args.markets.split(",") if m]
    parallel = _default_parallel() if args.parallel is None else args.parallel
    unknown = sorted(set(names) - set(TRADING)) + sorted(set(markets) - set(MARKETS))
    if unknown or not names or not markets or args.seeds < 1 or parallel < 1:
        print(f"bench.learnability: error: unknown {unknown} (experiments: {', '.join(TRADING)}; markets: "
              f"{', '.join(MARKETS)}), none given, or --seeds/--parallel < 1", file=sys.stderr)
        return 2
    out = Path(args.out)
    pairs = [(e, MARKETS[m]) for e in names for m in markets]
    used = [out / e / m.label for e, m in pairs if (out / e / m.label).exists()]
    if used:  # a reused folder would mix an earlier run's jobs into this table
        print(f"bench.learnability: error: {used[0]} exists; choose another --out", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        rows = list(pool.map(lambda pair: run_pair(*pair, args.seeds, out, extra), pairs))
    meta = {**tags(), "seeds": args.seeds, "overrides": extra, "parallel": parallel,
            "wall_s": round(time.perf_counter() - t0, 1)}
    failed = [f"- {r['experiment']} on {r['market']}: rc {r['rc']}; " +
              ("; ".join(r["problems"]) or "no job folder") + f" (see {r['sweep_dir']}/stdout.log)"
              for r in rows if r["rc"] != 0 or r["problems"]]
    text = (f"# Learnability over {args.seeds} seeds\n\n"
            f"{meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, {meta['date']}; "
            f"{parallel} multiruns at a time, {meta['wall_s']} s in all; overrides: {' '.join(extra) or 'none'}.\n\n"
            "Test split of each market, greedy agent, selection on the validation split only. Test return: the "
            "agent's total return, mean ± std over seeds; trades: the median over seeds; oracle (generated markets "
            "only), buy-and-hold and flat: their total return on the same bars; captured: mean agent return / "
            "oracle return, where the oracle's is > 0; ensemble PSR > 0: the probabilistic Sharpe ratio of the "
            "seeds' per-bar test returns averaged into one portfolio. Targets: on the no-edge market "
            f"(martingale_1h) {TARGETS['no_edge']}; on AR(1) markets with |φ| ≥ {EDGE_MIN_PHI:g} "
            f"{TARGETS['edge']}; a pair with a seed without results does not meet its target.\n\n" +
            to_markdown(rows) + ("\nRuns with problems:\n\n" + "\n".join(failed) + "\n" if failed else "") +
            "\nWall per multirun (s): " + ", ".join(f"{r['experiment']}/{r['market']} {r['wall_s']}" for r in rows)
            + "\n")
    gpu = meta["gpu"].replace(" ", "-").replace(":", "-")
    stem = f"{meta['date'][:10]}_{gpu}_learnability" + (f"-{args.tag}" if args.tag else "")
    results_dir = Path(args.results)
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / f"{stem}.md").write_text(text)
    targets = {"no_edge_max_loss": NO_EDGE_MAX_LOSS, "no_edge_max_trades": NO_EDGE_MAX_TRADES,
               "edge_min_capture": EDGE_MIN_CAPTURE, "edge_min_phi": EDGE_MIN_PHI}
    (results_dir / f"{stem}.json").write_text(json.dumps({"meta": meta, "targets": targets, "rows": rows}, indent=1,
                                                         default=str))
    print(text)
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
