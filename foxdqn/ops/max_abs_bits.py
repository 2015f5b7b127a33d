"""Largest |x| of a flat float32 tensor, as the bit pattern of a float32, max-accumulated on the device.

Design: docs/design/guard.md#after-the-step (the post-step weight check). Per call, with ``x``
float32 ``[N]`` contiguous (N >= 0) and ``out`` int32 0-d:

* ``out = max(out, max_i bits(|x_i|))`` where ``bits(|v|)`` is the IEEE-754 bit pattern of ``v``
  with the sign bit cleared, read as an int32.

For non-negative floats the order of these integers is the order of the values, and it extends
past them: ``+Inf`` (0x7F800000) is above every finite value and every NaN (0x7F800001 and up)
is above ``+Inf``. So ``out`` read back as a float32 (``out.view(torch.float32)``) is the largest
|x_i| when all entries are finite, ``+Inf`` when some entry is infinite and none NaN, and a NaN
when some entry is NaN: one integer max gives the finiteness check and the magnitude bound
together (``not (as_float(out) <= bound)`` is "some entry is non-finite or above ``bound``").

An integer max is exact and independent of the order of reduction: the Triton kernel (many
programs, one ``atomic_max`` each) and the torch reference give the same bits. ``out`` is
accumulated, not overwritten: the caller sets it to 0 before the first call (the training guard
resets it after reading it, :func:`foxdqn.ops.training_guard.training_guard`). An empty ``x``
leaves ``out`` unchanged.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from foxdqn.ops.backend import resolve_backend
from foxdqn.ops.library import device_op, wrap_triton

_BLOCK = 2048  # elements per program per loop turn
_MAX_PROGRAMS = 264  # at most this many programs (one atomic each); they loop over the rest


# ---------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def _max_abs_bits_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.int32)
    for start in range(pid * BLOCK, n, nprog * BLOCK):
        idx = start + offs
        x = tl.load(x_ptr + idx, mask=idx < n, other=0.0)
        acc = tl.maximum(acc, x.to(tl.int32, bitcast=True) & 0x7FFFFFFF)
    tl.atomic_max(out_ptr, tl.max(acc, axis=0))


# ---------------------------------------------------------------------------------------------
# Launcher (a device_op: register_ops() registers it with torch.library for torch.compile, foxdqn/ops/library.py)
# ---------------------------------------------------------------------------------------------
def _grid(n: int) -> int:
    return max(1, min(triton.cdiv(n, _BLOCK), _MAX_PROGRAMS))


@device_op("foxdqn::max_abs_bits", mutates_args={"out"})
def _max_abs_bits_op(x: torch.Tensor, out: torch.Tensor) -> None:
    n = x.shape[0]
    wrap_triton(_max_abs_bits_kernel)[(_grid(n),)](x, out, n, BLOCK=_BLOCK, num_warps=8)


# ---------------------------------------------------------------------------------------------
# Reference (plain torch; the CPU path)
# ---------------------------------------------------------------------------------------------
def max_abs_bits_reference(x: torch.Tensor, out: torch.Tensor) -> None:
    """Plain-torch reference of :func:`max_abs_bits` (same arguments, same in-place write).
    Device ops only (no sync; capturable)."""
    if x.numel() == 0:
        return
    bits = torch.bitwise_and(x.view(torch.int32), 0x7FFFFFFF).amax()
    torch.maximum(out, bits, out=out)


# ---------------------------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------------------------
def _check_args(x, out) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 1 or x.dtype != torch.float32 or not x.is_contiguous():
        raise ValueError(f"x must be a contiguous float32 tensor [N], got "
                         f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
    if not isinstance(out, torch.Tensor) or out.dim() != 0 or out.dtype != torch.int32:
        raise ValueError(f"out must be a 0-d int32 tensor, got {getattr(out, 'dtype', type(out).__name__)} "
                         f"{tuple(getattr(out, 'shape', ()))}")
    if out.device != x.device:
        raise ValueError(f"out is on {out.device} but x is on {x.device}")
    if x.numel() >= 2**31:
        raise ValueError(f"x has {x.numel()} entries; at most 2**31 - 1 are supported")


def max_abs_bits(x: torch.Tensor, out: torch.Tensor, backend: str = "auto") -> None:
    """``out = max(out, bits(max |x|))`` on the device (rules in the module docstring). No sync.

    Args:
        x: float32 ``[N]``, contiguous (e.g. a flat buffer that the weights are views of).
        out: int32 0-d on x's device, mutated: the running max of the sign-cleared bit patterns.
            Read it as a float with ``out.view(torch.float32)``.
        backend: "auto" (Triton for CUDA tensors, torch for CPU), "triton", "torch".

    Raises:
        ValueError: wrong dtype, shape, layout or device of an argument, or an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check_args(x, out)
    if resolve_backend("max_abs_bits", backend, x) == "torch":
        max_abs_bits_reference(x, out)
    elif x.numel() > 0:
        _max_abs_bits_op(x, out)
