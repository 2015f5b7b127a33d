"""Proportional prioritized replay (Schaul, Quan, Antonoglou & Silver 2016, §3.3, §3.4).

P(i) = p_i^α / Σ_k p_k^α, importance weights w_i = (N·P(i))^(−β) / max_batch w, β annealed
linearly from ``beta_start`` to 1 over ``beta_updates`` gradient updates (computed on the device
from the update counter, so it changes without a recapture). New transitions get the largest
priority seen so far; after an update the sampled rows get |TD| + ε, unless the training guard's
skip flag is set (then nothing changes). The sum structure and kernels are ``foxdqn.ops.per_*``.

With n-step returns the n−1 newest time rows have incomplete windows: a sampled row that new is
moved back n−1 rows (same env) and keeps the importance weight of the row it was drawn as. This
touches at most (n−1)·N of the capacity and is documented as a small bias.

:class:`Priorities` is that logic on the slots ``t·N + e`` of a time-major ring of N envs, with or
without a member axis: a single run's :class:`PrioritizedReplayBuffer` has one sum over its N
envs; a population's replay (``foxdqn.population.replay.MemberPrioritizedReplay``) has one per
member over the member's own N env columns, with the member's own α, ε, β₀ and uniforms.
"""
from __future__ import annotations

import torch

from foxdqn.ops.per_sample import per_sample
from foxdqn.ops.per_schedule import per_schedule
from foxdqn.ops.per_state import PERState
from foxdqn.ops.per_update import per_insert_row, per_update
from foxdqn.replay.buffer import ReplayBuffer
from foxdqn.device.schedules import LinearSchedule


class Priorities:
    """PER's side of a replay ring: priority sums, β schedule, and the insert, sample and update
    of the slots ``t·N + e`` (time row t, env e of N), in [0, rows·N).

    Args:
        replay: the :class:`~foxdqn.replay.buffer.ReplayBuffer` whose ring this serves (its
            ``rows``, ``n_step``, ``filled()`` and ``age()`` are read).
        envs: N, envs per sum (a single run: all its envs; a population: each member's).
        members: None (one sum) or P (one sum per member: every tensor below gains a leading
            ``[P]``; :class:`~foxdqn.ops.per_state.PERState`).
        alpha: priority exponent α (``replay.alpha``), float or float32 ``[P]``.
        beta_start: initial IS exponent β₀ (``replay.beta_start``), annealed to 1, float or
            float32 ``[P]``.
        beta_updates: updates over which β reaches 1 (≥ 1).
        eps: ε added to |TD| (``replay.eps``), float or float32 ``[P]``.
        updates: int64 0-d device counter of gradient updates (the step's counter).

    Attributes:
        per: the :class:`~foxdqn.ops.per_state.PERState`.  beta: the
        :class:`~foxdqn.device.schedules.LinearSchedule` of β (0-d, or ``[P]``).
    """

    def __init__(self, replay: ReplayBuffer, envs: int, *, members: int | None = None,
                 alpha: float | torch.Tensor, beta_start: float | torch.Tensor, beta_updates: int,
                 eps: float | torch.Tensor, updates: torch.Tensor):
        device = replay.device
        self.replay, self.envs, self.updates = replay, envs, updates
        self.per = PERState(replay.rows * envs, device, alpha=alpha, eps=eps, members=members)
        self.beta = LinearSchedule(beta_start, 1.0, beta_updates, device)
        # the draw's inputs, written by one kernel before each draw (foxdqn/ops/per_schedule.py)
        self._size = torch.zeros((), dtype=torch.int64, device=device)
        self._beta = torch.zeros_like(self.beta.start)

    def insert(self, row: torch.Tensor) -> None:
        """Give time row ``row`` (int64 ``[1]``) of every env (of every member) the maximal
        priority so far (its own member's)."""
        per_insert_row(self.per, row, self.envs)

    def draw(self, rand: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`sample` without the n-step move-back: (slots, weights) as the sums give them: the
        slots written so far (``filled() · envs``) and β at the current update, both from one
        kernel (:func:`foxdqn.ops.per_schedule.per_schedule`), then :func:`foxdqn.ops.per_sample.per_sample`."""
        b = self.beta
        per_schedule(self.replay.written, self.replay.rows, self.envs, self.updates, b.start, b.end, b.duration,
                     self._size, self._beta)
        return per_sample(self.per, rand, self._size, self._beta)

    def sample(self, rand: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(slots int64, weights float32), ``rand``'s shape (``[B]``, or ``[P, B]``: member p's B
        uniforms): stratified proportional slots of the rows written so far, each sum on its
        own, with their importance weights normalised by the batch's (member's) largest; slots
        in the n−1 newest rows are moved back n−1 rows (module docstring)."""
        r = self.replay
        slots, weight = self.draw(rand)
        if r.n_step > 1:
            t, e = slots // self.envs, slots % self.envs
            t = torch.where(r.age(t) < r.n_step - 1, (t - (r.n_step - 1)) % r.rows, t)
            slots = t * self.envs + e
        return slots, weight

    def update(self, slots: torch.Tensor, td_abs: torch.Tensor, skip: torch.Tensor) -> None:
        """Priorities |TD| + ε of the sampled ``slots`` (``[B]`` or ``[P, B]``, as :meth:`sample`
        gave them) from ``td_abs`` (float32, same shape); ``skip`` (float32 0-d, or ``[P]``: each
        member's guard flag) ≠ 0 leaves the sum (the member's) unchanged."""
        per_update(self.per, slots, td_abs, skip)


class PrioritizedReplayBuffer(ReplayBuffer):
    """:class:`ReplayBuffer` with proportional prioritized sampling (one :class:`Priorities` sum
    over all N envs).

    Args (beyond ReplayBuffer's):
        alpha: priority exponent α (``replay.alpha``).
        beta_start: initial IS exponent β₀ (``replay.beta_start``), annealed to 1.
        beta_updates: updates over which β reaches 1.
        eps: ε added to |TD| (``replay.eps``).
        updates: int64 0-d device counter of gradient updates (the step's counter).
    """

    def __init__(self, capacity, num_envs, obs_dim, device, n_step=1, gamma=0.99, *, alpha=0.6, beta_start=0.4,
                 beta_updates=100_000, eps=1e-6, updates: torch.Tensor, obs_dtype: torch.dtype = torch.float32):
        super().__init__(capacity, num_envs, obs_dim, device, n_step, gamma, obs_dtype=obs_dtype)
        self.priorities = Priorities(self, num_envs, alpha=alpha, beta_start=beta_start, beta_updates=beta_updates,
                                     eps=eps, updates=updates)
        self.per, self.beta = self.priorities.per, self.priorities.beta

    def _after_add(self, row: torch.Tensor) -> None:
        self.priorities.insert(row)

    def sample_index(self, batch_size: int, generator: torch.Generator):
        rand = torch.rand(batch_size, device=self.device, generator=generator)
        return self.priorities.sample(rand)

    def _sample_stacked(self, batch_size: int, generator: torch.Generator, stacked: bool = True):
        """PER's rows and weights (:meth:`sample_index`), gathered by one kernel (``stacked``: obs and
        next_obs in one [2B, D] tensor)."""
        index, weight = self.sample_index(batch_size, generator)
        return self.gather(index, weight, stacked=stacked)

    def update_priorities(self, index: torch.Tensor, td_abs: torch.Tensor, skip: torch.Tensor) -> None:
        self.priorities.update(index, td_abs, skip)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "per": self.per.state_dict()}
