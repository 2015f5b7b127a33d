"""Host-side reader of the guard record ring (never waits on the device).

Design: docs/design/ring.md#polling (reads pinned memory, no stream sync) and rule 5
of docs/design/hot_loop.md#the-contract: the host polls, it never
waits. The layout is in :mod:`foxdqn.device.ring_record`.

Freshness: the reader looks at host memory as it is *now*. Kernels of the iteration in flight
may not have run yet, so the newest complete record is typically from one or two iterations
back. That is the intended trade: the host learns of a halt an iteration late while the device
has already skipped the bad update (the skip flag is consumed on the device in the same replay).

Torn reads: the writers follow a seqlock (STEP first, COMMIT last, a system fence between; the
Q monitor writes Q_STEP before its columns). The reader reads COMMIT, then the record, then
STEP and Q_STEP again; a record whose COMMIT != STEP (being written, or never written) is
ignored, and Q columns whose Q_STEP changed during the read or differs from STEP are reported
as missing (``None``).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from foxdqn.device import ring_record as R

FLAG_FIELDS = ("halt_nan", "halt_loss_clip", "halt_grad_collapse", "halt_weight", "q_divergence")


class HostRingReader:
    """Reads the newest complete record of a record ring without synchronising.

    Args:
        ring: ``float64 [R, 18]`` CPU tensor (pinned on CUDA runs) written by
            :func:`foxdqn.ops.training_guard.training_guard` and
            :func:`foxdqn.ops.qvalue_stats.qvalue_stats`.

    Raises:
        ValueError: ``ring`` is not a CPU ``float64 [R, 18]`` contiguous tensor.

    A record is returned as a dict: ``step``, ``collapse_count`` (int); ``halt_nan``,
    ``halt_loss_clip``, ``halt_grad_collapse``, ``skip``, ``halted``, ``q_divergence`` (bool);
    ``clipped_loss``, ``raw_loss``, ``raw_grad_norm`` (float); ``q_min``, ``q_max``,
    ``q_mean`` (float, or ``None`` when ``q_stats`` did not run for this step).
    """

    def __init__(self, ring: torch.Tensor) -> None:
        R.check_ring(ring)
        if ring.device.type != "cpu":
            raise ValueError(f"ring must live in (pinned) CPU memory, got device {ring.device}")
        self.ring = ring
        self._arr = ring.numpy()  # a view of the same memory: every read goes to memory

    # -- reading -----------------------------------------------------------------------------
    def _read_slot(self, slot: int) -> dict | None:
        """Seqlock read of one slot: COMMIT, Q_STEP, row, Q_STEP, STEP. None if torn/empty."""
        arr = self._arr
        commit = float(arr[slot, R.COMMIT])
        q_step_before = float(arr[slot, R.Q_STEP])
        row = arr[slot].copy()
        q_step_after = float(arr[slot, R.Q_STEP])
        step_after = float(arr[slot, R.STEP])
        if not (commit >= 0 and commit == step_after and row[R.STEP] == commit and row[R.COMMIT] == commit):
            return None
        q_fresh = q_step_before == q_step_after == commit and row[R.Q_STEP] == commit
        return _to_dict(row, q_fresh)

    def _complete_slots(self) -> tuple[np.ndarray, np.ndarray]:
        arr = self._arr
        commits = arr[:, R.COMMIT].copy()  # read COMMIT before STEP (seqlock order)
        steps = arr[:, R.STEP].copy()
        ok = (commits == steps) & (steps >= 0)
        slots = np.nonzero(ok)[0]
        return slots, steps[slots]

    def latest(self) -> dict | None:
        """Newest complete record (highest STEP with COMMIT == STEP >= 0), or None.

        Never waits: reads host memory as it is. Values may be one or two iterations old.
        """
        for _ in range(4):  # a slot can be overwritten between the scan and the read: retry
            slots, steps = self._complete_slots()
            if slots.size == 0:
                return None
            for i in np.argsort(-steps, kind="stable"):
                rec = self._read_slot(int(slots[i]))
                if rec is not None:
                    if rec["step"] == int(steps[i]):
                        return rec
                    break  # slot advanced to a newer step since the scan: rescan
        return None

    def records(self) -> list[dict]:
        """All complete records, oldest first (torn ones left out)."""
        slots, steps = self._complete_slots()
        out = []
        for i in np.argsort(steps, kind="stable"):
            rec = self._read_slot(int(slots[i]))
            if rec is not None:
                out.append(rec)
        out.sort(key=lambda r: r["step"])
        return out

    def first_halt(self) -> dict | None:
        """Oldest complete record that carries a halt flag (incl. q_divergence), or None.

        Use it after :meth:`latest` shows ``halted``: the record where the latch fired is
        still in the ring if the host polled at least once every R steps.
        """
        for rec in self.records():
            if any(rec[f] for f in FLAG_FIELDS):
                return rec
        return None

    # -- interpretation ----------------------------------------------------------------------
    @staticmethod
    def halt_reason(record: dict | None) -> str | None:
        """Message naming the halt flag(s) and the step, or None when the record is clean.

        Flags are listed in the order halt_nan, halt_loss_clip, halt_grad_collapse,
        halt_weight, q_divergence, e.g. ``"halt_nan, halt_loss_clip at step 1234 (loss=inf, grad_norm=3.2)"``.
        A record with no flag of its own but with the device latch set gives
        ``"halted (latched by an earlier step) as of step N"``.
        """
        if record is None:
            return None
        names = [f for f in FLAG_FIELDS if record.get(f)]
        step = record["step"]
        if names:
            detail = f"loss={record['raw_loss']:.6g}, grad_norm={record['raw_grad_norm']:.6g}"
            if "halt_grad_collapse" in names:
                detail += f", collapse_count={record['collapse_count']}"
            if "halt_weight" in names:
                detail += f", max|w| after the step={record['max_weight']:.6g}"
            if "q_divergence" in names:
                detail += f", q_min={record['q_min']}, q_max={record['q_max']}"
            return f"{', '.join(names)} at step {step} ({detail})"
        if record.get("halted"):
            return f"halted (latched by an earlier step) as of step {step}"
        return None


def _to_dict(row: np.ndarray, q_fresh: bool) -> dict:
    def q(col: int) -> float | None:
        return float(row[col]) if q_fresh else None

    return {
        "step": int(row[R.STEP]),
        "halt_nan": bool(row[R.HALT_NAN] == 1.0),
        "halt_loss_clip": bool(row[R.HALT_LOSS_CLIP] == 1.0),
        "halt_grad_collapse": bool(row[R.HALT_GRAD_COLLAPSE] == 1.0),
        "clipped_loss": float(row[R.CLIPPED_LOSS]),
        "raw_loss": float(row[R.RAW_LOSS]),
        "raw_grad_norm": float(row[R.RAW_GRAD_NORM]),
        "skip": bool(row[R.SKIP] == 1.0),
        "collapse_count": int(row[R.COLLAPSE_COUNT]) if math.isfinite(row[R.COLLAPSE_COUNT]) else -1,
        "q_min": q(R.Q_MIN),
        "q_max": q(R.Q_MAX),
        "q_mean": q(R.Q_MEAN),
        "q_divergence": bool(q_fresh and row[R.Q_DIVERGENCE] == 1.0),
        "halted": bool(row[R.HALTED] == 1.0),
        "halt_weight": bool(row[R.HALT_WEIGHT] == 1.0),
        "max_weight": None if row[R.MAX_WEIGHT] < 0 else float(row[R.MAX_WEIGHT]),
    }
