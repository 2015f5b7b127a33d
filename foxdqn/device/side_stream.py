"""Two pieces of device work run concurrently: one on a second stream, one on the current stream.

Captured in a CUDA graph they become two parallel branches of the graph, joined where the current
stream waits for the second (docs/design/hot_loop.md#one-graph). The warm-up of a captured function
uses it (:func:`foxdqn.device.capture.run_on_side_stream`); the iteration's collect steps beside its
update fork and join the same way, with the join inside the update
(:func:`foxdqn.population.step.collect_beside_update`).
"""
from __future__ import annotations

from typing import Callable, TypeVar

import torch

__all__ = ["beside"]

A = TypeVar("A")
B = TypeVar("B")


def beside(branch: torch.cuda.Stream | None, side: Callable[[], A], main: Callable[[], B]) -> tuple[A, B]:
    """``(side(), main())``: ``side`` on ``branch``, forked from the current stream after its queued
    work, ``main`` on the current stream, which then waits for ``branch`` (also when ``main``
    raises), so what either wrote is ready for the current stream's later work.

    ``side`` and ``main`` must neither write what the other reads nor read what it writes. A tensor
    ``side`` returns was allocated on ``branch``; the current stream may use it, and the caching
    allocator may give its memory back to ``branch`` once freed: safe because every later use of
    ``branch`` through this function first waits for the current stream. Inputs of ``side`` must stay referenced by the caller until
    the join is queued (the current stream frees none of them before the branch read them).

    Args:
        branch: the second CUDA stream, of the current stream's device; ``None`` (the CPU, or no
            second stream): ``side()`` then ``main()``, in that order, on the current stream.
        side, main: callables of no argument queuing device work.

    Returns:
        their two results.
    """
    if branch is None:
        return side(), main()
    current = torch.cuda.current_stream(branch.device)
    branch.wait_stream(current)
    try:
        with torch.cuda.stream(branch):
            first = side()
        second = main()
    finally:
        current.wait_stream(branch)
    return first, second
