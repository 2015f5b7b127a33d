"""Layout of the host ring of guard records (shared by the training guard and the Q monitor).

Design: docs/design/ring.md (layout, slot, write protocol) and rule 5 of
docs/design/hot_loop.md#the-contract.

The ring is a ``float64`` tensor ``[R, RECORD_SIZE]`` (``RECORD_SIZE == 18``) in pinned CPU
memory when CUDA is available (Triton kernels store into it directly, eagerly and from CUDA
graph replay) and in plain CPU memory otherwise. Step ``s`` writes slot ``s mod R`` (Python
modulo, computed on the device from the step tensor). ``float64`` holds every step number
below 2**53 exactly.

Field indices (columns):

====  ==================  ===========================================================
col   name                written by / meaning
====  ==================  ===========================================================
0     STEP                guard: the step number; written FIRST (opens the record)
1     HALT_NAN            guard: 1.0 if loss or grad norm is NaN or +/-Inf
2     HALT_LOSS_CLIP      guard: 1.0 if loss > loss_clip
3     HALT_GRAD_COLLAPSE  guard: 1.0 if the collapse counter exceeded the patience
4     CLIPPED_LOSS        guard: loss, or loss_clip where loss > loss_clip (NaN stays NaN)
5     RAW_LOSS            guard: loss as given
6     RAW_GRAD_NORM       guard: gradient norm before clipping, as given
7     SKIP                guard: 1.0 if this step's optimizer update was skipped
8     COLLAPSE_COUNT      guard: consecutive collapsed steps after this step
9     Q_MIN               q_stats: min over all B x A Q-values (NaN if any is NaN)
10    Q_MAX               q_stats: max over all B x A Q-values (NaN if any is NaN)
11    Q_MEAN              q_stats: mean over all B x A Q-values
12    Q_DIVERGENCE        q_stats: 1.0 if |Q_MIN| or |Q_MAX| > threshold or any entry non-finite
13    HALTED              guard: the device halt latch after this step (1.0 once any halt fired)
14    Q_STEP              q_stats: the step whose Q-values fill columns 9-12; written FIRST by q_stats
15    COMMIT              guard: equal to STEP, written LAST; the record is complete iff COMMIT == STEP
16    HALT_WEIGHT         guard: 1.0 if the weights after Adam's step would be non-finite or above
                          ``guard.max_weight`` (post-step check; 0.0 when the check is off)
17    MAX_WEIGHT          guard: max |w| over the weights after Adam's step (NaN if any is NaN),
                          or -1.0 when the post-step check is off
====  ==================  ===========================================================

Columns 13 and 14 were "reserved" in the first layout; they now carry the halt latch (so a
host that missed the record where a halt fired still sees that the run is halted) and the
freshness marker of the Q columns (so a step without ``q_stats`` is not mistaken for one with
it). Columns 16 and 17 were added with the post-step weight check (records grew from 16 to 18
columns; :func:`foxdqn.run.checkpoint.restore_state` pads a 16-column ring of an older checkpoint).
A fresh ring holds ``STEP == COMMIT == Q_STEP == MAX_WEIGHT == -1``, NaN in the Q value columns
and 0 elsewhere: no record is complete.

Write protocol (a seqlock; see ``foxdqn.device.host_ring.HostRingReader`` for the reader side):
``q_stats`` (runs before the guard in a training step) writes Q_STEP, then columns 9-12; the
guard writes STEP, then columns 1-8, 13, 16 and 17, then COMMIT. On CUDA each kernel puts a
system-scope fence between these groups so the host observes them in this order.
"""
from __future__ import annotations

from typing import Sequence

import torch

STEP = 0
HALT_NAN = 1
HALT_LOSS_CLIP = 2
HALT_GRAD_COLLAPSE = 3
CLIPPED_LOSS = 4
RAW_LOSS = 5
RAW_GRAD_NORM = 6
SKIP = 7
COLLAPSE_COUNT = 8
Q_MIN = 9
Q_MAX = 10
Q_MEAN = 11
Q_DIVERGENCE = 12
HALTED = 13
Q_STEP = 14
COMMIT = 15
HALT_WEIGHT = 16
MAX_WEIGHT = 17

RECORD_SIZE = 18
RING_DTYPE = torch.float64

FIELD_NAMES: dict[int, str] = {
    STEP: "step",
    HALT_NAN: "halt_nan",
    HALT_LOSS_CLIP: "halt_loss_clip",
    HALT_GRAD_COLLAPSE: "halt_grad_collapse",
    CLIPPED_LOSS: "clipped_loss",
    RAW_LOSS: "raw_loss",
    RAW_GRAD_NORM: "raw_grad_norm",
    SKIP: "skip",
    COLLAPSE_COUNT: "collapse_count",
    Q_MIN: "q_min",
    Q_MAX: "q_max",
    Q_MEAN: "q_mean",
    Q_DIVERGENCE: "q_divergence",
    HALTED: "halted",
    Q_STEP: "q_step",
    COMMIT: "commit",
    HALT_WEIGHT: "halt_weight",
    MAX_WEIGHT: "max_weight",
}

# Columns written by each op (the reference implementations write exactly these).
GUARD_FIELDS = (STEP, HALT_NAN, HALT_LOSS_CLIP, HALT_GRAD_COLLAPSE, CLIPPED_LOSS, RAW_LOSS,
                RAW_GRAD_NORM, SKIP, COLLAPSE_COUNT, HALTED, COMMIT, HALT_WEIGHT, MAX_WEIGHT)
QSTATS_FIELDS = (Q_STEP, Q_MIN, Q_MAX, Q_MEAN, Q_DIVERGENCE)


def new_ring(ring_size: int = 64, pin_memory: bool | None = None) -> torch.Tensor:
    """Allocate and initialise an empty record ring.

    Args:
        ring_size: number of records R (>= 1). It must exceed the number of steps between two
            host polls, or records are overwritten before the host sees them.
        pin_memory: pin the host memory (needed for kernels to store into it); default: pin
            exactly when CUDA is available.

    Returns:
        ``float64`` CPU tensor ``[R, 18]`` with ``STEP == COMMIT == Q_STEP == MAX_WEIGHT == -1``,
        NaN in Q_MIN/Q_MAX/Q_MEAN and 0 elsewhere.

    Raises:
        ValueError: ``ring_size < 1``.
    """
    if int(ring_size) < 1:
        raise ValueError(f"ring_size must be >= 1, got {ring_size}")
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    ring = torch.empty((int(ring_size), RECORD_SIZE), dtype=RING_DTYPE, pin_memory=bool(pin_memory))
    reset_ring(ring)
    return ring


def reset_ring(ring: torch.Tensor) -> None:
    """Mark every record of ``ring`` empty, in place (host memory; not for use during replay)."""
    check_ring(ring)
    ring.zero_()
    ring[:, STEP] = -1.0
    ring[:, COMMIT] = -1.0
    ring[:, Q_STEP] = -1.0
    ring[:, MAX_WEIGHT] = -1.0
    ring[:, Q_MIN:Q_MEAN + 1] = float("nan")


def check_ring(ring: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``ring`` is a contiguous ``float64 [R, 18]`` tensor, R >= 1."""
    if not isinstance(ring, torch.Tensor):
        raise ValueError(f"ring must be a torch.Tensor, got {type(ring).__name__}")
    if ring.dtype != RING_DTYPE or ring.dim() != 2 or ring.shape[1] != RECORD_SIZE or ring.shape[0] < 1:
        raise ValueError(
            f"ring must be a float64 tensor [R, {RECORD_SIZE}] with R >= 1, "
            f"got {ring.dtype} {tuple(ring.shape)}")
    if not ring.is_contiguous():
        raise ValueError("ring must be contiguous")


def write_record(ring: torch.Tensor, step: torch.Tensor, values: torch.Tensor, cols: list[int]) -> None:
    """``ring[step mod R, cols] = values`` (the reference ops' ring write).

    No sync when ``ring`` and ``step`` share a device (and then capturable in a CUDA graph);
    when the ring is on the host and the values on CUDA, the slot is only known on the device,
    so this makes blocking device-to-host copies (a sync; use the Triton ops on CUDA).
    """
    n = ring.shape[0]
    if ring.device != values.device:
        values = values.to(ring.device)  # blocking copies: a sync
        step = step.to(ring.device)
    slot = torch.remainder(step.to(torch.int64), n).reshape(1).expand(len(cols))
    ring.index_put_((slot, _col_index(cols, ring.device)), values.to(ring.dtype))


def _col_index(cols: list[int], device: torch.device) -> torch.Tensor:
    """int64 tensor of ``cols`` built on ``device`` from aranges (no host-to-device copy)."""
    runs, start = [], 0
    for i in range(1, len(cols) + 1):
        if i == len(cols) or cols[i] != cols[i - 1] + 1:
            runs.append(torch.arange(cols[start], cols[i - 1] + 1, dtype=torch.int64, device=device))
            start = i
    return runs[0] if len(runs) == 1 else torch.cat(runs)


def named(cls, values: Sequence[float]):
    """``cls`` (a NamedTuple of floats: :class:`~foxdqn.guard.host.GuardTotals`,
    :class:`~foxdqn.guard.q_monitor.QTotals`) from the host copy of a device accumulator
    (a list, numpy array or CPU tensor slice).

    Raises:
        ValueError: ``values`` does not hold one entry per field.
    """
    values = [float(v) for v in values]
    if len(values) != len(cls._fields):
        raise ValueError(f"{cls.__name__}: expected {len(cls._fields)} accumulator values, got {len(values)}")
    return cls(*values)
