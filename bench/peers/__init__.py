"""Other implementations measured beside foxdqn in ``make bench`` (docs/bench.md#population).

A peer runs as its own process (``python -m bench.peers.<name>``), so that its framework and
torch never share one process. Importing this package or a peer module needs none of the peer's
packages: they are imported where the peer trains.
"""
from __future__ import annotations

import importlib.util

#: The packages of the JAX peer (pyproject.toml's ``peers`` extra).
JAX_PEER_MODULES = ("jax", "flax", "optax", "gymnax", "flashbax")


def missing(modules: tuple[str, ...] = JAX_PEER_MODULES) -> list[str]:
    """The modules of ``modules`` that this interpreter cannot import (found without importing them)."""
    return [m for m in modules if importlib.util.find_spec(m) is None]
