"""tests/fast_interpreter.py's reduction on whole slices gives what Triton's per-element loop gives, bit
for bit: foxdqn/ops/argmax.py's tile_argmax (its one user) on NaN, ±inf, ±0 and ties, along a tile's
rows and over a vector."""
import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("the interpreter's reduction (CPU sessions only)", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter as I  # noqa: E402

from foxdqn.ops.argmax import argmax_combine, tile_argmax  # noqa: E402


@triton.jit
def _tile_kernel(x_ptr, v_ptr, i_ptr, R: tl.constexpr, C: tl.constexpr, A: tl.constexpr):
    r = tl.arange(0, R)
    c = tl.arange(0, C)
    v = tl.load(x_ptr + r[:, None] * C + c[None, :])
    val, idx = tile_argmax(v, c, (c[None, :] < A) & (r[:, None] >= 0), A)
    tl.store(v_ptr + r, val)
    tl.store(i_ptr + r, idx)


@triton.jit
def _vector_kernel(x_ptr, v_ptr, i_ptr, C: tl.constexpr):
    c = tl.arange(0, C)
    val, idx = tl.reduce((tl.load(x_ptr + c), c), 0, argmax_combine)
    tl.store(v_ptr, val)
    tl.store(i_ptr, idx)


def _argmaxes(x: torch.Tensor) -> list[torch.Tensor]:
    rows, cols = x.shape
    out = []
    for valid in (cols, cols - 3):  # every column, and the last three left out
        v, i = torch.empty(rows), torch.empty(rows, dtype=torch.int32)
        _tile_kernel[(1,)](x, v, i, rows, cols, valid)
        out += [v, i]
    for row in (1, 3):
        v, i = torch.empty(1), torch.empty(1, dtype=torch.int32)
        _vector_kernel[(1,)](x[row].contiguous(), v, i, cols)
        out += [v, i]
    return [t.view(torch.int32) if t.is_floating_point() else t for t in out]


def test_the_reduction_on_slices_equals_tritons_loop(monkeypatch):
    fast = I.ReduceOps.generic_reduce
    if not hasattr(fast, "triton"):
        pytest.skip("fast_interpreter did not replace this Triton's generic_reduce")
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-2, 3, (16, 16), generator=g).float()  # many ties
    for value, p in ((float("nan"), 0.1), (float("inf"), 0.05), (float("-inf"), 0.05), (-0.0, 0.1)):
        x[torch.rand(x.shape, generator=g) < p] = value
    x[0] = float("nan")
    x[2] = -0.0
    x[3:5] = 1.0
    x[3, -1] = 5.0  # the maximum in the last column
    x[4, -1] = float("nan")  # the only NaN there
    got = _argmaxes(x)
    monkeypatch.setattr(I.ReduceOps, "generic_reduce", fast.triton)
    want = _argmaxes(x)
    assert len(got) == len(want) == 8
    for a, b in zip(got, want):
        assert torch.equal(a, b), (a, b)
    assert got[1][3] == 15 and got[1][4] == 15 and got[-1] == 15
