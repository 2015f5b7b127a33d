"""Per-member monitoring accumulators of a population, read by the host once per log interval.

One float64 ``[P, FIELDS]`` device tensor: collect and update steps add to it with device ops;
:meth:`MemberStats.read` copies it to the host (the interval's one sync) and zeroes it.
"""
from __future__ import annotations

import numpy as np
import torch

EPISODES, RETURN_SUM, REWARD_SUM, TRANSITIONS, TRADES, LOSS_SUM, GRAD_NORM_SUM, UPDATES, SKIPPED, MAX_Q_SUM = range(10)
FIELDS = 10


class MemberStats:
    """Accumulators of P members (float64 ``[P, FIELDS]``, indices above)."""

    def __init__(self, members: int, envs_per_member: int, device: torch.device):
        self.members, self.n = members, envs_per_member
        self.acc = torch.zeros(members, FIELDS, dtype=torch.float64, device=device)
        self._transitions = torch.full((members,), float(envs_per_member), device=device)  # per step
        self._none = torch.zeros(members, device=device)  # trades of an env without fills
        self._ones = torch.ones(members, device=device)  # one update

    def add_step(self, reward: torch.Tensor, done: torch.Tensor, episode_return: torch.Tensor,
                 trades: torch.Tensor | None) -> None:
        """One collect step: ``[P·N]`` rewards (unscaled), episode-done flags, finished returns, trades."""
        p, n = self.members, self.n
        cols = [done.view(p, n).sum(1), episode_return.view(p, n).sum(1), reward.view(p, n).sum(1),
                self._transitions, trades.view(p, n).sum(1) if trades is not None else self._none]
        self.acc[:, :TRADES + 1] += torch.stack([c.to(torch.float64) for c in cols], dim=1)

    def add_update(self, loss: torch.Tensor, grad_norm: torch.Tensor, skip: torch.Tensor,
                   max_q: torch.Tensor) -> None:
        """One update: float32 ``[P]`` loss, gradient norm, skip flag and mean max-Q of the batch."""
        cols = torch.stack([loss, grad_norm, self._ones, skip, max_q], dim=1).to(torch.float64)
        self.acc[:, LOSS_SUM:] += torch.nan_to_num(cols, nan=0.0, posinf=0.0, neginf=0.0)

    def read(self) -> np.ndarray:
        """Host copy (float64 ``[P, FIELDS]``) of the accumulators, which are then zeroed."""
        host = self.acc.to("cpu", copy=True).numpy()  # a copy also on CPU, where .cpu() would alias
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
