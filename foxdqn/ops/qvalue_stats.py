"""Q-value monitor: min/max/mean/divergence into the host ring, mean max-Q on the device.

Design: docs/design/monitors.md#q-value-monitor (the predecessor's Q-value monitor): the
``qvalue_accumulate`` and ``qvalue_divergence_check`` kernels fused into one launch that reads
the whole ``[B, A]`` batch once.

Per call, with ``q`` float32 ``[B, A]`` (for C51/IQN pass the per-action means):

* ``acc[0] += sum_b max_a q[b, a]``   (NaN in a row makes that row's max NaN, as ``torch.amax``)
* ``acc[1] += B``
* ring slot ``step mod R``: Q_STEP = step first (marks the Q columns as being written), then
  Q_MIN = min over all entries, Q_MAX = max over all entries (both NaN if any entry is NaN,
  as ``torch.amin/amax``; +/-Inf are ordinary values), Q_MEAN = mean over all B x A entries
  (summed in float64; NaN/Inf propagate as in IEEE addition), Q_DIVERGENCE = 1.0 if any entry
  is NaN or +/-Inf, or ``|Q_MIN| > threshold`` or ``|Q_MAX| > threshold`` (strict: a value
  exactly at the threshold does not diverge; a NaN threshold never trips the magnitude test).

Run it BEFORE the training guard in a step: the guard then writes STEP and COMMIT, closing
the record (see :mod:`foxdqn.device.ring_record`). Q divergence only reaches the host (the reader's
``halt_reason``); it does not set the guard's skip flag or latch.

The kernel is a single program that loops over the rows in tiles (fine for training sizes
B <= 8192, A <= 64; it is one SM's worth of bandwidth for larger batches). Being one
program, its sums are deterministic; they are accumulated in a different order than torch's,
so Q_MEAN and acc[0] match the reference to rounding, not bit for bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from foxdqn.device import ring_record as R
from foxdqn.ops.backend import resolve_backend, use_sys_fence
from foxdqn.ops.library import compile_disabled, device_op, wrap_triton


# ---------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def _sys_fence(x):
    # System-scope release fence before the Q columns (see record.py). NVIDIA only.
    return tl.inline_asm_elementwise("fence.acq_rel.sys;\n\tmov.b32 $0, $1;", "=r,r", [x],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _qvalue_stats_kernel(
    q_ptr, step_ptr, acc_ptr, ring_ptr, thr_ptr,
    B, A, stride_b, stride_a, ring_size,
    BLOCK_B: tl.constexpr, BLOCK_A: tl.constexpr, RECORD: tl.constexpr, SYS_FENCE: tl.constexpr,
):
    INF = float("inf")
    rows = tl.arange(0, BLOCK_B)
    cols = tl.arange(0, BLOCK_A)
    cmask = cols < A
    vmin = tl.full([BLOCK_B, BLOCK_A], INF, tl.float32)
    vmax = tl.full([BLOCK_B, BLOCK_A], -INF, tl.float32)
    vsum = tl.zeros([BLOCK_B, BLOCK_A], tl.float64)
    n_nan = tl.zeros([BLOCK_B, BLOCK_A], tl.int32)
    n_inf = tl.zeros([BLOCK_B, BLOCK_A], tl.int32)
    n_all = tl.zeros([BLOCK_B, BLOCK_A], tl.int32)
    n_rows = tl.zeros([BLOCK_B], tl.int32)
    rowmax_sum = tl.zeros([BLOCK_B], tl.float64)
    for b0 in range(0, B, BLOCK_B):
        r = b0 + rows
        rmask = r < B
        m = rmask[:, None] & cmask[None, :]
        x = tl.load(q_ptr + r[:, None].to(tl.int64) * stride_b + cols[None, :] * stride_a,
                    mask=m, other=0.0).to(tl.float32)
        isnan = (x != x) & m
        isinf = (tl.abs(x) == INF) & m
        n_nan += isnan.to(tl.int32)
        n_inf += isinf.to(tl.int32)
        n_all += m.to(tl.int32)
        n_rows += rmask.to(tl.int32)
        ok = m & (x == x)
        vmin = tl.minimum(vmin, tl.where(ok, x, INF))
        xmax = tl.where(ok, x, -INF)
        vmax = tl.maximum(vmax, xmax)
        vsum += tl.where(m, x, 0.0).to(tl.float64)
        row_nan = tl.sum(isnan.to(tl.int32), axis=1) > 0
        row_max = tl.where(row_nan, float("nan"), tl.max(xmax, axis=1))
        rowmax_sum += tl.where(rmask, row_max, 0.0).to(tl.float64)

    any_nan = tl.sum(tl.sum(n_nan, axis=1), axis=0) > 0
    any_inf = tl.sum(tl.sum(n_inf, axis=1), axis=0) > 0
    qmin = tl.where(any_nan, float("nan"), tl.min(tl.min(vmin, axis=1), axis=0))
    qmax = tl.where(any_nan, float("nan"), tl.max(tl.max(vmax, axis=1), axis=0))
    total = tl.sum(tl.sum(vsum, axis=1), axis=0)
    qmean = total / tl.sum(tl.sum(n_all, axis=1), axis=0).to(tl.float64)
    thr = tl.load(thr_ptr).to(tl.float32)
    diverged = any_nan | any_inf | (tl.abs(qmin) > thr) | (tl.abs(qmax) > thr)

    # device accumulator (sum of per-sample max, sample count)
    tl.store(acc_ptr + 0, tl.load(acc_ptr + 0) + tl.sum(rowmax_sum, axis=0).to(tl.float32))
    tl.store(acc_ptr + 1, tl.load(acc_ptr + 1) + tl.sum(n_rows, axis=0).to(tl.float32))

    # host record: Q_STEP first, then the Q columns
    step = tl.load(step_ptr).to(tl.int64)
    slot = step % ring_size
    slot = tl.where(slot < 0, slot + ring_size, slot)
    base = ring_ptr + slot * RECORD
    tl.store(base + 14, step.to(tl.float64))
    if SYS_FENCE:
        _sys_fence(step.to(tl.int32))
    tl.store(base + 9, qmin.to(tl.float64))
    tl.store(base + 10, qmax.to(tl.float64))
    tl.store(base + 11, qmean)
    tl.store(base + 12, tl.where(diverged, 1.0, 0.0).to(tl.float64))


# ---------------------------------------------------------------------------------------------
# Launcher (a device_op: registered with torch.library by register_ops(), foxdqn/ops/library.py)
# ---------------------------------------------------------------------------------------------
def _blocks(A: int) -> tuple[int, int]:
    block_a = triton.next_power_of_2(A)
    block_b = max(1, min(4096 // block_a, 256))  # ~4K elements per tile
    return block_b, block_a


@device_op("foxdqn::qvalue_stats", mutates_args={"acc", "ring"})
def _qvalue_stats_op(q: torch.Tensor, step: torch.Tensor, acc: torch.Tensor, ring: torch.Tensor,
                     threshold: torch.Tensor) -> None:
    B, A = q.shape
    block_b, block_a = _blocks(A)
    wrap_triton(_qvalue_stats_kernel)[(1,)](
        q, step, acc, ring, threshold,
        B, A, q.stride(0), q.stride(1), ring.shape[0],
        BLOCK_B=block_b, BLOCK_A=block_a, RECORD=R.RECORD_SIZE,
        SYS_FENCE=use_sys_fence(q, _qvalue_stats_kernel),
        num_warps=8,
    )


# ---------------------------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------------------------
_Q_COLS = list(R.QSTATS_FIELDS)


def qvalue_stats_reference(q: torch.Tensor, step: torch.Tensor, acc: torch.Tensor, ring: torch.Tensor,
                           threshold: torch.Tensor) -> None:
    """Plain-torch reference of :func:`qvalue_stats` (same arguments, same in-place writes).

    No sync when the ring is on the inputs' device; with CUDA inputs and a host ring it makes
    one blocking device-to-host copy of the record (use the Triton op on CUDA).
    """
    q = q.to(torch.float32)
    B = q.shape[0]
    qd = q.to(torch.float64)
    qmin = q.amin()
    qmax = q.amax()
    qmean = qd.sum() / (q.numel())
    nonfinite = ~torch.isfinite(q).all()
    thr = threshold.to(torch.float32)
    diverged = nonfinite | (qmin.abs() > thr) | (qmax.abs() > thr)
    rowmax_sum = q.amax(dim=1).to(torch.float64).sum().to(torch.float32)
    acc.add_(torch.stack([rowmax_sum, torch.full_like(rowmax_sum, float(B))]).to(acc.dtype))
    f64 = torch.float64
    values = torch.stack([step.to(f64), qmin.to(f64), qmax.to(f64), qmean, diverged.to(f64)])  # R.QSTATS_FIELDS
    R.write_record(ring, step, values, _Q_COLS)


# ---------------------------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------------------------
# Dynamo runs this op as an opaque call (a graph break): Inductor cannot treat the pinned host
# ring written from a CUDA kernel as a device argument. CUDA-graph capture is unaffected.
@compile_disabled
def qvalue_stats(q: torch.Tensor, step: torch.Tensor, acc: torch.Tensor, ring: torch.Tensor,
                 threshold: torch.Tensor, backend: str = "auto") -> None:
    """Q-value statistics of one batch into the device accumulator and the host ring.

    Design: docs/design/monitors.md#q-value-monitor. Rules in the module docstring.

    Args:
        q: float32 ``[B, A]`` (B >= 1, A >= 1; any strides), Q-values in return units.
        step: int64 0-d, the update number (ring slot ``step mod R``).
        acc: float32 ``[2]``, mutated: ``+= [sum_b max_a q, B]``.
        ring: float64 ``[R, 16]`` record ring (pinned host memory for CUDA inputs, or a
            tensor on q's device); columns Q_STEP, Q_MIN, Q_MAX, Q_MEAN, Q_DIVERGENCE written.
        threshold: float32 0-d, divergence threshold on |Q| (e.g. 1e4).
        backend: "auto" (Triton for CUDA tensors, torch for CPU), "triton", "torch".

    Raises:
        ValueError: wrong dtype, shape or device of an argument, or an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check_args(q, step, acc, ring, threshold)
    if resolve_backend("qvalue_stats", backend, q) == "torch":
        qvalue_stats_reference(q, step, acc, ring, threshold)
    else:
        _qvalue_stats_op(q, step, acc, ring, threshold)


def _check_args(q, step, acc, ring, threshold) -> None:
    if not isinstance(q, torch.Tensor) or q.dim() != 2 or q.dtype != torch.float32 or q.shape[0] < 1 or q.shape[1] < 1:
        raise ValueError(f"q must be a float32 tensor [B, A] with B, A >= 1, got "
                         f"{getattr(q, 'dtype', type(q).__name__)} {tuple(getattr(q, 'shape', ()))}")
    if not isinstance(step, torch.Tensor) or step.dim() != 0 or step.dtype != torch.int64:
        raise ValueError("step must be a 0-d int64 tensor")
    if not isinstance(threshold, torch.Tensor) or threshold.dim() != 0 or threshold.dtype != torch.float32:
        raise ValueError("threshold must be a 0-d float32 tensor")
    if not isinstance(acc, torch.Tensor) or acc.shape != (2,) or acc.dtype != torch.float32 or not acc.is_contiguous():
        raise ValueError("acc must be a contiguous float32 tensor [2]")
    R.check_ring(ring)
    for name, t in (("step", step), ("acc", acc), ("threshold", threshold)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    # (skipped while capturing: is_pinned queries the driver; the check ran at warm-up)
    if (q.is_cuda and ring.device.type == "cpu"
            and not torch.cuda.is_current_stream_capturing() and not ring.is_pinned()):
        raise ValueError("ring must be in pinned host memory (record.new_ring) for CUDA q")
