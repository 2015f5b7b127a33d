"""target_lerp_: Triton kernel (TRITON_INTERPRET=1 on CPU) vs torch reference vs torch.lerp and
the weight rule written out (Polyak and hard, skipped or not; 1 to 10 tensors, 1 to 4097 elements, empty ones);
the hard copy exact (-0.0, Inf targets), a skipped update leaves targets bit for bit (NaN sources);
the counter advanced once, the weight written; members=3 = three single-member calls; argument
checks. GPU: kernel vs reference on CUDA, captured in a CUDA graph = eager, replay after changing
tau and skip in place, no host sync."""
import pytest
import torch

from foxdqn.ops import backend as B
import foxdqn.ops.target_lerp as tl_mod
from foxdqn.ops.target_lerp import target_lerp_

from support import MULTI_TENSOR_SHAPES, capture_graph, no_host_sync, randn_list, require_compiled_kernels

_need_compiled = require_compiled_kernels(B.INTERPRET)
F32, I64 = torch.float32, torch.int64
NAN, INF = float("nan"), float("inf")
SHAPES = {k: v for k, v in MULTI_TENSOR_SHAPES.items() if k != "seven"}


def _pair(shapes, seed, members=1, device="cpu"):
    return randn_list(shapes, seed, members, device), randn_list(shapes, seed + 1, members, device)


def _run(targets, sources, u0, skip, tau, period, hard, backend, members=1):
    t = [x.clone() for x in targets]
    updates = torch.tensor(u0, device=t[0].device)
    weight = torch.empty_like(skip)
    target_lerp_(t, sources, updates, skip, tau, period, hard=hard, advance=True, weight=weight, members=members,
                 backend=backend)
    return t, updates, weight


@pytest.mark.parametrize("shapes", list(SHAPES))
@pytest.mark.parametrize("hard, u0, skip", [(False, 0, 0.0), (False, 0, 1.0), (True, 4, 0.0), (True, 5, 0.0),
                                           (True, 4, 1.0)])
def test_kernel_reference_and_torch_lerp_agree(shapes, hard, u0, skip):
    targets, sources = _pair(SHAPES[shapes], seed=u0)
    args = (torch.tensor(skip), torch.tensor(0.3), torch.tensor(5))
    kt, ku, kw = _run(targets, sources, u0, *args, hard, "triton")
    rt, ru, rw = _run(targets, sources, u0, *args, hard, "torch")
    base = torch.tensor(1.0 if (u0 + 1) % 5 == 0 else 0.0) if hard else torch.tensor(0.3)
    w_expect = torch.mul(base, 1.0 - torch.tensor(skip))  # the module docstring's w, in float32
    assert int(ku) == int(ru) == u0 + 1
    assert torch.equal(kw, w_expect) and torch.equal(rw, w_expect)
    for k, t0, s0, r in zip(kt, targets, sources, rt):
        assert torch.equal(k, torch.lerp(t0, s0, w_expect)) and torch.equal(k, r)
    if float(w_expect) == 1.0:
        assert all(torch.equal(k, s) for k, s in zip(kt, sources))
    if float(w_expect) == 0.0:
        assert all(torch.equal(k, t) for k, t in zip(kt, targets))


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_hard_copy_and_skip_exact_with_special_values(backend):
    targets = [torch.tensor([1.0, INF, NAN, -1.0, 2.0])]
    sources = [torch.tensor([-0.0, 3.0, 4.0, NAN, 5.0])]
    hard_copy, _, w = _run(targets, sources, 4, torch.tensor(0.0), torch.tensor(0.3), torch.tensor(5), True, backend)
    assert float(w) == 1.0
    assert torch.equal(hard_copy[0].view(torch.int32), sources[0].view(torch.int32))  # -0.0 and NaN bits too
    skipped, u, w = _run(targets, sources, 4, torch.tensor(1.0), torch.tensor(0.3), torch.tensor(5), False, backend)
    assert float(w) == 0.0 and int(u) == 5
    assert torch.equal(skipped[0].view(torch.int32), targets[0].view(torch.int32))


@pytest.mark.parametrize("hard", [False, True])
def test_members_equal_separate_calls(hard):
    targets, sources = _pair(SHAPES["ten_with_empty"], seed=2, members=3)
    skip, tau, period = torch.tensor([0.0, 1.0, 0.0]), torch.tensor([0.005, 0.5, 0.7]), torch.tensor([5, 5, 2])
    kt, ku, kw = _run(targets, sources, 9, skip, tau, period, hard, "triton", members=3)
    rt, ru, rw = _run(targets, sources, 9, skip, tau, period, hard, "torch", members=3)
    assert int(ku) == int(ru) == 10 and torch.equal(kw, rw)
    for p in range(3):
        one, _, w1 = _run([t[p] for t in targets], [s[p] for s in sources], 9, skip[p], tau[p], period[p], hard,
                          "triton")
        assert torch.equal(kw[p], w1)
        for a, b in zip(kt, one):
            assert torch.equal(a[p], b), p
    for a, b in zip(kt, rt):
        assert torch.equal(a, b)


@pytest.mark.parametrize("programs,max_rows", [(1, 8), (1, 3), (4, 2)])
@pytest.mark.parametrize("hard", [False, True])
def test_rows_per_program(monkeypatch, programs, max_rows, hard):
    """Several rows per program (member-major chunks, rows past a member's end masked; two launches
    for more than MAX_SLOTS tensors): the reference's bits, the weights and the counter advanced
    once; a member whose weight is 0 (skipped, or no hard copy due) keeps its targets."""
    monkeypatch.setattr(tl_mod, "HARD_PROGRAMS", programs)
    monkeypatch.setattr(tl_mod, "POLYAK_PROGRAMS", programs)
    monkeypatch.setattr(tl_mod, "MAX_ROWS", max_rows)
    for shapes in (SHAPES["ten_with_empty"], [(2, 700), (3,), (1025,)] * 6):
        targets, sources = _pair(shapes, seed=4, members=3)
        skip, tau, period = torch.tensor([0.0, 1.0, 0.0]), torch.tensor([0.005, 0.5, 0.7]), torch.tensor([3, 5, 2])
        kt, ku, kw = _run(targets, sources, 9, skip, tau, period, hard, "triton", members=3)
        rt, ru, rw = _run(targets, sources, 9, skip, tau, period, hard, "torch", members=3)
        assert int(ku) == int(ru) == 10 and torch.equal(kw, rw)
        for a, b, t0, s0 in zip(kt, rt, targets, sources):
            assert torch.equal(a, b)
            assert torch.equal(a[1], t0[1])  # skipped
            if hard:  # update 10: member 0's copy (every 3) is not due, member 2's (every 2) is
                assert torch.equal(a[0], t0[0]) and torch.equal(a[2], s0[2])


def test_without_weight_and_advance():
    targets, sources = _pair([(5,), (9,)], seed=1)
    t = [x.clone() for x in targets]
    updates = torch.tensor(7)
    target_lerp_(t, sources, updates, torch.tensor(0.0), torch.tensor(0.25), torch.tensor(3), hard=False,
                 advance=False, backend="triton")
    assert int(updates) == 7
    assert all(torch.equal(a, torch.lerp(x, s, 0.25)) for a, x, s in zip(t, targets, sources))


def test_argument_errors():
    t, s = [torch.zeros(3)], [torch.zeros(3)]
    u, sk, tau, per = torch.tensor(0), torch.tensor(0.0), torch.tensor(0.1), torch.tensor(2)
    with pytest.raises(ValueError, match=r"sources\[0\] must be .*shape \[3\]"):
        target_lerp_(t, [torch.zeros(4)], u, sk, tau, per, hard=False, advance=True)
    with pytest.raises(ValueError, match="updates must be an int64 0-d"):
        target_lerp_(t, s, torch.tensor(0.0), sk, tau, per, hard=False, advance=True)
    with pytest.raises(ValueError, match="hard_period must be a contiguous torch.int64"):
        target_lerp_(t, s, u, sk, tau, torch.tensor(2.0), hard=True, advance=True)
    with pytest.raises(ValueError, match="tau must have skip's shape"):
        target_lerp_(t, s, u, sk, torch.tensor([0.1]), per, hard=False, advance=True)
    with pytest.raises(ValueError, match=r"weight must be .*\[P\] = \[2\]"):
        target_lerp_([torch.zeros(2, 3)], [torch.zeros(2, 3)], u, torch.zeros(2), torch.zeros(2),
                     torch.ones(2, dtype=I64), hard=False, advance=True, weight=torch.zeros(()), members=2)


@pytest.mark.gpu
def test_gpu_kernel_equals_reference_and_graph_replay():
    shapes = SHAPES["ten_with_empty"] + [(256, 64), (256,), (256, 256)]
    targets, sources = _pair(shapes, seed=3, device="cuda")
    for hard in (False, True):
        args = (torch.tensor(0.0, device="cuda"), torch.tensor(0.3, device="cuda"), torch.tensor(5, device="cuda"))
        kt, ku, kw = _run(targets, sources, 4, *args, hard, "auto")
        rt, ru, rw = _run(targets, sources, 4, *args, hard, "torch")
        assert int(ku) == int(ru) and torch.equal(kw, rw)
        for a, b in zip(kt, rt):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)  # nvcc and Triton may contract differently
    skip, tau, period = (torch.tensor(0.0, device="cuda"), torch.tensor(0.3, device="cuda"),
                         torch.tensor(5, device="cuda"))
    state = [[t.clone() for t in targets] for _ in range(2)]
    updates = [torch.tensor(0, device="cuda") for _ in range(2)]
    weight = [torch.zeros((), device="cuda") for _ in range(2)]

    def call(j):
        target_lerp_(state[j], sources, updates[j], skip, tau, period, hard=False, advance=True, weight=weight[j])

    with no_host_sync():
        graph, _ = capture_graph(lambda: call(0))
        for _ in range(3):
            call(1)
        for tau_v, skip_v in ((0.3, 0.0), (0.01, 0.0), (0.01, 1.0)):
            tau.fill_(tau_v)
            skip.fill_(skip_v)
            graph.replay()
            call(1)
    torch.cuda.synchronize()
    assert int(updates[0]) == int(updates[1]) == 6 and torch.equal(weight[0], weight[1]) and float(weight[0]) == 0.0
    for a, b in zip(state[0], state[1]):
        assert torch.equal(a, b)
