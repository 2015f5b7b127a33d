"""Constant device tensors of the update step, made once.

An update reads a few constants as device tensors (the backward seed 1/M of each member's loss,
``[P]``, M = ``optim.accumulate``, the clip bound ``optim.grad_clip``; the replay insert the float64 reward
scale ``loss.reward_scale``): made once per (device, value), before
a CUDA graph's capture (in the warm-up iterations), they cost no fill kernel per update and a
captured graph reads the same memory at every replay.
"""
from __future__ import annotations

import torch

_SCALARS: dict[tuple[torch.device, float, torch.dtype], torch.Tensor] = {}
_VECTORS: dict[tuple[torch.device, int, float], torch.Tensor] = {}


def device_scalar(device: torch.device | str, value: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """0-d ``value`` of ``dtype`` (float32 unless said) on ``device``, the same tensor for every call
    with the same (device, value, dtype). Read-only: never write into it."""
    key = (torch.device(device), float(value), dtype)
    if key not in _SCALARS:
        _SCALARS[key] = torch.full((), float(value), dtype=dtype, device=device)
    return _SCALARS[key]


def device_vector(device: torch.device | str, length: int, value: float) -> torch.Tensor:
    """float32 ``[length]`` of ``value`` on ``device``, the same (contiguous) tensor for every call
    with the same (device, length, value). Read-only: never write into it."""
    key = (torch.device(device), int(length), float(value))
    if key not in _VECTORS:
        _VECTORS[key] = torch.full((int(length),), float(value), dtype=torch.float32, device=device)
    return _VECTORS[key]


def is_ones_vector(t) -> bool:
    """Whether ``t`` is one of :func:`device_vector`'s vectors of ones (the tensor itself, not a copy
    or view): the backward seed of a population whose members' losses each count once
    (foxdqn.population.step.update), which a loss's backward may skip multiplying by (one launch
    fewer, the same bits). Host metadata only."""
    return any(v is t for (_, _, value), v in _VECTORS.items() if value == 1.0)
