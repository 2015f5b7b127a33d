"""route_exposure_to_factored: Triton kernel vs torch reference vs the spec's if-chain.

Integer outputs: exact equality everywhere, including NaN/Inf, ties at 1x/2x/1.5x/0.5x of the
medians, zero/negative/subnormal/huge medians.
"""
import itertools

import numpy as np
import pytest
import torch

from foxdqn.ops.library import register_ops
from foxdqn.ops.route_exposure_to_factored import (
    route_exposure_to_factored,
    route_exposure_to_factored_reference,
)

from support import capture_graph, no_host_sync

F32 = torch.float32
I64 = torch.int64
NAN, INF = float("nan"), float("inf")


def route_python(e: int, s: float, ms: float, v: float, mv: float) -> int:
    """The spec's if-chain on numpy float32 scalars (docs/environments.md#routing-rule)."""
    s, ms, v, mv = (np.float32(x) for x in (s, ms, v, mv))
    with np.errstate(over="ignore", invalid="ignore"):
        if ms <= 0:
            order = 0
        elif s < ms:
            order = 1
        elif s > np.float32(2.0) * ms:
            order = 0
        else:
            order = 2
        if mv <= 0:
            urg = 1
        elif v > np.float32(1.5) * mv:
            urg = 2
        elif v < np.float32(0.5) * mv:
            urg = 0
        else:
            urg = 1
    return int(e) * 9 + order * 3 + urg


def assert_equal_int(actual: torch.Tensor, expected: torch.Tensor, context=None):
    assert actual.dtype == expected.dtype == I64, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape
    bad = (actual.cpu() != expected.cpu()).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        extra = "" if context is None else f" inputs={[c[i].item() for c in context]}"
        raise AssertionError(f"{bad.numel()} mismatches, first at row {i}: "
                             f"{int(actual[i])} != {int(expected[i])}{extra}")


def f32(x):
    return torch.tensor(x, dtype=F32)


def _edge_values(median: float, factors: tuple[float, ...]) -> list[float]:
    """Values around the tie points factor*median, computed in float32 like the kernel."""
    m = f32(median)
    vals = [NAN, INF, -INF, 0.0, -0.0, -1.0, 1.0]
    for k in factors:
        t = m * k  # float32 product, as in the kernel
        vals += [t.item(), torch.nextafter(t, f32(INF)).item(), torch.nextafter(t, f32(-INF)).item()]
    return vals


MEDIANS = [NAN, -INF, -1.0, -0.0, 0.0, 1.4e-45, 1e-30, 0.3, 1.0, 3.3, 3.4e38, INF]


def _edge_grid(ms: float):
    """For each median volatility ``mv`` in MEDIANS: ``(mv, e, s, v)``, every spread around the tie
    points of ``ms`` crossed with every volatility around those of ``mv`` (CPU tensors)."""
    spreads = _edge_values(ms, (1.0, 2.0, 0.5, 3.0))
    for mv in MEDIANS:
        vols = _edge_values(mv, (1.5, 0.5, 1.0, 2.0))
        rows = list(itertools.product(spreads, vols))
        e = torch.arange(len(rows), dtype=I64) % 5
        yield mv, e, f32([r[0] for r in rows]), f32([r[1] for r in rows])


# ---------------------------------------------------------------------------------------------
# golden cases
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize(
    "e, s, ms, v, mv, expected",
    [
        (0, 0.5, 1.0, 1.0, 1.0, 0 * 9 + 1 * 3 + 1),   # limit-maker, normal
        (2, 0.5, 1.0, 2.0, 1.0, 2 * 9 + 1 * 3 + 2),   # limit-maker, aggressive
        (4, 3.0, 1.0, 0.1, 1.0, 4 * 9 + 0 * 3 + 0),   # market (wide), patient
        (1, 1.0, 1.0, 1.5, 1.0, 1 * 9 + 2 * 3 + 1),   # at median: IoC; at 1.5x: normal
        (3, 2.0, 1.0, 0.5, 1.0, 3 * 9 + 2 * 3 + 1),   # at 2x: IoC; at 0.5x: normal
        (3, 0.5, 0.0, 9.0, 0.0, 3 * 9 + 0 * 3 + 1),   # zero medians: market, normal
        (1, 0.5, -2.0, 9.0, -1.0, 1 * 9 + 0 * 3 + 1),  # negative medians: market, normal
        (2, 0.5, NAN, 9.0, NAN, 2 * 9 + 2 * 3 + 1),    # NaN medians: IoC, normal
        (2, NAN, 1.0, NAN, 1.0, 2 * 9 + 2 * 3 + 1),    # NaN values: IoC, normal
        (0, INF, 1.0, INF, 1.0, 0 * 9 + 0 * 3 + 2),    # +Inf values: market, aggressive
        (0, -INF, 1.0, -INF, 1.0, 0 * 9 + 1 * 3 + 0),  # -Inf values: limit-maker, patient
    ],
)
def test_golden(backend, e, s, ms, v, mv, expected):
    out = route_exposure_to_factored(torch.tensor([e]), f32([s]), f32(ms), f32([v]), f32(mv),
                                     backend=backend)
    assert out.tolist() == [expected]
    assert route_python(e, s, ms, v, mv) == expected


# ---------------------------------------------------------------------------------------------
# exhaustive grid of edge values
# ---------------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # 2 x 3.4e38 -> inf, intended
@pytest.mark.parametrize("ms", MEDIANS)
def test_edge_grid(ms):
    for mv, e, s, v in _edge_grid(ms):
        n = len(e)
        kern = route_exposure_to_factored(e, s, f32(ms), v, f32(mv), backend="triton")
        ref = route_exposure_to_factored_reference(e, s, f32(ms), v, f32(mv))
        py = torch.tensor([route_python(e[i], s[i].item(), ms, v[i].item(), mv) for i in range(n)])
        assert_equal_int(ref, py, context=(e, s, v))
        assert_equal_int(kern, ref, context=(e, s, v))


# ---------------------------------------------------------------------------------------------
# random rows, odd sizes
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("exp_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("n", [1, 7, 1023, 2053])
@pytest.mark.parametrize("ms, mv", [(1.0, 1.0), (0.37, 2.5), (0.0, 0.7), (NAN, -1.0)])
def test_random_rows(n, ms, mv, exp_dtype):
    g = torch.Generator().manual_seed(n)
    e = torch.randint(0, 5, (n,), generator=g).to(exp_dtype)
    # mix of continuous values and exact tie points
    s = torch.rand(n, generator=g) * 3 * abs(ms if ms == ms else 1.0)
    v = torch.rand(n, generator=g) * 2 * abs(mv)
    ties_s = f32(ms) * f32([1.0, 2.0, 0.5])
    ties_v = f32(mv) * f32([1.5, 0.5, 1.0])
    pick = torch.randint(0, 4, (n,), generator=g)
    s = torch.where(pick < 3, ties_s[pick.clamp(max=2)], s)
    v = torch.where(pick > 0, ties_v[(pick - 1).clamp(min=0)], v)
    kern = route_exposure_to_factored(e, s, f32(ms), v, f32(mv), backend="triton")
    ref = route_exposure_to_factored(e, s, f32(ms), v, f32(mv), backend="torch")
    assert_equal_int(kern, ref, context=(e, s, v))
    if n <= 7:
        py = torch.tensor([route_python(e[i], s[i].item(), ms, v[i].item(), mv) for i in range(n)])
        assert_equal_int(ref, py)
    assert ((kern >= 0) & (kern <= 44)).all()


def test_auto_backend_on_cpu_is_reference():
    e = torch.tensor([0, 1, 2, 3, 4])
    s, v = f32([0.1, 1.0, 1.5, 2.0, 2.5]), f32([0.1, 0.5, 1.0, 1.5, 2.0])
    assert torch.equal(route_exposure_to_factored(e, s, f32(1.0), v, f32(1.0)),
                       route_exposure_to_factored_reference(e, s, f32(1.0), v, f32(1.0)))


def test_out_of_range_exposure_agrees():
    # Not checked by the op (documented): kernel and reference apply the same formula.
    e = torch.tensor([-3, 5, 100, -1, 2**40])
    s, v = f32([0.5, 1.0, 3.0, NAN, 0.1]), f32([2.0, 1.0, 0.1, NAN, 1.2])
    kern = route_exposure_to_factored(e, s, f32(1.0), v, f32(1.0), backend="triton")
    ref = route_exposure_to_factored(e, s, f32(1.0), v, f32(1.0), backend="torch")
    assert_equal_int(kern, ref)
    assert kern[0].item() == -3 * 9 + 1 * 3 + 2


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_scalar_spread_volatility_broadcast(backend):
    e = torch.arange(11) % 5
    out = route_exposure_to_factored(e, f32(0.5), f32(1.0), f32(2.0), f32(1.0), backend=backend)
    assert torch.equal(out, e * 9 + 1 * 3 + 2)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_empty(backend):
    out = route_exposure_to_factored(torch.zeros(0, dtype=I64), torch.zeros(0), f32(1.0),
                                     torch.zeros(0), f32(1.0), backend=backend)
    assert out.shape == (0,) and out.dtype == I64


def test_strided_inputs():
    base = torch.rand(40)
    s, v = base[::2], base[1::2]  # non-contiguous views
    e = torch.arange(20) % 5
    kern = route_exposure_to_factored(e, s, f32(0.5), v, f32(0.5), backend="triton")
    ref = route_exposure_to_factored_reference(e, s, f32(0.5), v, f32(0.5))
    assert_equal_int(kern, ref)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(exposure=torch.zeros(3)), "exposure"),
        (dict(spread=torch.zeros(4)), "spread"),
        (dict(volatility=torch.zeros(3, dtype=torch.float64)), "volatility"),
        (dict(median_spread=torch.zeros(1)), "median_spread"),
        (dict(backend="cuda"), "backend"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = dict(exposure=torch.zeros(3, dtype=I64), spread=torch.zeros(3), median_spread=f32(1.0),
                volatility=torch.zeros(3), median_volatility=f32(1.0))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        route_exposure_to_factored(**args)


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------
def _cuda_inputs(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    e = torch.randint(0, 5, (n,), generator=g)
    s = torch.rand(n, generator=g) * 3
    v = torch.rand(n, generator=g) * 2
    s[: min(n, 6)] = f32([NAN, INF, -INF, 1.0, 2.0, 0.5])[: min(n, 6)]
    v[: min(n, 6)] = f32([NAN, INF, -INF, 1.5, 0.5, 1.0])[: min(n, 6)]
    return [t.cuda() for t in (e, s, f32(1.0), v, f32(1.0))]


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 7, 1023, 1 << 20])
def test_gpu_matches_reference(n):
    args = _cuda_inputs(n)
    kern = route_exposure_to_factored(*args)  # auto -> triton on CUDA
    ref_gpu = route_exposure_to_factored(*args, backend="torch")
    ref_cpu = route_exposure_to_factored_reference(*[a.cpu() for a in args])
    assert_equal_int(kern, ref_gpu)
    assert_equal_int(kern.cpu(), ref_cpu)


@pytest.mark.gpu
@pytest.mark.parametrize("ms", MEDIANS)
def test_gpu_edge_grid(ms):
    for mv, e, s, v in _edge_grid(ms):
        ref = route_exposure_to_factored_reference(e, s, f32(ms), v, f32(mv))
        kern = route_exposure_to_factored(e.cuda(), s.cuda(), f32(ms).cuda(), v.cuda(), f32(mv).cuda())
        assert_equal_int(kern.cpu(), ref, context=(e, s, v))


@pytest.mark.gpu
def test_gpu_cuda_graph_and_no_sync():
    n = 4099
    e, s, ms, v, mv = _cuda_inputs(n, seed=1)
    route_exposure_to_factored(e, s, ms, v, mv)  # compile outside capture
    torch.cuda.synchronize()
    graph, out = capture_graph(lambda: route_exposure_to_factored(e, s, ms, v, mv), warmup=1)
    for seed in range(2, 5):
        e2, s2, ms2, v2, mv2 = _cuda_inputs(n, seed=seed)
        ms2.fill_(0.3 * seed)
        for dst, src in ((e, e2), (s, s2), (ms, ms2), (v, v2), (mv, mv2)):
            dst.copy_(src)
        with no_host_sync():
            graph.replay()
            eager = route_exposure_to_factored(e, s, ms, v, mv)
        torch.cuda.synchronize()
        ref = route_exposure_to_factored_reference(*[t.cpu() for t in (e, s, ms, v, mv)])
        assert_equal_int(out.cpu(), ref)
        assert_equal_int(eager.cpu(), ref)


@pytest.mark.gpu
def test_gpu_torch_compile():
    register_ops()  # torch.library registration, made for torch.compile / opcheck only
    args = _cuda_inputs(1023, seed=7)
    compiled = torch.compile(route_exposure_to_factored)
    out = compiled(*args)
    ref = route_exposure_to_factored_reference(*[a.cpu() for a in args])
    assert_equal_int(out.cpu(), ref)
