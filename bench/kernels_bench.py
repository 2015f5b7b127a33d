"""Kernels section: CUDA kernels per collect step and per gradient update, beside their time, for
every shipped experiment (``conf/experiment/``), at P = 1 (a single run) and P = 64 (a population).

Each experiment runs as shipped, the trading ones at ``TRADING_ENVS`` envs (the size of issue 17's
table; a population member has the experiment's own envs, so P = 64 steps 64 × ``env.num_envs``:
the kernel count does not depend on N). At P = 1 a population of one is built
(:func:`bench.harness.make_state`, the state a single run trains with) and warmed up, then:

* ``kernels``, ``device_us`` and ``longest_us``: one eager call of the step under
  ``torch.profiler`` (CUDA activity): the kernels it launched (memcpy/memset and the profiler's GPU ranges of user annotations not counted), the sum
  of their device durations in µs, and the four longest with their µs;
* ``graph_nodes`` and ``ms``: the same step captured alone in a CUDA graph
  (:class:`~foxdqn.step.iteration.Iteration` with one collect step, or one update): the graph's
  node count (kernels, memsets and copies that one replay launches, ``cudaGraphGetNodes``) and the
  median ms per replay (:func:`bench.iteration_graph.replay_ms`);
* ``env_steps_per_s``: N / ms for a collect step (P·N / ms at P members), and N·T / ms for the
  ``collect_only`` row (the experiment's own T collect steps in one graph, no update: one
  replay's fixed cost spread over T steps) and the ``iteration`` row (its T collect steps and K
  updates in one graph, as training runs them: the collect steps beside the update where
  :func:`foxdqn.population.step.collects_beside`, column ``collect_beside``);
* ``iteration_in_turn``: for an experiment whose iteration runs the collect steps beside the
  update, the same iteration with the collect steps first, then the update
  (``agent.collect_beside_update=false``'s order), measured on the same state after the
  ``iteration`` row: the two orders side by side in one run.

At P = ``POPULATION`` (issue 33: the kernels per iteration should not grow with P) a
:class:`~foxdqn.population.state.PopulationState` of 64 members, seeds 0..63, is built
(:func:`bench.harness.make_population`, as ``hydra/launcher=population`` builds one) and warmed
up, and its ``collect`` and ``update`` rows are measured as above with the population's steps
(:func:`foxdqn.population.step.collect_step`, :func:`~foxdqn.population.step.update_step`; the
guard's once-per-iteration copy to the host, ``publish_guard``, is not part of either). These
rows are cheap (one eager step counted, one step captured and replayed 3 × ``REPS`` times); the
``collect_only`` and ``iteration`` rows are not run at P = 64 (the population section,
bench/population_bench.py, times whole populations).

Rows that cannot be measured are written with a ``note`` and no numbers, never dropped: at P = 64
the ``collect`` and ``update`` rows of an experiment the population trainer refuses (the note is
the refusal); at P = 1 an experiment that cannot be built here (a package missing: ``pong_dqn``
without ale_py; the note says which) has a ``collect`` and an ``update`` row, and a Gymnasium
host env (``cartpole_gym``, ``pong_dqn``: the env steps on the CPU, its collect step cannot be
captured) a ``collect`` row with a note, its ``update`` row measured and no ``collect_only`` or
``iteration`` rows. A failure while building or measuring becomes the note of the rows it leaves
unmeasured (the traceback goes to stderr) and the section goes on with the next experiment.

Rows: ``section=kernels``, ``features`` (the experiment), ``members`` (1 or 64), ``phase``
(collect | update | collect_only | iteration | iteration_in_turn), ``num_envs`` (N, per member),
``note``.
:func:`table`: every experiment's collect and update kernels at P = 1 and P = 64 side by side
with their ratio, then every row. CUDA only (kernels are what is counted). docs/bench.md#kernels.
"""
from __future__ import annotations

import gc
import importlib.util
import math
import sys
import traceback
from dataclasses import dataclass

import torch

from bench.ops.training import TRADING_ENVS

#: Members of the population rows (P = 1 is the single run).
POPULATION = 64
MEMBERS = (1, POPULATION)
#: The phases measured at P = 1 (all of them; ``iteration_in_turn`` only where the iteration runs its
#: collect steps beside its update) and at P = POPULATION (the first two).
PHASES = ("collect", "update", "collect_only", "iteration", "iteration_in_turn")
STEP_PHASES = ("collect", "update")
#: Replays per timed block (bench.iteration_graph.replay_ms: the median of 3 blocks).
REPS = 200
#: replay.capacity of each member of a host env's population (the update's kernels do not depend on it)
HOST_ENV_POPULATION_CAPACITY = 2048
HOST_ENV_NOTE = ("host env (Gymnasium, stepped on the CPU): no device collect step to count or capture; "
                 "its update is counted")


@dataclass(frozen=True)
class Case:
    """One experiment as the section runs it.

    name: the experiment (``conf/experiment/<name>.yaml``).  env: its ``env.name``.  overrides:
    the bench's overrides (trading: ``env.num_envs=TRADING_ENVS``).  host_env: its env steps on
    the CPU (``env=gym``).
    missing: why it cannot be built on this machine (a package not importable), else None.
    refusal: why the population trainer refuses it (:func:`~foxdqn.population.grouping.batch_refusal`),
    else None.
    beside: its iteration runs the collect steps beside the update
    (:func:`foxdqn.population.step.collects_beside`).
    """

    name: str
    env: str = ""
    overrides: tuple[str, ...] = ()
    host_env: bool = False
    missing: str | None = None
    refusal: str | None = None
    beside: bool = False


def missing_packages(cfg) -> str | None:
    """Why ``cfg`` cannot be built here: the Python packages its env needs that are not
    importable (Gymnasium for ``env=gym``, and ale_py for its ``ALE/*`` ids), else None."""
    if cfg.env.name != "gym":
        return None
    from foxdqn.envs.gym_adapter import is_atari

    need = ["gymnasium", *(["ale_py"] if is_atari(cfg.env.id) else [])]
    absent = [m for m in need if importlib.util.find_spec(m) is None]
    if not absent:
        return None
    extra = "pip install -e '.[atari]'" if "ale_py" in absent else "pip install -e ."
    return f"cannot be built here: {', '.join(absent)} not importable ({extra})"


def case(name: str) -> Case:
    """The :class:`Case` of experiment ``name`` (its config composed once, on no device)."""
    from foxdqn.config.compose import load_config
    from foxdqn.population.grouping import batch_refusal
    from foxdqn.population.step import collects_beside

    cfg = load_config([f"+experiment={name}"])
    overrides = (f"env.num_envs={TRADING_ENVS}",) if cfg.env.name == "trading" else ()
    return Case(name, str(cfg.env.name), overrides, host_env=cfg.env.name == "gym", missing=missing_packages(cfg),
                refusal=batch_refusal(cfg), beside=collects_beside(cfg))


def experiments(only: tuple[str, ...] | None = None) -> list[str]:
    """Every shipped experiment (:func:`foxdqn.config.compose.experiment_names`), or those in ``only``."""
    from foxdqn.config.compose import experiment_names

    return [n for n in experiment_names() if not only or n in only]


def plan(c: Case) -> list[tuple[int, str, str | None]]:
    """``(members, phase, note)`` of every row the section writes for ``c``, in order; ``note``
    None: the row is measured, else it is written with that note and no numbers."""
    if c.missing:
        single = [(1, phase, c.missing) for phase in STEP_PHASES]
    elif c.host_env:
        single = [(1, "collect", HOST_ENV_NOTE), (1, "update", None)]
    else:
        single = [(1, phase, None) for phase in PHASES if phase != "iteration_in_turn" or c.beside]
    note = c.refusal or c.missing
    if c.host_env and note is None:  # a population of host envs: its collect step is not captured either
        return single + [(POPULATION, "collect", HOST_ENV_NOTE), (POPULATION, "update", None)]
    return single + [(POPULATION, phase, note) for phase in STEP_PHASES]


def profile_kernels(fn) -> tuple[int, float, str]:
    """(kernels launched, Σ device µs, the 4 longest as "name µs; ...") of one eager ``fn()`` (CUDA)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.is_user_annotation and not e.name.lower().startswith(("memcpy", "memset"))]
    top = sorted(kernels, key=lambda e: -e.device_time_total)[:4]
    longest = "; ".join(f"{e.name[:48]} {e.device_time_total:.1f}" for e in top)
    return len(kernels), sum(e.device_time_total for e in kernels), longest


def _steps(members: int):
    """(collect step, update step) of a population (of one: a single run)."""
    from foxdqn.population.step import collect_step, update_step

    return collect_step, update_step


def _build(c: Case, members: int, device: str = "cuda"):
    """The warmed-up state of ``c`` with ``members`` members on ``device`` (Triton compilation,
    gradient and Adam state allocation done)."""
    from bench.harness import make_population, make_state

    if members == 1:
        s = make_state([f"+experiment={c.name}", *c.overrides, "graph=on" if device == "cuda" else "graph=off"], device)
    else:  # the shipped envs per member: the kernel count does not depend on N, the memory does
        shipped = [o for o in c.overrides if o != f"env.num_envs={TRADING_ENVS}"]
        if c.host_env:  # nor on the replay's capacity: 64 members of pong_dqn's 100k frames would need 361 GB
            shipped.append(f"replay.capacity={HOST_ENV_POPULATION_CAPACITY}")
        s = make_population([f"+experiment={c.name}", *shipped], members, device)
    collect, update = _steps(members)
    for _ in range(3):
        collect(s)
        update(s)
    return s


def _measure(s, phase: str, members: int, reps: int = REPS) -> dict:
    """The numbers of one row: kernels (collect, update), graph nodes and ms of ``phase``
    captured alone, env steps/s (all members')."""
    from bench.iteration_graph import graph_nodes, replay_ms
    from foxdqn.population.step import iteration_steps
    from foxdqn.step.iteration import Iteration

    collect, update = _steps(members)
    n = s.cfg.env.num_envs
    row: dict = {"num_envs": n}
    if phase in STEP_PHASES:  # the profiler counts one eager step
        fn = collect if phase == "collect" else update
        row["kernels"], row["device_us"], row["longest_us"] = profile_kernels(lambda: fn(s))
    shape = {"collect": dict(collect_steps=1, updates=0), "update": dict(collect_steps=0, updates=1),
             "collect_only": dict(updates=0), "iteration": {}, "iteration_in_turn": {}}[phase]
    # the iteration as training runs it (the collect steps beside the update where they may be), or in turn
    beside = iteration_steps(s)["beside"] if phase != "iteration_in_turn" else None
    it = Iteration(s, use_graph=True, collect=collect, update=update, beside=beside, **shape)
    if phase.startswith("iteration"):
        row["collect_beside"] = it.collect_beside
    row["ms"] = round(replay_ms(it, reps), 5)
    row["graph_nodes"] = graph_nodes(it.graph)
    steps = {"collect": 1, "update": 0}.get(phase, it.collect_steps)
    row["T"], row["K"] = it.collect_steps, it.updates
    if steps:
        row["env_steps_per_s"] = members * n * steps / (row["ms"] / 1e3)
    return row


def _error(exc: BaseException) -> str:
    traceback.print_exc()
    return f"{type(exc).__name__}: {exc}"[:200]


def _close(s) -> None:
    """End what state ``s`` holds outside tensors (a host env's workers); None: nothing built."""
    if s is not None and s.env.on_host:  # env=gym: its vector env's workers
        s.env.close()


def _free() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def case_rows(c: Case):
    """The rows of ``c`` (:func:`plan`), one at a time; the state of each member count is built
    once, for its first measured row, and freed after its last."""
    todo = plan(c)
    for members in MEMBERS:
        part = [(phase, note) for m, phase, note in todo if m == members]
        s, failed = None, None
        if any(note is None for _, note in part):
            try:
                s = _build(c, members)
            except Exception as exc:  # noqa: BLE001 (the section goes on; the note says what failed)
                failed = f"building the state: {_error(exc)}"
        for phase, note in part:
            row = {"section": "kernels", "features": c.name, "members": members, "phase": phase}
            note = note or failed
            if note is None:
                try:
                    row.update(_measure(s, phase, members))
                except Exception as exc:  # noqa: BLE001
                    note = _error(exc)
            if note is not None:
                row["note"] = note
            yield row
        _close(s)
        s = None
        _free()


def rows(device: str = "cuda", only: tuple[str, ...] | None = None):
    """The section's rows (a generator: one experiment at a time). CUDA only."""
    if device != "cuda":
        print("kernels section: counts CUDA kernels; skipped on CPU", file=sys.stderr)
        return
    from bench.iteration_graph import keep_graphs

    keep_graphs()
    for name in experiments(only):
        try:
            c = case(name)
        except Exception as exc:  # noqa: BLE001 (composing failed: its rows say so)
            note = f"composing the config: {_error(exc)}"
            yield from ({"section": "kernels", "features": name, "members": m, "phase": phase, "note": note}
                        for m in MEMBERS for phase in STEP_PHASES)
            continue
        yield from case_rows(c)


def _with_members(df):
    """``df`` with a ``members`` column (a CSV from before it: every row P = 1)."""
    return df if "members" in df else df.assign(members=1)


def summary(df):
    """One row per experiment (first-seen order): kernels of one collect step and one update at
    P = 1 and P = ``POPULATION`` and their ratio P = 64 / P = 1, and the notes of the rows left
    unmeasured (one per member count where its rows share it)."""
    import pandas as pd

    df = _with_members(df)
    out = []
    for name in dict.fromkeys(df["features"]):
        g = df[df["features"] == name]
        row: dict = {"experiment": name}
        for phase in STEP_PHASES:
            counts = {}
            for m in MEMBERS:
                r = g[(g["phase"] == phase) & (g["members"] == m)]
                k = float(r["kernels"].iloc[-1]) if len(r) and "kernels" in r else math.nan
                counts[m] = row[f"{phase} P={m}"] = k
            ratio = counts[POPULATION] / counts[1] if counts[1] > 0 and not math.isnan(counts[POPULATION]) else math.nan
            row[f"{phase} P={POPULATION}/P=1"] = ratio
        notes = []
        if "note" in g:
            for m in MEMBERS:
                r = g[(g["members"] == m) & g["phase"].isin(STEP_PHASES)].drop_duplicates("phase", keep="last")
                noted = r[r["note"].notna() & (r["note"] != "")]
                if not len(noted):
                    continue
                if len(noted) == len(r) and noted["note"].nunique() == 1:
                    notes.append(f"P={m}: {noted['note'].iloc[0]}")
                else:
                    notes += [f"{p} P={m}: {n}" for p, n in zip(noted["phase"], noted["note"])]
        row["note"] = "; ".join(notes)
        out.append(row)
    return pd.DataFrame(out)


def _markdown(df, floatfmt: str) -> str:
    """``df`` as a markdown table, an empty cell where a value is missing (not "nan")."""
    return df.astype(object).where(df.notna(), None).to_markdown(index=False, floatfmt=floatfmt, missingval="")


def table(df) -> str:
    """Markdown: the side-by-side kernels at P = 1 and P = 64 (:func:`summary`), then every row
    (kernels, graph nodes and ms per collect step / update / iteration, env steps/s, notes)."""
    df = _with_members(df)
    s = summary(df)
    cols = [c for c in ("features", "members", "phase", "num_envs", "T", "K", "kernels", "graph_nodes", "device_us",
                        "ms", "env_steps_per_s", "note") if c in df]
    return (f"## kernels: per collect step and per update, P = 1 (a single run) and P = {POPULATION} (a population "
            f"of {POPULATION} seeds), eager profiler count\n\n"
            f"Issue 33: the kernels per iteration should not grow with P; P={POPULATION}/P=1 is the ratio of the "
            "two counts (the population runs its own steps, foxdqn/population/step.py). Empty: not measured "
            "(the note says why).\n\n"
            + _markdown(s, ".4g")
            + "\n\n## kernels: per collect step, per update and per iteration (eager profiler count; captured graph "
            "nodes and ms)\n\n" + _markdown(df[cols], ".4g"))
