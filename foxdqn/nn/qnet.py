"""Q network = encoder + head (built from the config by foxdqn.step.build.build_network)."""
from __future__ import annotations

import torch
from torch import nn


class QNetwork(nn.Module):
    """obs float32 [B, D] → Q values float32 [B, A]."""

    def __init__(self, encoder: nn.Module, head: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.head = head

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(obs))
