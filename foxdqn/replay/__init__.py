"""Replay memories on the training device."""
from foxdqn.replay.buffer import Batch, ReplayBuffer
from foxdqn.replay.prioritized import PrioritizedReplayBuffer

__all__ = ["Batch", "ReplayBuffer", "PrioritizedReplayBuffer"]
