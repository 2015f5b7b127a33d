"""MLP encoder over a flat observation vector."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "silu": nn.SiLU}


class MLPEncoder(nn.Module):
    """Stack of Linear + activation layers.

    Args:
        in_dim: observation size D.
        hidden: widths of the hidden layers; the output size is ``hidden[-1]``.
        activation: one of relu, gelu, tanh, silu.

    Shapes: ``forward(obs)``: obs float32 [B, D] → features float32 [B, hidden[-1]].
    """

    def __init__(self, in_dim: int, hidden: Sequence[int], activation: str = "relu"):
        super().__init__()
        layers: list[nn.Module] = []
        width = in_dim
        for h in hidden:
            layers += [nn.Linear(width, h), ACTIVATIONS[activation]()]
            width = h
        self.net = nn.Sequential(*layers)
        self.out_dim = width

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)
