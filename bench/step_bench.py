"""Step section: ms per gradient update, eager vs torch.compile vs one CUDA graph, in one run.

Feature sets: every experiment's (its config as shipped), plus ``full`` = dueling C51 + CQL +
PER + 3-step returns. Sizes: (batch 256, MLP 2×256), (batch 1024, MLP 3×512), (batch 4096,
attention encoder, trading sets only); on CPU only the first size. K updates are timed per call and divided by K; ratios
eager/graph and compile/graph come from the same process. ``torch.compile`` (default mode) of
the objective (forward + loss; whole-update compilation fails in Inductor on the guard's pinned
ring writes, see docs/bench.md#against-the-targets) with the rest eager is measured for the batch-256 size of a few sets (``COMPILE_SETS``): its
compile time dominates the section. On CPU only the eager rows run.
"""
from __future__ import annotations

from pathlib import Path

import torch

from bench.common import time_ms
from bench.harness import make_state
from foxdqn.config.compose import experiment_names
from foxdqn.ops.library import register_ops
from foxdqn.step.iteration import Iteration

EXPERIMENTS = experiment_names()
FULL = ["+experiment=eurusd_c51", "head.dueling=true", "objective=cql", "replay=per", "replay.n_step=3"]
SIZES = {
    "b256_mlp2x256": ["agent.batch_size=256", "model.hidden=[256,256]"],
    "b1024_mlp3x512": ["agent.batch_size=1024", "model.hidden=[512,512,512]"],
    "b4096_attention": ["agent.batch_size=4096", "model=attention"],
}
K = 8
COMPILE_SIZES = ("b256_mlp2x256",)
COMPILE_SETS = ("eurusd_dqn", "full")  # compile time is about a minute per set


def feature_sets() -> dict[str, list[str]]:
    sets = {name: [f"+experiment={name}"] for name in EXPERIMENTS}
    sets["full"] = FULL
    return sets


CPU_SIZES = ("b256_mlp2x256",)  # the eager rows a CPU can run in a few minutes


def rows(device: str = "cuda", sets: dict | None = None, sizes: dict | None = None) -> list[dict]:
    out = []
    if sizes is None:
        sizes = SIZES if device == "cuda" else {k: v for k, v in SIZES.items() if k in CPU_SIZES}
    for fname, fover in (sets or feature_sets()).items():
        trading = not any(x in " ".join(fover) for x in ("cartpole", "bitflip"))
        for sname, sover in sizes.items():
            if "attention" in sname and not trading:
                continue
            over = [*fover, *sover, "replay.capacity=262144", f"agent.updates_per_iter={K}", "env.num_envs=64"]
            base = {"section": "step", "features": fname, "size": sname}
            s = make_state(over, device)
            eager = Iteration(s, use_graph=False, collect_steps=0, updates=K)
            out.append({**base, "provider": "eager", "ms_per_update": time_ms(eager)[0] / K})
            if device != "cuda":
                continue
            graph = Iteration(s, use_graph=True, collect_steps=0, updates=K)
            for _ in range(5):
                graph()
            out.append({**base, "provider": "graph", "ms_per_update": time_ms(graph)[0] / K})
            if sname in COMPILE_SIZES and fname in COMPILE_SETS:
                try:  # a fresh state: compiled code keeps its own autograd state alive
                    sc = make_state(over, device)
                    register_ops()  # our ops in the objective (C51's projection) trace instead of breaking the graph
                    sc.nets.objective = torch.compile(sc.nets.objective)  # the model part; ops, Adam, target eager
                    compiled = Iteration(sc, use_graph=False, collect_steps=0, updates=K)
                    out.append({**base, "provider": "torch.compile", "ms_per_update": time_ms(compiled)[0] / K})
                except Exception as exc:  # report, do not hide
                    out.append({**base, "provider": "torch.compile", "ms_per_update": float("nan"),
                                "note": f"{type(exc).__name__}: {str(exc)[:160]}"})
            print(out[-3:], flush=True)
    return out
