"""K device steps as one chunk, run eagerly or captured once in a CUDA graph and replayed.

The evaluation loops (:meth:`foxdqn.envs.trading.TradingEnv.run_policies`,
:func:`foxdqn.analysis.backtest.finished_episodes`) step until every walk or episode quota has ended, which
only the host can decide. Stepping one step at a time from Python costs a launch per op and a
host read per check; :class:`ChunkGraph` runs ``K`` steps per call instead and reads the host once
per chunk:

* each step returns its records (a dict of device tensors of the same shapes and dtypes every
  step); step ``j`` of a chunk stacks them, grouped by dtype and shape, into row ``j`` of
  ``[K, R, ...]`` device buffers (one kernel per group; ``j`` is a constant of the captured
  graph, so no device row counter is needed);
* after the chunk the buffers are copied to the host (one copy per group, the first waits for
  the chunk) and handed back as numpy arrays ``[K, ...]``;
* with ``use_graph`` (CUDA) the first chunk runs eagerly on a side stream (warm-up: lazy
  initialisation, Triton compilation; it is a real chunk), the second call captures one chunk
  into a ``torch.cuda.CUDAGraph`` and replays it, every later call is one ``graph.replay()``, as
  :class:`foxdqn.step.iteration.Iteration` does for training (docs/design/hot_loop.md#one-graph,
  docs/design/hot_loop.md#evaluation).

The step must carry its state in device tensors updated in place (e.g. the observation copied
into a fixed buffer), launch only fixed-shape device ops, never read a device value on the host,
and draw randomness only from the ``generators`` given here: that is what makes it capturable.
On CPU (``use_graph=False``) the same chunks run eagerly.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from foxdqn.device.capture import capture, run_on_side_stream

__all__ = ["CHUNK_STEPS", "ChunkGraph"]

#: Default K: steps per chunk (one captured graph of K steps; one host read per chunk).
CHUNK_STEPS = 32

Records = dict[str, np.ndarray]


class ChunkGraph:
    """``K`` calls of ``step`` per call, eagerly or as one CUDA-graph replay (see the module docstring).

    Args:
        step: ``step() -> dict[str, Tensor]``: one step; returns that step's records, device
            tensors with the same names, shapes and dtypes on every call (cast them as they
            should be kept). Runs under ``torch.no_grad()``.
        device: where ``step``'s tensors live.
        chunk: ``K >= 1``, steps per chunk.
        use_graph: capture the chunk in a CUDA graph (``device`` must be CUDA and ``step``
            capturable); False: eager.
        generators: the ``torch.Generator`` objects ``step`` draws from, registered with the graph
            so that every replay advances them like an eager chunk.

    Raises:
        ValueError: ``chunk`` not an integer ``>= 1``; ``use_graph`` on a non-CUDA ``device``.

    Attributes:
        chunk: K.  graph: the captured ``torch.cuda.CUDAGraph`` (None before capture or eager).
        chunks_run: chunks run so far (warm-up and replays included).
    """

    def __init__(self, step: Callable[[], dict[str, Tensor]], device: torch.device, chunk: int = CHUNK_STEPS, *,
                 use_graph: bool = False, generators: Sequence[torch.Generator] = ()):
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"chunk: must be an integer >= 1 (steps per chunk), got {chunk!r}")
        device = torch.device(device)
        if use_graph and device.type != "cuda":
            raise ValueError(f"use_graph: a CUDA graph needs a CUDA device, got {device}")
        self._step = step
        self.device = device
        self.chunk = chunk
        self.use_graph = bool(use_graph)
        self._generators = tuple(generators)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.chunks_run = 0
        self._groups: list[tuple[tuple[str, ...], Tensor]] | None = None  # (names, buffer [K, R, ...])

    def __call__(self) -> Records:
        """Run one chunk of K steps; returns its records on the host, ``name -> [K, ...]`` numpy
        arrays (row j = step j of the chunk). One host synchronisation (on CUDA)."""
        with torch.no_grad():
            if not self.use_graph:
                self._body()
            elif self.graph is not None:
                self.graph.replay()
            elif self.chunks_run == 0:
                self._warm_up()
            else:
                self._capture()
        self.chunks_run += 1
        return self._host()

    def run(self, max_steps: int, stop: Callable[[Records], bool] | None = None, *, keep: bool = True) -> Records:
        """Run chunks until ``stop`` returns True or ``max_steps`` steps have run.

        Args:
            max_steps: ``>= 1``, the most steps whose records are kept; the last chunk may step
                beyond it (its extra records are dropped, ``stop`` never sees them).
            stop: called after each chunk with its host records (``[k, ...]``, ``k <= K``: the
                steps kept), in order; True ends the run.
            keep: False: the records are only handed to ``stop`` (which keeps what it needs:
                joining every chunk's records costs seconds at 10⁴ envs and 10³ steps).

        Returns:
            ``name -> [S, ...]`` numpy arrays, the records of the ``S`` steps kept
            (``S = min(chunks run * K, max_steps)``); an empty dict when not ``keep``.

        Raises:
            ValueError: ``max_steps`` not an integer ``>= 1``.
        """
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps: must be an integer >= 1, got {max_steps!r}")
        parts: list[Records] = []
        kept = 0
        while kept < max_steps:
            take = min(self.chunk, max_steps - kept)
            records = {name: value[:take] for name, value in self().items()}
            if keep:
                parts.append(records)
            kept += take
            if stop is not None and stop(records):
                break
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]} if keep else {}

    # ------------------------------------------------------------------ internals

    def _body(self) -> None:
        """K steps, step j's records stacked into row j of the buffers (allocated at the first step)."""
        for j in range(self.chunk):
            records = self._step()
            if self._groups is None:
                self._groups = _allocate(records, self.chunk)
            elif len(records) != sum(len(names) for names, _ in self._groups):
                raise ValueError(f"step: returned the records {sorted(records)}, the first step returned "
                                 f"{sorted(n for names, _ in self._groups for n in names)}")
            for names, buf in self._groups:
                torch.stack([records[name] for name in names], out=buf[j])

    def _warm_up(self) -> None:
        run_on_side_stream(self.device, self._body)

    def _capture(self) -> None:
        self.graph = capture(self.device, self._body, self._generators)
        self.graph.replay()

    def _host(self) -> Records:
        out: Records = {}
        for names, buf in self._groups:
            host = buf.to("cpu", copy=True).numpy()  # a copy on CPU too: the next chunk rewrites buf
            for r, name in enumerate(names):
                out[name] = host[:, r]
        return out


def _allocate(records: dict[str, Tensor], chunk: int) -> list[tuple[tuple[str, ...], Tensor]]:
    """One ``[K, R, *shape]`` zero buffer per (dtype, shape, device) of the records, with its R names."""
    groups: dict[tuple, list[str]] = {}
    for name, value in records.items():
        if not isinstance(value, Tensor):
            raise ValueError(f"step: record {name!r} must be a tensor, got {type(value).__name__}")
        groups.setdefault((value.dtype, tuple(value.shape), value.device), []).append(name)
    return [(tuple(names), torch.zeros(chunk, len(names), *shape, dtype=dtype, device=device))
            for (dtype, shape, device), names in groups.items()]
