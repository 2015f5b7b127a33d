"""MLP encoder over a flat observation vector."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from foxdqn.ops.linear_relu import linear_relu

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "silu": nn.SiLU}


class MLPEncoder(nn.Module):
    """Stack of Linear + activation layers.

    Args:
        in_dim: observation size D.
        hidden: widths of the hidden layers; the output size is ``hidden[-1]``.
        activation: one of relu, gelu, tanh, silu.

    Shapes: ``forward(obs)``: obs float32 [B, D] → features float32 [B, hidden[-1]].

    With activation relu each Linear + ReLU pair runs as one GEMM with cuBLASLt's bias + ReLU
    epilogue on CUDA (foxdqn/ops/linear_relu.py); the modules and ``state_dict`` keys
    (``net.0.weight``, ``net.0.bias``, ``net.2.weight``, ...) are those of the ``nn.Sequential``.
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
        # (Linear, activation, fused) per layer, made once (a plain list: registers nothing, and a
        # deepcopy of the encoder maps it to the copied modules)
        self._layers = [(lin, act, type(act) is nn.ReLU) for lin, act in zip(layers[0::2], layers[1::2])]

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = obs
        for linear, act, fused in self._layers:
            h = linear_relu(h, linear.weight, linear.bias) if fused else act(linear(h))
        return h
