"""Uniform replay ring buffer that lives on the training device.

All bookkeeping (write pointer, size) is in device tensors, so :meth:`ReplayBuffer.add` and
:meth:`ReplayBuffer.sample` never read device memory into Python and can run inside a CUDA
graph. Shapes are fixed: ``add`` always writes ``N`` rows (one per env).
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class Batch(NamedTuple):
    """A sampled batch. obs/next_obs float32 [B, D]; action int64 [B]; reward float32 [B];
    done float32 [B] (1.0 = terminal: no bootstrap); index int64 [B] (buffer rows)."""

    obs: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    next_obs: torch.Tensor
    done: torch.Tensor
    index: torch.Tensor


class ReplayBuffer:
    """Ring buffer of transitions (s, a, r, s', terminal).

    Args:
        capacity: C rows.
        obs_dim: D.
        device: the training device (all storage lives there).

    ``ptr`` (int64 0-d) is the next row to write, ``size`` (int64 0-d) the number of valid
    rows, both on the device.
    """

    def __init__(self, capacity: int, obs_dim: int, device: torch.device):
        self.capacity = capacity
        self.device = device
        f32 = dict(device=device, dtype=torch.float32)
        self.obs = torch.zeros(capacity, obs_dim, **f32)
        self.next_obs = torch.zeros(capacity, obs_dim, **f32)
        self.action = torch.zeros(capacity, dtype=torch.int64, device=device)
        self.reward = torch.zeros(capacity, **f32)
        self.done = torch.zeros(capacity, **f32)
        self.ptr = torch.zeros((), dtype=torch.int64, device=device)
        self.size = torch.zeros((), dtype=torch.int64, device=device)
        self._arange_cache: dict[int, torch.Tensor] = {}

    def _arange(self, n: int) -> torch.Tensor:
        if n not in self._arange_cache:
            self._arange_cache[n] = torch.arange(n, device=self.device)
        return self._arange_cache[n]

    def add(self, obs, action, reward, next_obs, done) -> torch.Tensor:
        """Write N transitions at the ring pointer. obs/next_obs [N, D], action [N] int64,
        reward [N], done [N] (bool or float). Returns the written rows, int64 [N]."""
        n = action.shape[0]
        rows = (self.ptr + self._arange(n)) % self.capacity
        self.obs.index_copy_(0, rows, obs.to(torch.float32))
        self.next_obs.index_copy_(0, rows, next_obs.to(torch.float32))
        self.action.index_copy_(0, rows, action)
        self.reward.index_copy_(0, rows, reward.to(torch.float32))
        self.done.index_copy_(0, rows, done.to(torch.float32))
        self.ptr.copy_((self.ptr + n) % self.capacity)
        self.size.copy_(torch.clamp(self.size + n, max=self.capacity))
        return rows

    def sample_index(self, batch_size: int, generator: torch.Generator) -> torch.Tensor:
        """Uniform rows in [0, size), int64 [B]; size is read on the device (no sync)."""
        u = torch.rand(batch_size, device=self.device, generator=generator)
        idx = (u * self.size.to(torch.float32)).to(torch.int64)
        return torch.minimum(idx, torch.clamp(self.size - 1, min=0))

    def gather(self, index: torch.Tensor) -> Batch:
        return Batch(self.obs[index], self.action[index], self.reward[index], self.next_obs[index],
                     self.done[index], index)

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        return self.gather(self.sample_index(batch_size, generator))

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("obs", "next_obs", "action", "reward", "done", "ptr", "size")}
