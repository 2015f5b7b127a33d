"""``make bench``: run every section, print a table, write bench/results/.

Writes ``bench/results/<date>_<gpu>_<sections>.csv`` (every row tagged with GPU name, torch and
triton versions and date), ``.md`` (tables with ratios measured in this run) and ``.png`` (chart). On CPU only the eager rows run; the GPU rows need CUDA.

Usage: ``python -m bench.run [--sections step,e2e,cartpole,ops,population,kernels,startup] [--out DIR] [--seeds S] [--only ROWS] [--members P1,P2] [--first-seed K] [--warm] [--bytecode on|as-configured] [--tag T]``;
``python -m bench.run --report CSV`` rebuilds the .md and .png of a CSV (a run cut by a time limit
has its CSV, written after every row, but no report).
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import re
import sys
import traceback
from pathlib import Path

import pandas as pd
import torch

from bench.common import RESULTS, tags, write_csv


def ops_modules() -> list[str]:
    """The op bench modules' names without their ``bench_`` prefix (``bench/ops/bench_*.py``)."""
    import bench.ops as ops_pkg

    return sorted(m.name[len("bench_"):] for m in pkgutil.iter_modules(ops_pkg.__path__) if m.name.startswith("bench_"))


def _ops_rows(device: str, only: tuple[str, ...] | None = None):
    """The rows of every op bench module (or of those in ``only``), yielded module by module so that
    the CSV keeps what ran if a time limit cuts the section."""
    for mod in ops_modules():
        if only and mod not in only:
            continue
        try:
            yield from importlib.import_module(f"bench.ops.bench_{mod}").rows(device)
        except Exception as exc:
            yield {"section": "ops", "op": mod, "provider": "error", "note": f"{type(exc).__name__}: {exc}"[:200]}
            traceback.print_exc()


SECTIONS = ("step", "e2e", "cartpole", "ops", "population", "kernels", "startup")


def _section(name: str, device: str, seeds: int = 1, only: tuple[str, ...] | None = None,
             members: tuple[int, ...] | None = None, warm: bool = False, bytecode: bool = True,
             first_seed: int = 0):
    """The section's rows: a list, or a generator yielding them one at a time."""
    if name == "ops":
        if device != "cuda":
            print("ops section: the Triton kernels need CUDA; skipped on CPU", file=sys.stderr)
            return []
        return _ops_rows(device, only)
    module = importlib.import_module(f"bench.{name}_bench")
    if name == "population":
        return module.rows(device, only=only, members=members, warm=warm, bytecode=bytecode, first_seed=first_seed)
    if name == "kernels":
        return module.rows(device, only=only)
    return module.rows(device, seeds=seeds, only=only) if name == "cartpole" else module.rows(device)


def _cartpole_tables(cp: pd.DataFrame) -> str:
    from bench.cartpole_bench import summary

    cols = [c for c in ("features", "provider", "device", "seed", "env_steps_per_s", "env_steps_to_475",
                        "time_to_475_s", "last_eval_return", "note") if c in cp]
    text = "## cartpole: time to mean greedy return >= 475, every run\n\n" + cp[cols].to_markdown(
        index=False, floatfmt=".4g")
    if "time_to_475_s" in cp:
        text += ("\n\n## cartpole: medians over seeds, against SB3 DQN (rl-zoo hyperparameters)\n\n"
                 "A seed that did not reach 475 counts as +inf, so a median is empty unless more than half the "
                 "seeds reached 475. SB3 median time / median time > 1: the row reaches 475 sooner than SB3. "
                 "cartpole_zoo runs SB3's own hyperparameters (the like-for-like row); cartpole_cleanrl runs "
                 "CleanRL's; cartpole_zoo_x16 takes cartpole_zoo's 256 env steps per iteration as 16 steps of 16 "
                 "envs; cartpole_dqn also takes its 128 updates of batch 64 as 32 of batch 256.\n\n" + summary(cp).to_markdown(index=False, floatfmt=".4g"))
    return text


def _ratios(df: pd.DataFrame) -> str:
    parts = []
    step = df[df.section == "step"] if "section" in df else df.iloc[0:0]
    if len(step):
        p = step.pivot_table(index=["features", "size"], columns="provider", values="ms_per_update")
        if "graph" in p:
            p["eager/graph"] = p["eager"] / p["graph"]
            if "torch.compile" in p:
                p["compile/graph"] = p["torch.compile"] / p["graph"]
        parts.append("## step: ms per update\n\n" + p.round(4).to_markdown())
    e2e = df[df.section == "e2e"] if "section" in df else df.iloc[0:0]
    if len(e2e):
        cols = [c for c in ("features", "size", "provider", "env_steps_per_s", "updates_per_s") if c in e2e]
        parts.append("## end to end\n\n" + e2e[cols].to_markdown(index=False, floatfmt=".4g"))
    cp = df[df.section == "cartpole"] if "section" in df else df.iloc[0:0]
    if len(cp) and "env_steps_per_s" in cp:
        parts.append(_cartpole_tables(cp))
    ops = df[df.section == "ops"] if "section" in df else df.iloc[0:0]
    if len(ops) and "ms" in ops:
        p = ops.pivot_table(index=["op", "size"], columns="provider", values="ms")
        kernel = None  # the op's own row: triton, or fused (linear_relu's cuBLASLt epilogue) where no triton row
        for name in ("fused", "triton"):
            if name in p:
                kernel = p[name] if kernel is None else p[name].fillna(kernel)
        if kernel is not None and "torch.compile" in p:
            p["compile/triton"] = p["torch.compile"] / kernel
        if kernel is not None and "torch" in p:
            p["torch/triton"] = p["torch"] / kernel
        parts.append("## ops: ms (median)\n\n" + p.round(5).to_markdown())
    for name in ("population", "kernels", "startup"):  # sections whose module writes its own table
        rows_ = df[df.section == name] if "section" in df else df.iloc[0:0]
        if len(rows_):
            parts.append(importlib.import_module(f"bench.{name}_bench").table(rows_))
    return "\n\n".join(parts)


def _cartpole_chart(cp: pd.DataFrame, machine: str, path: Path) -> None:
    """Two bar panels per CartPole row: training seconds and env steps to a mean greedy return of 475
    (a row that did not reach it shows no bar and "not reached")."""
    import matplotlib.pyplot as plt

    seed = cp["seed"].map(lambda v: "" if pd.isna(v) else f" / seed {int(v)}") if "seed" in cp else ""
    labels = (cp.features + " / " + cp.provider + seed).tolist()
    fig, axes = plt.subplots(1, 2, figsize=(11, 1.2 + 0.5 * len(cp)), sharey=True)
    for ax, col, unit in zip(axes, ("time_to_475_s", "env_steps_to_475"), ("training seconds", "env steps")):
        values = cp[col].astype(float).tolist() if col in cp else [float("nan")] * len(cp)
        ax.barh(labels, [0.0 if pd.isna(v) else v for v in values])
        for y, v in enumerate(values):
            if pd.isna(v):
                ax.text(0, y, " not reached", va="center")
        ax.set_xlabel(f"{unit} to mean greedy return 475")
    axes[0].invert_yaxis()
    fig.suptitle(f"CartPole-v1, time to 475: {machine}")
    plt.tight_layout()
    plt.savefig(path, dpi=110)
    plt.close()


def _chart(df: pd.DataFrame, path: Path) -> bool:
    """Draw the chart of the step or cartpole rows of ``df`` into ``path``; False: no such rows,
    nothing written (start-up, kernels, ...)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    step = df[df.section == "step"] if "section" in df else df.iloc[0:0]
    if not len(step):
        if "section" in df and "time_to_475_s" in df and len(df[df.section == "cartpole"]):
            _cartpole_chart(df[df.section == "cartpole"], df["gpu"].iloc[0], path)
            return path.is_file()
        return False
    p = step.pivot_table(index=["features", "size"], columns="provider", values="ms_per_update")
    ax = p.plot.barh(figsize=(9, 1 + 0.5 * len(p)), logx=True)
    ax.set_xlabel("ms per update (log)")
    ax.set_title(f"foxdqn step: {df['gpu'].iloc[0]}")
    plt.tight_layout()
    plt.savefig(path, dpi=110)
    plt.close()
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--seeds", type=int, default=1, help="cartpole section: seeds per graph and SB3 row")
    ap.add_argument("--only", help="cartpole section: comma-separated rows (bench.cartpole_bench.ROWS); "
                                   "population section: experiments (bench.population_bench.CASES); kernels "
                                   "section: experiments (conf/experiment/); ops section: op modules "
                                   "(bench/ops/bench_<name>.py)")
    ap.add_argument("--members", help="population section: comma-separated member counts, a subset of each "
                                      "experiment's (bench.population_bench.CASES); default: all")
    ap.add_argument("--first-seed", type=int, default=0,
                    help="population section: each sweep (foxdqn's and the JAX peer's) trains seeds K..K+P-1 "
                         "(default 0), e.g. another draw of seeds for the greedy returns")
    ap.add_argument("--warm", action="store_true", help="population section: run each population sweep once "
                                                         "untimed first (Triton's cache warm for its shapes)")
    ap.add_argument("--bytecode", choices=("on", "as-configured"), default="on",
                    help="population section: Python's bytecode cache for its processes, turned on in a folder of "
                         "the section's where the environment turns it off (PYTHONDONTWRITEBYTECODE), or as configured")
    ap.add_argument("--tag", help="appended to the result files' name (<date>_<gpu>_<sections>-<tag>)")
    ap.add_argument("--report", metavar="CSV", help="only rebuild the .md and .png beside CSV from its rows "
                                                    "(e.g. of a run cut by a time limit)")
    args = ap.parse_args(argv)
    _check_args(ap, args)
    if args.report:
        csv_path = Path(args.report)
        df = pd.read_csv(csv_path)
        _write_report(df, df.iloc[0][["gpu", "torch", "triton", "date"]].to_dict(), csv_path.with_suffix(""))
        return 0
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        print("No CUDA device: running the eager rows only; graph, torch.compile and ops rows need CUDA.")
    t = tags()
    rows = []
    slug = re.sub(r"[^A-Za-z0-9]+", "-", t["gpu"]).strip("-")
    sections = args.sections.replace(",", "-")
    stem = Path(args.out) / f"{t['date'][:10]}_{slug}_{sections}{'-' + args.tag if args.tag else ''}"
    only = tuple(args.only.split(",")) if args.only else None
    stem.parent.mkdir(parents=True, exist_ok=True)
    for name in args.sections.split(","):
        members = tuple(int(m) for m in args.members.split(",")) if args.members else None
        for r in _section(name.strip(), device, args.seeds, only, members, args.warm,
                          args.bytecode == "on", args.first_seed):  # a list, or a generator of rows (cartpole)
            rows.append({**t, **r})
            write_csv(rows, stem.with_suffix(".csv"))  # after every row: a time-out keeps what ran
    _write_report(pd.DataFrame(rows), t, stem)
    return 0


def _check_args(ap: argparse.ArgumentParser, args) -> None:
    """Bad flags end the run here with one message and exit code 2 (argparse's ``error``)."""
    from bench.cartpole_bench import ROWS

    sections = [x.strip() for x in args.sections.split(",")]
    unknown = [x for x in sections if x not in SECTIONS]
    if unknown:
        ap.error(f"--sections: unknown {unknown}; allowed: {','.join(SECTIONS)}")
    if args.only:
        from bench.population_bench import CASES
        from foxdqn.config.compose import experiment_names

        allowed = ((set(ROWS) if "cartpole" in sections else set()) | (set(CASES) if "population" in sections else set())
                   | (set(experiment_names()) if "kernels" in sections else set())
                   | (set(ops_modules()) if "ops" in sections else set()))
        bad = sorted(set(args.only.split(",")) - allowed)
        if bad:
            ap.error(f"--only: unknown rows {bad}; allowed: {','.join(sorted(allowed))} (cartpole: its rows; "
                     "population, kernels: their experiments)")
    if args.seeds < 1:
        ap.error(f"--seeds: must be >= 1, got {args.seeds}")
    if args.first_seed < 0:
        ap.error(f"--first-seed: must be >= 0, got {args.first_seed}")
    if args.members:
        from bench.population_bench import CASES, CPU_CASES

        counts = {c for cases in (CASES, CPU_CASES) for v in cases.values() for c in v}
        given = args.members.split(",")
        if not all(m.isdigit() and int(m) in counts for m in given):
            ap.error(f"--members: {args.members!r}; allowed: comma-separated counts of {sorted(counts)}")
    if args.report:
        path = Path(args.report)
        if not path.is_file():
            ap.error(f"--report: no such file {path}")
        try:
            cols = set(pd.read_csv(path, nrows=1).columns)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
            cols = set()
        if not {"gpu", "torch", "triton", "date", "section"} <= cols:
            ap.error(f"--report: {path} is not a bench CSV (needs the columns gpu, torch, triton, date, section)")


def _write_report(df: pd.DataFrame, t: dict, stem: Path) -> None:
    md = f"# foxdqn bench — {t['gpu']}, torch {t['torch']}, triton {t['triton']}, {t['date']}\n\n" + _ratios(df)
    stem.with_suffix(".md").write_text(md + "\n")
    chart = _chart(df, stem.with_suffix(".png"))
    print(md)
    print(f"\n{written(stem, chart)}")


def written(stem: Path, chart: bool) -> str:
    """``wrote <stem>.csv, .md[, .png]``: the .csv and .md of ``stem`` that exist, and the .png when
    this run drew it (``chart``; a section without a chart, such as startup, draws none)."""
    suffixes = [s for s in (".csv", ".md") if stem.with_suffix(s).is_file()] + [".png"] * bool(chart)
    return f"wrote {stem}{', '.join(suffixes)}" if suffixes else f"wrote nothing to {stem}.*"


if __name__ == "__main__":
    sys.exit(main())
