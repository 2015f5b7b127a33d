"""Step section: ms per gradient update, eager vs torch.compile vs one CUDA graph, in one run.

For each feature set × size, K updates are timed per call and divided by K. Ratios are
eager/graph and compile/graph from the same process. On CPU only the eager rows run.
"""
from __future__ import annotations

import torch

from bench.common import time_ms
from bench.harness import make_state
from foxdqn.step.iteration import Iteration
from foxdqn.step.update import update_step

FEATURE_SETS = {
    "dqn": ["head=q"],
    "dueling_double": ["head=dueling"],
}
SIZES = {
    "b256_mlp2x256": ["agent.batch_size=256", "model.hidden=[256,256]"],
    "b1024_mlp3x512": ["agent.batch_size=1024", "model.hidden=[512,512,512]"],
}
K = 8


def rows(device: str = "cuda") -> list[dict]:
    out = []
    for fname, fover in FEATURE_SETS.items():
        for sname, sover in SIZES.items():
            over = [*fover, *sover, "replay.capacity=65536", f"agent.updates_per_iter={K}"]
            base = {"section": "step", "features": fname, "size": sname}
            s = make_state(over, device)
            eager = Iteration(s, use_graph=False, collect_steps=0, updates=K)
            ms = time_ms(eager)[0] / K
            out.append({**base, "provider": "eager", "ms_per_update": ms})
            if device != "cuda":
                continue
            try:
                compiled_update = torch.compile(update_step)

                def run_compiled():
                    for _ in range(K):
                        compiled_update(s)

                out.append({**base, "provider": "torch.compile", "ms_per_update": time_ms(run_compiled)[0] / K})
            except Exception as exc:  # report, do not hide
                out.append({**base, "provider": "torch.compile", "ms_per_update": float("nan"),
                            "note": f"{type(exc).__name__}: {str(exc)[:120]}"})
            graph = Iteration(s, use_graph=True, collect_steps=0, updates=K)
            for _ in range(5):
                graph()
            out.append({**base, "provider": "graph", "ms_per_update": time_ms(graph)[0] / K})
    return out
