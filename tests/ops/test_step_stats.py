"""step_stats: Triton kernel (interpreter) vs torch reference for N over one to 18 programs
(small blocks; with fewer partial rows per iteration, the last program's loop runs three times), A = 1 to 70,
with and without trades and the env-step counter, float32 and float64 inputs; counts are exact,
the float64 sums agree to rounding and repeat bit for bit, the ticket is back at 0 after every
call; out-of-range actions; argument and scratch checks; with members (a population): each
member's row equals a call on its envs alone bit for bit, whatever P, acc rows of a wider
tensor, no histogram; on the GPU the compiled kernel against the reference, bit for bit run to
run, captured and replayed without host syncs, timed at N = 4,096."""
import pytest
import torch

from foxdqn.ops.backend import INTERPRET
import foxdqn.ops.step_stats as mod
from foxdqn.ops.step_stats import BLOCK, NUM_FIELDS, StepStatsScratch, step_stats

from support import require_compiled_kernels

F32, F64, I64 = torch.float32, torch.float64, torch.int64
_need_compiled = require_compiled_kernels(INTERPRET)


def _case(n, a, dtype, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    action = torch.randint(0, a, (n,), generator=g)
    reward = torch.randn(n, generator=g, dtype=dtype) * 1e-3
    done = torch.rand(n, generator=g) < 0.2
    ret = torch.where(done, torch.randn(n, generator=g, dtype=dtype), torch.zeros((), dtype=dtype))
    length = torch.where(done, torch.randint(1, 500, (n,), generator=g), torch.zeros((), dtype=I64))
    traded = torch.rand(n, generator=g) < 0.5
    return [t.to(device) for t in (action, reward, done, ret, length, traded)]


def _accumulate(backend, steps, a, with_traded, with_steps, device="cpu", block=BLOCK):
    acc = torch.zeros(NUM_FIELDS, dtype=F64, device=device)
    hist = torch.zeros(a, dtype=F64, device=device)
    env_steps = torch.zeros((), dtype=I64, device=device) if with_steps else None
    scratch = StepStatsScratch(steps[0][0].shape[0], device, block=block)
    for action, reward, done, ret, length, traded in steps:
        step_stats(action, reward, done, ret, length, traded if with_traded else None, acc, hist, env_steps,
                   scratch=scratch, backend=backend)
        assert int(scratch.ticket) == 0  # the last program zeroed it for the next call
    return acc, hist, env_steps


#: partial rows per iteration of the last program's loop in the tests that run it several times
#: (the kernel's ROWS, 64, would need 129 programs: over 2,000 envs in the interpreter)
FEW_ROWS = 8


@pytest.mark.parametrize("n,a,dtype,with_traded,with_steps,block", [
    (1, 1, F32, True, True, 16),  # one program
    (37, 5, F64, False, True, 16),  # 3 programs, the last one partial
    (275, 45, F32, True, True, 16),  # 18 programs, ROWS = FEW_ROWS: the last program's loop runs 3 times
    (2 * BLOCK + 3, 45, F32, True, False, BLOCK),  # the default block
    (300, 70, F64, True, True, 128)])  # A over two histogram bin blocks
def test_kernel_equals_reference(n, a, dtype, with_traded, with_steps, block, monkeypatch):
    if n == 275:
        monkeypatch.setattr(mod, "ROWS", FEW_ROWS)
    steps = [_case(n, a, dtype, seed=n + k) for k in range(3)]
    (acc_k, hist_k, st_k), (acc_r, hist_r, st_r) = (_accumulate(b, steps, a, with_traded, with_steps, block=block)
                                                    for b in ("triton", "torch"))
    for f in (1, 2, 4, 5):  # counts: exact
        assert acc_k[f] == acc_r[f], f
    torch.testing.assert_close(acc_k, acc_r, rtol=1e-13, atol=1e-15)
    assert torch.equal(hist_k, hist_r) and float(hist_k.sum()) == 3 * n
    if with_steps:
        assert int(st_k) == int(st_r) == 3 * n
    if not with_traded:
        assert float(acc_k[5]) == 0.0
    again = _accumulate("triton", steps, a, with_traded, with_steps, block=block)
    assert torch.equal(again[0], acc_k) and torch.equal(again[1], hist_k)  # deterministic: bit for bit


def test_scratch_larger_than_needed_and_counter_accumulates():
    """A scratch made for more envs than a call has serves it; the counter and the sums add up over
    calls of different N (its rows are rewritten every call)."""
    scratch = StepStatsScratch(100, "cpu", block=8)
    acc, hist, steps = torch.zeros(NUM_FIELDS, dtype=F64), torch.zeros(4, dtype=F64), torch.tensor(5)
    acc_r, hist_r, steps_r = acc.clone(), hist.clone(), steps.clone()
    for n, seed in ((100, 1), (9, 2), (64, 3)):
        case = _case(n, 4, F32, seed)
        step_stats(*case, acc, hist, steps, scratch=scratch, backend="triton")
        step_stats(*case, acc_r, hist_r, steps_r, backend="torch")
        assert int(scratch.ticket) == 0
    assert int(steps) == int(steps_r) == 5 + 173 and float(acc[4]) == 173.0
    torch.testing.assert_close(acc, acc_r, rtol=1e-13, atol=1e-15)
    assert torch.equal(hist, hist_r)


def test_actions_outside_the_range_are_not_counted_by_the_kernel():
    n = 40
    action, reward, done, ret, length, traded = _case(n, 3, F32, seed=5)
    action[3], action[17], action[33] = -1, 3, 1000
    acc, hist = torch.zeros(NUM_FIELDS, dtype=F64), torch.zeros(3, dtype=F64)
    step_stats(action, reward, done, ret, length, traded, acc, hist, scratch=StepStatsScratch(n, "cpu", block=16),
               backend="triton")
    inside = action[(action >= 0) & (action < 3)]
    assert torch.equal(hist, torch.bincount(inside, minlength=3).to(F64)) and float(hist.sum()) == n - 3
    assert float(acc[4]) == n  # the transitions still count


def test_values_of_a_small_step():
    action = torch.tensor([0, 2, 2, 1])
    reward = torch.tensor([0.5, -1.0, 0.25, 2.0])
    done = torch.tensor([True, False, True, False])
    ret = torch.tensor([3.0, 9.0, -1.0, 9.0])  # 9.0 where not done: not counted
    length = torch.tensor([10, 99, 4, 99])
    traded = torch.tensor([True, True, False, False])
    for backend in ("triton", "torch"):
        acc, hist, steps = torch.zeros(NUM_FIELDS, dtype=F64), torch.zeros(3, dtype=F64), torch.tensor(7)
        step_stats(action, reward, done, ret, length, traded, acc, hist, steps,
                   scratch=StepStatsScratch(4, "cpu", block=2), backend=backend)
        assert acc.tolist() == [2.0, 2.0, 14.0, 1.75, 4.0, 2.0]
        assert hist.tolist() == [1.0, 1.0, 2.0] and int(steps) == 11


def test_argument_errors():
    action, reward, done, ret, length, traded = _case(8, 3, F32, seed=0)
    acc, hist = torch.zeros(NUM_FIELDS, dtype=F64), torch.zeros(3, dtype=F64)
    with pytest.raises(ValueError, match="done must be"):
        step_stats(action, reward, done.float(), ret, length, traded, acc, hist)
    with pytest.raises(ValueError, match="acc must be"):
        step_stats(action, reward, done, ret, length, traded, acc.float(), hist)
    with pytest.raises(ValueError, match="env_steps must be"):
        step_stats(action, reward, done, ret, length, traded, acc, hist, torch.tensor(0.0))
    with pytest.raises(ValueError, match="reward must be"):
        step_stats(action, reward[:4], done, ret, length, traded, acc, hist)
    with pytest.raises(ValueError, match="needs scratch=StepStatsScratch"):
        step_stats(action, reward, done, ret, length, traded, acc, hist, backend="triton")
    with pytest.raises(ValueError, match=r"scratch.partials must be .*\[>= 2, 6\]"):
        step_stats(action, reward, done, ret, length, traded, acc, hist, scratch=StepStatsScratch(4, "cpu", block=4),
                   backend="triton")
    for bad in (dict(num_envs=-1), dict(num_envs=8, block=24), dict(num_envs=8, block=0)):
        with pytest.raises(ValueError, match="StepStatsScratch: (num_envs|block) must be"):
            StepStatsScratch(device="cpu", **bad)


def _member_call(backend, case, members, a, width=NUM_FIELDS + 3, hist=True, block=16, device="cpu"):
    """acc rows ``[P, width]`` (the step's fields first: a view of wider rows), histogram, counter,
    after two calls."""
    wide = torch.zeros(members, width, dtype=F64, device=device)
    wide[:, NUM_FIELDS:] = 0.5  # columns the call must leave alone
    actions = torch.zeros(members, a, dtype=F64, device=device) if hist else None
    steps = torch.tensor(3, device=device)
    n = case[0].shape[0] // members
    scratch = StepStatsScratch(n, device, block=block, members=members)
    for _ in range(2):
        step_stats(*case, wide[:, :NUM_FIELDS], actions, steps, members=members, scratch=scratch, backend=backend)
        assert not scratch.ticket.any()
    return wide, actions, steps


@pytest.mark.parametrize("members,n,a,dtype,block", [
    (1, 5, 3, F32, 16), (5, 37, 5, F64, 16), (4, 1, 2, F32, 16),
    (2, 275, 45, F32, 16),  # 18 programs a member, ROWS = FEW_ROWS: the loop runs 3 times
    (3, 2 * BLOCK + 3, 70, F32, BLOCK)])
def test_members_each_equal_a_call_on_their_own_envs(members, n, a, dtype, block, monkeypatch):
    """Member p's row (sums, histogram) is, bit for bit, the kernel's sums of its envs alone (a
    population of one); the kernel equals the reference (counts exact, sums to rounding); the
    counter advances by N per member; the columns past the step's fields are untouched."""
    if n == 275:
        monkeypatch.setattr(mod, "ROWS", FEW_ROWS)
    case = _case(members * n, a, dtype, seed=7 * members + n)
    (acc_k, hist_k, st_k), (acc_r, hist_r, st_r) = (_member_call(b, case, members, a, block=block)
                                                    for b in ("triton", "torch"))
    assert int(st_k) == int(st_r) == 3 + 2 * n
    assert torch.equal(hist_k, hist_r) and hist_k.sum(1).tolist() == [2.0 * n] * members
    assert (acc_k[:, NUM_FIELDS:] == 0.5).all() and torch.equal(acc_k[:, [1, 2, 4, 5]], acc_r[:, [1, 2, 4, 5]])
    torch.testing.assert_close(acc_k, acc_r, rtol=1e-13, atol=1e-15)
    for p in range(members):
        own = [t[p * n:(p + 1) * n].contiguous() for t in case]
        alone = _member_call("triton", own, 1, a, block=block)
        assert torch.equal(alone[0][0], acc_k[p]) and torch.equal(alone[1][0], hist_k[p]), p
        single = _accumulate("triton", [own, own], a, True, True, block=block)  # the single run's call: the same sums
        assert torch.equal(single[0], acc_k[p, :NUM_FIELDS]) and torch.equal(single[1], hist_k[p])
        torch.testing.assert_close(acc_r[p, :NUM_FIELDS], _accumulate("torch", [own, own], a, True, True)[0],
                                   rtol=1e-13, atol=1e-15)


def test_members_without_a_histogram_and_members_never_mix():
    """actions None: the sums alone; a member whose envs all end with a huge return leaves the
    others' rows as they were; an action out of range is not counted for another member."""
    members, n, a = 3, 6, 4
    case = _case(members * n, a, F32, seed=1)
    base = _member_call("triton", case, members, a, hist=False)
    assert base[1] is None
    case[2][n:2 * n], case[3][n:2 * n] = True, 1e30  # member 1: done everywhere, huge returns
    case[0][n] = a  # an action of member 1 outside [0, A): not member 2's action 0
    changed = _member_call("triton", case, members, a)
    assert torch.equal(changed[0][[0, 2]], base[0][[0, 2]]) and changed[0][1, 0] > 1e30
    assert changed[1][1].sum() == 2 * (n - 1) and changed[1][2].sum() == 2 * n
    with pytest.raises(RuntimeError):  # the reference refuses it rather than count it elsewhere
        _member_call("torch", case, members, a)


def test_member_argument_errors():
    case = _case(8, 3, F32, seed=0)
    acc, hist = torch.zeros(2, NUM_FIELDS, dtype=F64), torch.zeros(2, 3, dtype=F64)
    with pytest.raises(ValueError, match="members must be None or an int >= 1 that divides N = 8"):
        step_stats(*case, acc, hist, members=3)
    with pytest.raises(ValueError, match=r"with members acc must be a float64 tensor \[P, 6\]"):
        step_stats(*case, torch.zeros(NUM_FIELDS, dtype=F64), hist, members=2)
    with pytest.raises(ValueError, match="with members acc must be"):
        step_stats(*case, torch.zeros(NUM_FIELDS, 2, dtype=F64).t(), hist, members=2)  # column stride 2
    with pytest.raises(ValueError, match="with members actions must be None or"):
        step_stats(*case, acc, torch.zeros(3, dtype=F64), members=2)
    with pytest.raises(ValueError, match="scratch made for members=None, the call has members=2"):
        step_stats(*case, acc, hist, members=2, scratch=StepStatsScratch(4, "cpu"), backend="triton")
    with pytest.raises(ValueError, match="StepStatsScratch: members must be"):
        StepStatsScratch(4, "cpu", members=0)


@pytest.mark.gpu
def test_gpu_members_equal_reference_and_capture():
    """Compiled, 64 members of 4,096 envs (16 programs each racing for their member's ticket): the
    reference's counts, its sums to rounding, bit for bit run to run; captured and replayed."""
    from support import capture_graph, no_host_sync

    members, n, a = 64, 4096, 45
    case = _case(members * n, a, F32, seed=3, device="cuda")
    (acc_k, hist_k, st_k), (acc_r, hist_r, st_r) = (_member_call(b, case, members, a, block=BLOCK, device="cuda")
                                                    for b in ("auto", "torch"))
    torch.testing.assert_close(acc_k, acc_r, rtol=1e-12, atol=1e-15)
    assert torch.equal(acc_k[:, [1, 2, 4, 5]], acc_r[:, [1, 2, 4, 5]]) and torch.equal(hist_k, hist_r)
    assert int(st_k) == int(st_r) == 3 + 2 * n
    again = _member_call("auto", case, members, a, block=BLOCK, device="cuda")
    assert torch.equal(again[0], acc_k) and torch.equal(again[1], hist_k)
    acc = torch.zeros(members, NUM_FIELDS, dtype=F64, device="cuda")
    steps, scratch = torch.zeros((), dtype=I64, device="cuda"), StepStatsScratch(n, "cuda", members=members)
    with no_host_sync():
        graph, _ = capture_graph(lambda: step_stats(*case, acc, None, steps, members=members, scratch=scratch))
        for _ in range(5):
            graph.replay()
    torch.cuda.synchronize()
    assert int(steps) == 8 * n and acc[:, 4].tolist() == [8.0 * n] * members and not scratch.ticket.any()


@pytest.mark.gpu
def test_gpu_kernel_equals_reference_deterministic_and_captured():
    """Compiled: 129 programs racing for the ticket equal the reference (sums within 1e-12
    relative, counts exact), repeat bit for bit, and replay in a CUDA graph without host syncs;
    prints the device time per call at N = 4,096 (no assertion on it)."""
    from support import capture_graph, no_host_sync

    n, a = BLOCK * 128 + 5, 45
    steps = [_case(n, a, F32, seed=k, device="cuda") for k in range(4)]
    (acc_k, hist_k, st_k), (acc_r, hist_r, st_r) = (_accumulate(b, steps, a, True, True, device="cuda")
                                                    for b in ("auto", "torch"))
    torch.testing.assert_close(acc_k, acc_r, rtol=1e-12, atol=1e-15)
    for f in (1, 2, 4, 5):  # counts: exact
        assert acc_k[f] == acc_r[f], f
    assert torch.equal(hist_k, hist_r) and int(st_k) == int(st_r) == 4 * n
    again = _accumulate("auto", steps, a, True, True, device="cuda")
    assert torch.equal(again[0], acc_k) and torch.equal(again[1], hist_k)  # bit for bit, run to run

    acc, hist = torch.zeros(NUM_FIELDS, dtype=F64, device="cuda"), torch.zeros(a, dtype=F64, device="cuda")
    env_steps, scratch = torch.zeros((), dtype=I64, device="cuda"), StepStatsScratch(n, "cuda")
    with no_host_sync():
        graph, _ = capture_graph(lambda: step_stats(*steps[0], acc, hist, env_steps, scratch=scratch))
        for _ in range(5):
            graph.replay()
    torch.cuda.synchronize()
    assert int(env_steps) == 8 * n and float(hist.sum()) == 8 * n and int(scratch.ticket) == 0  # 3 warm-up, 5 replays
    one = _accumulate("torch", steps[:1], a, True, True, device="cuda")
    assert torch.equal(hist, 8 * one[1]) and float(acc[4]) == 8 * n

    # timing at N = 4,096: a graph of CALLS calls, kernel vs reference
    calls, n = 50, 4096
    case = _case(n, 3, F32, seed=9, device="cuda")
    for backend in ("auto", "torch"):
        acc, hist = torch.zeros(NUM_FIELDS, dtype=F64, device="cuda"), torch.zeros(3, dtype=F64, device="cuda")
        env_steps, scratch = torch.zeros((), dtype=I64, device="cuda"), StepStatsScratch(n, "cuda")

        def many():
            for _ in range(calls):
                step_stats(*case, acc, hist, env_steps, scratch=scratch, backend=backend)

        graph, _ = capture_graph(many)
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        print(f"step_stats ({backend}) at N = {n}: {start.elapsed_time(end) * 1e3 / (10 * calls):.2f} us per call")
