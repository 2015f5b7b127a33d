"""One training iteration = T collect steps of N envs + K gradient updates.

``graph: off`` runs :meth:`Iteration.body` eagerly (the CPU path). ``graph: on`` runs the same
``body`` a few times eagerly on a side stream to warm up (allocating gradients and Adam state,
compiling Triton kernels — these warm-up runs are real iterations and are counted), then captures
one call of ``body`` into a ``torch.cuda.CUDAGraph`` with the run's generator registered, and from
then on each iteration is exactly one ``graph.replay()``. Nothing in ``body`` reads the device from
Python, so there is nothing else to launch and nothing to wait for (docs/design/hot_loop.md#the-contract, rules 1–4).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from foxdqn.device.capture import capture, run_on_side_stream
from foxdqn.timings import mark

WARMUP_ITERATIONS = 3


class Iteration:
    """Callable training iteration.

    Args:
        state: the training state the steps read (a population's
            :class:`~foxdqn.population.state.PopulationState`).
        use_graph: capture into a CUDA graph (requires a CUDA device).
        collect_steps: env steps of all N envs per iteration (T; default ``agent.steps_per_iter``).
        updates: gradient updates per iteration (K; default ``agent.updates_per_iter``; 0 for the
            collect-only iterations before ``agent.learning_starts``).
        collect, update: the step functions, called with ``state`` (the population's,
            :mod:`foxdqn.population.step`). after_updates: called with ``state`` once after the K
            updates of an iteration that has some (e.g. the population's guard copy to the host), or
            None. ``state`` needs ``cfg``, ``device`` and ``generator``
            (a torch.Generator registered with the graph, or None).
        beside: for an iteration of T >= 1 collect steps and K = 1 update, called as
            ``beside(state, T, branch)`` in place of the T collect calls and the update call: the
            collect steps on ``branch`` (a second stream on CUDA, else None) beside the update
            (:func:`foxdqn.population.step.collect_beside_update`); None: the collect calls, then
            the update calls.
    """

    def __init__(self, state: Any, use_graph: bool, collect_steps: int | None = None,
                 updates: int | None = None, *, collect: Callable, update: Callable,
                 after_updates: Callable | None = None, beside: Callable | None = None):
        self.s = state
        self._collect, self._update, self._after_updates = collect, update, after_updates
        self.use_graph = use_graph
        a = state.cfg.agent
        self.collect_steps = a.steps_per_iter if collect_steps is None else collect_steps
        self.updates = a.updates_per_iter if updates is None else updates
        self.graph: torch.cuda.CUDAGraph | None = None
        self._eager_runs = 0
        self._beside = beside if self.collect_steps and self.updates == 1 else None
        #: this iteration runs ``beside`` (its collect steps beside its update)
        self.collect_beside = self._beside is not None
        self._branch = (torch.cuda.Stream(state.device)
                        if self.collect_beside and state.device.type == "cuda" else None)

    def body(self) -> None:
        s = self.s
        if self._beside is not None:
            self._beside(s, self.collect_steps, self._branch)
        else:
            for _ in range(self.collect_steps):
                self._collect(s)
            for _ in range(self.updates):
                self._update(s)
        if self.updates and self._after_updates is not None:
            self._after_updates(s)

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
            return
        if self._eager_runs == 0:  # foxdqn.timings: the first call (and on CUDA, the warm-up) begins
            mark("training")
        if not self.use_graph:
            self.body()
            if self._eager_runs == 0:  # eager: the first call is the warm-up (lazy imports, allocations)
                self._eager_runs = 1
                mark("warmup")
            return
        if self._eager_runs < WARMUP_ITERATIONS:
            run_on_side_stream(self.s.device, self.body)
            self._eager_runs += 1
            return
        torch.cuda.synchronize(self.s.device)
        mark("warmup")  # the warm-up iterations have run on the device
        self.graph = capture(self.s.device, self.body, (self.s.generator,))
        mark("graph_capture")
        self.graph.replay()


class HostEnvIteration:
    """Training iteration for an env that steps on the host (foxdqn.envs.gym_adapter).

    The T collect steps run eagerly (each env step copies the actions to the host once and the
    results back once; that cannot be captured), then the K updates run as one update-only
    :class:`Iteration` (``collect_steps=0``), captured in a CUDA graph when ``use_graph``: the
    update graph reads only the device replay and never synchronises.

    ``steps``: :class:`Iteration`'s ``collect``, ``update`` and ``after_updates`` (the
    population's, :mod:`foxdqn.population.step`: its member envs of ``env.name=gym``); the
    ``after_updates`` call belongs to the update iteration (captured with it).

    Attributes:
        collect: the eager collect-only :class:`Iteration`.  update: the update-only :class:`Iteration`.
        collect_steps, updates: T and K.  graph: the update graph (None until captured / eager).
    """

    def __init__(self, state: Any, use_graph: bool, collect_steps: int | None = None,
                 updates: int | None = None, **steps: Callable):
        self.collect = Iteration(state, False, collect_steps=collect_steps, updates=0, collect=steps["collect"],
                                 update=steps["update"])
        self.update = Iteration(state, use_graph, collect_steps=0, updates=updates, **steps)  # collects nothing
        self.collect_steps, self.updates = self.collect.collect_steps, self.update.updates

    @property
    def graph(self) -> torch.cuda.CUDAGraph | None:
        return self.update.graph

    def __call__(self) -> None:
        self.collect()
        if self.updates:
            self.update()


def make_iteration(state: Any, use_graph: bool, collect_steps: int | None = None,
                   updates: int | None = None, *, on_host: bool,
                   **steps: Callable) -> Iteration | HostEnvIteration:
    """:class:`HostEnvIteration` when the env steps on the host (``on_host``), else
    :class:`Iteration`. ``steps``: :class:`Iteration`'s ``collect``, ``update`` and ``after_updates``."""
    cls = HostEnvIteration if on_host else Iteration
    return cls(state, use_graph, collect_steps=collect_steps, updates=updates, **steps)
