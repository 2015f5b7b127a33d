"""foxdqn.ops.tensor_list.fma (the multi-tensor ops' fused multiply-add, TRITON_INTERPRET=1 on CPU)
against the exactly rounded a·b + c (Python fractions): random values over many exponents; the cases
where float64 then float32 rounds twice to another float than one rounding (the sum lands on a float32
midpoint); signed zeros; inf and NaN inputs; subnormal results. On CUDA it is ``tl.fma``
(``fma.rn.f32``); the interpreter's own ``tl.fma`` rounds twice before Triton 3.9."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from foxdqn.ops import backend as B
from foxdqn.ops.tensor_list import fma

pytestmark = pytest.mark.skipif(not B.INTERPRET, reason="the interpreter's fma (CPU suite)")


@triton.jit
def _fma_kernel(a_ptr, b_ptr, c_ptr, out_ptr, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    tl.store(out_ptr + i, fma(tl.load(a_ptr + i, mask=m), tl.load(b_ptr + i, mask=m), tl.load(c_ptr + i, mask=m)),
             mask=m)


def _kernel(a, b, c):
    out = torch.empty_like(a)
    _fma_kernel[(triton.cdiv(a.numel(), 64),)](a, b, c, out, a.numel(), BLOCK=64)
    return out


def _exact(a, b, c):
    """a·b + c rounded once to float32 (round to nearest even), from the exact rational value."""
    out = []
    for x, y, z in zip(a.tolist(), b.tolist(), c.tolist()):
        v = Fraction(x) * Fraction(y) + Fraction(z)
        lo = np.float32(float(v))  # a float32 within an ulp of v: pick the nearest of it and its neighbours
        cands = {lo, np.nextafter(lo, np.float32(np.inf)), np.nextafter(lo, np.float32(-np.inf))}
        best = min(cands, key=lambda f: (abs(Fraction(float(f)) - v), int(np.float32(f).view(np.int32)) & 1))
        out.append(float(best))
    return torch.tensor(out, dtype=torch.float32)


def _midpoint_cases():
    """(a, b, 1.0) where a·b = 2^-24 + δ with 0 < δ < 2^-54: 1 + a·b lies just above the midpoint
    of 1 and 1 + 2^-23, and its float64 sum is that midpoint (which float32 rounds down to 1)."""
    t, found = Fraction(2) ** -24, []
    for i in range(2000, 6000):
        a = np.float32(1 + i * 2.0 ** -23)
        b0 = np.float32(2.0 ** -24 / float(a))
        for b in (np.nextafter(b0, np.float32(0)), b0, np.nextafter(b0, np.float32(1))):
            if 0 < Fraction(float(a)) * Fraction(float(b)) - t < Fraction(2) ** -54:
                found.append((float(a), float(b)))
    return found


def test_random_values_round_once():
    g = torch.Generator().manual_seed(0)
    n = 4000
    a = torch.randn(n, generator=g) * torch.exp2(torch.randint(-20, 20, (n,), generator=g).float())
    b = torch.randn(n, generator=g) * torch.exp2(torch.randint(-20, 20, (n,), generator=g).float())
    c = torch.randn(n, generator=g) * torch.exp2(torch.randint(-40, 40, (n,), generator=g).float())
    c[::3] = -(a[::3] * b[::3])  # near cancellation: the exact value is a·b's rounding error
    assert torch.equal(_kernel(a, b, c), _exact(a, b, c))


def test_where_float64_rounds_twice_to_another_float():
    cases = _midpoint_cases()
    assert len(cases) >= 20
    a = torch.tensor([x for x, _ in cases])
    b = torch.tensor([y for _, y in cases])
    c = torch.ones(len(cases))
    twice = (a.double() * b.double() + c.double()).float()
    assert torch.equal(twice, torch.ones(len(cases)))  # the naive path: down to 1
    got = _kernel(a, b, c)
    assert torch.equal(got, _exact(a, b, c)) and torch.equal(got, torch.full_like(c, 1 + 2.0 ** -23))
    assert torch.equal(_kernel(-a, b, -c), -got)  # and the mirror image, below zero


def test_zeros_inf_nan_and_subnormals():
    inf, nan, tiny = float("inf"), float("nan"), 2.0 ** -140
    a = torch.tensor([-0.0, 0.0, inf, 1.0, nan, 2.0, inf, 2.0 ** -70, 1.5])
    b = torch.tensor([1.0, -1.0, 1.0, 1.0, 1.0, 3.0, 0.0, 2.0 ** -70, tiny])
    c = torch.tensor([-0.0, -0.0, 1.0, -inf, 1.0, nan, 1.0, 0.0, tiny])
    got = _kernel(a, b, c)
    want = torch.tensor([-0.0, -0.0, inf, -inf, nan, nan, nan, 2.0 ** -140, 2.5 * tiny])
    assert torch.equal(got.isnan(), want.isnan())
    ok = ~want.isnan()
    assert torch.equal(got[ok], want[ok]) and torch.equal(got[ok].signbit(), want[ok].signbit())
