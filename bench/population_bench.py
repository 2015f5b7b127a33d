"""``make bench`` section ``population``: a seed sweep as one population against one process per job.

Each row is one ``python -m foxdqn.train --multirun +experiment=E seed=K..K+P-1`` (``first_seed``
K, default 0) run as a subprocess, timed from the command to the last job's ``eval/summary.json``:

* ``launcher=population``: the jobs run as one population (``hydra/launcher=population``; P = 1
  is the single-run path), with ``graph=auto`` (captured on CUDA) or ``graph=off`` (eager);
* ``launcher=basic``: Hydra's basic launcher, one job after another in one process, for the ratio.
  It runs ``BASIC_JOBS`` jobs at most; its time for P jobs is scaled from them (``note`` says so).

Columns: experiment, launcher, graph, members (P), wall_s (command to the last summary.json),
exit_s (command to the process's exit: the report plots and the sweep's report come after the
summaries), train_s (the training time the summaries report, shared by a population's members), env_steps_per_s
(all members' env steps / train_s), env_steps_per_s_run (population rows: all members' env steps / the
training loop's seconds, :data:`RUN_PHASES` of ``timings.json``, without the build, the warm-up and the
capture, as the peer's leaves its compile out), wall_per_job_s, check_s (the population launcher's collection of
the jobs, from its log line "N jobs checked in X s"), host_s (wall_s − train_s: start-up,
composition, checks, evaluation and reports), the population launcher's phases from the sweep's
``timings.json`` (P = 1: the job's own, which counts from the job's start; :data:`PHASE_COLUMNS`: imports, composition and checks, build, warm-up and
capture, checkpoints, final evaluation, reports; seconds of the whole process, the periodic
checkpoints inside ``train_s`` included), greedy return or test Sharpe per member (mean, its
standard error ``metric_se`` (:func:`standard_error`), min, max), jobs that failed.

Beside each ``cartpole_cleanrl`` population row runs the JAX peer (``launcher=jax_peer``,
:mod:`bench.peers.jax_dqn_cartpole`: PureJaxRL's DQN with the same settings, read from the same
composed config, P seeds vmapped in one jit) as its own process, timed the same way: from the
command to its result file. Its ``train_s`` counts its compile (``compile_s``: training and
evaluation compiled ahead of time), like foxdqn's counts its warm-up and graph capture. It needs
``pip install -e '.[peers]'`` (jax, flax, optax, gymnax, flashbax) in the interpreter that runs
it (``FOXDQN_PEER_PYTHON``, default this one); without them the section prints one line and runs
on without it. ``table`` adds the foxdqn / peer ratios of the rows of one run.

Python's bytecode cache (column ``bytecode_cache``): every process of the section, foxdqn's and
the peer's alike, runs in one environment. Where this environment turns the cache off
(``PYTHONDONTWRITEBYTECODE``, as the GPU machines' image does), each process would compile
torch's (and JAX's) modules from source, seconds that a machine where pip installed the packages
never pays; the section then turns it on in a folder of its own (:func:`bench.common.bytecode_cache_on`,
``on (prefix)``), and fills it before the first row: one process that imports what foxdqn's
sweeps import, and where the peer runs, one that imports the peer's packages (:func:`fill_bytecode`).
``bytecode=False`` (``python -m bench.run --bytecode as-configured``) keeps the environment as it is
(``as configured``).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import bytecode_cache_on

#: (experiment, member counts) measured on CUDA; on CPU only the smallest counts run (eager).
CASES = {"cartpole_cleanrl": (1, 16, 128, 512), "eurusd_dqn": (1, 5, 8, 64)}
CPU_CASES = {"cartpole_cleanrl": (2,), "eurusd_dqn": (2,)}  # with debug=smoke
BASIC_JOBS = 2
#: columns from the sweep's timings.json (foxdqn.timings phases, seconds of the whole process)
PHASE_COLUMNS = {"imports_s": ("interpreter", "imports"), "compose_s": ("compose", "validate", "preflight", "data_load"),
                 "build_s": ("build",), "warmup_s": ("warmup", "graph_capture"), "checkpoint_s": ("checkpoint", "periodic_checkpoint"),
                 "final_eval_s": ("final_evaluation", "validation"), "report_s": ("report", "summary")}
#: the phases of the training loop itself: a foxdqn row's ``env_steps_per_s_run`` is its env steps over
#: their seconds, as the peer's is its env steps over its training run without the compile
RUN_PHASES = ("training", "periodic_checkpoint")
#: The experiment the JAX peer runs beside (bench/peers/jax_dqn_cartpole.py), its launcher column.
PEER_EXPERIMENT, PEER = "cartpole_cleanrl", "jax_peer"
ROOT = Path(__file__).resolve().parents[1]


def standard_error(values) -> float:
    """The standard error of the mean of ``values`` (one number per member): the sample standard
    deviation (ddof = 1) over √n; NaN for fewer than 2 values. A greedy mean of 512
    ``cartpole_cleanrl`` seeds has about 2 (the seeds' returns had an sd of 41-47 in
    docs/bench.md#cartpolecleanrl-on-cleanrls-target), so means of other seeds of the same algorithm
    differ by that much."""
    values = np.asarray(values, dtype=float)
    return float(values.std(ddof=1) / np.sqrt(values.size)) if values.size > 1 else float("nan")


def loop_seconds(timings: dict) -> float:
    """Seconds of the training loop in a ``timings.json`` dict (:data:`RUN_PHASES`; 0 without them)."""
    return sum(timings["phases"].get(k, 0.0) for k in RUN_PHASES)


def sweep(experiment: str, members: int, launcher: str, graph: str, extra: list[str] = (),
          env: dict | None = None, first_seed: int = 0) -> dict:
    """Run one multirun of seeds ``first_seed``.. in environment ``env`` (default this process's);
    returns the row (wall time, rates, per-member results)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sweep"
        jobs = members if launcher == "population" else min(members, BASIC_JOBS)
        cmd = [sys.executable, "-m", "foxdqn.train", "--multirun", f"+experiment={experiment}",
               f"seed=range({first_seed},{first_seed + jobs})", "log.progress=false", "logger=csv",
               f"graph={graph}", f"hydra.sweep.dir={out}", *extra]
        if launcher == "population":
            cmd.append("hydra/launcher=population")
        start = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        exit_s = time.time() - start
        checked = re.search(r"(\d+) jobs checked in ([0-9.]+) s", proc.stdout + proc.stderr)
        files = sorted(out.glob("*/eval/summary.json"))
        # the sweep's timings.json; a sweep whose one job trained alone (P = 1) has only the job's own
        found = next((f for f in (out / "timings.json", out / "0" / "timings.json") if f.is_file()), None)
        timings = json.loads(found.read_text()) if found is not None and (jobs == 1 or found.parent == out) else None
        summaries = [json.loads(p.read_text()) for p in files]
        wall = max((p.stat().st_mtime for p in files), default=time.time()) - start
    row = {"section": "population", "experiment": experiment, "launcher": launcher, "graph": graph,
           "members": members, "first_seed": first_seed, "jobs_run": jobs, "failed": jobs - len(summaries),
           "rc": proc.returncode}
    if not summaries:
        row["note"] = proc.stderr.strip().splitlines()[-1][:200] if proc.stderr.strip() else "no summary"
        return row
    train_s = [s["wall_time_s"] for s in summaries]
    steps = sum(s["env_steps"] for s in summaries)
    values = [s["metrics"]["agent"].get("mean_return", s["metrics"]["agent"].get("sharpe")) for s in summaries]
    scale = members / jobs
    row.update(
        wall_s=round(wall * scale, 2), exit_s=round(exit_s * scale, 2), wall_per_job_s=round(wall / jobs, 3),
        train_s=round(max(train_s) if launcher == "population" else sum(train_s) * scale, 2),
        env_steps_per_s=round(steps / (max(train_s) if launcher == "population" else sum(train_s)), 1),
        metric="mean_return" if "mean_return" in summaries[0]["metrics"]["agent"] else "sharpe",
        metric_mean=float(np.mean(values)), metric_se=standard_error(values), metric_min=float(np.min(values)),
        metric_max=float(np.max(values)), check_s=float(checked.group(2)) if checked else None,
    )
    if launcher == "population":
        row["host_s"] = round(row["wall_s"] - row["train_s"], 2)
    if timings is not None:  # the sweep's timings.json (population launcher): where the host time went
        row.update({column: round(sum(timings["phases"].get(k, 0.0) for k in phases), 2)
                    for column, phases in PHASE_COLUMNS.items()})
        loop_s = loop_seconds(timings)
        if launcher == "population" and loop_s > 0:
            row["env_steps_per_s_run"] = round(steps / loop_s, 1)
    if scale != 1:
        row["note"] = f"{jobs} of {members} jobs run; wall_s and train_s scaled by {scale:g}"
    return row


def peer_python() -> str:
    """The interpreter that runs the JAX peer: ``FOXDQN_PEER_PYTHON`` (a venv with the peers extra
    beside foxdqn's), else this one."""
    return os.environ.get("FOXDQN_PEER_PYTHON") or sys.executable


def peer_missing(python: str | None = None) -> list[str]:
    """The JAX peer's packages that ``python`` (default :func:`peer_python`) cannot import."""
    from bench.peers import JAX_PEER_MODULES, missing

    python = python or peer_python()
    if python == sys.executable:
        return missing(JAX_PEER_MODULES)
    probe = ("import sys; from importlib.util import find_spec; "
             "print(' '.join(m for m in sys.argv[1:] if find_spec(m) is None))")
    try:
        proc = subprocess.run([python, "-c", probe, *JAX_PEER_MODULES], capture_output=True, text=True)
    except OSError as exc:
        return [f"{python} ({type(exc).__name__})"]
    return proc.stdout.split() if proc.returncode == 0 else [f"{python} (exit {proc.returncode})"]


def peer_settings(experiment: str, extra: list[str] = ()):
    """The JAX peer's :class:`~bench.peers.jax_dqn_cartpole.Settings` for ``experiment`` composed with
    ``extra`` (so the peer trains what the foxdqn rows train), or None: not the peer's experiment,
    or a package missing (then one line on stderr says which)."""
    if experiment != PEER_EXPERIMENT:
        return None
    absent = peer_missing()
    if absent:
        print(f"population section: JAX peer skipped, {', '.join(absent)} not importable "
              f"(pip install -e '.[peers]')", file=sys.stderr)
        return None
    from bench.peers.jax_dqn_cartpole import settings_from_config
    from foxdqn.config.compose import load_config

    return settings_from_config(load_config([f"+experiment={experiment}", *extra]))


def peer_row(members: int, settings, env: dict | None = None, first_seed: int = 0) -> dict:
    """Run the JAX peer on seeds ``first_seed``..``first_seed`` + members - 1 as a subprocess in
    environment ``env`` (default this process's; JAX allocating GPU memory as it goes, so that it
    leaves room for others); the row, timed from the command to its result file."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peer.json"
        cmd = [peer_python(), "-m", "bench.peers.jax_dqn_cartpole", "--seeds", str(members),
               "--first-seed", str(first_seed), "--settings", settings.to_json(), "--out", str(out)]
        env = {**(os.environ if env is None else env), "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        start = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        wall = (out.stat().st_mtime if out.is_file() else time.time()) - start
        result = json.loads(out.read_text()) if out.is_file() else None
    return peer_result_row(members, result, wall, proc.returncode, proc.stderr, first_seed)


def peer_result_row(members: int, result: dict | None, wall: float, rc: int = 0, stderr: str = "",
                    first_seed: int = 0) -> dict:
    """The section's row of one JAX peer run: ``result`` as ``jax_dqn_cartpole.train`` returns it
    (None: the run failed; ``stderr``'s last line is the note), ``wall`` seconds from the command;
    ``first_seed``: the seeds asked for (the result's own where it has one)."""
    row = {"section": "population", "experiment": PEER_EXPERIMENT, "launcher": PEER, "graph": "jit",
           "members": members, "first_seed": (result or {}).get("first_seed", first_seed), "jobs_run": members,
           "failed": 0 if result else members, "rc": rc}
    if not result:
        row["note"] = stderr.strip().splitlines()[-1][:200] if stderr.strip() else "no result"
        return row
    row.update(
        wall_s=round(wall, 2), wall_per_job_s=round(wall / members, 3), train_s=result["train_s"],
        compile_s=result["compile_s"], host_s=round(wall - result["train_s"], 2),
        env_steps_per_s=result["env_steps_per_s"], env_steps_per_s_run=result["env_steps_per_s_run"],
        metric="mean_return", metric_mean=result["return_mean"], metric_se=standard_error(result.get("returns", ())),
        metric_min=result["return_min"], metric_max=result["return_max"],
        note=f"JAX peer, jax {result['jax']} on {result['device']}: {result['settings']['eval_episodes']} greedy "
             f"episodes per seed; train_s = {result['compile_train_s']:g} s compile + {result['run_s']:g} s run")
    return row


def rows(device: str, only: tuple[str, ...] | None = None, members: tuple[int, ...] | None = None,
         warm: bool = False, bytecode: bool = True, first_seed: int = 0):
    """The section's rows, one at a time (each a finished multirun, or a JAX peer run after the
    ``cartpole_cleanrl`` row of the same P, on the same seeds ``first_seed``..``first_seed`` + P - 1:
    another ``first_seed`` is another draw of seeds, column ``first_seed``); ``only``: these
    experiments; ``members``: only these member counts (the basic launcher's row then runs at the
    largest of them); ``warm``: each population row's sweep runs once untimed first, so that the
    timed one finds Triton's cache warm for its shapes (column ``triton_cache``: ``warm``; else
    ``as found``: the rows before it compiled what they share).
    Eager rows (``graph=off``) run for the trading experiment only on CUDA: 50,000 eager CartPole
    iterations take minutes and say nothing the captured rows do not. ``bytecode``: Python's bytecode
    cache on for every process of the section (the module's docstring); False: as configured."""
    with tempfile.TemporaryDirectory(prefix="foxdqn-pycache-") as cache_dir:
        env = {**os.environ}
        on = bytecode_cache_on(env, cache_dir) if bytecode else None
        label = "on (prefix)" if on is not None else ("on" if not env.get("PYTHONDONTWRITEBYTECODE") else "as configured")
        if on is not None:
            fill_bytecode(on, peer=PEER_EXPERIMENT in (only or CASES) and device == "cuda")
        for row in _rows(device, only, members, warm, env if on is None else on, first_seed):
            yield {**row, "bytecode_cache": label}


def fill_bytecode(env: dict, peer: bool) -> None:
    """Fill the bytecode cache of environment ``env`` (``PYTHONPYCACHEPREFIX``): one process imports
    ``foxdqn.train`` (torch with it) and, with ``peer``, one :func:`peer_python` process imports the
    JAX peer's packages, so that no timed row pays for writing the cache. A failed import is left to
    the rows, which report it."""
    subprocess.run([sys.executable, "-c", "import foxdqn.train"], capture_output=True, env=env, cwd=ROOT)
    if peer:
        from bench.peers import JAX_PEER_MODULES

        subprocess.run([peer_python(), "-c", "import " + ", ".join(JAX_PEER_MODULES)], capture_output=True,
                       env=env, cwd=ROOT)


def _rows(device: str, only, members, warm: bool, env: dict, first_seed: int = 0):
    """:func:`rows` in environment ``env``."""
    cases = CASES if device == "cuda" else CPU_CASES
    extra = [] if device == "cuda" else ["debug=smoke"]  # on CPU: the plumbing, not the numbers
    for experiment, counts in cases.items():
        if only and experiment not in only:
            continue
        peer = peer_settings(experiment, extra)
        counts = tuple(c for c in counts if members is None or c in members)
        if not counts:
            continue
        for members_p in counts:
            if warm:
                sweep(experiment, members_p, "population", "auto", extra, env, first_seed)
            yield {**sweep(experiment, members_p, "population", "auto", extra, env, first_seed),
                   "triton_cache": "warm" if warm else "as found"}
            if peer is not None:  # right after the foxdqn row of the same P: a cut run keeps both
                yield peer_row(members_p, peer, env, first_seed)
            if device == "cuda" and experiment != "cartpole_cleanrl" and members_p <= 8:
                yield sweep(experiment, members_p, "population", "off", extra, env, first_seed)
        yield sweep(experiment, max(counts), "basic", "auto", extra, env, first_seed)


def table(df) -> str:
    """Markdown: every row, and population vs basic launcher wall time as a ratio."""
    cols = [c for c in ("experiment", "launcher", "graph", "triton_cache", "bytecode_cache", "members", "first_seed", "wall_s", "exit_s", "wall_per_job_s", "train_s",
                        "compile_s", "check_s", "host_s", *PHASE_COLUMNS, "env_steps_per_s", "env_steps_per_s_run",
                        "metric", "metric_mean", "metric_se", "metric_min", "metric_max", "failed", "note")
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
    peer = peer_table(df)
    return text + ("\n\n" + peer if peer else "")


def peer_table(df) -> str:
    """Markdown: foxdqn's population rows of ``PEER_EXPERIMENT`` against the JAX peer's rows of the
    same P, from one run of the section; "" where no P has both."""
    if "launcher" not in df or "wall_s" not in df:
        return ""
    g = df[df.experiment == PEER_EXPERIMENT]
    ours = g[(g.launcher == "population") & (g.graph != "off")].drop_duplicates("members", keep="last")
    peer = g[g.launcher == PEER].drop_duplicates("members", keep="last")
    pairs = ours.merge(peer, on="members", suffixes=("", "_peer")).sort_values("members")
    pairs = pairs[pairs.wall_s.notna() & pairs.wall_s_peer.notna()]
    if not len(pairs):
        return ""
    fmt = lambda v: "" if v != v else f"{v:.4g}"  # noqa: E731 (NaN: empty)
    run = lambda r, side: float(getattr(r, "env_steps_per_s_run" + side, float("nan")))  # noqa: E731
    se = lambda r, side: float(getattr(r, "metric_se" + side, float("nan")))  # noqa: E731
    pm = lambda v, e: fmt(v) + ("" if e != e else f" ± {e:.2g}")  # noqa: E731 (a mean ± its standard error)
    lines = [f"| {int(r.members)} | {fmt(r.wall_s)} | {fmt(r.wall_s_peer)} | {fmt(r.wall_s / r.wall_s_peer)} | "
             f"{fmt(r.env_steps_per_s)} | {fmt(r.env_steps_per_s_peer)} | "
             f"{fmt(r.env_steps_per_s / r.env_steps_per_s_peer)} | {fmt(run(r, ''))} | {fmt(run(r, '_peer'))} | "
             f"{fmt(run(r, '') / run(r, '_peer'))} | {fmt(r.compile_s_peer)} | "
             f"{pm(r.metric_mean, se(r, ''))} | {pm(r.metric_mean_peer, se(r, '_peer'))} | "
             f"{pm(r.metric_mean - r.metric_mean_peer, (se(r, '') ** 2 + se(r, '_peer') ** 2) ** 0.5)} |"
             for r in pairs.itertuples()]
    return (f"## population: foxdqn / JAX peer ({PEER_EXPERIMENT}, same settings, same device, one run)\n\n"
            "The peer is PureJaxRL's DQN (bench/peers/jax_dqn_cartpole.py), its seeds vmapped in one jit. Wall: "
            "from the command to the last result (foxdqn: the last summary.json; the peer: its result file), "
            "compile included; wall foxdqn/peer > 1: the peer finished sooner. Env steps/s: training throughput, "
            "the peer's with its compile counted in (foxdqn's with its warm-up and capture); foxdqn/peer > 1: "
            "foxdqn trained faster. Run env steps/s: the training loop alone (foxdqn: the loop's phases of "
            "timings.json, without build, warm-up and capture; the peer: its run without the compile). "
            "Greedy return: mean over seeds ± its standard error (sample sd / √seeds); the difference's is "
            "the root sum of their squares, so a difference within about twice it is the seeds' spread, not the "
            "implementations'.\n\n"
            "| members | foxdqn wall s | peer wall s | wall foxdqn/peer | foxdqn env steps/s | peer env steps/s | "
            "env steps/s foxdqn/peer | foxdqn run env steps/s | peer run env steps/s | run env steps/s foxdqn/peer | "
            "peer compile s | foxdqn greedy return | peer greedy return | greedy return foxdqn − peer |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(lines))
