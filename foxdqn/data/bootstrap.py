"""The stationary bootstrap of Politis & Romano (1994): which source item each resampled position copies.

D. N. Politis and J. P. Romano, "The Stationary Bootstrap", Journal of the American Statistical
Association 89(428), 1303-1313, 1994. A resampled series of ``length`` items from ``n`` source
items ``0 .. n-1`` (wrapped around a circle) is a run of blocks: each block starts at a uniform
source item and copies the items after it in order (``n-1`` is followed by ``0``); its length is
geometric with mean ``mean_block`` (a new block starts at each position after the first with
probability ``p = 1 / mean_block``). The resampled series is stationary when the source is, and
keeps the source's dependence within a block.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["stationary_bootstrap_indices"]


def stationary_bootstrap_indices(n: int, length: int, paths: int, mean_block: float,
                                 generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Source indices of ``paths`` stationary-bootstrap resamples of ``length`` items each.

    Position ``i`` of path ``k`` starts a new block when ``i == 0`` or ``u[k, i] < 1/mean_block``
    (``u = torch.rand(paths, length)``, drawn first); a block starting at ``i`` begins at source item
    ``s[k, i]`` (``s = torch.randint(0, n, (paths, length))``, drawn second) and position
    ``i + j`` of it copies item ``(s[k, i] + j) mod n``.

    Args:
        n: source items, >= 1.
        length: items per resampled path, >= 1.
        paths: resampled paths, >= 1.
        mean_block: mean block length, >= 1 (1: every item drawn on its own, the i.i.d. bootstrap).
        generator: the ``torch.Generator`` the draws come from (its device is where they are made;
            a CPU generator gives the same indices on every machine for one seed).

    Returns:
        ``(index, starts)``: int64 ``[paths, length]`` source items in ``0 .. n-1``, and bool
        ``[paths, length]``, True where a block starts (column 0 always). On the generator's device.

    Raises:
        ValueError: an argument out of range (named).
    """
    for name, value in (("n", n), ("length", length), ("paths", paths)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"stationary_bootstrap_indices: {name} must be an integer >= 1, got {value!r}")
    if isinstance(mean_block, bool) or not isinstance(mean_block, (int, float)) or not (
            math.isfinite(mean_block) and mean_block >= 1):
        raise ValueError(f"stationary_bootstrap_indices: mean_block must be a finite number >= 1, got {mean_block!r}")
    device = generator.device
    u = torch.rand(paths, length, generator=generator, device=device, dtype=torch.float64)
    first = torch.randint(0, n, (paths, length), generator=generator, device=device)
    starts = u < 1.0 / float(mean_block)
    starts[:, 0] = True
    position = torch.arange(length, device=device).expand(paths, length)
    block_start = torch.cummax(torch.where(starts, position, torch.zeros_like(position)), dim=1).values
    index = (first.gather(1, block_start) + (position - block_start)) % n
    return index, starts
