"""``make bench`` section ``population``: a seed sweep as one population against one process per job.

Each row is one ``python -m foxdqn.train --multirun +experiment=E seed=0..P-1`` run as a
subprocess, timed from the command to the last job's ``eval/summary.json``:

* ``launcher=population``: the jobs run as one population (``hydra/launcher=population``; P = 1
  is the single-run path), with ``graph=auto`` (captured on CUDA) or ``graph=off`` (eager);
* ``launcher=basic``: Hydra's basic launcher, one job after another in one process, for the ratio.
  It runs ``BASIC_JOBS`` jobs at most; its time for P jobs is scaled from them (``note`` says so).

Columns: experiment, launcher, graph, members (P), wall_s (command to the last summary.json),
train_s (the training time the summaries report, shared by a population's members), env_steps_per_s
(all members' env steps / train_s), wall_per_job_s, check_s (the population launcher's collection of
the jobs, from its log line "N jobs checked in X s"), host_s (wall_s − train_s: start-up,
composition, checks, evaluation and reports), greedy return or test Sharpe per member (mean, min,
max), jobs that failed.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

#: (experiment, member counts) measured on CUDA; on CPU only the smallest counts run (eager).
CASES = {"cartpole_cleanrl": (1, 16, 128, 512), "eurusd_dqn": (1, 8, 64)}
CPU_CASES = {"cartpole_cleanrl": (2,), "eurusd_dqn": (2,)}  # with debug=smoke
BASIC_JOBS = 2


def sweep(experiment: str, members: int, launcher: str, graph: str, extra: list[str] = ()) -> dict:
    """Run one multirun; returns the row (wall time, rates, per-member results)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sweep"
        jobs = members if launcher == "population" else min(members, BASIC_JOBS)
        cmd = [sys.executable, "-m", "foxdqn.train", "--multirun", f"+experiment={experiment}",
               f"seed=range(0,{jobs})", "log.progress=false", "logger=csv", f"graph={graph}",
               f"hydra.sweep.dir={out}", *extra]
        if launcher == "population":
            cmd.append("hydra/launcher=population")
        start = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        checked = re.search(r"(\d+) jobs checked in ([0-9.]+) s", proc.stdout + proc.stderr)
        files = sorted(out.glob("*/eval/summary.json"))
        summaries = [json.loads(p.read_text()) for p in files]
        wall = max((p.stat().st_mtime for p in files), default=time.time()) - start
    row = {"section": "population", "experiment": experiment, "launcher": launcher, "graph": graph,
           "members": members, "jobs_run": jobs, "failed": jobs - len(summaries), "rc": proc.returncode}
    if not summaries:
        row["note"] = proc.stderr.strip().splitlines()[-1][:200] if proc.stderr.strip() else "no summary"
        return row
    train_s = [s["wall_time_s"] for s in summaries]
    steps = sum(s["env_steps"] for s in summaries)
    values = [s["metrics"]["agent"].get("mean_return", s["metrics"]["agent"].get("sharpe")) for s in summaries]
    scale = members / jobs
    row.update(
        wall_s=round(wall * scale, 2), wall_per_job_s=round(wall / jobs, 3),
        train_s=round(max(train_s) if launcher == "population" else sum(train_s) * scale, 2),
        env_steps_per_s=round(steps / (max(train_s) if launcher == "population" else sum(train_s)), 1),
        metric="mean_return" if "mean_return" in summaries[0]["metrics"]["agent"] else "sharpe",
        metric_mean=float(np.mean(values)), metric_min=float(np.min(values)), metric_max=float(np.max(values)),
        check_s=float(checked.group(2)) if checked else None,
    )
    if launcher == "population":
        row["host_s"] = round(row["wall_s"] - row["train_s"], 2)
    if scale != 1:
        row["note"] = f"{jobs} of {members} jobs run; wall_s and train_s scaled by {scale:g}"
    return row


def rows(device: str, only: tuple[str, ...] | None = None):
    """The section's rows, one at a time (each a finished multirun); ``only``: these experiments.
    Eager rows (``graph=off``) run for the trading experiment only on CUDA: 50,000 eager CartPole
    iterations take minutes and say nothing the captured rows do not."""
    cases = CASES if device == "cuda" else CPU_CASES
    extra = [] if device == "cuda" else ["debug=smoke"]  # on CPU: the plumbing, not the numbers
    for experiment, counts in cases.items():
        if only and experiment not in only:
            continue
        for members in counts:
            yield sweep(experiment, members, "population", "auto", extra)
            if device == "cuda" and experiment != "cartpole_cleanrl" and members <= 8:
                yield sweep(experiment, members, "population", "off", extra)
        yield sweep(experiment, max(counts), "basic", "auto", extra)


def table(df) -> str:
    """Markdown: every row, and population vs basic launcher wall time as a ratio."""
    cols = [c for c in ("experiment", "launcher", "graph", "members", "wall_s", "wall_per_job_s", "train_s",
                        "check_s", "host_s", "env_steps_per_s", "metric", "metric_mean", "metric_min", "metric_max", "failed", "note")
            if c in df]
    text = "## population: a seed sweep as one population vs one job after another\n\n" + \
        df[cols].to_markdown(index=False, floatfmt=".4g")
    lines = []
    for exp, g in df.groupby("experiment"):
        basic = g[g.launcher == "basic"]
        pop = g[(g.launcher == "population") & (g.graph != "off")]
        if len(basic) and len(pop) and "wall_s" in g:
            top = pop.sort_values("members").iloc[-1]
            b = basic.iloc[0]
            if b.members == top.members and top.wall_s == top.wall_s:
                lines.append(f"| {exp} | {int(top.members)} | {b.wall_s:.4g} | {top.wall_s:.4g} | "
                             f"{b.wall_s / top.wall_s:.3g} |")
    if lines:
        text += ("\n\n## population: basic launcher wall time / population wall time (same jobs)\n\n"
                 "| experiment | jobs | basic wall s | population wall s | ratio |\n|---|---|---|---|---|\n" +
                 "\n".join(lines))
    return text
