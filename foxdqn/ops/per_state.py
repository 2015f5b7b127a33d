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

Member axis (a population, docs/design/population.md): with ``members=P`` the state is P
independent sums of the same capacity and block, one per member, in one set of tensors with a
leading member dimension: ``leaves`` ``[P, capacity_padded]``, ``block_sums`` ``[P, num_blocks]``,
and ``max_priority``, ``alpha``, ``eps`` ``[P]``. The ops (``per_sample``, ``per_update``,
``per_insert``) then take P groups of items, member p's reading and writing only row p; member
p's row evolves exactly as a state without the member axis given member p's items would.
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
        members: None (one sum, the shapes below) or P >= 1: P sums with a leading member
            dimension (module docstring). ``alpha`` and ``eps`` may then also be float32 ``[P]``
            tensors on ``device``, one value per member, which the state keeps (not copies), so
            that changing them in place reaches the ops; a float gives every member that value.

    Attributes:
        capacity, block, num_blocks (``ceil(capacity / block)``), capacity_padded
        (``num_blocks * block``): Python ints, fixed for the life of the state.
        members: None or P (the ``members`` argument); num_members: P, or 1 without a member axis.
        leaves: f32 ``[capacity_padded]`` (``[P, capacity_padded]``), ``p^alpha`` per slot.
        block_sums: f32 ``[num_blocks]`` (``[P, num_blocks]``), exact f32 sums of the leaves of
            each block.
        max_priority: f32 0-d (``[P]``), the largest raw priority ``|TD| + eps`` seen so far
            (starts at 1.0); new items get ``max_priority^alpha`` (Schaul §3.3).
        alpha, eps: f32 0-d (``[P]``) tensors; change them in place (``state.alpha.fill_(0.7)``).

    Raises:
        ConfigError: capacity < 1, block not a power of two in range, members < 1, alpha < 0,
            eps < 0 or non-finite, or an ``alpha``/``eps`` tensor that is not float32 ``[P]`` on
            ``device``.
    """

    def __init__(self, capacity: int, device, alpha: float | torch.Tensor = 0.6, eps: float | torch.Tensor = 1e-6,
                 block: int = 1024, members: int | None = None):
        if int(capacity) != capacity or capacity < 1:
            raise ConfigError(f"per: capacity must be an integer >= 1, got {capacity!r}")
        if int(block) != block or block < 2 or block > _MAX_BLOCK or (int(block) & (int(block) - 1)) != 0:
            raise ConfigError(f"per: block must be a power of two in [2, {_MAX_BLOCK}], got {block!r}")
        if members is not None and (int(members) != members or members < 1):
            raise ConfigError(f"per: members must be an integer >= 1 (or None), got {members!r}")
        self.capacity = int(capacity)
        self.block = int(block)
        self.num_blocks = (self.capacity + self.block - 1) // self.block
        self.capacity_padded = self.num_blocks * self.block
        self.device = torch.empty(0, device=device).device  # 'cuda' resolved to its index (cuda:0)
        self.members = None if members is None else int(members)
        lead = () if members is None else (self.members,)
        f32 = dict(dtype=torch.float32, device=self.device)
        self.leaves = torch.zeros(*lead, self.capacity_padded, **f32)
        self.block_sums = torch.zeros(*lead, self.num_blocks, **f32)
        self.max_priority = torch.ones(lead, **f32)
        self.alpha = self._parameter("alpha", alpha, lead)
        self.eps = self._parameter("eps", eps, lead)

    @property
    def num_members(self) -> int:
        """P, or 1 for a state without a member axis."""
        return 1 if self.members is None else self.members

    def _parameter(self, name: str, value, lead: tuple) -> torch.Tensor:
        """``alpha`` or ``eps`` as a float32 tensor of shape ``lead`` on the device: a float filled
        in, a member axis's ``[P]`` tensor kept as it is (checked once, at setup: a host read)."""
        if isinstance(value, torch.Tensor):
            if not lead or value.shape != lead or value.dtype != torch.float32 or value.device != self.device:
                raise ConfigError(f"per: {name} as a tensor must be float32 {list(lead) or '[P]'} on {self.device} "
                                  f"with a member axis, got {value.dtype} {list(value.shape)} on {value.device}")
            values = value.tolist()
        else:
            values = [value]
        for v in values:
            if not (float(v) >= 0.0 and float(v) < float("inf")):
                raise ConfigError(f"per: {name} must be finite and >= 0, got {v!r}")
        if isinstance(value, torch.Tensor):
            return value
        return torch.full(lead, float(value), dtype=torch.float32, device=self.device)

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
        self.block_sums.copy_(self.leaves.view(*self.block_sums.shape, self.block).sum(dim=-1))

    def state_dict(self) -> dict:
        """Tensors and sizes for a checkpoint (tensors are the live ones: clone to snapshot)."""
        return {
            "capacity": self.capacity,
            "block": self.block,
            **({} if self.members is None else {"members": self.members}),
            "leaves": self.leaves,
            "block_sums": self.block_sums,
            "max_priority": self.max_priority,
            "alpha": self.alpha,
            "eps": self.eps,
        }

    def load_state_dict(self, sd: dict) -> None:
        """Copy a :meth:`state_dict` into this state (same capacity, block and members), in place.

        Raises:
            ConfigError: capacity, block or members differ from this state's.
        """
        if (int(sd["capacity"]) != self.capacity or int(sd["block"]) != self.block
                or sd.get("members") != self.members):
            raise ConfigError(
                f"per: checkpoint has capacity={sd['capacity']} block={sd['block']} members={sd.get('members')}, "
                f"this buffer capacity={self.capacity} block={self.block} members={self.members}"
            )
        for name in ("leaves", "block_sums", "max_priority", "alpha", "eps"):
            getattr(self, name).copy_(sd[name])

    def __repr__(self) -> str:
        return (
            f"PERState(capacity={self.capacity}, block={self.block}, num_blocks={self.num_blocks}, "
            f"members={self.members}, device={self.device})"
        )
