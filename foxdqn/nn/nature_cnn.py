"""Nature-CNN encoder of Mnih et al. (2015), "Human-level control through deep reinforcement
learning", Methods, "Model architecture": conv 32 filters 8×8 stride 4, conv 64 4×4 stride 2,
conv 64 3×3 stride 1 (each followed by a rectifier), then fully connected 512 + rectifier.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

#: Smallest H and W the three convolutions accept (8×8/4, 4×4/2, 3×3/1 leave a 1×1 map at 36).
MIN_IMAGE_SIZE = 36


def check_obs_shape(obs_shape: Sequence[int]) -> tuple[int, int, int]:
    """``obs_shape`` as ``(C, H, W)`` ints, checked for :class:`NatureCNNEncoder`.

    Raises:
        ValueError: ``obs_shape`` is not ``(C, H, W)``, or H or W < 36 (message names ``obs_shape``).
    """
    if len(obs_shape) != 3:
        raise ValueError(f"NatureCNNEncoder: obs_shape must be an image shape (C, H, W), got {tuple(obs_shape)}")
    c, h, w = (int(v) for v in obs_shape)
    if min(h, w) < MIN_IMAGE_SIZE:
        raise ValueError(f"NatureCNNEncoder: obs_shape must have H and W >= {MIN_IMAGE_SIZE} "
                         f"(at least {MIN_IMAGE_SIZE}x{MIN_IMAGE_SIZE} pixels), got {h}x{w}")
    return c, h, w


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
        ValueError: ``obs_shape`` is not ``(C, H, W)`` or the image is too small for the convolutions
            (H, W ≥ 36); see :func:`check_obs_shape`.
    """

    def __init__(self, obs_shape: Sequence[int], hidden: Sequence[int] = (512,)):
        super().__init__()
        c, h, w = check_obs_shape(obs_shape)
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
