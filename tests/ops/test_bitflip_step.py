"""bitflip_step: Triton kernel (interpreter on the CPU) vs torch reference, bit for bit (odd N and n,
one bit, actions outside 0..n-1, envs one step from the time limit or one flip from the goal, all-zero
candidate masks, NaN draws), the reference against the classic env's step on the same starts, a
trajectory, argument checks, and on the GPU the compiled kernel, captured, against the reference."""
import pytest
import torch

from foxdqn.envs.bitflip import BitFlipEnv
from foxdqn.ops.bitflip_step import bitflip_step, bitflip_step_reference, start_and_goal

from support import capture_graph

I64 = torch.int64


def _case(num, n, k, seed, device="cpu"):
    """Random states and goals (a third of the envs one flip from their goal, the action that flip),
    step counts (a fifth one short of the limit n), actions in -1..n (outside 0..n-1: no flip), and
    reset draws with K = k candidates (a fifth of the envs' candidates all zero: u >= 0.5)."""
    g = torch.Generator().manual_seed(seed)
    state = torch.rand(num, n, generator=g) < 0.5
    goal = torch.rand(num, n, generator=g) < 0.5
    action = torch.randint(-1, n + 1, (num,), generator=g)
    near = torch.rand(num, generator=g) < 0.33
    flip = torch.randint(0, n, (num,), generator=g)
    goal[near] = state[near] ^ (torch.arange(n) == flip[near, None])
    action[near] = flip[near]
    steps = torch.randint(0, n, (num,), generator=g)
    steps[torch.rand(num, generator=g) < 0.2] = n - 1
    u = torch.rand(num, (1 + k) * n, generator=g)
    zero = torch.rand(num, generator=g) < 0.2
    u[zero, n:] = 0.5 + 0.5 * u[zero, n:]
    return [t.to(device) for t in (state, goal, steps, action, u)]


def _run(case, backend, obs_dtype=torch.float32):
    state, goal, steps = (t.clone() for t in case[:3])
    out = bitflip_step(state, goal, steps, case[3], case[4], obs_dtype, backend=backend)
    return (state, goal, steps), out


def _assert_equal(a, b):
    for x, y in zip(a[0], b[0]):
        assert x.dtype == y.dtype and torch.equal(x.cpu(), y.cpu())
    for name, x, y in zip(a[1]._fields, a[1], b[1]):
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.cpu(), y.cpu()), name


@pytest.mark.parametrize("num,n,k", [(1, 1, 64), (7, 3, 22), (33, 6, 11), (70, 17, 4), (5, 40, 2), (31, 64, 1)])
@pytest.mark.parametrize("obs_dtype", [torch.float32, torch.float64])
def test_kernel_matches_reference(num, n, k, obs_dtype):
    case = _case(num, n, k, seed=num * 100 + n)
    ref = _run(case, "torch", obs_dtype)
    _assert_equal(_run(case, "triton", obs_dtype), ref)
    out = ref[1]
    assert out.next_obs.shape == (num, 2 * n) and out.obs.dtype == obs_dtype
    if num >= 33:  # the case exercises goals reached, time limits and envs running on
        assert out.terminated.any() and out.truncated.any() and (~out.done).any()


def test_all_zero_candidates_and_nan_draws_take_bit_zero():
    """Every env ends (n = 1 bit: one step is the limit); candidates all zero (u >= 0.5) or NaN
    (no bit: NaN < 0.5 is false) give the mask of bit 0; NaN start bits are 0."""
    num, n, k = 6, 5, 3
    state = torch.zeros(num, n, dtype=torch.bool)
    goal = torch.ones(num, n, dtype=torch.bool)
    steps = torch.full((num,), n - 1, dtype=I64)
    u = torch.full((num, (1 + k) * n), 0.75)
    u[:3, :n] = float("nan")
    u[3:, :n] = 0.25  # start all ones
    u[4, 2 * n + 3] = 0.1  # env 4: second candidate has bit 3
    u[5] = float("nan")
    case = [state, goal, steps, torch.zeros(num, dtype=I64), u]
    ref = _run(case, "torch")
    _assert_equal(_run(case, "triton"), ref)
    (s, g, st), out = ref
    assert bool(out.done.all()) and torch.equal(st, torch.zeros(num, dtype=I64))
    bit0 = torch.arange(n) == 0
    assert torch.equal(s[:3], torch.zeros(3, n, dtype=torch.bool)) and torch.equal(g[:3], bit0.expand(3, n))
    assert torch.equal(g[3], ~bit0) and torch.equal(g[4], torch.arange(n) != 3)
    assert torch.equal(s[5], torch.zeros(n, dtype=torch.bool)) and torch.equal(g[5], bit0)


def test_start_and_goal_takes_the_first_non_zero_candidate():
    n = 4
    u = torch.ones(2, 4 * n)
    u[:, :n] = torch.tensor([0.1, 0.9, 0.1, 0.9])  # start 1010
    u[0, 2 * n + 1] = 0.0  # env 0: candidate 1 is bit 1, candidate 2 bit 2
    u[0, 3 * n + 2] = 0.0
    u[1, n + 3] = 0.3  # env 1: candidate 0 is bit 3
    start, goal = start_and_goal(u, n)
    assert start.tolist() == [[True, False, True, False]] * 2
    assert goal.tolist() == [[True, True, True, False], [True, False, True, True]]


def test_reference_is_the_classic_envs_step():
    """On the same start draws, the reference steps as foxdqn.envs.bitflip.BitFlipEnv does."""
    num, n, k = 40, 5, 13
    state, goal, steps, action, u = _case(num, n, k, seed=9)
    env = BitFlipEnv(num, n, "cpu", torch.Generator().manual_seed(0))
    env.set_state(state, goal, steps)
    env._draw_starts = lambda: start_and_goal(u, n)
    want = env.step(action)
    (s, g, st), got = _run([state, goal, steps, action, u], "torch")
    assert torch.equal(s, env.state) and torch.equal(g, env.goal) and torch.equal(st, env.steps)
    for name in ("next_obs", "obs", "reward", "terminated", "truncated"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    for name, key in (("episode_return", "episode_return"), ("done", "episode_done"),
                      ("episode_length", "episode_length"), ("is_success", "is_success")):
        assert torch.equal(getattr(got, name), want.info[key]), name


def test_trajectory_of_many_steps_matches():
    """60 steps of 19 envs of 7 bits from fresh starts: in-place state, goal and counters evolve alike."""
    g = torch.Generator().manual_seed(3)
    num, n, k = 19, 7, 10
    state, goal = start_and_goal(torch.rand(num, (1 + k) * n, generator=g), n)
    kern = [state.clone(), goal.clone(), torch.zeros(num, dtype=I64)]
    ref = [t.clone() for t in kern]
    ended = 0
    for _ in range(60):
        action = torch.randint(0, n, (num,), generator=g)
        u = torch.rand(num, (1 + k) * n, generator=g)
        ok = bitflip_step(*kern, action, u, backend="triton")
        orr = bitflip_step(*ref, action, u, backend="torch")
        assert torch.equal(ok.obs, orr.obs) and torch.equal(ok.done, orr.done)
        assert all(torch.equal(a, b) for a, b in zip(kern, ref))
        ended += int(orr.done.sum())
        assert not bool((ref[0] == ref[1]).all(dim=1).any())  # a goal is never the state it starts from
    assert ended > num


def test_argument_errors():
    state, goal, steps, action, u = _case(5, 4, 3, 0)
    with pytest.raises(ValueError, match="state must be a contiguous bool"):
        bitflip_step(state.float(), goal, steps, action, u)
    with pytest.raises(ValueError, match="goal must be"):
        bitflip_step(state, goal[:4], steps, action, u)
    with pytest.raises(ValueError, match="steps must be"):
        bitflip_step(state, goal, steps.int(), action, u)
    with pytest.raises(ValueError, match="action must be"):
        bitflip_step(state, goal, steps, action[:4], u)
    with pytest.raises(ValueError, match="u must be"):
        bitflip_step(state, goal, steps, action, u[:, :7].contiguous())
    with pytest.raises(ValueError, match="u must be"):
        bitflip_step(state, goal, steps, action, u[:, :4].contiguous())  # K = 0
    with pytest.raises(ValueError, match="u must be"):
        bitflip_step(state, goal, steps, action, u.half())
    with pytest.raises(ValueError, match="obs_dtype"):
        bitflip_step(state, goal, steps, action, u, torch.int64)
    with pytest.raises(ValueError, match="backend"):
        bitflip_step(state, goal, steps, action, u, backend="cuda")


def test_auto_is_the_reference_on_the_cpu():
    case = _case(9, 3, 22, 1)
    _assert_equal(_run(case, "auto"), (case[:3], bitflip_step_reference(*case)))


@pytest.mark.gpu
@pytest.mark.parametrize("num,n,k", [(1, 1, 64), (1000, 10, 7), (4096, 70, 1)])
def test_compiled_kernel_matches_reference_on_cuda(num, n, k):
    case = _case(num, n, k, seed=num + n, device="cuda")
    _assert_equal(_run(case, "auto"), _run(case, "torch"))


@pytest.mark.gpu
def test_captured_kernel_matches_reference():
    case = _case(300, 12, 6, 5, "cuda")
    state, goal, steps = (t.clone() for t in case[:3])
    graph, out = capture_graph(lambda: bitflip_step(state, goal, steps, case[3], case[4]), warmup=0)
    for t, c in zip((state, goal, steps), case[:3]):
        t.copy_(c)
    graph.replay()
    _assert_equal(((state, goal, steps), out), _run(case, "torch"))
