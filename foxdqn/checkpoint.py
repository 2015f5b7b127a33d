"""Checkpoints written atomically (temporary file in the same folder, then ``os.replace``)."""
from __future__ import annotations

import os
from pathlib import Path

import torch


def save_checkpoint(path: str | Path, state, extra: dict | None = None) -> Path:
    """Save online/target weights, optimizer state, counters and the resolved config.

    ``state`` is a :class:`foxdqn.step.state.TrainState`. Reads device counters (a host sync:
    only called at the end of a run or on halt, never in the steady-state loop).
    """
    import dataclasses

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "online": state.online.state_dict(),
        "target": state.target.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "env_steps": int(state.env_steps.item()),
        "updates": int(state.updates.item()),
        "config": dataclasses.asdict(state.cfg),
        **(extra or {}),
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | Path, map_location="cpu") -> dict:
    return torch.load(Path(path), map_location=map_location, weights_only=False)
