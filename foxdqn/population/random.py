"""Per-member random draws for the population path, from a counter-based generator.

Member p's draws are a function of its key (from its seed) and of one shared counter only
(:mod:`foxdqn.ops.member_uniform`), never of the other members or of P: every member consumes
the same number of values per call, so one int64 0-d counter, advanced on the device, serves all.
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
    """

    def __init__(self, seeds: Sequence[int], device: torch.device):
        self.keys = member_keys(list(seeds), device)
        self.counter = torch.zeros((), dtype=torch.int64, device=device)
        self.num_members = len(seeds)

    def uniform(self, n: int) -> torch.Tensor:
        """float32 ``[P, n]`` in [0, 1), member p's next n values."""
        u = member_uniform(self.keys, self.counter, n)
        self.counter.add_(n)
        return u

    def randint(self, high: int, n: int) -> torch.Tensor:
        """int64 ``[P, n]`` in [0, high), member p's next n values."""
        r = member_randint(self.keys, self.counter, n, high)
        self.counter.add_(n)
        return r
