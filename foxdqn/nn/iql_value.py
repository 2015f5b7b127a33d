"""State-value network V(s) of Implicit Q-Learning (Kostrikov, Nair & Levine 2021, §4).

IQL fits V_ψ(s) to an upper expectile of Q over the dataset's actions (eq. 5) and uses it as the
bootstrap target of Q (eq. 6). It has its own encoder (no weights shared with the Q network),
is trained by the same optimizer as Q (``IQLObjective.extra_parameters()``) and has no target
copy.
"""
from __future__ import annotations

import torch
from torch import nn


class IQLValueNetwork(nn.Module):
    """obs float32 [B, D] → V(s) float32 [B] (return units).

    Args:
        encoder: obs [B, D] → features [B, H] with attribute ``out_dim`` = H, e.g.
            ``MLPEncoder(obs_dim, model.hidden, model.activation)`` — a separate instance from
            the Q network's encoder.
    """

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.value = nn.Linear(encoder.out_dim, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.value(self.encoder(obs)).squeeze(-1)  # (B,)
