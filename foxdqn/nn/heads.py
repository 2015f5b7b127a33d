"""Q heads: plain linear Q (Mnih et al. 2015) and dueling (Wang et al. 2016)."""
from __future__ import annotations

import torch
from torch import nn

from foxdqn.ops.dueling_combine import dueling_combine


class QHead(nn.Module):
    """Linear map features [B, H] → Q values [B, A] (float32)."""

    def __init__(self, in_dim: int, num_actions: int):
        super().__init__()
        self.q = nn.Linear(in_dim, num_actions)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.q(h)


class DuelingHead(nn.Module):
    """Dueling head, Wang et al. 2016 eq. 9: Q(s,a) = V(s) + A(s,a) − mean_a' A(s,a').

    Shapes: features [B, H] → Q values [B, A] (float32).

    The combine is one kernel forward and one backward on CUDA (foxdqn/ops/dueling_combine.py);
    parameters and ``state_dict`` keys (``value.*``, ``advantage.*``) are those of two ``nn.Linear``.
    """

    def __init__(self, in_dim: int, num_actions: int):
        super().__init__()
        self.value = nn.Linear(in_dim, 1)
        self.advantage = nn.Linear(in_dim, num_actions)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return dueling_combine(self.value(h), self.advantage(h))  # V [B, 1], A [B, A] → Q [B, A]
