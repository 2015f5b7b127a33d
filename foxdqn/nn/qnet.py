"""Q network = encoder + head, built from the config."""
from __future__ import annotations

import torch
from torch import nn

from foxdqn.nn.heads import DuelingHead, QHead
from foxdqn.nn.mlp import MLPEncoder

_HEADS = {"q": QHead, "dueling": DuelingHead}


class QNetwork(nn.Module):
    """obs float32 [B, D] → Q values float32 [B, A]."""

    def __init__(self, encoder: nn.Module, head: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.head = head

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(obs))


def build_qnet(model_cfg, head_cfg, obs_dim: int, num_actions: int) -> QNetwork:
    """Build the online network from ``model`` and ``head`` config groups (foxdqn.config)."""
    encoder = MLPEncoder(obs_dim, list(model_cfg.hidden), model_cfg.activation)
    head = _HEADS[head_cfg.name](encoder.out_dim, num_actions)
    return QNetwork(encoder, head)
