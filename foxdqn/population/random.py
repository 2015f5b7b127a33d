"""Per-member random draws for the population path, from a counter-based generator.

Member p's draws are a function of its key (from its seed) and of one shared counter only
(:mod:`foxdqn.ops.member_uniform`), never of the other members or of P: every member consumes
the same number of values per call, so one int64 0-d counter, advanced on the device, serves all.
Each draw is one kernel on CUDA that also advances the counter (the op's ``ticket``).
"""
from __future__ import annotations

from typing import Sequence

import torch

from foxdqn.ops.member_uniform import member_keys, member_randint, member_uniform


class MemberRandom:
    """Random source of P members.

    Args:
        seeds: the members' seeds (``seed`` of each job).
        device: where the keys and the counter live.

    Attributes:
        keys: int64 ``[P]``.  counter: int64 0-d, values drawn so far per member (advanced in place).
        ticket: int32 0-d, the draws' scratch (zero between calls; not state: never checkpointed).
    """

    def __init__(self, seeds: Sequence[int], device: torch.device):
        self.keys = member_keys(list(seeds), device)
        self.counter = torch.zeros((), dtype=torch.int64, device=device)
        self.ticket = torch.zeros((), dtype=torch.int32, device=device)
        self.num_members = len(seeds)

    def uniform(self, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``dtype`` (float32 or float64) ``[P, n]`` in [0, 1), member p's next n values."""
        return member_uniform(self.keys, self.counter, n, dtype=dtype, ticket=self.ticket)

    def randint(self, high: int, n: int, low: int = 0) -> torch.Tensor:
        """int64 ``[P, n]`` in [low, low + high), member p's next n values."""
        return member_randint(self.keys, self.counter, n, high, low=low, ticket=self.ticket)
