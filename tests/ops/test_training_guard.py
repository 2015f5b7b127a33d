"""training_guard: Triton kernel vs torch reference vs a pure-Python model of the rules; the op in
CUDA graphs and torch.compile (GPU). TrainingGuard and HostRingReader: tests/guard/."""

import numpy as np
import pytest
import torch

from foxdqn.device import ring_record as R
from foxdqn.guard.host import TrainingGuard
from foxdqn.ops.library import register_ops
from foxdqn.ops.training_guard import training_guard, training_guard_reference

from support import assert_close_report, capture_graph, no_host_sync

F32, I64 = torch.float32, torch.int64
NAN, INF = float("nan"), float("inf")
STATE_KEYS = ("collapse_count", "acc", "skip", "halted", "ring")


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def new_state(count_dtype=I64, ring_size=8, device="cpu", pin=False):
    return dict(
        collapse_count=torch.zeros((), dtype=count_dtype, device=device),
        acc=torch.zeros(4, dtype=F32, device=device),
        skip=torch.zeros((), dtype=F32, device=device),
        halted=torch.zeros((), dtype=F32, device=device),
        ring=R.new_ring(ring_size, pin_memory=pin),
    )


def new_params(loss_clip=1e6, threshold=0.0, warmup=0, patience=0, device="cpu"):
    return dict(
        loss_clip=torch.tensor(loss_clip, dtype=F32, device=device),
        collapse_threshold=torch.tensor(threshold, dtype=F32, device=device),
        warmup_steps=torch.tensor(warmup, dtype=I64, device=device),
        patience=torch.tensor(patience, dtype=I64, device=device),
    )


def call(backend, state, params, loss, norm, step, device="cpu"):
    training_guard(torch.tensor(loss, dtype=F32, device=device), torch.tensor(norm, dtype=F32, device=device),
                   torch.tensor(step, dtype=I64, device=device), **params, **state, backend=backend)


def assert_state_equal(a, b, where=""):
    for k in STATE_KEYS:
        assert a[k].dtype == b[k].dtype, (k, a[k].dtype, b[k].dtype)
        assert_close_report(a[k], b[k], name=f"{k} {where}")


class Model:
    """Pure-Python statement of the guard rules (module docstring of training_guard)."""

    def __init__(self, loss_clip, threshold, warmup, patience):
        self.clip, self.thr = np.float32(loss_clip), np.float32(threshold)
        self.warmup, self.patience = warmup, patience
        self.count, self.halted = 0, False
        self.acc = np.zeros(4, dtype=np.float32)

    def step(self, loss, norm, step):
        loss, norm = np.float32(loss), np.float32(norm)
        with np.errstate(invalid="ignore"):
            halt_nan = not (np.isfinite(loss) and np.isfinite(norm))
            halt_clip = bool(loss > self.clip)
            collapsed = step >= self.warmup and bool(norm < self.thr)
        self.count = self.count + 1 if collapsed else 0
        halt_collapse = collapsed and self.count > self.patience
        self.halted = self.halted or halt_nan or halt_clip or halt_collapse
        if not halt_nan:
            self.acc[0] += loss
            self.acc[1] += norm
            self.acc[2] += np.float32(1)
        self.acc[3] += np.float32(self.halted)
        clipped = self.clip if loss > self.clip else loss
        return dict(halt_nan=halt_nan, halt_clip=halt_clip, halt_collapse=halt_collapse,
                    count=self.count, halted=self.halted, clipped=float(clipped),
                    loss=float(loss), norm=float(norm))

    def check(self, state, out, step):
        assert int(state["collapse_count"]) == self.count
        assert float(state["halted"]) == float(self.halted) == float(state["skip"])
        assert_close_report(state["acc"], torch.from_numpy(self.acc.copy()), name="acc vs model")
        rec = state["ring"][step % state["ring"].shape[0]].cpu()
        expect = {R.STEP: step, R.HALT_NAN: out["halt_nan"], R.HALT_LOSS_CLIP: out["halt_clip"],
                  R.HALT_GRAD_COLLAPSE: out["halt_collapse"], R.CLIPPED_LOSS: out["clipped"],
                  R.RAW_LOSS: out["loss"], R.RAW_GRAD_NORM: out["norm"], R.SKIP: out["halted"],
                  R.COLLAPSE_COUNT: out["count"], R.HALTED: out["halted"], R.COMMIT: step}
        cols = list(expect)
        assert_close_report(rec[cols], torch.tensor([float(expect[c]) for c in cols], dtype=torch.float64),
                            name=f"record of step {step} vs model")


# ---------------------------------------------------------------------------------------------
# single-step flag table (kernel == reference == golden)
# ---------------------------------------------------------------------------------------------
# (loss, norm, step, clip, thr, warmup, patience, count0, halted0) -> (nan, clip, collapse, count, skip)
CASES = {
    "normal": ((1.0, 1.0, 10, 1e6, 0.1, 0, 0, 0, 0.0), (0, 0, 0, 0, 0)),
    "nan_loss": ((NAN, 1.0, 10, 1e6, 0.1, 0, 0, 0, 0.0), (1, 0, 0, 0, 1)),
    "+inf_loss": ((INF, 1.0, 10, 1e6, 0.1, 0, 0, 0, 0.0), (1, 1, 0, 0, 1)),
    "-inf_loss": ((-INF, 1.0, 10, 1e6, 0.1, 0, 0, 0, 0.0), (1, 0, 0, 0, 1)),
    "nan_norm_resets_count": ((1.0, NAN, 10, 1e6, 0.1, 0, 5, 3, 0.0), (1, 0, 0, 0, 1)),
    "+inf_norm": ((1.0, INF, 10, 1e6, 0.1, 0, 0, 0, 0.0), (1, 0, 0, 0, 1)),
    "-inf_norm_is_also_collapsed": ((1.0, -INF, 10, 1e6, 0.1, 0, 0, 0, 0.0), (1, 0, 1, 1, 1)),
    "loss_at_clip": ((1e6, 1.0, 10, 1e6, 0.1, 0, 0, 0, 0.0), (0, 0, 0, 0, 0)),
    "loss_above_clip": ((1000000.0625, 1.0, 10, 1e6, 0.1, 0, 0, 0, 0.0), (0, 1, 0, 0, 1)),
    "negative_huge_loss": ((-1e30, 1.0, 10, 1e6, 0.1, 0, 0, 0, 0.0), (0, 0, 0, 0, 0)),
    "norm_at_threshold": ((1.0, 0.1, 10, 1e6, 0.1, 0, 0, 4, 0.0), (0, 0, 0, 0, 0)),
    "collapse_patience0": ((1.0, 0.05, 10, 1e6, 0.1, 0, 0, 0, 0.0), (0, 0, 1, 1, 1)),
    "collapse_within_patience": ((1.0, 0.05, 10, 1e6, 0.1, 0, 2, 1, 0.0), (0, 0, 0, 2, 0)),
    "collapse_exceeds_patience": ((1.0, 0.05, 10, 1e6, 0.1, 0, 2, 2, 0.0), (0, 0, 1, 3, 1)),
    "warmup_last_step": ((1.0, 0.05, 9, 1e6, 0.1, 10, 0, 7, 0.0), (0, 0, 0, 0, 0)),
    "warmup_first_checked": ((1.0, 0.05, 10, 1e6, 0.1, 10, 0, 0, 0.0), (0, 0, 1, 1, 1)),
    "threshold_zero_disables": ((1.0, 0.0, 10, 1e6, 0.0, 0, 0, 0, 0.0), (0, 0, 0, 0, 0)),
    "nan_and_clip_and_collapse": ((INF, -INF, 10, 1e6, 0.1, 0, 0, 0, 0.0), (1, 1, 1, 1, 1)),
    "clip_and_collapse": ((2e6, 0.01, 10, 1e6, 0.1, 0, 0, 0, 0.0), (0, 1, 1, 1, 1)),
    "latched_skips_good_step": ((1.0, 1.0, 10, 1e6, 0.1, 0, 0, 0, 1.0), (0, 0, 0, 0, 1)),
    "nan_clip_threshold": ((5.0, 1.0, 10, NAN, 0.1, 0, 0, 0, 0.0), (0, 0, 0, 0, 0)),
}


@pytest.mark.parametrize("count_dtype", [I64, torch.int32])
@pytest.mark.parametrize("case", list(CASES))
def test_flag_table(case, count_dtype):
    (loss, norm, step, clip, thr, warmup, pat, count0, halted0), (nan, clipf, col, count, skip) = CASES[case]
    states = {}
    for backend in ("triton", "torch"):
        st = new_state(count_dtype)
        st["collapse_count"].fill_(count0)
        st["halted"].fill_(halted0)
        call(backend, st, new_params(clip, thr, warmup, pat), loss, norm, step)
        states[backend] = st
    assert_state_equal(states["triton"], states["torch"], case)
    st = states["triton"]
    rec = st["ring"][step % 8]
    assert (rec[R.HALT_NAN].item(), rec[R.HALT_LOSS_CLIP].item(), rec[R.HALT_GRAD_COLLAPSE].item()) == (nan, clipf, col)
    assert int(st["collapse_count"]) == count == rec[R.COLLAPSE_COUNT].item()
    assert st["skip"].item() == skip == rec[R.SKIP].item() == st["halted"].item() == rec[R.HALTED].item()
    assert rec[R.STEP].item() == rec[R.COMMIT].item() == step
    assert_close_report(rec[R.RAW_LOSS], torch.tensor(loss, dtype=F32), name="raw loss")
    assert_close_report(rec[R.RAW_GRAD_NORM], torch.tensor(norm, dtype=F32), name="raw norm")
    expected_clipped = clip if loss > clip else loss
    assert_close_report(rec[R.CLIPPED_LOSS], torch.tensor(expected_clipped, dtype=F32), name="clipped")
    # q_stats columns untouched
    assert rec[R.Q_STEP] == -1 and torch.isnan(rec[R.Q_MIN:R.Q_MEAN + 1]).all() and rec[R.Q_DIVERGENCE] == 0


# ---------------------------------------------------------------------------------------------
# sequences: full state after each call
# ---------------------------------------------------------------------------------------------
def _sequence(seed, n=60):
    rng = np.random.default_rng(seed)
    losses = [1.0, 2.5, 0.125, 100.0, 100.5, NAN, INF, -INF, -3.0]
    lp = np.array([30, 20, 20, 4, 2, 1, 1, 1, 3], dtype=float)
    norms = [1.0, 0.5, 0.05, 0.1, 0.0, NAN, INF]
    seq = []
    streak = 0
    for _ in range(n):
        if streak == 0 and rng.random() < 0.15:
            streak = int(rng.integers(1, 6))  # a run of collapsed norms
        if streak:
            norm, streak = 0.05, streak - 1
        else:
            norm = norms[rng.choice(len(norms), p=np.array([40, 20, 5, 5, 2, 1, 1]) / 74)]
        seq.append((losses[rng.choice(len(losses), p=lp / lp.sum())], norm))
    return seq


@pytest.mark.parametrize("count_dtype", [I64, torch.int32])
@pytest.mark.parametrize("seed, warmup, patience", [(0, 0, 0), (1, 5, 2), (2, 3, 3), (3, 100, 1)])
def test_sequence_matches_reference_and_model(seed, warmup, patience, count_dtype):
    params = new_params(loss_clip=100.0, threshold=0.1, warmup=warmup, patience=patience)
    kern, ref = new_state(count_dtype, ring_size=7), new_state(count_dtype, ring_size=7)
    model = Model(100.0, 0.1, warmup, patience)
    for step, (loss, norm) in enumerate(_sequence(seed)):
        call("triton", kern, params, loss, norm, step)
        call("torch", ref, params, loss, norm, step)
        out = model.step(loss, norm, step)
        assert_state_equal(kern, ref, f"after step {step}")
        model.check(kern, out, step)


def test_collapse_fires_exactly_after_patience():
    params = new_params(threshold=0.1, warmup=2, patience=3)
    st = new_state()
    fired = []
    for step in range(10):
        call("triton", st, params, 1.0, 0.01, step)  # collapsed from step 2 (end of warm-up) on
        fired.append(int(st["ring"][step % 8, R.HALT_GRAD_COLLAPSE].item()))
    # counts: steps 0,1 -> 0 (warm-up); step 2 -> 1, 3 -> 2, 4 -> 3, 5 -> 4 > 3 fires
    assert fired == [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
    assert int(st["collapse_count"]) == 8


def test_normal_step_resets_counter():
    params = new_params(threshold=0.1, patience=2)
    st = new_state()
    for step, norm in enumerate([0.01, 0.01, 1.0, 0.01, 0.01, 0.01]):
        call("triton", st, params, 1.0, norm, step)
        if step == 1:
            assert int(st["collapse_count"]) == 2
        if step == 2:
            assert int(st["collapse_count"]) == 0
    assert int(st["collapse_count"]) == 3 and st["skip"].item() == 1.0
    assert [st["ring"][s, R.HALT_GRAD_COLLAPSE].item() for s in range(6)] == [0, 0, 0, 0, 0, 1]


@pytest.mark.parametrize("step", [-1, -9, 0, 7, 8, 2**40 + 3])
def test_slot_is_python_modulo(step):
    states = {}
    for backend in ("triton", "torch"):
        st = new_state(ring_size=8)
        call(backend, st, new_params(), 1.0, 1.0, step)
        states[backend] = st
    assert_state_equal(states["triton"], states["torch"])
    assert states["triton"]["ring"][step % 8, R.COMMIT].item() == float(step)


def test_ring_of_one():
    kern, ref = new_state(ring_size=1), new_state(ring_size=1)
    for step in range(3):
        call("triton", kern, new_params(), 1.0 + step, 1.0, step)
        call("torch", ref, new_params(), 1.0 + step, 1.0, step)
    assert_state_equal(kern, ref)
    assert kern["ring"][0, R.STEP] == 2


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("loss", torch.tensor([1.0]), "loss"),
        ("grad_norm", torch.tensor(1.0, dtype=torch.float64), "grad_norm"),
        ("step", torch.tensor(1), None),
        ("step", torch.tensor(1, dtype=torch.int32), "step"),
        ("acc", torch.zeros(3), "acc"),
        ("collapse_count", torch.tensor(0.0), "collapse_count"),
        ("ring", torch.zeros(4, 16), "ring"),
    ],
)
def test_bad_arguments(key, value, match):
    args = dict(loss=torch.tensor(1.0), grad_norm=torch.tensor(1.0), step=torch.tensor(0),
                **new_params(), **new_state())
    args[key] = value
    if match is None:
        training_guard(**args)
        return
    with pytest.raises(ValueError, match=match):
        training_guard(**args)


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------
def _cpu_copy(state):
    return {k: (v.clone() if k == "ring" else v.cpu().clone()) for k, v in state.items()}


@pytest.mark.gpu
@pytest.mark.parametrize("count_dtype", [I64, torch.int32])
def test_gpu_sequence_matches_reference(count_dtype):
    dev = "cuda"
    gpu = new_state(count_dtype, ring_size=7, device=dev, pin=True)
    assert gpu["ring"].is_pinned()
    ref = new_state(count_dtype, ring_size=7)
    p_gpu = new_params(100.0, 0.1, 5, 2, device=dev)
    p_ref = new_params(100.0, 0.1, 5, 2)
    for step, (loss, norm) in enumerate(_sequence(1)):
        call("auto", gpu, p_gpu, loss, norm, step, device=dev)
        call("torch", ref, p_ref, loss, norm, step)
        torch.cuda.synchronize()
        assert_state_equal(_cpu_copy(gpu), ref, f"after step {step}")


@pytest.mark.gpu
def test_gpu_graph_replay_pinned_ring_visible_and_no_sync():
    dev = torch.device("cuda")
    guard = TrainingGuard(dev, loss_clip=100.0, collapse_threshold=0.1, warmup_steps=3, patience=1, ring_size=8)
    loss = torch.zeros((), device=dev)
    norm = torch.ones((), device=dev)
    step = torch.zeros((), dtype=I64, device=dev)

    def body():
        guard.check(loss, norm, step)
        step.add_(1)

    graph, _ = capture_graph(body, warmup=1)  # warm-up: compiles the kernel; writes step 0
    torch.cuda.synchronize()

    ref = new_state(I64, ring_size=8)
    p_ref = new_params(100.0, 0.1, 3, 1)
    call("torch", ref, p_ref, 0.0, 1.0, 0)
    seq = [(1.0, 1.0), (2.0, 0.05), (3.0, 0.05), (4.0, 1.0), (5.0, 0.05), (6.0, 0.05), (7.0, 0.05), (NAN, 1.0),
           (1.0, 1.0), (200.0, 1.0)]
    for i, (l_val, n_val) in enumerate(seq, start=1):
        loss.fill_(l_val)
        norm.fill_(n_val)
        with no_host_sync():
            graph.replay()
        torch.cuda.synchronize()
        call("torch", ref, p_ref, l_val, n_val, i)
        gpu_state = {"collapse_count": guard.collapse_count, "acc": guard.acc, "skip": guard.skip,
                     "halted": guard.halted, "ring": guard.ring}
        assert_state_equal(_cpu_copy(gpu_state), ref, f"after replay {i}")
        assert guard.reader.latest()["step"] == i  # visible in pinned memory after synchronize
    assert guard.reader.first_halt()["step"] == 6  # collapsed at 5, 6 (after warm-up 3): 2 > 1


@pytest.mark.gpu
def test_gpu_eager_no_sync():
    dev = torch.device("cuda")
    guard = TrainingGuard(dev)
    loss, norm, step = torch.tensor(1.0, device=dev), torch.tensor(1.0, device=dev), torch.tensor(0, device=dev)
    guard.check(loss, norm, step)  # compile first
    torch.cuda.synchronize()
    with no_host_sync():
        for _ in range(5):
            guard.check(loss, norm, step)
            step.add_(1)
    torch.cuda.synchronize()
    assert guard.reader.latest()["step"] == 4
    assert guard.read_accumulators()["count"] == 6


@pytest.mark.gpu
def test_gpu_fused_adam_skips_inside_graph():
    dev = torch.device("cuda")
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(64, device=dev))
    opt = torch.optim.Adam([p], lr=0.01, fused=True, capturable=True)
    guard = TrainingGuard(dev, loss_clip=1e6)
    opt.found_inf = guard.skip
    g = torch.randn(64, device=dev)
    p.grad = g.clone()
    loss = torch.ones((), device=dev)
    step = torch.zeros((), dtype=I64, device=dev)

    def body():
        p.grad.copy_(g)
        guard.check(loss, torch.linalg.vector_norm(p.grad), step)
        opt.step()
        step.add_(1)

    graph, _ = capture_graph(body, warmup=2)
    torch.cuda.synchronize()

    def replay():
        before, before_step = p.detach().clone(), opt.state[p]["step"].clone()
        with no_host_sync():
            graph.replay()
        torch.cuda.synchronize()
        return (not torch.equal(p.detach(), before)), (opt.state[p]["step"] - before_step).item()

    assert replay() == (True, 1.0)
    loss.fill_(float("nan"))
    assert replay() == (False, 0.0)  # the bad step itself is skipped in the same replay
    loss.fill_(1.0)
    assert replay() == (False, 0.0)  # latched
    assert guard.reader.first_halt()["halt_nan"]


@pytest.mark.gpu
def test_gpu_guard_and_qstats_inside_torch_compile():
    """Under torch.compile the ring-writing ops run as opaque calls and still write the record."""
    register_ops()  # torch.library registration, made for torch.compile / opcheck only
    from foxdqn.guard.host import TrainingGuard
    from foxdqn.guard.q_monitor import QValueMonitor

    guard = TrainingGuard("cuda", loss_clip=10.0)
    qmon = QValueMonitor(guard.ring, "cuda")
    w = torch.randn(8, 5, device="cuda", requires_grad=True)

    @torch.compile
    def step(x, t):
        q = x @ w
        loss = (q ** 2).mean()
        qmon.update(q.detach(), t)
        return guard.check(loss.detach(), loss.detach() * 0 + 1.0, t), loss

    x = torch.randn(16, 8, device="cuda")
    for i in range(3):
        skip, loss = step(x, torch.tensor(i, device="cuda"))
    torch.cuda.synchronize()
    rec = guard.reader.latest()
    assert rec["step"] == 2 and rec["q_min"] is not None
    assert float(skip) == float(loss > 10.0)


# ---------------------------------------------------------------------------------------------
# post-step weight check (weight_bits, max_weight)
# ---------------------------------------------------------------------------------------------
def _bits(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=F32).view(torch.int32).clone()


# (max|w| after the step, bound, loss, halted0) -> (halt_weight, skip)
WEIGHT_CASES = {
    "below": ((1.5, 2.0, 1.0, 0.0), (0, 0)),
    "exactly_at_bound": ((2.0, 2.0, 1.0, 0.0), (0, 0)),
    "one_ulp_above": ((float(torch.nextafter(torch.tensor(2.0), torch.tensor(INF))), 2.0, 1.0, 0.0), (1, 1)),
    "far_above": ((3.8e26, 100.0, 1.0, 0.0), (1, 1)),
    "inf_weight": ((INF, 3e38, 1.0, 0.0), (1, 1)),
    "nan_weight": ((NAN, 3e38, 1.0, 0.0), (1, 1)),
    "zero_weights": ((0.0, 1e-30, 1.0, 0.0), (0, 0)),
    "nan_loss_fires_halt_nan_only": ((NAN, 2.0, NAN, 0.0), (0, 1)),
    "latched_does_not_fire_again": ((5.0, 2.0, 1.0, 1.0), (0, 1)),
}


@pytest.mark.parametrize("case", list(WEIGHT_CASES))
def test_weight_flag_table(case):
    (wmax, bound, loss, halted0), (flag, skip) = WEIGHT_CASES[case]
    states = {}
    for backend in ("triton", "torch"):
        st = new_state()
        st["halted"].fill_(halted0)
        bits = _bits(wmax)
        training_guard(torch.tensor(loss, dtype=F32), torch.tensor(1.0), torch.tensor(6, dtype=I64), **new_params(),
                       **st, weight_bits=bits, max_weight=torch.tensor(bound, dtype=F32), backend=backend)
        rec = st["ring"][6 % 8]
        assert rec[R.HALT_WEIGHT] == flag, (backend, case)
        assert float(st["skip"]) == float(st["halted"]) == rec[R.SKIP] == rec[R.HALTED] == skip, (backend, case)
        got = rec[R.MAX_WEIGHT].item()
        assert (np.isnan(got) and np.isnan(wmax)) or got == np.float32(wmax), (backend, got)
        assert rec[R.COMMIT] == 6
        assert int(bits) == 0  # reset for the next update
        assert float(st["acc"][3]) == skip  # counted as a skipped update
        states[backend] = st
    assert_state_equal(states["triton"], states["torch"], case)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_weight_check_off_writes_minus_one_and_no_flag(backend):
    st = new_state()
    call(backend, st, new_params(), 1.0, 1.0, 3)
    assert st["ring"][3, R.HALT_WEIGHT] == 0 and st["ring"][3, R.MAX_WEIGHT] == -1.0


def test_weight_halt_latches_later_steps():
    for backend in ("triton", "torch"):
        st, bound = new_state(), torch.tensor(10.0)
        for step, wmax in enumerate([1.0, 11.0, 1.0, 1.0]):
            training_guard(torch.tensor(1.0), torch.tensor(1.0), torch.tensor(step), **new_params(), **st,
                           weight_bits=_bits(wmax), max_weight=bound, backend=backend)
        ring = st["ring"]
        assert ring[:4, R.HALT_WEIGHT].tolist() == [0, 1, 0, 0]
        assert ring[:4, R.SKIP].tolist() == [0, 1, 1, 1] and ring[:4, R.HALTED].tolist() == [0, 1, 1, 1]
        assert st["acc"].tolist() == [4.0, 4.0, 4.0, 3.0]  # finite loss and norm still summed; 3 skipped


@pytest.mark.parametrize(
    "weights, match",
    [
        (dict(weight_bits=torch.zeros((), dtype=torch.int32)), "go together"),
        (dict(max_weight=torch.tensor(1.0)), "go together"),
        (dict(weight_bits=torch.zeros((), dtype=torch.int64), max_weight=torch.tensor(1.0)), "weight_bits"),
        (dict(weight_bits=torch.zeros((), dtype=torch.int32), max_weight=torch.tensor([1.0])), "max_weight"),
    ],
)
def test_bad_weight_arguments(weights, match):
    with pytest.raises(ValueError, match=match):
        training_guard(torch.tensor(1.0), torch.tensor(1.0), torch.tensor(0), **new_params(), **new_state(), **weights)


@pytest.mark.gpu
def test_gpu_weight_check_matches_reference_in_a_graph():
    dev = torch.device("cuda")
    guard = TrainingGuard(dev, ring_size=8, max_weight=10.0)
    loss, norm = torch.ones((), device=dev), torch.ones((), device=dev)
    step = torch.zeros((), dtype=I64, device=dev)
    wvalue = torch.zeros((), device=dev)

    def body():  # what WeightCheck.run leaves in weight_bits, then the guard
        torch.maximum(guard.weight_bits, wvalue.view(torch.int32), out=guard.weight_bits)
        guard.check(loss, norm, step)
        step.add_(1)

    graph, _ = capture_graph(body, warmup=1)  # step 0, max|w| 0
    torch.cuda.synchronize()
    ref, p_ref = new_state(I64, ring_size=8), new_params()
    ref_bits, bound = torch.zeros((), dtype=torch.int32), torch.tensor(10.0)
    training_guard(torch.tensor(1.0), torch.tensor(1.0), torch.tensor(0), **p_ref, **ref,
                   weight_bits=ref_bits, max_weight=bound, backend="torch")
    for i, w in enumerate([3.0, 10.0, INF, 2.0], start=1):
        wvalue.fill_(w)
        with no_host_sync():
            graph.replay()
        torch.cuda.synchronize()
        ref_bits.copy_(_bits(w))
        training_guard(torch.tensor(1.0), torch.tensor(1.0), torch.tensor(i), **p_ref, **ref,
                       weight_bits=ref_bits, max_weight=bound, backend="torch")
        gpu_state = {"collapse_count": guard.collapse_count, "acc": guard.acc, "skip": guard.skip,
                     "halted": guard.halted, "ring": guard.ring}
        assert_state_equal(_cpu_copy(gpu_state), ref, f"after replay {i}")
    assert guard.reader.first_halt()["step"] == 3 and guard.reader.first_halt()["halt_weight"]
