"""Step section: ms per gradient update, eager vs one CUDA graph, in one run (a population of one).

Feature sets: every experiment's (its config as shipped), plus ``full`` = dueling C51 + CQL +
PER + 3-step returns. Sizes: (batch 256, MLP 2×256), (batch 1024, MLP 3×512), (batch 4096,
attention encoder, trading sets only); on CPU only the first size. K updates are timed per call and divided by K; ratios
eager/graph come from the same process. On CPU only the eager rows run.
"""
from __future__ import annotations

from pathlib import Path


from bench.common import time_ms
from bench.harness import iteration, make_state
from foxdqn.config.compose import experiment_names

EXPERIMENTS = experiment_names()
FULL = ["+experiment=eurusd_c51", "head.dueling=true", "objective=cql", "replay=per", "replay.n_step=3"]
SIZES = {
    "b256_mlp2x256": ["agent.batch_size=256", "model.hidden=[256,256]"],
    "b1024_mlp3x512": ["agent.batch_size=1024", "model.hidden=[512,512,512]"],
    "b4096_attention": ["agent.batch_size=4096", "model=attention"],
}
K = 8


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
            eager = iteration(s, use_graph=False, collect_steps=0, updates=K)
            out.append({**base, "provider": "eager", "ms_per_update": time_ms(eager)[0] / K})
            if device != "cuda":
                continue
            graph = iteration(s, use_graph=True, collect_steps=0, updates=K)
            for _ in range(5):
                graph()
            out.append({**base, "provider": "graph", "ms_per_update": time_ms(graph)[0] / K})
            print(out[-2:], flush=True)
    return out
