"""Proportional prioritized replay (Schaul, Quan, Antonoglou & Silver 2016, §3.3, §3.4).

P(i) = p_i^α / Σ_k p_k^α, importance weights w_i = (N·P(i))^(−β) / max_batch w, β annealed
linearly from ``beta_start`` to 1 over ``beta_updates`` gradient updates (computed on the device
from the update counter, so it changes without a recapture). New transitions get the largest
priority seen so far; after an update the sampled rows get |TD| + ε, unless the training guard's
skip flag is set (then nothing changes). The sum structure and kernels are ``foxdqn.ops.per_*``.

With n-step returns the n−1 newest time rows have incomplete windows: a sampled row that new is
moved back n−1 rows (same env) and keeps the importance weight of the row it was drawn as. This
touches at most (n−1)·N of the capacity and is documented as a small bias.
"""
from __future__ import annotations

import torch

from foxdqn.ops.per_sample import per_sample
from foxdqn.ops.per_state import PERState
from foxdqn.ops.per_update import per_insert, per_update
from foxdqn.replay.buffer import ReplayBuffer
from foxdqn.device.schedules import LinearSchedule


class PrioritizedReplayBuffer(ReplayBuffer):
    """:class:`ReplayBuffer` with proportional prioritized sampling.

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
        self.per = PERState(self.capacity, device, alpha=alpha, eps=eps)
        self.beta = LinearSchedule(beta_start, 1.0, beta_updates, device)
        self._updates = updates
        self._env_ids = torch.arange(num_envs, device=device)

    def _after_add(self, row: torch.Tensor) -> None:
        per_insert(self.per, row * self.num_envs + self._env_ids)

    def sample_index(self, batch_size: int, generator: torch.Generator):
        rand = torch.rand(batch_size, device=self.device, generator=generator)
        size = self.filled() * self.num_envs
        index, weight = per_sample(self.per, rand, size, self.beta(self._updates))
        if self.n_step > 1:
            t, e = index // self.num_envs, index % self.num_envs
            t = torch.where(self.age(t) < self.n_step - 1, (t - (self.n_step - 1)) % self.rows, t)
            index = t * self.num_envs + e
        return index, weight

    def _sample_stacked(self, batch_size: int, generator: torch.Generator, stacked: bool = True):
        """PER's rows and weights (:meth:`sample_index`), gathered by one kernel (``stacked``: obs and
        next_obs in one [2B, D] tensor)."""
        index, weight = self.sample_index(batch_size, generator)
        return self.gather(index, weight, stacked=stacked)

    def update_priorities(self, index: torch.Tensor, td_abs: torch.Tensor, skip: torch.Tensor) -> None:
        per_update(self.per, index, td_abs, skip)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "per": self.per.state_dict()}
