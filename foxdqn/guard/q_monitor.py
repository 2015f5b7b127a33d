"""The Q-value monitor's host-side owner: device accumulator, threshold and named totals.

The op (kernel, reference, rules) is :func:`foxdqn.ops.qvalue_stats.qvalue_stats`;
:class:`QValueMonitor` owns its accumulator and threshold and writes into the guard's ring.
:class:`QTotals` names the entries of the accumulator ``acc`` for the host.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from foxdqn.device import ring_record as R
from foxdqn.ops.qvalue_stats import qvalue_stats


class QTotals(NamedTuple):
    """The Q monitor's accumulator ``acc`` (float32 [2] on the device) by name, as read on the host.

    Fields, in the order of ``acc``: ``max_q_sum`` (sum over sampled rows of max_a Q, return
    units), ``samples`` (rows summed).
    """

    max_q_sum: float
    samples: float

    @classmethod
    def from_host(cls, values: Sequence[float]) -> "QTotals":
        """Name the 2 host values of ``acc`` (:func:`foxdqn.device.ring_record.named`; ValueError
        unless exactly 2)."""
        return R.named(cls, values)

    @property
    def mean_max_q(self) -> float:
        """Mean over the summed rows of max_a Q (NaN when none)."""
        return self.max_q_sum / self.samples if self.samples else float("nan")


class QValueMonitor:
    """Owns the Q monitor's device accumulator and threshold; shares the guard's ring.

    Args:
        ring: the record ring (e.g. ``TrainingGuard.ring``).
        device: device of the Q-values.
        threshold: divergence threshold on |Q| (default 1e4); ``self.threshold`` is a float32
            0-d device tensor, update it in place (``fill_``) to change it without recapture.

    Attributes: ``acc`` (float32 [2] device: sum of per-sample max Q, sample count), ``threshold``,
    ``ring``.
    """

    def __init__(self, ring: torch.Tensor, device, threshold: float = 1e4) -> None:
        R.check_ring(ring)
        self.ring = ring
        self.device = torch.device(device)
        self.acc = torch.zeros(2, dtype=torch.float32, device=self.device)
        self.threshold = torch.tensor(float(threshold), dtype=torch.float32, device=self.device)

    def update(self, q: torch.Tensor, step: torch.Tensor) -> None:
        """Launch :func:`qvalue_stats` for ``q`` float32 [B, A] at ``step`` (int64 0-d). No sync."""
        qvalue_stats(q, step, self.acc, self.ring, self.threshold)

    def read_mean_max_q(self) -> float:
        """Mean over accumulated samples of max_a Q (one device-to-host copy; NaN if none)."""
        return QTotals.from_host(self.acc.to("cpu").tolist()).mean_max_q

    def reset(self) -> None:
        """Zero the accumulator on the device (no sync)."""
        self.acc.zero_()
