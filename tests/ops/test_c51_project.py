"""Tests of foxdqn.ops.c51_project (Bellemare et al. 2017, Algorithm 1).

CPU: the Triton kernel runs under TRITON_INTERPRET=1 (set in tests/conftest.py) and is checked
against hand-computed projections, the torch reference and an independent naive loop.
GPU (`gpu` marker): CUDA kernel vs reference, CUDA graph capture + replay, sync debug mode,
torch.compile, bitwise determinism.
"""
from __future__ import annotations

import math

import pytest
import torch

from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.c51_project import (
    _c51_project_launch,
    _launch_config,
    c51_project,
    c51_project_reference,
    support_table,
)
from foxdqn.ops.library import register_ops

from support import assert_close_nan, capture_graph, no_host_sync, require_compiled_kernels

NAN = float("nan")
INF = float("inf")

_gpu_tests_need_compiled_kernels = require_compiled_kernels(INTERPRET)


def naive_project(p, r, d, v_min, v_max):
    """Independent scalar loop in float64 (Algorithm 1 with the l == u fix), lists in and out."""
    num_rows, k = len(p), len(p[0])
    dz = (v_max - v_min) / (k - 1)
    out = [[0.0] * k for _ in range(num_rows)]
    for row in range(num_rows):
        for j in range(k):
            tz = min(max(r[row] + d[row] * (v_min + j * dz), v_min), v_max)
            b = min(max((tz - v_min) / dz, 0.0), k - 1.0)
            lo, hi = math.floor(b), math.ceil(b)
            if lo == hi:
                out[row][lo] += p[row][j]
            else:
                out[row][lo] += p[row][j] * (hi - b)
                out[row][hi] += p[row][j] * (b - lo)
    return out


def _t(x):
    return torch.tensor(x, dtype=torch.float32)


U32 = 2.0**-24  # unit roundoff of float32 (half an ulp of 1)


def f32_error_bound(p, r, d, v_min, v_max):
    """Per-row bound on |float32 projection - exact projection| for every output atom, (B,) float64.

    First-order rounding analysis of the float32 steps (u = 2^-24, V = max(|v_min|, |v_max|),
    dz = (v_max - v_min) / (K - 1); inputs p, r, d are exact, they are the same float32 values):
      z_j = fl(fl(j * fl(dz)) + fl(v_min))          error <= 6 u V
      Tz_j = fl(r + fl(d * z_j)), then the clip     error <= u (|r| + 8 |d| V + V)
      fl(Tz_j - fl(v_min))                          error <= u (|r| + 8 |d| V + 4 V)
      b_j = fl(that * fl(1 / dz))                   error <= u (|r| + 8 |d| V + 4 V) / dz + 2 u (K - 1)
    The hat weight max(0, 1 - |b_j - i|) is 1-Lipschitz in b_j, so output atom i moves by at most
    sum_j |p_j| * err(b_j); computing the weights and products adds <= 2 u |p_j| per term and the
    sum of <= K terms <= (K - 1) u sum_j |p_j|. The bound is that total, doubled to cover the
    second-order terms. A terminal row (all b_j equal) is where it is nearly attained: the whole
    row mass sits on two atoms and moves with b_j, whose float32 ulp near atom K - 1 is
    2^-23 (K - 1) (3.6e-5 at K = 300).
    """
    k = p.shape[1]
    big_v = max(abs(v_min), abs(v_max))
    dz = (v_max - v_min) / (k - 1)
    r, d = r.double().abs(), d.double().abs()
    b_err = U32 * ((r + 8 * d * big_v + 4 * big_v) / dz + 2 * (k - 1))
    return 2 * p.double().abs().sum(1) * (b_err + U32 * (k + 1))


def assert_within_f32_bound(out, p, r, d, v_min, v_max):
    """Kernel output (float32 inputs) vs the reference run in float64 on the same values."""
    exact = c51_project_reference(p.double(), r.double(), d.double(), v_min, v_max)
    err = (out.double() - exact).abs().amax(1)  # (B,) worst atom per row
    bound = f32_error_bound(p, r, d, v_min, v_max)
    worst = int((err / bound).argmax())
    assert (err <= bound).all(), f"row {worst}: error {float(err[worst]):.3g} > bound {float(bound[worst]):.3g}"


# ------------------------------------------------------------------------------ golden cases
# (K, v_min, v_max, next_probs row, reward, discount, expected row), all written by hand.
GOLDEN = [
    # support [-1, 0, 1]; r=0.5, d=1: Tz = [-0.5, 0.5, 1.5 -> 1], b = [0.5, 1.5, 2]
    # j0: 0.2 -> 0.1 / 0.1 on atoms 0/1; j1: 0.3 -> 0.15 / 0.15 on atoms 1/2; j2: 0.5 on atom 2
    pytest.param(3, -1.0, 1.0, [0.2, 0.3, 0.5], 0.5, 1.0, [0.1, 0.25, 0.65], id="k3_r0.5_d1"),
    # terminal (d=0): every Tz_j = r = 0.25, b = 1.25 -> 0.75 on atom 1, 0.25 on atom 2
    pytest.param(3, -1.0, 1.0, [0.2, 0.3, 0.5], 0.25, 0.0, [0.0, 0.75, 0.25], id="k3_done_between"),
    # terminal with r exactly on atom 1 (z_1 = 0): all mass on that atom
    pytest.param(3, -1.0, 1.0, [0.2, 0.3, 0.5], 0.0, 0.0, [0.0, 1.0, 0.0], id="k3_done_on_atom"),
    # identity: r=0, d=1 -> every b_j exactly on atom j (l == u)
    pytest.param(3, -1.0, 1.0, [0.2, 0.3, 0.5], 0.0, 1.0, [0.2, 0.3, 0.5], id="k3_identity"),
    # r=1, d=0.5: Tz = [0.5, 1, 1.5 -> 1], b = [1.5, 2, 2]: 0.1/0.1 on atoms 1/2, then 0.3 + 0.5 on atom 2
    pytest.param(3, -1.0, 1.0, [0.2, 0.3, 0.5], 1.0, 0.5, [0.0, 0.1, 0.9], id="k3_half_on_atom"),
    # r far above v_max / far below v_min: all mass on the end atom
    pytest.param(3, -1.0, 1.0, [0.2, 0.3, 0.5], 100.0, 0.99, [0.0, 0.0, 1.0], id="k3_far_above"),
    pytest.param(3, -1.0, 1.0, [0.2, 0.3, 0.5], -100.0, 0.99, [1.0, 0.0, 0.0], id="k3_far_below"),
    # K=5, support [0, 2.5, 5, 7.5, 10]; r=1, d=0.9: Tz = [1, 3.25, 5.5, 7.75, 10],
    # b = [0.4, 1.3, 2.2, 3.1, 4.0]:
    # j0 0.1 -> 0.06/0.04 (atoms 0/1); j1 0.2 -> 0.14/0.06 (1/2); j2 0.3 -> 0.24/0.06 (2/3);
    # j3 0.2 -> 0.18/0.02 (3/4); j4 0.2 -> 0.2 (4)
    pytest.param(5, 0.0, 10.0, [0.1, 0.2, 0.3, 0.2, 0.2], 1.0, 0.9, [0.06, 0.18, 0.30, 0.24, 0.22], id="k5"),
    # K=2 support [-1, 1]: r=0.5, d=0: b = 0.75 -> 0.25 / 0.75
    pytest.param(2, -1.0, 1.0, [0.4, 0.6], 0.5, 0.0, [0.25, 0.75], id="k2_done"),
    # unnormalised row (sum 0.7): mass conserved, r=0.5 d=1 as in the first case
    pytest.param(3, -1.0, 1.0, [0.1, 0.2, 0.4], 0.5, 1.0, [0.05, 0.15, 0.5], id="k3_sum0.7"),
]


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("k,v_min,v_max,p,r,d,expected", GOLDEN)
def test_golden(backend, k, v_min, v_max, p, r, d, expected):
    assert len(p) == k == len(expected)
    out = c51_project(_t([p]), _t([r]), _t([d]), v_min, v_max, backend=backend)
    assert out.dtype == torch.float32 and out.shape == (1, k)
    torch.testing.assert_close(out, _t([expected]), atol=1e-6, rtol=0)
    # the independent loop agrees with the hand-written vector too
    torch.testing.assert_close(_t(naive_project([p], [r], [d], v_min, v_max)), _t([expected]), atol=1e-6, rtol=0)


def test_golden_batched_rows_are_independent():
    # all golden K=3 rows in one batch: each row projected on its own
    rows = [g.values for g in GOLDEN if g.values[0] == 3]
    p = _t([g[3] for g in rows])
    r = _t([g[4] for g in rows])
    d = _t([g[5] for g in rows])
    expected = _t([g[6] for g in rows])
    torch.testing.assert_close(c51_project(p, r, d, -1.0, 1.0, backend="triton"), expected, atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------ random vs reference
def _random_case(num_rows: int, k: int, seed: int, normalised: bool = True):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_rows, k, generator=g) * 2
    p = torch.softmax(logits, dim=1)
    if not normalised:
        p = p * torch.rand(num_rows, 1, generator=g) * 2
    r = torch.randn(num_rows, generator=g) * 6  # many rows clip at v_min/v_max = -10/10
    d = torch.rand(num_rows, generator=g)
    d[::5] = 0.0  # terminal transitions
    d[1::7] = 1.0
    r[2::11] = 0.0  # r = 0, d = 1: b on atoms
    return p, r, d


@pytest.mark.parametrize("normalised", [True, False])
@pytest.mark.parametrize("k", [2, 51, 101])
@pytest.mark.parametrize("num_rows", [1, 7, 1023])
def test_kernel_matches_reference(num_rows, k, normalised):
    p, r, d = _random_case(num_rows, k, seed=num_rows * 1000 + k, normalised=normalised)
    out = c51_project(p, r, d, -10.0, 10.0, backend="triton")
    ref = c51_project_reference(p, r, d, -10.0, 10.0)
    assert_close_nan(out, ref, atol=2e-6, rtol=1e-5)
    # mass conservation: rows sum to the input row sums
    torch.testing.assert_close(out.sum(1), p.sum(1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ref.sum(1), p.sum(1), atol=1e-5, rtol=1e-5)
    assert (out >= 0).all()


@pytest.mark.parametrize(
    "k,blocks",
    [
        (51, None),  # the CUDA tiling (several j chunks), run by the interpreter
        (101, (4, 32, 16)),  # several i chunks and j chunks, partial last chunk
        (7, (2, 4, 2)),
        (2, (8, 2, 2)),
    ],
)
def test_chunked_tiling_matches_reference(k, blocks):
    num_rows = 37
    p, r, d = _random_case(num_rows, k, seed=7 + k)
    if blocks is None:
        blocks = _launch_config(num_rows, k, interpret=False)
    out = _c51_project_launch(p, r, d, -10.0, 10.0, blocks=blocks)
    assert_close_nan(out, c51_project_reference(p, r, d, -10.0, 10.0), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("k", [2, 3, 7, 11])
def test_against_naive_loop(k):
    p, r, d = _random_case(9, k, seed=k, normalised=False)
    v_min, v_max = -3.0, 5.0
    expected = _t(naive_project(p.tolist(), r.tolist(), d.tolist(), v_min, v_max))
    torch.testing.assert_close(c51_project(p, r, d, v_min, v_max, backend="triton"), expected, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(c51_project_reference(p, r, d, v_min, v_max), expected, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("k", [51, 300])
def test_terminal_rows_match_reference_tightly(k):
    # d = 0: every b_j of a row is the same point, so a one-ulp difference in b_j between kernel and
    # reference would move the whole row mass (2^-23 (K - 1) = 3.6e-5 at K = 300). Both compute
    # b_j = fl(fl(Tz_j - v_min) * fl(1 / dz)), so they agree to summation order only.
    num_rows = 64
    g = torch.Generator().manual_seed(k)
    p = torch.softmax(torch.randn(num_rows, k, generator=g) * 2, dim=1)
    r = (torch.rand(num_rows, generator=g) * 2 - 1) * 10.0  # inside [v_min, v_max]
    d = torch.zeros(num_rows)
    out = c51_project(p, r, d, -10.0, 10.0, backend="triton")
    assert_close_nan(out, c51_project_reference(p, r, d, -10.0, 10.0), atol=2e-6, rtol=1e-5)
    assert_within_f32_bound(out, p, r, d, -10.0, 10.0)


@pytest.mark.parametrize("k", [2, 51, 300])
def test_float32_error_vs_float64_within_bound(k):
    # the kernel's float32 result is within the derived float32 rounding bound of exact (float64)
    p, r, d = _random_case(97, k, seed=11 * k, normalised=False)
    out = c51_project(p, r, d, -10.0, 10.0, backend="triton")
    assert_within_f32_bound(out, p, r, d, -10.0, 10.0)


def test_strided_rows():
    # a (B, K) view with a row stride larger than K (e.g. a slice of per-action probabilities)
    p_full, r, d = _random_case(13, 51 * 3, seed=3)
    p = p_full[:, 51:102]
    assert p.stride(0) == 153
    out = c51_project(p, r, d, -10.0, 10.0, backend="triton")
    assert_close_nan(out, c51_project_reference(p.contiguous(), r, d, -10.0, 10.0), atol=2e-6, rtol=1e-5)


def test_empty_batch():
    p = torch.empty(0, 51)
    out = c51_project(p, torch.empty(0), torch.empty(0), -10.0, 10.0, backend="triton")
    assert out.shape == (0, 51)


# ------------------------------------------------------------------------------ NaN / Inf
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy (interpreter) warns on inf - inf
def test_nan_inf_rows():
    # Rule: a row is all-NaN iff some p_j is NaN/Inf or some unclipped Tz_j = r + d z_j is NaN.
    k = 5  # support [-2, -1, 0, 1, 2]: z_2 = 0
    p = torch.full((9, k), 0.2)
    r = torch.zeros(9)
    d = torch.full((9,), 0.9)
    p[0, 1] = NAN  # NaN probability
    p[1, 4] = INF  # Inf probability
    r[2] = NAN  # NaN reward
    d[3] = NAN  # NaN discount
    d[4] = INF  # Inf * z_2 (= 0) -> NaN
    r[5] = INF  # +Inf reward: clipped, all mass on v_max
    r[6] = -INF  # -Inf reward: all mass on v_min
    r[7], d[7] = INF, -INF  # Inf + (-Inf * z_j) for z_j > 0 -> NaN
    # row 8 stays finite
    expected_nan_rows = torch.tensor([True, True, True, True, True, False, False, True, False])
    out = c51_project(p, r, d, -2.0, 2.0, backend="triton")
    ref = c51_project_reference(p, r, d, -2.0, 2.0)
    assert_close_nan(out, ref, atol=1e-6, rtol=1e-6)
    assert torch.equal(torch.isnan(out).all(1), expected_nan_rows)
    assert torch.equal(torch.isnan(out).any(1), expected_nan_rows)
    torch.testing.assert_close(out[5], _t([0, 0, 0, 0, 1.0]))
    torch.testing.assert_close(out[6], _t([1.0, 0, 0, 0, 0]))


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("backend", ["auto", "triton", "torch"])
def test_errors(backend):
    p = torch.full((2, 3), 1 / 3)
    r, d = torch.zeros(2), torch.ones(2)
    with pytest.raises(ValueError, match="num_atoms"):
        c51_project(torch.ones(2, 1), r, d, -1.0, 1.0, backend=backend)
    with pytest.raises(ValueError, match="v_min"):
        c51_project(p, r, d, 1.0, 1.0, backend=backend)
    with pytest.raises(ValueError, match="v_max"):
        c51_project(p, r, d, 2.0, -1.0, backend=backend)
    with pytest.raises(ValueError, match="finite"):
        c51_project(p, r, d, -INF, 1.0, backend=backend)
    with pytest.raises(ValueError, match="rewards"):
        c51_project(p, torch.zeros(3), d, -1.0, 1.0, backend=backend)
    with pytest.raises(ValueError, match="next_probs"):
        c51_project(torch.ones(3), r, d, -1.0, 1.0, backend=backend)


def test_bad_backend_and_dtype():
    p = torch.full((2, 3), 1 / 3)
    r, d = torch.zeros(2), torch.ones(2)
    with pytest.raises(ValueError, match="backend"):
        c51_project(p, r, d, -1.0, 1.0, backend="cuda")
    with pytest.raises(ValueError, match="float32"):
        c51_project(p.double(), r, d, -1.0, 1.0, backend="triton")


# ------------------------------------------------------------------------------ GPU
GPU_SHAPES = [(1, 51), (7, 2), (1023, 51), (256, 101), (4096, 256), (300, 300)]


@pytest.mark.gpu
@pytest.mark.parametrize("num_rows,k", GPU_SHAPES)
def test_gpu_matches_reference(num_rows, k):
    p, r, d = (x.cuda() for x in _random_case(num_rows, k, seed=k))
    out = c51_project(p, r, d, -10.0, 10.0)  # auto -> Triton on CUDA
    ref = c51_project_reference(p, r, d, -10.0, 10.0)
    # The kernel rounds z_j, Tz_j and b_j exactly like the reference's separate torch ops (no FMA
    # contraction, reciprocal multiply): only the summation order differs (atomic scatter_add_ in
    # the reference), so the tolerance is far below one ulp of b_j (3.6e-5 at K = 300).
    assert_close_nan(out, ref, atol=2e-6, rtol=1e-5)
    # and both are within the float32 rounding bound of exact arithmetic
    assert_within_f32_bound(out, p, r, d, -10.0, 10.0)
    torch.testing.assert_close(out.sum(1), p.sum(1), atol=1e-5, rtol=1e-5)
    # deterministic: no atomics
    assert torch.equal(out, c51_project(p, r, d, -10.0, 10.0))


@pytest.mark.gpu
@pytest.mark.parametrize("k,v_min,v_max,p,r,d,expected", GOLDEN)
def test_gpu_golden(k, v_min, v_max, p, r, d, expected):
    out = c51_project(_t([p]).cuda(), _t([r]).cuda(), _t([d]).cuda(), v_min, v_max)
    torch.testing.assert_close(out.cpu(), _t([expected]), atol=1e-6, rtol=0)


@pytest.mark.gpu
def test_gpu_nan_rows():
    p = torch.full((3, 5), 0.2)
    r = torch.tensor([NAN, 0.0, INF])
    d = torch.tensor([0.9, 0.9, 0.9])
    p[1, 0] = NAN
    out = c51_project(p.cuda(), r.cuda(), d.cuda(), -2.0, 2.0)
    assert_close_nan(out, c51_project_reference(p, r, d, -2.0, 2.0))


@pytest.mark.gpu
def test_gpu_cuda_graph_capture_and_replay():
    num_rows, k = 256, 51
    p, r, d = (x.cuda() for x in _random_case(num_rows, k, seed=1))
    graph, out = capture_graph(lambda: c51_project(p, r, d, -10.0, 10.0), warmup=3)
    for seed in (2, 3):
        p2, r2, d2 = (x.cuda() for x in _random_case(num_rows, k, seed=seed))
        p.copy_(p2)
        r.copy_(r2)
        d.copy_(d2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, c51_project(p2, r2, d2, -10.0, 10.0))
        assert_close_nan(out, c51_project_reference(p2, r2, d2, -10.0, 10.0), atol=2e-5, rtol=1e-5)


@pytest.mark.gpu
def test_gpu_no_host_sync():
    p, r, d = (x.cuda() for x in _random_case(512, 51, seed=4))
    c51_project(p, r, d, -10.0, 10.0)  # warm-up: kernel compilation outside the check
    torch.cuda.synchronize()
    with no_host_sync():
        for _ in range(3):
            out = c51_project(p, r, d, -10.0, 10.0)
    assert_close_nan(out, c51_project_reference(p, r, d, -10.0, 10.0), atol=2e-5, rtol=1e-5)


@pytest.mark.gpu
def test_gpu_torch_compile():
    register_ops()  # torch.library registration, made for torch.compile / opcheck only
    p, r, d = (x.cuda() for x in _random_case(129, 51, seed=5))

    def fn(p, r, d):
        return c51_project(p, r, d, -10.0, 10.0) * 2.0

    compiled = torch.compile(fn, fullgraph=True)
    assert_close_nan(compiled(p, r, d), fn(p, r, d), atol=1e-6, rtol=1e-6)

    # Bounds as arguments: the second call recompiles with them symbolic (automatic dynamic), and
    # Inductor passes Python-float kernel arguments as fp64 (the kernel casts them to fp32).
    def fn_bounds(p, r, d, v_min, v_max):
        return c51_project(p, r, d, v_min, v_max)

    compiled_bounds = torch.compile(fn_bounds, fullgraph=True)
    for v_min, v_max in ((-10.0, 10.0), (-5.0, 7.5), (-3.0, 3.0)):
        assert_close_nan(
            compiled_bounds(p, r, d, v_min, v_max), c51_project(p, r, d, v_min, v_max), atol=1e-6, rtol=1e-6
        )


# ------------------------------------------------------------------------------ a support per group of rows
GROUP_BOUNDS = [(-3.3, 7.1), (-10.0, 10.0), (-0.7, 0.3)]  # -3.3, 7.1, -0.7, 0.3: not float32 values


def _group_bounds(per_group, dtype=torch.float64):
    lo = torch.tensor([b[0] for b in per_group], dtype=dtype)
    hi = torch.tensor([b[1] for b in per_group], dtype=dtype)
    return lo, hi


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("k", [2, 11, 51])
def test_grouped_rows_equal_the_scalar_projection_of_their_group(backend, k):
    """[G] bounds: group g's rows get bit for bit what the float bounds of group g give (the
    population's member p equals a population of one), and no group reads another's support."""
    rows_per_group = 13
    p, r, d = _random_case(rows_per_group * len(GROUP_BOUNDS), k, seed=k)
    lo, hi = _group_bounds(GROUP_BOUNDS)
    out = c51_project(p, r, d, lo, hi, backend=backend)
    for g, (v_min, v_max) in enumerate(GROUP_BOUNDS):
        rows = slice(g * rows_per_group, (g + 1) * rows_per_group)
        alone = c51_project(p[rows], r[rows], d[rows], v_min, v_max, backend=backend)
        assert torch.equal(out[rows], alone), g
        assert torch.equal(c51_project(p[rows], r[rows], d[rows], lo[g:g + 1], hi[g:g + 1], backend=backend), alone)
    # the groups' supports differ: projecting every row on group 0's support gives other rows
    assert not torch.equal(out, c51_project(p, r, d, *GROUP_BOUNDS[0], backend=backend))


@pytest.mark.parametrize("blocks", [None, (4, 16, 8), (2, 64, 64)])
def test_grouped_kernel_matches_reference(blocks):
    """Blocks of rows that span two groups (BLOCK_B not dividing B/G) still read each row's own support."""
    k, per = 51, 7
    p, r, d = _random_case(per * len(GROUP_BOUNDS), k, seed=5, normalised=False)
    lo, hi = _group_bounds(GROUP_BOUNDS)
    out = _c51_project_launch(p, r, d, 0.0, 1.0, blocks=blocks, table=support_table(lo, hi, k))
    assert_close_nan(out, c51_project_reference(p, r, d, lo, hi), atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(out.sum(1), p.sum(1), atol=1e-5, rtol=1e-5)


def test_support_table_is_the_scalar_paths_rounding():
    lo, hi = _group_bounds(GROUP_BOUNDS)
    table = support_table(lo, hi, 51)
    assert table.dtype == torch.float32 and table.shape == (3, 4)
    for g, (v_min, v_max) in enumerate(GROUP_BOUNDS):
        want = torch.tensor([v_min, v_max, (v_max - v_min) / 50, 50 / (v_max - v_min)], dtype=torch.float32)
        assert torch.equal(table[g], want)


@pytest.mark.parametrize("backend", ["auto", "triton", "torch"])
def test_grouped_errors(backend):
    p = torch.full((4, 3), 1 / 3)
    r, d = torch.zeros(4), torch.ones(4)
    lo, hi = torch.tensor([-1.0, -2.0]), torch.tensor([1.0, 2.0])
    with pytest.raises(ValueError, match="G dividing B=4"):
        c51_project(p, r, d, torch.tensor([-1.0, -1.0, -1.0]), torch.tensor([1.0, 1.0, 1.0]), backend=backend)
    with pytest.raises(ValueError, match="must both be floats"):
        c51_project(p, r, d, lo, 1.0, backend=backend)
    with pytest.raises(ValueError, match="must both be floats"):
        c51_project(p, r, d, lo.long(), hi.long(), backend=backend)
    with pytest.raises(ValueError, match="num_atoms"):
        c51_project(torch.ones(4, 1), r, d, lo, hi, backend=backend)


@pytest.mark.gpu
def test_gpu_grouped_matches_reference_and_capture():
    k, per = 51, 256
    p, r, d = (x.cuda() for x in _random_case(per * len(GROUP_BOUNDS), k, seed=9))
    lo, hi = (x.cuda() for x in _group_bounds(GROUP_BOUNDS))
    out = c51_project(p, r, d, lo, hi)
    assert_close_nan(out, c51_project_reference(p, r, d, lo, hi), atol=2e-6, rtol=1e-5)
    for g, (v_min, v_max) in enumerate(GROUP_BOUNDS):
        rows = slice(g * per, (g + 1) * per)
        assert torch.equal(out[rows], c51_project(p[rows], r[rows], d[rows], v_min, v_max))
    graph, captured = capture_graph(lambda: c51_project(p, r, d, lo, hi), warmup=3)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, out)
