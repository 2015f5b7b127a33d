"""Kernels section: CUDA kernels per collect step and per gradient update, beside their time.

For each feature set (an experiment as shipped; trading sets at ``TRADING_ENVS`` envs, the size of
issue 17's table) one :class:`~foxdqn.step.state.TrainState` is built and warmed up, then:

* ``kernels``, ``device_us`` and ``longest_us``: one eager call of the step under
  ``torch.profiler`` (CUDA activity): the kernels it launched (memcpy/memset and the profiler's GPU ranges of user annotations not counted), the sum
  of their device durations in µs, and the four longest with their µs;
* ``graph_nodes`` and ``ms``: the same step captured alone in a CUDA graph
  (:class:`~foxdqn.step.iteration.Iteration` with one collect step, or one update): the graph's
  node count (kernels, memsets and copies that one replay launches, ``cudaGraphGetNodes``) and the
  median ms per replay (:func:`bench.iteration_graph.replay_ms`);
* ``env_steps_per_s``: N / ms for a collect step, and N·T / ms for the ``collect_only`` row (the
  experiment's own T collect steps in one graph, no update: one replay's fixed cost spread over
  T steps) and the ``iteration`` row (its T collect steps and K updates in one graph).

Rows: ``section=kernels``, ``features``, ``phase`` (collect | update | collect_only | iteration), ``num_envs``.
CUDA only (kernels are what is counted). docs/bench.md#kernels.
"""
from __future__ import annotations

import sys

import torch

from bench.harness import make_state
from bench.ops.training import TRADING_ENVS
from foxdqn.step.collect import collect_step
from foxdqn.step.iteration import Iteration
from foxdqn.step.update import update_step

TRADING_SETS = ("eurusd_dqn", "eurusd_rainbowish", "eurusd_iqn", "eurusd_branching")
EPISODIC_SETS = ("cartpole_cleanrl",)


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


def _rows_for(name: str, overrides: list[str]) -> list[dict]:
    from bench.iteration_graph import graph_nodes, replay_ms

    s = make_state([f"+experiment={name}", "graph=on", *overrides], "cuda")
    n = s.cfg.env.num_envs
    for _ in range(3):  # Triton compilation, gradient and Adam state allocation
        collect_step(s)
        update_step(s)
    out = []
    shapes = {"collect": dict(collect_steps=1, updates=0), "update": dict(collect_steps=0, updates=1),
              "collect_only": dict(updates=0), "iteration": {}}
    for phase, shape in shapes.items():
        row = {"section": "kernels", "features": name, "phase": phase, "num_envs": n}
        if phase in ("collect", "update"):  # the profiler counts one eager step
            fn = collect_step if phase == "collect" else update_step
            row["kernels"], row["device_us"], row["longest_us"] = profile_kernels(lambda: fn(s))
        it = Iteration(s, use_graph=True, **shape)
        row["ms"] = round(replay_ms(it, 200), 5)
        row["graph_nodes"] = graph_nodes(it.graph)
        steps = {"collect": 1, "update": 0}.get(phase, it.collect_steps)
        row["T"], row["K"] = it.collect_steps, it.updates
        if steps:
            row["env_steps_per_s"] = n * steps / (row["ms"] / 1e3)
        out.append(row)
    return out


def rows(device: str = "cuda", only: tuple[str, ...] | None = None):
    """The section's rows (a generator: one feature set at a time). CUDA only."""
    if device != "cuda":
        print("kernels section: counts CUDA kernels; skipped on CPU", file=sys.stderr)
        return
    from bench.iteration_graph import keep_graphs

    keep_graphs()
    for name in TRADING_SETS + EPISODIC_SETS:
        if only and name not in only:
            continue
        overrides = [f"env.num_envs={TRADING_ENVS}"] if name in TRADING_SETS else []
        yield from _rows_for(name, overrides)


def table(df) -> str:
    """Markdown: kernels, graph nodes and ms per collect step / update, env steps/s."""
    cols = [c for c in ("features", "phase", "num_envs", "T", "K", "kernels", "graph_nodes", "device_us", "ms",
                        "env_steps_per_s") if c in df]
    return ("## kernels: per collect step, per update and per iteration (eager profiler count; captured graph "
            "nodes and ms)\n\n" + df[cols].to_markdown(index=False, floatfmt=".4g"))
