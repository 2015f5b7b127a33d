"""Per-member monitoring accumulators of a population, read by the host once per log interval.

One float64 ``[P, FIELDS]`` device tensor: collect and update steps add to it with device ops;
:meth:`MemberStats.read` copies it to the host (the interval's one sync) and zeroes it. A collect
step's sums are the single run's monitor op with a member axis,
:func:`foxdqn.ops.step_stats.step_stats` with ``members=P`` (one kernel on CUDA, which also
advances the env-step counter), into the first ``NUM_FIELDS`` columns, in its order.
"""
from __future__ import annotations

import numpy as np
import torch

from foxdqn.ops.step_stats import NUM_FIELDS, StepStatsScratch, step_stats

# the collect step's columns (step_stats's fields, in its order), then the update's
RETURN_SUM, EPISODES, LENGTH_SUM, REWARD_SUM, TRANSITIONS, TRADES = range(NUM_FIELDS)
LOSS_SUM, GRAD_NORM_SUM, UPDATES, SKIPPED, MAX_Q_SUM = range(NUM_FIELDS, NUM_FIELDS + 5)
FIELDS = NUM_FIELDS + 5


class MemberStats:
    """Accumulators of P members (float64 ``[P, FIELDS]``, indices above)."""

    def __init__(self, members: int, envs_per_member: int, device: torch.device):
        self.members, self.n = members, envs_per_member
        self.acc = torch.zeros(members, FIELDS, dtype=torch.float64, device=device)
        self._scratch = StepStatsScratch(envs_per_member, device, members=members)  # the kernel's (not checkpointed)

    def add_step(self, action: torch.Tensor, reward: torch.Tensor, done: torch.Tensor, episode_return: torch.Tensor,
                 episode_length: torch.Tensor, trades: torch.Tensor | None, env_steps: torch.Tensor) -> None:
        """One collect step: ``[P·N]`` executed actions, rewards (unscaled), episode-done flags,
        finished returns and lengths, trades (None: an env without fills); advances ``env_steps``
        (int64 0-d, per member) by N. One kernel on CUDA (no action histogram)."""
        step_stats(action, reward, done, episode_return, episode_length, trades, self.acc[:, :NUM_FIELDS], None,
                   env_steps, members=self.members, scratch=self._scratch)

    def update_columns(self) -> torch.Tensor:
        """float64 ``[P, 5]`` view of the update's columns (LOSS_SUM .. MAX_Q_SUM), which the guard's
        kernel adds to (:meth:`foxdqn.population.member_guard.MemberGuard.check`: loss, gradient norm,
        1, skip flag and mean max-Q of the batch, NaN and ±Inf as 0)."""
        return self.acc[:, LOSS_SUM:]

    def read(self, extra: torch.Tensor | None = None) -> np.ndarray:
        """Host copy (float64 ``[P, FIELDS]``) of the accumulators, which are then zeroed; with
        ``extra`` (float64 ``[P, K]``, e.g. the pruner's sparsities) ``[P, FIELDS + K]``, its columns
        after the accumulators' in the same one copy."""
        both = self.acc if extra is None else torch.cat([self.acc, extra], dim=1)
        host = both.to("cpu", copy=True).numpy()  # a copy also on CPU, where .cpu() would alias
        self.acc.zero_()
        return host

    @staticmethod
    def row(acc: np.ndarray) -> dict:
        """A member's log row (``train/*`` names of a single run) from its accumulator row."""
        eps, updates = acc[EPISODES], acc[UPDATES]
        return {
            "episodes": acc[EPISODES],
            "episode_return": acc[RETURN_SUM] / eps if eps else float("nan"),
            "reward_per_step": acc[REWARD_SUM] / max(acc[TRANSITIONS], 1),
            "fill_rate": acc[TRADES] / max(acc[TRANSITIONS], 1),
            "loss": acc[LOSS_SUM] / updates if updates else float("nan"),
            "grad_norm": acc[GRAD_NORM_SUM] / updates if updates else float("nan"),
            "skipped_updates": acc[SKIPPED],
            "mean_max_q": acc[MAX_Q_SUM] / updates if updates else float("nan"),
        }
