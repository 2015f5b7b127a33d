"""The training guard's host-side owner: device state, thresholds, host ring and named totals.

The guard op itself (kernel, reference, rules) is :func:`foxdqn.ops.training_guard.training_guard`;
:class:`TrainingGuard` allocates what it reads and writes, launches it once per update and hands
the ring to :class:`~foxdqn.device.host_ring.HostRingReader`. :class:`GuardTotals` names the entries of
the op's accumulator ``acc`` for the host.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from foxdqn.errors import ConfigError
from foxdqn.device import ring_record as R
from foxdqn.device.host_ring import HostRingReader
from foxdqn.ops.training_guard import training_guard


class GuardTotals(NamedTuple):
    """The guard's accumulator ``acc`` (float32 [4] on the device) by name, as read on the host.

    Fields, in the order of ``acc``: ``loss_sum`` (sum of the loss over updates with finite loss
    and gradient norm), ``grad_norm_sum`` (sum of the pre-clip gradient norm over those updates),
    ``count`` (such updates), ``skipped`` (updates with skip == 1).
    """

    loss_sum: float
    grad_norm_sum: float
    count: float
    skipped: float

    @classmethod
    def from_host(cls, values: Sequence[float]) -> "GuardTotals":
        """Name the 4 host values of ``acc`` (:func:`foxdqn.device.ring_record.named`; ValueError
        unless exactly 4)."""
        return R.named(cls, values)

    @property
    def mean_loss(self) -> float:
        """Mean loss over the counted updates (NaN when none)."""
        return self.loss_sum / self.count if self.count else float("nan")

    @property
    def mean_grad_norm(self) -> float:
        """Mean pre-clip gradient norm over the counted updates (NaN when none)."""
        return self.grad_norm_sum / self.count if self.count else float("nan")


class TrainingGuard:
    """Owns the guard's device state, thresholds and host ring.

    Args:
        device: device of the training tensors.
        loss_clip: a loss above this halts (float, units of the loss).
        collapse_threshold: a post-warm-up gradient norm below this counts as collapsed
            (learning rate x multiplier); 0 disables the check.
        warmup_steps: steps without the collapse check.
        patience: consecutive collapsed steps tolerated (the (patience+1)-th halts).
        ring_size: records in the host ring (> updates between two host polls).
        max_weight: bound on |w| of the weights after Adam's step (the post-step weight check,
            docs/design/guard.md#after-the-step); None or 0: no check, and the guard has no
            ``weight_bits`` / ``max_weight`` tensors (runs without it are unchanged).

    Attributes (0-d device tensors unless noted; update thresholds in place, e.g.
    ``guard.collapse_threshold.fill_(x)`` or ``torch.mul(lr, k, out=guard.collapse_threshold)``
    inside the graph, never by rebinding, so a captured graph sees the new values):
        loss_clip, collapse_threshold (float32); warmup_steps, patience (int64);
        collapse_count (int64); acc (float32 [4]); skip, halted (float32);
        ring (float64 [R, 18] host tensor, pinned when CUDA is available); reader;
        with the weight check: max_weight (float32, the bound) and weight_bits (int32, the max
        |w| bits that :class:`foxdqn.step.weight_check.WeightCheck` accumulates and the guard
        reads and resets), else both None.

    Raises:
        ConfigError: negative patience or warm-up, ring_size < 1, NaN loss_clip, a negative or
            non-finite max_weight.
    """

    def __init__(self, device, loss_clip: float = 1e6, collapse_threshold: float = 0.0,
                 warmup_steps: int = 0, patience: int = 0, ring_size: int = 64,
                 max_weight: float | None = None) -> None:
        if int(ring_size) < 1:
            raise ConfigError(f"guard.ring_size must be >= 1, got {ring_size}")
        if int(patience) < 0:
            raise ConfigError(f"guard.patience must be >= 0, got {patience}")
        if int(warmup_steps) < 0:
            raise ConfigError(f"guard.warmup_steps must be >= 0, got {warmup_steps}")
        if loss_clip != loss_clip:
            raise ConfigError("guard.loss_clip must be a number, got NaN")
        if max_weight is not None and not (0 <= max_weight < float("inf")):
            raise ConfigError(f"guard.max_weight must be a finite number >= 0 (0 or null: off), got {max_weight}")
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        f32, i64 = torch.float32, torch.int64
        self.loss_clip = torch.tensor(float(loss_clip), dtype=f32, device=dev)
        self.collapse_threshold = torch.tensor(float(collapse_threshold), dtype=f32, device=dev)
        self.warmup_steps = torch.tensor(int(warmup_steps), dtype=i64, device=dev)
        self.patience = torch.tensor(int(patience), dtype=i64, device=dev)
        self.collapse_count = torch.zeros((), dtype=i64, device=dev)
        self.acc = torch.zeros(4, dtype=f32, device=dev)
        self.skip = torch.zeros((), dtype=f32, device=dev)
        self.halted = torch.zeros((), dtype=f32, device=dev)
        self.ring = R.new_ring(ring_size)
        self.max_weight: torch.Tensor | None = None
        self.weight_bits: torch.Tensor | None = None
        if max_weight:
            self.max_weight = torch.tensor(float(max_weight), dtype=f32, device=dev)
            self.weight_bits = torch.zeros((), dtype=torch.int32, device=dev)
        self.reader = HostRingReader(self.ring)

    def check(self, loss: torch.Tensor, grad_norm: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        """Launch the guard for this update and return ``self.skip`` (the Adam step's ``skip``).

        Args: loss, grad_norm float32 0-d; step int64 0-d; on ``self.device``. No sync.
        With the weight check, :meth:`WeightCheck.run <foxdqn.step.weight_check.WeightCheck.run>`
        must have filled ``weight_bits`` for this update first.
        """
        training_guard(loss, grad_norm, step, self.loss_clip, self.collapse_threshold,
                       self.warmup_steps, self.patience, self.collapse_count, self.acc,
                       self.skip, self.halted, self.ring, self.weight_bits, self.max_weight)
        return self.skip

    def read_accumulators(self) -> dict:
        """One device-to-host copy (a sync: call at log boundaries only).

        Returns: ``mean_loss``, ``mean_grad_norm`` (float, NaN when count == 0; over steps
        with finite loss and norm), ``count`` (int, such steps), ``skipped`` (int, skipped updates).
        """
        t = GuardTotals.from_host(self.acc.to("cpu").tolist())
        return {"mean_loss": t.mean_loss, "mean_grad_norm": t.mean_grad_norm, "count": int(t.count),
                "skipped": int(t.skipped)}

    def reset_accumulators(self) -> None:
        """Zero the accumulators on the device (no sync)."""
        self.acc.zero_()

    @property
    def checks_weights(self) -> bool:
        """The post-step weight check is on (``max_weight`` set and not 0)."""
        return self.weight_bits is not None

    def reset_halt(self) -> None:
        """Clear the latch, skip flag, collapse counter (and weight bits) on the device (no sync)."""
        self.halted.zero_()
        self.skip.zero_()
        self.collapse_count.zero_()
        if self.weight_bits is not None:
            self.weight_bits.zero_()
