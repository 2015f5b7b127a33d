"""Trading experiments over seeds: one Hydra ``--multirun`` per experiment, several at once.

Usage::

    python -m bench.trading_seeds [--experiments a,b,...] [--seeds 5] [--data NAME] [--parallel 6]
                                  [--out DIR] [--tag T] [-- extra overrides...]

Each experiment runs as ``python -m foxdqn.train --multirun +experiment=E seed=0,...,S-1
[data.name=NAME] [overrides]`` into ``OUT/E``; the multirun's report (foxdqn.report.tables, its settings
aggregated over seeds by foxdqn.report.seeds) is written there by the Hydra callback. This script then writes one combined report,
``bench/results/<date>_<gpu>_trading-seeds[-tag].md`` (and ``.json``), with the GPU name and versions:
each experiment's test metrics as mean ± std [min, max] over seeds, the seed ensemble's Sharpe
interval and probabilistic Sharpe ratios, and buy-and-hold and flat on the same bars.
Selection is on validation only: the test split is evaluated once per seed, with the weights
the run kept, behind the deployment gate (``eval.gate``, on by default for trading); a second table
gives the seeds and their ensemble as trained, from the same runs (bench.gate_rows).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import RESULTS, run_multirun, tags
from bench.gate_rows import as_trained
from foxdqn.io_atomic import read_json

TRADING = ("eurusd_dqn", "googl_dqn", "eurusd_c51", "eurusd_iqn", "eurusd_cql", "eurusd_iql", "eurusd_attention",
           "eurusd_routed", "eurusd_branching", "eurusd_rainbowish", "eurusd_controls")


def run_one(experiment: str, seeds: int, data: str | None, out: Path, extra: list[str]) -> dict:
    """One experiment's multirun over seeds into ``out/experiment`` (bench.common.run_multirun, with
    ``data.name=data`` where given); returns its exit code, wall seconds and report settings."""
    sweep = out / experiment
    run = run_multirun(experiment, seeds, sweep, [*extra, *([f"data.name={data}"] if data else [])])
    report = sweep / "report.json"
    return {"experiment": experiment, **run, "gate": gate_row(sweep),
            "settings": read_json(report)["settings"] or None if report.is_file() else None}


def gate_row(sweep: Path) -> dict | None:
    """Behind the deployment gate (``eval.gate.enabled``): how many of the sweep's seeds it kept flat,
    and their mean test return and median trades as trained (bench.gate_rows.as_trained); None
    without the gate."""
    from foxdqn.report.seeds import find_job_dirs, read_job

    summaries = [j["summary"] for j in (read_job(d) for d in find_job_dirs(sweep)) if j["summary"]]
    out = as_trained(summaries)
    return {**out, "seeds": len(summaries)} if out else None


def gate_markdown(results: list[dict]) -> str:
    """The gate's table: per experiment, seeds kept flat, and the seeds' and the ensemble policy's
    test return and trades as trained (from the same runs); "" when no run had the gate."""
    def pct(v):
        return "—" if v is None else f"{v * 100:+.2f} %"

    def num(v):
        return "—" if v is None else f"{v:g}"

    rows = [r for r in results if r.get("gate")]
    if not rows:
        return ""
    lines = ["Deployment gate (`eval.gate`): the table above is behind it; as trained, without it (its last "
             "candidate, from the same runs):", "",
             "| experiment | seeds flat | as trained: mean test return, median trades | ensemble policy as trained |",
             "|---|---|---|---|"]
    for r in rows:
        g = r["gate"]
        ens = ("—" if g.get("ungated_policy_return") is None else
               f"{pct(g['ungated_policy_return'])}, {num(g['ungated_policy_trades'])}"
               + (" (gated: flat)" if g.get("gate_policy_flat") else ""))
        lines.append(f"| {r['experiment']} | {g['gate_flat']} of {g['seeds']} | {pct(g['ungated_return'])}, "
                     f"{num(g['ungated_trades'])} | {ens} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experiments", default=",".join(TRADING))
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--data", default=None, help="data.name for every run (e.g. martingale_1h); default: each experiment's")
    p.add_argument("--parallel", type=int, default=6)
    p.add_argument("--out", default="multirun/trading_seeds")
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--tag", default="")
    args = p.parse_args(argv)
    names = [e for e in args.experiments.split(",") if e]
    unknown = sorted(set(names) - set(TRADING))
    if unknown or args.seeds < 1 or args.parallel < 1:
        print(f"bench.trading_seeds: error: unknown experiments {unknown} (allowed: {', '.join(TRADING)}), or "
              "--seeds/--parallel < 1", file=sys.stderr)
        return 2
    out = Path(args.out)
    used = [e for e in names if (out / e).exists()]
    if used:  # a reused folder would mix an earlier run's jobs into this report
        print(f"bench.trading_seeds: error: {out / used[0]} exists; choose another --out", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        results = list(pool.map(lambda e: run_one(e, args.seeds, args.data, out, extra), names))
    meta = {**tags(), "seeds": args.seeds, "data": args.data or "each experiment's", "overrides": extra,
            "parallel": args.parallel, "wall_s": round(time.perf_counter() - t0, 1)}
    from foxdqn.report.seeds import to_markdown

    table = to_markdown([{**r["settings"][0], "setting": r["experiment"]} for r in results if r["settings"]],
                        first_column="experiment")
    failed = [f"- {r['experiment']}: failed (rc {r['rc']}, see its stdout.log)" for r in results if not r["settings"]]
    text = (f"# Trading experiments over {args.seeds} seeds ({meta['data']} data)\n\n"
            f"{meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, {meta['date']}; "
            f"{args.parallel} multiruns at a time, {meta['wall_s']} s in all; overrides: {' '.join(extra) or 'none'}.\n\n"
            "Test split metrics of the greedy agent, mean ± std [min, max] over seeds; selection on the validation "
            "split only. Ensemble: the seeds' per-bar test returns averaged (one equal-weight portfolio), with its "
            "block-bootstrap 95 % Sharpe interval, PSR against 0, and the PSR of its return minus buy-and-hold's. "
            "Flat earns 0 by construction. Turnover and more per run: each run's eval/summary.json.\n\n" +
            table + ("\n" + "\n".join(failed) + "\n" if failed else "") + "\n" +
            (gate_markdown(results) + "\n" if any(r.get("gate") for r in results) else "") +
            "Wall per experiment (s): " + ", ".join(f"{r['experiment']} {r['wall_s']}" for r in results) + "\n")
    gpu = meta["gpu"].replace(" ", "-").replace(":", "-")
    stem = f"{meta['date'][:10]}_{gpu}_trading-seeds" + (f"-{args.tag}" if args.tag else "")
    results_dir = Path(args.results)
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / f"{stem}.md").write_text(text)
    (results_dir / f"{stem}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1, default=str))
    print(text)
    return 0 if all(r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
