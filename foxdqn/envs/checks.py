"""Argument checks shared by the env constructors; each failure is a ValueError naming the parameter."""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["check_generator", "float_dtype", "positive_int"]


def positive_int(value, name: str) -> int:
    """``value`` as an int; ValueError naming ``name`` unless it is an integer ``>= 1`` (bool refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
    return int(value)


def float_dtype(dtype, name: str = "dtype") -> torch.dtype:
    """``dtype`` if it is a floating ``torch.dtype``, else ValueError naming ``name``."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"{name}: must be a floating torch dtype, got {dtype!r}")
    return dtype


def check_generator(generator, device: torch.device) -> None:
    """ValueError naming ``generator`` unless it is a ``torch.Generator`` of ``device``'s type."""
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator: must be a torch.Generator, got {type(generator).__name__}")
    if generator.device.type != device.type:
        raise ValueError(
            f"generator: generator is on {generator.device} but the env is on {device}; "
            "create it with torch.Generator(device=<env device>)"
        )
