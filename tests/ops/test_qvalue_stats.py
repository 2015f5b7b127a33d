"""qvalue_stats: Triton kernel vs torch reference, golden values, ring records, CUDA graphs (GPU).
QValueMonitor and its records shared with the guard: tests/guard/test_q_monitor.py."""
import pytest
import torch

from foxdqn.device import ring_record as R
from foxdqn.guard.q_monitor import QValueMonitor
from foxdqn.ops.qvalue_stats import qvalue_stats, qvalue_stats_reference

from support import assert_close_report, capture_graph, no_host_sync

F32, I64 = torch.float32, torch.int64
# NaN/Inf inputs are the point of several tests; numpy (the interpreter) warns about them.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
NAN, INF = float("nan"), float("inf")


def run_both(q, step, ring_size=5, threshold=1e4, acc0=None):
    """Run kernel and reference on fresh state; return (ring, acc) for each."""
    out = {}
    for backend in ("triton", "torch"):
        ring = R.new_ring(ring_size, pin_memory=False)
        acc = torch.zeros(2) if acc0 is None else acc0.clone()
        qvalue_stats(q, torch.tensor(step), acc, ring, torch.tensor(threshold, dtype=F32), backend=backend)
        out[backend] = (ring, acc)
    return out["triton"], out["torch"]


def compare(kern, ref, q):
    (ring_k, acc_k), (ring_r, acc_r) = kern, ref
    # Exact: everything except the float sums (Q_MEAN and acc[0]).
    cols = [c for c in range(R.RECORD_SIZE) if c != R.Q_MEAN]
    assert_close_report(ring_k[:, cols], ring_r[:, cols], name="ring (exact columns)")
    scale = q.double().abs().nan_to_num(posinf=0.0).mean().item() + 1e-30
    assert_close_report(ring_k[:, R.Q_MEAN], ring_r[:, R.Q_MEAN], rtol=1e-12, atol=1e-12 * scale, name="Q_MEAN")
    rowmax_scale = q.double().amax(1).abs().nan_to_num(posinf=0.0).sum().item() + 1e-30
    assert_close_report(acc_k, acc_r, rtol=1e-6, atol=1e-6 * rowmax_scale, name="acc")


def _special(q, kind, g):
    q = q.clone()
    if kind == "none":
        return q
    n = q.numel()
    idx = torch.randint(0, n, (max(1, n // 50),), generator=g)
    vals = {"nan": [NAN], "+inf": [INF], "-inf": [-INF], "mixed": [NAN, INF, -INF]}[kind]
    flat = q.view(-1)
    for j, i in enumerate(idx.tolist()):
        flat[i] = vals[j % len(vals)]
    return q


# ---------------------------------------------------------------------------------------------
# kernel vs reference
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("special", ["none", "nan", "+inf", "-inf", "mixed"])
@pytest.mark.parametrize("A", [1, 5, 45])
@pytest.mark.parametrize("B", [1, 7, 1023])
def test_matches_reference(B, A, special):
    g = torch.Generator().manual_seed(B * 100 + A)
    q = torch.randn(B, A, generator=g) * 50 + 3
    q = _special(q, special, g)
    kern, ref = run_both(q, step=13)
    compare(kern, ref, q)
    ring = kern[0]
    assert ring[13 % 5, R.Q_STEP] == 13
    assert ring[13 % 5, R.Q_DIVERGENCE] == (0.0 if special == "none" else 1.0)
    # the guard columns are untouched
    assert ring[13 % 5, R.STEP] == -1 and ring[13 % 5, R.COMMIT] == -1


@pytest.mark.parametrize("scale", [1.0, 1e3, 1e5])
def test_values_above_threshold_diverge(scale):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(64, 9, generator=g) * scale
    kern, ref = run_both(q, step=2)
    compare(kern, ref, q)
    expected = float(q.abs().max() > 1e4)
    assert kern[0][2, R.Q_DIVERGENCE].item() == expected


def test_golden_values():
    q = torch.tensor([[1.0, 2.0, -3.0], [4.0, 0.5, 0.0]])
    for backend in ("triton", "torch"):
        ring = R.new_ring(4, pin_memory=False)
        acc = torch.zeros(2)
        qvalue_stats(q, torch.tensor(6), acc, ring, torch.tensor(1e4), backend=backend)
        rec = ring[2]
        assert rec[R.Q_STEP] == 6
        assert rec[R.Q_MIN] == -3.0 and rec[R.Q_MAX] == 4.0
        assert rec[R.Q_MEAN].item() == pytest.approx(4.5 / 6, rel=1e-15)
        assert rec[R.Q_DIVERGENCE] == 0.0
        assert acc.tolist() == [6.0, 2.0]  # max per row: 2 + 4; two samples


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize(
    "values, threshold, diverged",
    [
        ([1e4, -5.0], 1e4, 0.0),                 # |max| exactly at the threshold: no
        ([-1e4, 5.0], 1e4, 0.0),                 # |min| exactly at the threshold: no
        ([10000.001, 0.0], 1e4, 1.0),            # just above (float32 10000.0009765625)
        ([-10000.001, 0.0], 1e4, 1.0),
        ([3.0, 4.0], NAN, 0.0),                  # NaN threshold: magnitude test never trips
        ([3.0, INF], NAN, 1.0),                  # ... but non-finite entries still do
        ([3e38, -3e38], INF, 0.0),               # infinite threshold, finite values
        ([-INF, 0.0], INF, 1.0),
        ([0.0, 0.0], 0.0, 0.0),                  # |0| > 0 is false
        ([0.0, 1e-45], 0.0, 1.0),
    ],
)
def test_threshold_edges(backend, values, threshold, diverged):
    q = torch.tensor([values], dtype=F32)
    ring = R.new_ring(2, pin_memory=False)
    qvalue_stats(q, torch.tensor(1), torch.zeros(2), ring, torch.tensor(threshold, dtype=F32), backend=backend)
    assert ring[1, R.Q_DIVERGENCE].item() == diverged


def test_nan_entries_make_min_max_nan():
    q = torch.tensor([[1.0, NAN], [INF, -2.0]])
    kern, ref = run_both(q, step=0)
    compare(kern, ref, q)
    rec = kern[0][0]
    assert torch.isnan(rec[R.Q_MIN]) and torch.isnan(rec[R.Q_MAX]) and torch.isnan(rec[R.Q_MEAN])
    assert torch.isnan(kern[1][0])  # row 0's max is NaN -> the accumulated sum is NaN
    assert kern[1][1] == 2.0


def test_inf_entries_are_values():
    q = torch.tensor([[1.0, INF], [-INF, -2.0]])
    kern, ref = run_both(q, step=0)
    compare(kern, ref, q)
    rec = kern[0][0]
    assert rec[R.Q_MIN] == -INF and rec[R.Q_MAX] == INF and torch.isnan(rec[R.Q_MEAN])
    assert rec[R.Q_DIVERGENCE] == 1.0


@pytest.mark.parametrize("step", [-1, 0, 4, 5, 123456789])
def test_slot_is_python_modulo(step):
    q = torch.randn(3, 4)
    kern, ref = run_both(q, step=step, ring_size=5)
    compare(kern, ref, q)
    assert kern[0][step % 5, R.Q_STEP] == step


def test_non_contiguous_q():
    g = torch.Generator().manual_seed(11)
    q = (torch.randn(9, 37, generator=g) * 7).t()  # [37, 9], strides (1, 37)
    assert not q.is_contiguous()
    kern, ref = run_both(q, step=3)
    compare(kern, ref, q)
    assert_close_report(kern[0], run_both(q.contiguous(), step=3)[0][0], rtol=1e-15, name="strided vs contiguous")


def test_accumulates_over_calls():
    g = torch.Generator().manual_seed(5)
    acc_k, acc_r = torch.zeros(2), torch.zeros(2)
    ring_k, ring_r = R.new_ring(3, pin_memory=False), R.new_ring(3, pin_memory=False)
    total, count = 0.0, 0
    for step, b in enumerate([1, 7, 30, 2]):
        q = torch.randn(b, 6, generator=g)
        thr = torch.tensor(1e4)
        qvalue_stats(q, torch.tensor(step), acc_k, ring_k, thr, backend="triton")
        qvalue_stats_reference(q, torch.tensor(step), acc_r, ring_r, thr)
        total += q.double().amax(1).sum().item()
        count += b
        assert_close_report(acc_k, acc_r, rtol=1e-6, atol=1e-6, name=f"acc after step {step}")
    assert acc_k[1].item() == count
    assert acc_k[0].item() == pytest.approx(total, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(q=torch.zeros(3)), "q must"),
        (dict(q=torch.zeros(0, 4)), "q must"),
        (dict(q=torch.zeros(3, 4, dtype=torch.float64)), "q must"),
        (dict(step=torch.tensor(1.0)), "step"),
        (dict(acc=torch.zeros(3)), "acc"),
        (dict(ring=torch.zeros(4, 15, dtype=torch.float64)), "ring"),
        (dict(threshold=torch.tensor(1, dtype=I64)), "threshold"),
        (dict(backend="cpu"), "backend"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = dict(q=torch.zeros(3, 4), step=torch.tensor(0), acc=torch.zeros(2),
                ring=R.new_ring(2, pin_memory=False), threshold=torch.tensor(1e4))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        qvalue_stats(**args)


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("special", ["none", "mixed"])
@pytest.mark.parametrize("B, A", [(1, 1), (7, 5), (1023, 45), (8192, 64), (256, 45)])
def test_gpu_matches_reference(B, A, special):
    g = torch.Generator().manual_seed(B + A)
    q = _special(torch.randn(B, A, generator=g) * 50, special, g)
    ring = R.new_ring(5)  # pinned (CUDA is available)
    assert ring.is_pinned()
    acc = torch.zeros(2, device="cuda")
    qvalue_stats(q.cuda(), torch.tensor(7, device="cuda"), acc, ring, torch.tensor(1e4, device="cuda"))
    torch.cuda.synchronize()
    ring_r, acc_r = R.new_ring(5, pin_memory=False), torch.zeros(2)
    qvalue_stats_reference(q, torch.tensor(7), acc_r, ring_r, torch.tensor(1e4))
    compare((ring, acc), (ring_r, acc_r), q)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_writes_pinned_ring_without_sync():
    B, A, R_SIZE = 256, 45, 8
    dev = torch.device("cuda")
    ring = R.new_ring(R_SIZE)
    mon = QValueMonitor(ring, dev, threshold=1e4)
    q = torch.randn(B, A, device=dev)
    step = torch.zeros((), dtype=I64, device=dev)

    def body():
        mon.update(q, step)
        step.add_(1)

    graph, _ = capture_graph(body, warmup=1)  # warm-up (compiles the kernel) at step 0
    torch.cuda.synchronize()
    mon.reset()
    ring_r, acc_r = R.new_ring(R_SIZE, pin_memory=False), torch.zeros(2)
    qvalue_stats_reference(q.cpu(), torch.tensor(0), torch.zeros(2), ring_r, torch.tensor(1e4))
    g = torch.Generator().manual_seed(0)
    for i in range(1, 12):
        q_host = torch.randn(B, A, generator=g) * (10.0 ** (i % 6))  # diverges at large scales
        q.copy_(q_host)
        with no_host_sync():
            graph.replay()
        torch.cuda.synchronize()
        qvalue_stats_reference(q_host, torch.tensor(i), acc_r, ring_r, torch.tensor(1e4))
        compare((ring, mon.acc), (ring_r, acc_r), q_host)
        assert ring[i % R_SIZE, R.Q_STEP] == i


@pytest.mark.gpu
def test_gpu_eager_no_sync():
    dev = torch.device("cuda")
    ring = R.new_ring(4)
    q, step = torch.randn(64, 5, device=dev), torch.tensor(3, device=dev)
    acc, thr = torch.zeros(2, device=dev), torch.tensor(1e4, device=dev)
    qvalue_stats(q, step, acc, ring, thr)  # compile first
    torch.cuda.synchronize()
    with no_host_sync():
        for _ in range(3):
            qvalue_stats(q, step, acc, ring, thr)
    torch.cuda.synchronize()
    assert acc[1].item() == 4 * 64
