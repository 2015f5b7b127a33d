"""Replay memories on the training device."""
from foxdqn.replay.buffer import Batch, ReplayBuffer

__all__ = ["Batch", "ReplayBuffer"]
