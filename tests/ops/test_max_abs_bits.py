"""max_abs_bits: Triton kernel (TRITON_INTERPRET=1 on CPU) vs torch reference vs numpy, bit for bit;
odd sizes, NaN / Inf / -0 / subnormals, the bound read back exactly, accumulation; GPU: CUDA graph."""
import numpy as np
import pytest
import torch

from foxdqn.ops import backend as B
from foxdqn.ops.max_abs_bits import _BLOCK, _MAX_PROGRAMS, max_abs_bits, max_abs_bits_reference

from support import capture_graph, no_host_sync, require_compiled_kernels

_need_compiled = require_compiled_kernels(B.INTERPRET)

NAN, INF = float("nan"), float("inf")
I32 = torch.int32


def numpy_bits(x: torch.Tensor) -> int:
    """The rule, stated with numpy: max over sign-cleared float32 bit patterns (0 when empty)."""
    a = x.detach().cpu().numpy().astype(np.float32).view(np.int32) & np.int32(0x7FFFFFFF)
    return int(a.max()) if a.size else 0


def run(x, backend, start=0):
    out = torch.tensor(start, dtype=I32, device=x.device)
    max_abs_bits(x, out, backend=backend)
    return int(out.cpu())


def as_float(bits: int) -> float:
    return float(torch.tensor(bits, dtype=I32).view(torch.float32))


SIZES = [0, 1, 2, 7, 63, _BLOCK - 1, _BLOCK, _BLOCK + 1, 3 * _BLOCK + 5,
         _BLOCK * _MAX_PROGRAMS + 17]  # the last one makes programs loop


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("special", [None, NAN, INF, -INF, -NAN])
def test_kernel_equals_reference_and_rule(n, special):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * 3
    if special is not None and n:
        x[(n * 7) // 11] = special
    expect = numpy_bits(x)
    assert run(x, "torch") == expect
    assert run(x, "triton") == expect


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_values_read_back(backend):
    assert as_float(run(torch.tensor([1.0, -7.25, 3.0]), backend)) == 7.25  # the sign is dropped
    assert as_float(run(torch.tensor([-0.0, 0.0]), backend)) == 0.0
    assert as_float(run(torch.tensor([1e-45, -1e-44]), backend)) == pytest.approx(1e-44, rel=0.2)  # subnormals order
    assert as_float(run(torch.tensor([3.4e38, -INF]), backend)) == INF  # Inf above every finite value
    assert np.isnan(as_float(run(torch.tensor([INF, 1.0, NAN]), backend)))  # NaN above Inf
    assert np.isnan(as_float(run(torch.tensor([-NAN]), backend)))


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_exactly_at_a_bound_reads_back_as_the_bound(backend):
    """The guard compares max|w| <= bound as floats: |w| == bound must read back exactly."""
    bound = torch.tensor(100.0)
    just_above = torch.nextafter(bound, torch.tensor(INF))
    assert as_float(run(torch.tensor([-100.0, 5.0]), backend)) <= float(bound)
    assert as_float(run(torch.tensor([float(just_above), 5.0]), backend)) > float(bound)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_out_is_max_accumulated_and_empty_leaves_it(backend):
    big = int(torch.tensor(50.0).view(I32))
    assert run(torch.tensor([1.0, 2.0]), backend, start=big) == big  # out already larger: stays
    assert as_float(run(torch.tensor([1.0, 2.0]), backend, start=int(torch.tensor(1.5).view(I32)))) == 2.0
    assert run(torch.zeros(0), backend, start=big) == big
    out = torch.zeros((), dtype=I32)
    for chunk in (torch.tensor([1.0]), torch.tensor([-4.0, 2.0]), torch.tensor([3.0])):  # many tensors, one out
        max_abs_bits(chunk, out, backend=backend)
    assert as_float(int(out)) == 4.0


def test_a_view_of_a_flat_buffer():
    flat = torch.zeros(200)
    flat[130:133] = torch.tensor([1.0, -9.0, 2.0])
    for backend in ("triton", "torch"):
        assert as_float(run(flat, backend)) == 9.0
        assert as_float(run(flat[64:128], backend)) == 0.0  # an offset view


@pytest.mark.parametrize(
    "x, out, match",
    [
        (torch.zeros(2, 2), torch.zeros((), dtype=I32), "x must be"),
        (torch.zeros(4, dtype=torch.float64), torch.zeros((), dtype=I32), "x must be"),
        (torch.zeros(8)[::2], torch.zeros((), dtype=I32), "x must be"),
        (torch.zeros(4), torch.zeros((), dtype=torch.int64), "out must be"),
        (torch.zeros(4), torch.zeros(1, dtype=I32), "out must be"),
    ],
)
def test_bad_arguments(x, out, match):
    with pytest.raises(ValueError, match=match):
        max_abs_bits(x, out)


def test_reference_has_the_same_signature():
    import inspect

    from foxdqn.ops.max_abs_bits import _max_abs_bits_op  # noqa: F401 - registered op

    ref = list(inspect.signature(max_abs_bits_reference).parameters)
    assert ref == list(inspect.signature(max_abs_bits).parameters)[:-1] == ["x", "out"]


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("special", [None, NAN, INF])
def test_gpu_matches_reference(n, special):
    x = torch.randn(n, device="cuda") * 3
    if special is not None and n:
        x[n // 2] = special
    assert run(x, "auto") == run(x.cpu(), "torch") == numpy_bits(x)


@pytest.mark.gpu
def test_gpu_graph_replay_without_sync():
    x = torch.randn(100_003, device="cuda")
    out = torch.zeros((), dtype=I32, device="cuda")

    def body():
        out.zero_()
        max_abs_bits(x, out)

    graph, _ = capture_graph(body, warmup=2)
    for value in (5.0, INF, NAN, -123.5):
        x[77_777] = value
        torch.cuda.synchronize()
        with no_host_sync():
            graph.replay()
        torch.cuda.synchronize()
        assert int(out) == numpy_bits(x)
