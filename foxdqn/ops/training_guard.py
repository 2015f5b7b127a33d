"""Training guard: NaN/Inf, loss-clip and gradient-collapse halts decided on the device.

Design: docs/design/guard.md (the predecessor's training guard, extended): the
collapse patience counter, the halt latch and the skip flag live on the device, and the result
of every step is written as a record into the pinned host ring (layout: :mod:`foxdqn.device.ring_record`)
that the host polls without waiting (:class:`foxdqn.device.host_ring.HostRingReader`).

Per step, in one kernel launch (one program, scalar code):

* ``halt_nan``           = loss or grad_norm is NaN or +/-Inf
* ``halt_loss_clip``     = loss > loss_clip                       (loss == loss_clip: no flag)
* ``collapsed``          = step >= warmup_steps and grad_norm < collapse_threshold
* ``collapse_count``     = collapse_count + 1 if collapsed else 0  (a normal step resets it)
* ``halt_grad_collapse`` = collapsed and collapse_count > patience (after the update above), i.e.
  it fires on the (patience+1)-th consecutive collapsed step after warm-up and on every further one
* ``halt_weight``        = (post-step weight check, only with ``weight_bits`` and ``max_weight``)
  not (max|w| <= max_weight) and no other flag fired now and the latch was not set before, where
  max|w| = ``weight_bits`` read as a float32: the largest |w| of the weights Adam's step would
  produce (:func:`foxdqn.ops.max_abs_bits.max_abs_bits`; NaN if any is NaN, Inf if any is
  infinite). So non-finite weights, and weights strictly above the bound, fire it; |w| exactly
  at the bound does not. ``weight_bits`` is reset to 0 for the next update.
* ``halted``             = halted or any halt flag                (a latch: stays 1.0)
* ``skip``               = halted (after the update)              (1.0 also for the bad step itself)
* ``clipped_loss``       = loss_clip if loss > loss_clip else loss (NaN and -Inf pass through)
* accumulators ``acc`` (float32 [4]) = [loss_sum, grad_norm_sum, count, skipped_count]:
  loss and grad_norm are added (and count incremented) for every step where BOTH are finite,
  whether or not the update was skipped; skipped_count counts steps with skip == 1.
* ring slot ``step mod R``: STEP, the three flags, CLIPPED_LOSS, RAW_LOSS, RAW_GRAD_NORM, SKIP,
  COLLAPSE_COUNT, HALTED, HALT_WEIGHT, MAX_WEIGHT (max|w|, or -1.0 when the weight check is off),
  then COMMIT = STEP last (system fence before it on CUDA).

Comparisons are IEEE: a NaN loss never trips the clip, a NaN norm never counts as collapsed
(and resets the counter), but both trip ``halt_nan``. ``+Inf`` loss trips ``halt_nan`` and
``halt_loss_clip`` together.

The skip flag is a float32 0-d tensor on the parameters' device, 1.0 = skip this update: the
run's Adam kernel takes it as ``skip`` (:func:`foxdqn.step.adam.adam_update_`), and it also works
as the ``found_inf`` of torch's fused Adam/AdamW (``optimizer.found_inf = guard.skip``), whose
kernels skip the update iff ``*found_inf == 1.0``.
"""
from __future__ import annotations

from typing import Optional

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
    # System-scope release fence (orders the preceding stores to pinned host memory before
    # the following ones as seen by the host). NVIDIA only; the interpreter never reaches it.
    return tl.inline_asm_elementwise("fence.acq_rel.sys;\n\tmov.b32 $0, $1;", "=r,r", [x],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _training_guard_kernel(
    loss_ptr, norm_ptr, step_ptr, clip_ptr, thr_ptr, warmup_ptr, patience_ptr,  # inputs (0-d)
    count_ptr, acc_ptr, skip_ptr, halted_ptr, ring_ptr,                          # state / outputs
    wbits_ptr, wmax_ptr,                                          # post-step weight check (0-d)
    ring_size,
    RECORD: tl.constexpr, SYS_FENCE: tl.constexpr, CHECK_WEIGHT: tl.constexpr,
):
    loss = tl.load(loss_ptr).to(tl.float32)
    norm = tl.load(norm_ptr).to(tl.float32)
    step = tl.load(step_ptr).to(tl.int64)
    clip = tl.load(clip_ptr).to(tl.float32)
    thr = tl.load(thr_ptr).to(tl.float32)
    warmup = tl.load(warmup_ptr).to(tl.int64)
    patience = tl.load(patience_ptr).to(tl.int64)
    count_old = tl.load(count_ptr).to(tl.int64)
    halted_old = tl.load(halted_ptr)

    INF = float("inf")
    loss_bad = (loss != loss) | (tl.abs(loss) == INF)
    norm_bad = (norm != norm) | (tl.abs(norm) == INF)
    halt_nan = loss_bad | norm_bad
    halt_clip = loss > clip
    collapsed = (step >= warmup) & (norm < thr)
    count_new = tl.where(collapsed, count_old + 1, 0)
    halt_collapse = collapsed & (count_new > patience)
    halted = (halted_old != 0.0) | halt_nan | halt_clip | halt_collapse
    if CHECK_WEIGHT:
        wmax = tl.load(wbits_ptr).to(tl.float32, bitcast=True)
        weight_ok = wmax <= tl.load(wmax_ptr).to(tl.float32)  # False for NaN; Inf > any finite bound
        halt_weight = (weight_ok == 0) & (halted == 0)
        halted = halted | halt_weight
        tl.store(wbits_ptr, 0)  # the next update's max starts from 0
        weight_flag = tl.where(halt_weight, 1.0, 0.0).to(tl.float64)
        wmax_rec = wmax.to(tl.float64)
    else:
        weight_flag = 0.0
        wmax_rec = -1.0
    skip_f = tl.where(halted, 1.0, 0.0).to(tl.float32)
    clipped = tl.where(loss > clip, clip, loss)

    # device state
    tl.store(count_ptr, count_new.to(count_ptr.dtype.element_ty))
    tl.store(halted_ptr, skip_f)
    tl.store(skip_ptr, skip_f)
    tl.store(acc_ptr + 0, tl.load(acc_ptr + 0) + tl.where(halt_nan, 0.0, loss))
    tl.store(acc_ptr + 1, tl.load(acc_ptr + 1) + tl.where(halt_nan, 0.0, norm))
    tl.store(acc_ptr + 2, tl.load(acc_ptr + 2) + tl.where(halt_nan, 0.0, 1.0))
    tl.store(acc_ptr + 3, tl.load(acc_ptr + 3) + skip_f)

    # host record: STEP first, fields, COMMIT last
    slot = step % ring_size
    slot = tl.where(slot < 0, slot + ring_size, slot)
    base = ring_ptr + slot * RECORD
    step_f = step.to(tl.float64)
    tl.store(base + 0, step_f)
    if SYS_FENCE:
        _sys_fence(count_new.to(tl.int32))
    tl.store(base + 1, tl.where(halt_nan, 1.0, 0.0).to(tl.float64))
    tl.store(base + 2, tl.where(halt_clip, 1.0, 0.0).to(tl.float64))
    tl.store(base + 3, tl.where(halt_collapse, 1.0, 0.0).to(tl.float64))
    tl.store(base + 4, clipped.to(tl.float64))
    tl.store(base + 5, loss.to(tl.float64))
    tl.store(base + 6, norm.to(tl.float64))
    tl.store(base + 7, skip_f.to(tl.float64))
    tl.store(base + 8, count_new.to(tl.float64))
    tl.store(base + 13, skip_f.to(tl.float64))
    tl.store(base + 16, weight_flag)
    tl.store(base + 17, wmax_rec)
    if SYS_FENCE:
        _sys_fence(count_new.to(tl.int32))
    tl.store(base + 15, step_f)


# ---------------------------------------------------------------------------------------------
# Launcher (a device_op: register_ops() registers it with torch.library for torch.compile, foxdqn/ops/library.py)
# ---------------------------------------------------------------------------------------------
def _launch(loss, grad_norm, step, loss_clip, collapse_threshold, warmup_steps, patience, collapse_count, acc,
            skip, halted, ring, weight_bits, max_weight) -> None:
    # One program, one warp: the guard is scalar code. Outputs are caller-owned buffers.
    check_weight = weight_bits is not None
    wrap_triton(_training_guard_kernel)[(1,)](
        loss, grad_norm, step, loss_clip, collapse_threshold, warmup_steps, patience,
        collapse_count, acc, skip, halted, ring,
        weight_bits if check_weight else skip, max_weight if check_weight else loss_clip,  # unread when off
        ring.shape[0],
        RECORD=R.RECORD_SIZE, SYS_FENCE=use_sys_fence(loss, _training_guard_kernel),
        CHECK_WEIGHT=check_weight, num_warps=1,
    )


# Two registered ops, one kernel: a custom op cannot declare an optional argument as mutated (the
# dispatcher drops trailing defaults), so the post-step weight check has an op of its own.
@device_op(
    "foxdqn::training_guard",
    mutates_args={"collapse_count", "acc", "skip", "halted", "ring"},
)
def _training_guard_op(
    loss: torch.Tensor, grad_norm: torch.Tensor, step: torch.Tensor, loss_clip: torch.Tensor,
    collapse_threshold: torch.Tensor, warmup_steps: torch.Tensor, patience: torch.Tensor,
    collapse_count: torch.Tensor, acc: torch.Tensor, skip: torch.Tensor, halted: torch.Tensor,
    ring: torch.Tensor,
) -> None:
    _launch(loss, grad_norm, step, loss_clip, collapse_threshold, warmup_steps, patience, collapse_count, acc,
            skip, halted, ring, None, None)


@device_op(
    "foxdqn::training_guard_weights",
    mutates_args={"collapse_count", "acc", "skip", "halted", "ring", "weight_bits"},
)
def _training_guard_weights_op(
    loss: torch.Tensor, grad_norm: torch.Tensor, step: torch.Tensor, loss_clip: torch.Tensor,
    collapse_threshold: torch.Tensor, warmup_steps: torch.Tensor, patience: torch.Tensor,
    collapse_count: torch.Tensor, acc: torch.Tensor, skip: torch.Tensor, halted: torch.Tensor,
    ring: torch.Tensor, weight_bits: torch.Tensor, max_weight: torch.Tensor,
) -> None:
    _launch(loss, grad_norm, step, loss_clip, collapse_threshold, warmup_steps, patience, collapse_count, acc,
            skip, halted, ring, weight_bits, max_weight)


# ---------------------------------------------------------------------------------------------
# Reference (plain torch; the CPU path)
# ---------------------------------------------------------------------------------------------
_GUARD_COLS = list(R.GUARD_FIELDS)


def training_guard_reference(
    loss, grad_norm, step, loss_clip, collapse_threshold, warmup_steps, patience,
    collapse_count, acc, skip, halted, ring, weight_bits=None, max_weight=None,
) -> None:
    """Plain-torch reference of :func:`training_guard` (same arguments, same in-place writes).

    Never synchronises when the ring lives on the same device as the inputs (CPU runs). When
    the inputs are on CUDA and the ring in host memory, the slot index is only known on the
    device, so the reference copies the record to the host (one blocking device-to-host copy):
    use the Triton op on CUDA.
    """
    loss = loss.to(torch.float32)
    norm = grad_norm.to(torch.float32)
    step = step.to(torch.int64)
    clip = loss_clip.to(torch.float32)
    inf = float("inf")
    loss_bad = torch.isnan(loss) | (loss.abs() == inf)
    norm_bad = torch.isnan(norm) | (norm.abs() == inf)
    halt_nan = loss_bad | norm_bad
    halt_clip = loss > clip
    collapsed = (step >= warmup_steps.to(torch.int64)) & (norm < collapse_threshold.to(torch.float32))
    count_new = torch.where(collapsed, collapse_count.to(torch.int64) + 1, torch.zeros_like(step))
    halt_collapse = collapsed & (count_new > patience.to(torch.int64))
    now_halted = (halted != 0) | halt_nan | halt_clip | halt_collapse
    if weight_bits is not None:
        wmax = weight_bits.view(torch.float32).clone()
        halt_weight = ~(wmax <= max_weight.to(torch.float32)) & ~now_halted
        now_halted = now_halted | halt_weight
        weight_bits.zero_()
        wmax_rec = wmax.to(torch.float64)
    else:
        halt_weight = torch.zeros_like(now_halted)
        wmax_rec = torch.full_like(loss, -1.0, dtype=torch.float64)
    skip_f = now_halted.to(torch.float32)
    clipped = torch.where(loss > clip, clip, loss)

    collapse_count.copy_(count_new)
    halted.copy_(skip_f)
    skip.copy_(skip_f)
    finite = ~(loss_bad | norm_bad)
    zero = torch.zeros_like(loss)
    acc.add_(torch.stack([torch.where(finite, loss, zero), torch.where(finite, norm, zero),
                          finite.to(torch.float32), skip_f]).to(acc.dtype))

    f64 = torch.float64
    values = torch.stack([  # in the order of R.GUARD_FIELDS
        step.to(f64), halt_nan.to(f64), halt_clip.to(f64), halt_collapse.to(f64), clipped.to(f64),
        loss.to(f64), norm.to(f64), skip_f.to(f64), count_new.to(f64), skip_f.to(f64), step.to(f64),
        halt_weight.to(f64), wmax_rec,
    ])
    R.write_record(ring, step, values, _GUARD_COLS)


# ---------------------------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------------------------
def _check_scalar(name: str, t, dtypes: tuple[torch.dtype, ...]) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != 0 or t.dtype not in dtypes:
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} must be a 0-d tensor of dtype {' or '.join(map(str, dtypes))}, got {got}")


def _check_guard_args(loss, grad_norm, step, loss_clip, collapse_threshold, warmup_steps, patience,
                      collapse_count, acc, skip, halted, ring, weight_bits=None, max_weight=None) -> None:
    f32, ints = (torch.float32,), (torch.int32, torch.int64)
    _check_scalar("loss", loss, f32)
    _check_scalar("grad_norm", grad_norm, f32)
    _check_scalar("step", step, (torch.int64,))
    _check_scalar("loss_clip", loss_clip, f32)
    _check_scalar("collapse_threshold", collapse_threshold, f32)
    _check_scalar("warmup_steps", warmup_steps, (torch.int64,))
    _check_scalar("patience", patience, (torch.int64,))
    _check_scalar("collapse_count", collapse_count, ints)
    _check_scalar("skip", skip, f32)
    _check_scalar("halted", halted, f32)
    if not isinstance(acc, torch.Tensor) or acc.shape != (4,) or acc.dtype != torch.float32 or not acc.is_contiguous():
        raise ValueError(f"acc must be a contiguous float32 tensor [4], got {getattr(acc, 'dtype', acc)} "
                         f"{tuple(getattr(acc, 'shape', ()))}")
    R.check_ring(ring)
    if (weight_bits is None) != (max_weight is None):
        raise ValueError("weight_bits and max_weight go together: pass both (post-step weight check) or neither")
    weights = ()
    if weight_bits is not None:
        _check_scalar("weight_bits", weight_bits, (torch.int32,))
        _check_scalar("max_weight", max_weight, f32)
        weights = (("weight_bits", weight_bits), ("max_weight", max_weight))
    dev = loss.device
    for name, t in (("grad_norm", grad_norm), ("step", step), ("loss_clip", loss_clip),
                    ("collapse_threshold", collapse_threshold), ("warmup_steps", warmup_steps),
                    ("patience", patience), ("collapse_count", collapse_count), ("acc", acc),
                    ("skip", skip), ("halted", halted), *weights):
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device} but loss is on {dev}: all guard tensors but "
                             "the ring must share one device")
    # (skipped while capturing: is_pinned queries the driver; the check ran at warm-up)
    if (dev.type == "cuda" and ring.device.type == "cpu"
            and not torch.cuda.is_current_stream_capturing() and not ring.is_pinned()):
        raise ValueError("ring must be in pinned host memory (record.new_ring) for a CUDA guard")


# Dynamo runs this op as an opaque call (a graph break): Inductor cannot treat the pinned host
# ring written from a CUDA kernel as a device argument. CUDA-graph capture is unaffected.
@compile_disabled
def training_guard(
    loss: torch.Tensor, grad_norm: torch.Tensor, step: torch.Tensor, loss_clip: torch.Tensor,
    collapse_threshold: torch.Tensor, warmup_steps: torch.Tensor, patience: torch.Tensor,
    collapse_count: torch.Tensor, acc: torch.Tensor, skip: torch.Tensor, halted: torch.Tensor,
    ring: torch.Tensor, weight_bits: Optional[torch.Tensor] = None, max_weight: Optional[torch.Tensor] = None,
    backend: str = "auto",
) -> None:
    """Check one training step on the device and record it in the host ring (one launch).

    Design: docs/design/guard.md#checks (with patience, latch and skip flag).
    The rules are in the module docstring.

    Args (all tensors on one device, except ``ring``):
        loss: float32 0-d, the training loss of this update.
        grad_norm: float32 0-d, the global gradient norm BEFORE clipping.
        step: int64 0-d, the update number (selects ring slot ``step mod R``).
        loss_clip: float32 0-d, loss above this halts (default in TrainingGuard: 1e6).
        collapse_threshold: float32 0-d, e.g. learning rate x multiplier; 0 disables.
        warmup_steps: int64 0-d, no collapse check while ``step < warmup_steps``.
        patience: int64 0-d (>= 0), collapse halts after more than this many consecutive
            collapsed steps.
        collapse_count: int32/int64 0-d, mutated: consecutive collapsed steps.
        acc: float32 [4], mutated: += [loss, grad_norm, 1, 0] for steps with both finite,
            and acc[3] += skip.
        skip: float32 0-d, written: 1.0 = skip this update (the Adam step's ``skip``).
        halted: float32 0-d, mutated: the halt latch.
        ring: float64 [R, 18] record ring (pinned host memory for CUDA inputs, or any tensor
            on the inputs' device); slot ``step mod R`` columns 0-8, 13, 15, 16, 17 written.
        weight_bits: int32 0-d or None, mutated (reset to 0): the post-step weight check's
            max |w| bits (:func:`foxdqn.ops.max_abs_bits.max_abs_bits` over the weights Adam's
            step would produce). None (with ``max_weight`` None): no weight check.
        max_weight: float32 0-d or None, the bound on |w| (strict: a weight at the bound passes).
        backend: "auto" (Triton for CUDA tensors, torch reference for CPU), "triton", "torch".

    Raises:
        ValueError: wrong dtype, shape or device of an argument, or an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    args = (loss, grad_norm, step, loss_clip, collapse_threshold, warmup_steps, patience,
            collapse_count, acc, skip, halted, ring, weight_bits, max_weight)
    _check_guard_args(*args)
    if resolve_backend("training_guard", backend, loss) == "torch":
        training_guard_reference(*args)
    elif weight_bits is None:
        _training_guard_op(*args[:12])
    else:
        _training_guard_weights_op(*args)
