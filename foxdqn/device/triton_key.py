"""Triton's cache key of its own install, computed in a background thread while a run starts.

The first Triton kernel launch of a process, whether it finds the kernel in Triton's cache or
compiles it, first computes ``triton.runtime.cache.triton_key()``: a SHA-256 over Triton's
compiler sources and its 500 MB ``libtriton.so``, once per process (``functools.lru_cache``):
0.34 s on the 2-core CPU, about 0.6 s inside a run on the H200 machine
(docs/bench.md#start-up). :func:`start` computes it in a daemon thread, where the file reads and
the hashing release the GIL, while the main thread composes the config and checks the job (a
second or more before the first launch); that launch then finds the key cached.

Only where CUDA is available: a CPU run launches no kernel (the torch references run there). A
failure in the thread is ignored: the first launch then computes the key itself, as it would
without this module; a launch that comes before the thread is done computes it too (the same
value).
"""
from __future__ import annotations

import threading

__all__ = ["start"]


def _compute() -> None:
    try:
        import torch

        if not torch.cuda.is_available():
            return
        from triton.runtime.cache import triton_key

        triton_key()
    except Exception:  # noqa: BLE001 - a cache warm-up only (module docstring)
        pass


def start() -> threading.Thread:
    """Compute Triton's cache key in a daemon thread (module docstring); returns the thread."""
    thread = threading.Thread(target=_compute, name="foxdqn-triton-key", daemon=True)
    thread.start()
    return thread
