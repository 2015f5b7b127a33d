"""Device state of proportional prioritized replay (Schaul et al. 2016, §3.3 and §3.4).

The priorities of a replay buffer of ``capacity`` slots live in a two-level blocked sum:

* ``leaves`` (f32, ``[capacity_padded]``): ``p_i^alpha`` for slot ``i``; 0 for a slot never
  written and for the padding slots ``capacity <= i < capacity_padded``.
* ``block_sums`` (f32, ``[num_blocks]``): ``block_sums[b] = sum(leaves[b*block:(b+1)*block])``.

Sampling one item costs O(num_blocks + block) instead of O(capacity) (see ``per_sample.py``);
an update rewrites the touched leaves and recomputes the sums of the touched blocks from their
leaves (see ``per_update.py``).

Why ``block_sums`` stays f32: a block sum is never updated incrementally (no ``+= new - old``,
which drifts); every touch recomputes it from scratch as the f32 sum of its ``block`` leaves,
so its error is that of one f32 reduction (about ``log2(block) * 2**-24`` relative) and does
not grow with the number of updates. The prefix over blocks, where thousands of terms are
accumulated, is formed in f64 inside the sampling kernel, and so is the scan within a block.

Everything that varies between steps is a 0-d device tensor (``alpha``, ``eps``,
``max_priority``), so a captured CUDA graph picks up a changed ``alpha`` without recapture.
Changing ``alpha`` affects priorities written afterwards; leaves written earlier keep the
exponent that was current when they were written (the usual behaviour of PER buffers).
"""
from __future__ import annotations

import torch

from foxdqn.errors import ConfigError

__all__ = ["PERState"]

_MAX_BLOCK = 16384


class PERState:
    """Priorities of a proportional prioritized replay buffer, resident on one device.

    Args:
        capacity: number of replay slots (``>= 1``). Slots are ``0 .. capacity-1``.
        device: device of every tensor of the state (``"cuda"``, ``"cpu"``, ...).
        alpha: priority exponent ``alpha >= 0`` of Schaul et al. eq. 1,
            ``P(i) = p_i^alpha / sum_k p_k^alpha``; stored in the 0-d tensor ``self.alpha``.
        eps: ``eps >= 0`` added to ``|TD|`` (Schaul §3.3, ``p_i = |delta_i| + eps``);
            stored in the 0-d tensor ``self.eps``.
        block: leaves per block, a power of two in ``[2, 16384]``. 1024 suits capacities of
            1M-10M on a GPU: one sample reads ``num_blocks + block`` values up to 1024 blocks,
            ``num_blocks/128 + 128 + block`` above.

    Attributes:
        capacity, block, num_blocks (``ceil(capacity / block)``), capacity_padded
        (``num_blocks * block``): Python ints, fixed for the life of the state.
        leaves: f32 ``[capacity_padded]``, ``p^alpha`` per slot.
        block_sums: f32 ``[num_blocks]``, exact f32 sums of the leaves of each block.
        max_priority: f32 0-d, the largest raw priority ``|TD| + eps`` seen so far (starts at
            1.0); new items get ``max_priority^alpha`` (Schaul §3.3).
        alpha, eps: f32 0-d tensors; change them in place (``state.alpha.fill_(0.7)``).

    Raises:
        ConfigError: capacity < 1, block not a power of two in range, alpha < 0, eps < 0 or
            non-finite.
    """

    def __init__(self, capacity: int, device, alpha: float = 0.6, eps: float = 1e-6, block: int = 1024):
        if int(capacity) != capacity or capacity < 1:
            raise ConfigError(f"per: capacity must be an integer >= 1, got {capacity!r}")
        if int(block) != block or block < 2 or block > _MAX_BLOCK or (int(block) & (int(block) - 1)) != 0:
            raise ConfigError(f"per: block must be a power of two in [2, {_MAX_BLOCK}], got {block!r}")
        if not (float(alpha) >= 0.0 and float(alpha) < float("inf")):
            raise ConfigError(f"per: alpha must be finite and >= 0, got {alpha!r}")
        if not (float(eps) >= 0.0 and float(eps) < float("inf")):
            raise ConfigError(f"per: eps must be finite and >= 0, got {eps!r}")
        self.capacity = int(capacity)
        self.block = int(block)
        self.num_blocks = (self.capacity + self.block - 1) // self.block
        self.capacity_padded = self.num_blocks * self.block
        self.device = torch.device(device)
        f32 = dict(dtype=torch.float32, device=self.device)
        self.leaves = torch.zeros(self.capacity_padded, **f32)
        self.block_sums = torch.zeros(self.num_blocks, **f32)
        self.max_priority = torch.ones((), **f32)
        self.alpha = torch.full((), float(alpha), **f32)
        self.eps = torch.full((), float(eps), **f32)

    def reset(self) -> None:
        """Forget every priority (leaves and block sums 0, ``max_priority`` 1.0); in place."""
        self.leaves.zero_()
        self.block_sums.zero_()
        self.max_priority.fill_(1.0)

    def rebuild_block_sums(self) -> None:
        """Recompute every block sum from the leaves, in place, on the device (no sync).

        Needed only after writing ``leaves`` directly (tests, loading old checkpoints); the
        ops keep the block sums consistent themselves. O(capacity).
        """
        self.block_sums.copy_(self.leaves.view(self.num_blocks, self.block).sum(dim=1))

    def state_dict(self) -> dict:
        """Tensors and sizes for a checkpoint (tensors are the live ones: clone to snapshot)."""
        return {
            "capacity": self.capacity,
            "block": self.block,
            "leaves": self.leaves,
            "block_sums": self.block_sums,
            "max_priority": self.max_priority,
            "alpha": self.alpha,
            "eps": self.eps,
        }

    def load_state_dict(self, sd: dict) -> None:
        """Copy a :meth:`state_dict` into this state (same capacity and block), in place.

        Raises:
            ConfigError: capacity or block differ from this state's.
        """
        if int(sd["capacity"]) != self.capacity or int(sd["block"]) != self.block:
            raise ConfigError(
                f"per: checkpoint has capacity={sd['capacity']} block={sd['block']}, "
                f"this buffer capacity={self.capacity} block={self.block}"
            )
        for name in ("leaves", "block_sums", "max_priority", "alpha", "eps"):
            getattr(self, name).copy_(sd[name])

    def __repr__(self) -> str:
        return (
            f"PERState(capacity={self.capacity}, block={self.block}, num_blocks={self.num_blocks}, "
            f"device={self.device})"
        )
