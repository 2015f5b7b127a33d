"""Monitoring accumulators kept on the device, read back once per log interval.

The collect and update phases add into :attr:`DeviceStats.acc` and :attr:`DeviceStats.actions`
with device ops only. :meth:`DeviceStats.snapshot` copies everything the log needs into pinned
host memory on a side stream (CUDA) and waits for that one copy: at most one host
synchronisation per log interval (docs/design/hot_loop.md#log-snapshot).
"""
from __future__ import annotations

import torch

from foxdqn.ops.step_stats import NUM_FIELDS, StepStatsScratch, step_stats

# acc fields (the order the op writes them in)
EP_RETURN_SUM, EP_COUNT, EP_LEN_SUM, REWARD_SUM, TRANSITIONS, TRADES = range(NUM_FIELDS)


class DeviceStats:
    """acc: float64 [NUM_FIELDS]; actions: float64 [num_actions] counts of executed actions."""

    def __init__(self, num_actions: int, num_envs: int, device: torch.device):
        self.device = device
        self.acc = torch.zeros(NUM_FIELDS, dtype=torch.float64, device=device)
        self.actions = torch.zeros(num_actions, dtype=torch.float64, device=device)
        self._scratch = StepStatsScratch(num_envs, device)  # the kernel's partial sums and ticket (not checkpointed)
        #: the second CUDA stream (None on the CPU): the collect step runs the env's draws and the
        #: per-step sums on it (:func:`foxdqn.device.side_stream.beside`), :meth:`snapshot` its copy to
        #: the host (between iterations, never during a step)
        self.branch = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._host = None

    def add_step(self, action: torch.Tensor, reward: torch.Tensor, episode_done: torch.Tensor,
                 episode_return: torch.Tensor, episode_len: torch.Tensor, traded: torch.Tensor | None, *,
                 env_steps: torch.Tensor | None = None, backend: str = "auto") -> None:
        """Accumulate one env step of N envs (all [N] tensors; reward in log-equity units; ``traded``
        [N] bool, or None for an env that does not trade: no trades); with ``env_steps`` (int64 0-d)
        also advance that counter by N (N at most the ``num_envs`` given at construction). One kernel
        on CUDA (:func:`foxdqn.ops.step_stats.step_stats`; its float64 sums are deterministic but in
        another order than torch's ``sum``)."""
        step_stats(action, reward, episode_done, episode_return, episode_len, traded, self.acc, self.actions,
                   env_steps, scratch=self._scratch, backend=backend)

    def snapshot(self, *extra: torch.Tensor) -> torch.Tensor:
        """Copy acc, actions and ``extra`` device tensors (flattened, as float64) to the host in one
        transfer; returns a CPU float64 tensor [NUM_FIELDS + A + Σ extra sizes]."""
        parts = [self.acc, self.actions] + [e.reshape(-1).to(torch.float64) for e in extra]
        if self.branch is None:
            return torch.cat(parts).clone()
        main = torch.cuda.current_stream(self.device)
        flat = torch.cat(parts)
        if self._host is None or self._host.numel() != flat.numel():
            self._host = torch.empty(flat.numel(), dtype=torch.float64, pin_memory=True)
        self.branch.wait_stream(main)
        with torch.cuda.stream(self.branch):
            self._host.copy_(flat, non_blocking=True)
            flat.record_stream(self.branch)
            done = torch.cuda.Event()
            done.record(self.branch)
        done.synchronize()  # the one host synchronisation of the log interval
        return self._host.clone()

    def reset(self) -> None:
        self.acc.zero_()
        self.actions.zero_()
