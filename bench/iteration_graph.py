"""Iteration section: one captured training iteration (collect + update) per experiment, its wall
time and its CUDA-graph node count (kernels and copies: what one ``graph.replay()`` launches).

``python -m bench.iteration_graph TAG [EXTRA_OVERRIDE ...]`` prints one JSON line per experiment:
``ms_per_iteration`` (median of 3 blocks of 100 replays, after the warm-up, the capture and one replay) and
``graph_nodes`` (``cudaGraphGetNodes`` of the captured graph). Run it on two trees in one device
call to compare them side by side (docs/bench.md#iteration); CUDA only.
"""
from __future__ import annotations

import ctypes
import glob
import json
import statistics
import sys
import time

import torch

from bench.harness import iteration, make_state

SETS = ("eurusd_dqn", "eurusd_rainbowish", "eurusd_branching", "eurusd_controls", "cartpole_dqn")


def keep_graphs() -> None:
    """Make every CUDAGraph keep its cudaGraph_t after instantiation, so its nodes can be counted."""
    original = torch.cuda.CUDAGraph

    def keep():
        return original(keep_graph=True)

    torch.cuda.CUDAGraph = keep


def graph_nodes(graph) -> int:
    """Nodes of a captured graph (cudaGraphGetNodes through the CUDA runtime library)."""
    for lib in ["libcudart.so", "libcudart.so.13", "libcudart.so.12", *glob.glob("/opt/**/libcudart.so*", recursive=True)]:
        try:
            runtime = ctypes.CDLL(lib)
            break
        except OSError:
            continue
    else:
        raise OSError("libcudart not found")
    count = ctypes.c_size_t(0)
    rc = runtime.cudaGraphGetNodes(ctypes.c_void_p(graph.raw_cuda_graph()), None, ctypes.byref(count))
    if rc != 0:
        raise RuntimeError(f"cudaGraphGetNodes returned {rc}")
    return int(count.value)


def replay_ms(it, reps: int = 100) -> float:
    """Median ms per replay of a captured iteration, 3 blocks of ``reps``, after the eager warm-up
    runs, the capture and one more replay (none of them timed)."""
    it()
    while it.graph is None:
        it()
    it()
    blocks = []
    for _ in range(3):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            it()
        torch.cuda.synchronize()
        blocks.append((time.perf_counter() - t) / reps * 1e3)
    return statistics.median(blocks)


def main(argv: list[str]) -> int:
    tag, extra = argv[0], argv[1:]
    keep_graphs()
    for name in SETS:
        s = make_state([f"+experiment={name}", "graph=on", *extra], "cuda")
        it = iteration(s, use_graph=True)
        ms = replay_ms(it)
        print(json.dumps({"tree": tag, "overrides": " ".join(extra), "experiment": name,
                          "ms_per_iteration": round(ms, 4), "graph_nodes": graph_nodes(it.graph),
                          "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
