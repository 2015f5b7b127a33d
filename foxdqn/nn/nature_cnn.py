"""Nature-CNN encoder of Mnih et al. (2015), "Human-level control through deep reinforcement
learning", Methods, "Model architecture": conv 32 filters 8×8 stride 4, conv 64 4×4 stride 2,
conv 64 3×3 stride 1 (each followed by a rectifier), then fully connected 512 + rectifier.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from foxdqn.errors import ConfigError


class NatureCNNEncoder(nn.Module):
    """Image observations → features.

    Args:
        obs_shape: ``(C, H, W)`` of one observation (Atari: ``(4, 84, 84)``, 4 stacked greyscale frames).
        hidden: widths of the fully connected layers after the convolutions (``model.hidden``;
            Mnih et al. 2015: ``[512]``); the output size is ``hidden[-1]``.

    Shapes: ``forward(obs)``: obs ``[B, C·H·W]`` (flattened, as stored in the replay) or
    ``[B, C, H, W]``, uint8 pixel values 0–255 (or float in the same units) → features float32
    ``[B, hidden[-1]]``. Pixels are scaled to [0, 1] (÷ 255) inside the encoder, so the replay keeps
    1 byte per pixel.

    Raises:
        ConfigError: ``obs_shape`` is not ``(C, H, W)`` or the image is too small for the convolutions
            (H, W ≥ 36).
    """

    def __init__(self, obs_shape: Sequence[int], hidden: Sequence[int] = (512,)):
        super().__init__()
        if len(obs_shape) != 3:
            raise ConfigError(f"model.encoder=nature_cnn needs image observations [C, H, W]; the env's "
                              f"observation shape is {tuple(obs_shape)}")
        c, h, w = (int(v) for v in obs_shape)
        if min(h, w) < 36:
            raise ConfigError(f"model.encoder=nature_cnn needs images of at least 36x36 pixels, got {h}x{w}")
        self.obs_shape = (c, h, w)
        self.conv = nn.Sequential(
            nn.Conv2d(c, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            width = self.conv(torch.zeros(1, c, h, w)).shape[1]  # 3136 = 64·7·7 for 84×84
        layers: list[nn.Module] = []
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        self.fc = nn.Sequential(*layers)
        self.out_dim = width

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.reshape(obs.shape[0], *self.obs_shape).to(torch.float32) / 255.0
        return self.fc(self.conv(x))
