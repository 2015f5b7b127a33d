"""Per-member monitoring accumulators of a population, read by the host once per log interval.

One float64 ``[P, FIELDS]`` device tensor and the members' executed-action counts (float64
``[P, A]``): collect and update steps add to them with device ops; :meth:`MemberStats.read` copies
them to the host (the interval's one sync) and zeroes them. A collect step's sums and counts are
the single run's monitor op with a member axis, :func:`foxdqn.ops.step_stats.step_stats` with
``members=P`` (one kernel on CUDA, which also advances the env-step counter), into the first
``NUM_FIELDS`` columns, in its order, and the counts (the action diversity of a single run's rows,
foxdqn.logger.diversity).
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
    """Accumulators of P members (``acc``: float64 ``[P, FIELDS]``, indices above; ``actions``:
    float64 ``[P, A]``, each member's executed-action counts, ``num_actions`` = A of the env)."""

    def __init__(self, members: int, envs_per_member: int, device: torch.device, num_actions: int):
        self.members, self.n = members, envs_per_member
        self.acc = torch.zeros(members, FIELDS, dtype=torch.float64, device=device)
        self.actions = torch.zeros(members, num_actions, dtype=torch.float64, device=device)
        self._scratch = StepStatsScratch(envs_per_member, device, members=members)  # the kernel's (not checkpointed)

    def add_step(self, action: torch.Tensor, reward: torch.Tensor, done: torch.Tensor, episode_return: torch.Tensor,
                 episode_length: torch.Tensor, trades: torch.Tensor | None, env_steps: torch.Tensor) -> None:
        """One collect step: ``[P·N]`` executed actions, rewards (unscaled), episode-done flags,
        finished returns and lengths, trades (None: an env without fills); advances ``env_steps``
        (int64 0-d, per member) by N; counts each member's executed actions. One kernel on CUDA."""
        step_stats(action, reward, done, episode_return, episode_length, trades, self.acc[:, :NUM_FIELDS],
                   self.actions, env_steps, members=self.members, scratch=self._scratch)

    def update_columns(self) -> torch.Tensor:
        """float64 ``[P, 5]`` view of the update's columns (LOSS_SUM .. MAX_Q_SUM), which the guard's
        kernel adds to (:meth:`foxdqn.population.member_guard.MemberGuard.check`: loss, gradient norm,
        1, skip flag and mean max-Q of the batch, NaN and ±Inf as 0)."""
        return self.acc[:, LOSS_SUM:]

    def read(self, extra: torch.Tensor | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of the accumulators (float64 ``[P, FIELDS]``; with ``extra``, float64
        ``[P, K]``, e.g. the pruner's sparsities, ``[P, FIELDS + K]``, its columns after the
        accumulators') and of the action counts (float64 ``[P, A]``), in one device→host copy;
        both are then zeroed."""
        parts = [self.acc] + ([] if extra is None else [extra]) + [self.actions]
        host = torch.cat(parts, dim=1).to("cpu", copy=True).numpy()  # a copy also on CPU, where .cpu() would alias
        self.acc.zero_()
        self.actions.zero_()
        a = self.actions.shape[1]
        return host[:, :-a], host[:, -a:]

    @staticmethod
    def episode_return(acc: np.ndarray) -> float:
        """The mean return of the episodes that ended in the interval (NaN: none) of one accumulator row."""
        return acc[RETURN_SUM] / acc[EPISODES] if acc[EPISODES] else float("nan")

    @staticmethod
    def mean_max_q(acc: np.ndarray) -> float:
        """The updates' mean of the batch's mean max-Q (NaN: no update) of one accumulator row."""
        return acc[MAX_Q_SUM] / acc[UPDATES] if acc[UPDATES] else float("nan")

    @staticmethod
    def row(acc: np.ndarray, diversity: dict | None = None) -> dict:
        """A member's log row (``train/*`` names of a single run, in its order) from its accumulator
        row; ``diversity``: its action-diversity columns (foxdqn.population.diversity), placed as a
        single run places them (``action_entropy`` after ``fill_rate``, the rest after ``mean_max_q``)."""
        eps, updates = acc[EPISODES], acc[UPDATES]
        rest = dict(diversity or {})
        row = {
            "episodes": acc[EPISODES],
            "episode_return": MemberStats.episode_return(acc),
            "reward_per_step": acc[REWARD_SUM] / max(acc[TRANSITIONS], 1),
            "fill_rate": acc[TRADES] / max(acc[TRANSITIONS], 1),
            **({"action_entropy": rest.pop("action_entropy")} if "action_entropy" in rest else {}),
            "loss": acc[LOSS_SUM] / updates if updates else float("nan"),
            "grad_norm": acc[GRAD_NORM_SUM] / updates if updates else float("nan"),
            "skipped_updates": acc[SKIPPED],
            "mean_max_q": MemberStats.mean_max_q(acc),
        }
        row.update(rest)
        return row
