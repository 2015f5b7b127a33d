"""The two steps of putting a function into a CUDA graph: warm it up on a side stream, capture it.

Shared by :class:`foxdqn.step.iteration.Iteration` (training) and
:class:`foxdqn.device.chunk_graph.ChunkGraph` (evaluation). The sequence is the one the PyTorch
CUDA-graph notes prescribe (docs/design/hot_loop.md#one-graph):

1. run ``fn`` eagerly on a side stream, once or a few times (:func:`run_on_side_stream`): lazy
   initialisation, allocator warm-up and Triton compilation happen outside the capture;
2. wait for the device, register every ``torch.Generator`` ``fn`` draws from so that each replay
   advances it like an eager call, capture one call of ``fn`` (:func:`capture`);
3. the caller replays the returned graph (the first replay is the first captured iteration).
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch

from foxdqn.device.side_stream import beside

__all__ = ["capture", "run_on_side_stream"]


def run_on_side_stream(device: torch.device, fn: Callable[[], object]) -> None:
    """Run ``fn()`` eagerly on a fresh side stream of ``device``, ordered after the current
    stream's queued work and before its later work (no host synchronisation).

    Args:
        device: a CUDA device.
        fn: the work to warm up; its return value is dropped.
    """
    beside(torch.cuda.Stream(device), fn, lambda: None)


def capture(device: torch.device, fn: Callable[[], object],
            generators: Iterable[torch.Generator | None] = ()) -> torch.cuda.CUDAGraph:
    """Synchronise ``device``, then capture one call of ``fn()`` into a new CUDA graph.

    ``fn`` runs once during the capture, which records its kernels without executing them; the
    caller replays the graph to run them.

    Args:
        device: the CUDA device ``fn`` launches on.
        fn: the capturable work (fixed shapes, no host reads; docs/design/hot_loop.md#the-contract).
        generators: the ``torch.Generator`` objects ``fn`` draws from, registered with the graph
            (``None`` entries are skipped).

    Returns:
        the captured ``torch.cuda.CUDAGraph``, not yet replayed.
    """
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    for gen in generators:
        if gen is not None:
            graph.register_generator_state(gen)
    with torch.cuda.graph(graph):
        fn()
    return graph
