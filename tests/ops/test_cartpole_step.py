"""cartpole_step: Triton kernel vs torch reference (odd N, thresholds, time limit, any action),
argument checks, and on the GPU the compiled kernel, captured, against the reference."""
import math

import pytest
import torch

from foxdqn.ops.cartpole_step import (THETA_THRESHOLD_RADIANS, X_THRESHOLD, cartpole_step,
                                      cartpole_step_reference)

from support import assert_close_report, capture_graph

F64, I64 = torch.float64, torch.int64


def _case(n, seed, device="cpu", near_edges=True, max_steps=500):
    """Random states (some just inside the thresholds, where a step may terminate), episode step
    counts (some one short of the time limit), actions in {-1, 0, 1, 2} (all but 1 push left)
    and reset draws."""
    g = torch.Generator().manual_seed(seed)
    state = (torch.rand(n, 4, generator=g, dtype=F64) - 0.5) * torch.tensor([4.0, 3.0, 0.35, 3.0], dtype=F64)
    if near_edges:
        edge = torch.rand(n, generator=g) < 0.3
        sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).to(F64)
        state[edge, 0] = sign[edge] * (X_THRESHOLD - 1e-3 * torch.rand(int(edge.sum()), generator=g, dtype=F64))
        state[edge, 2] = sign[edge] * (THETA_THRESHOLD_RADIANS - 1e-3 * torch.rand(int(edge.sum()), generator=g,
                                                                                     dtype=F64))
    steps = torch.randint(0, max_steps, (n,), generator=g)
    steps[torch.rand(n, generator=g) < 0.2] = max_steps - 1
    action = torch.randint(-1, 3, (n,), generator=g)
    u = torch.rand(n, 4, generator=g, dtype=F64)
    return [t.to(device) for t in (state, steps, action, u)]


def _both(n, seed, obs_dtype, max_steps=500, device="cpu", triton_backend="triton"):
    state, steps, action, u = _case(n, seed, device, max_steps=max_steps)
    out = {}
    for backend in (triton_backend, "torch"):
        s, st = state.clone(), steps.clone()
        res = cartpole_step(s, st, action, u, max_steps, obs_dtype, backend=backend)
        out[backend] = (s, st, res)
    return out[triton_backend], out["torch"]


def _compare(kern, ref, obs_dtype):
    (s_k, st_k, o_k), (s_r, st_r, o_r) = kern, ref
    assert torch.equal(o_k.terminated.cpu(), o_r.terminated.cpu()), "terminated"
    assert torch.equal(o_k.truncated.cpu(), o_r.truncated.cpu()), "truncated"
    assert torch.equal(o_k.done.cpu(), o_r.done.cpu()), "done"
    assert torch.equal(st_k.cpu(), st_r.cpu()), "steps"
    assert torch.equal(o_k.episode_length.cpu(), o_r.episode_length.cpu()), "episode_length"
    assert o_k.terminated.dtype == o_k.truncated.dtype == o_k.done.dtype == torch.bool
    # float64 state: same expressions, FMA contraction on the GPU at most -> 1e-15-level differences
    assert_close_report(s_k, s_r, rtol=1e-12, atol=1e-14, name="state")
    tol = dict(rtol=1e-12, atol=1e-14) if obs_dtype == F64 else dict(rtol=2e-7, atol=1e-9)
    for name in ("next_obs", "obs"):
        a, e = getattr(o_k, name), getattr(o_r, name)
        assert a.dtype == e.dtype == obs_dtype and a.shape == e.shape, name
        assert_close_report(a, e, name=name, **tol)
    for name in ("reward", "episode_return"):
        a, e = getattr(o_k, name), getattr(o_r, name)
        assert a.dtype == obs_dtype and torch.equal(a.cpu(), e.cpu()), name


@pytest.mark.parametrize("n", [1, 7, 128, 131])
@pytest.mark.parametrize("obs_dtype", [torch.float32, F64])
def test_kernel_matches_reference(n, obs_dtype):
    kern, ref = _both(n, seed=n, obs_dtype=obs_dtype)
    _compare(kern, ref, obs_dtype)
    done = ref[2].done
    # the case exercises terminations, truncations and untouched envs
    if n >= 128:
        assert ref[2].terminated.any() and ref[2].truncated.any() and (~done).any()


def test_time_limit_of_one_truncates_every_surviving_env():
    kern, ref = _both(33, seed=3, obs_dtype=torch.float32, max_steps=1)
    _compare(kern, ref, torch.float32)
    o = ref[2]
    assert torch.equal(o.truncated, ~o.terminated) and bool(o.done.all())


def test_trajectory_of_many_steps_matches():
    """80 consecutive steps of 67 envs from fresh starts: in-place state and step counters evolve
    the same way, auto-resets included (random actions keep episodes short)."""
    g = torch.Generator().manual_seed(7)
    n = 67
    state = (0.1 * torch.rand(n, 4, generator=g, dtype=F64) - 0.05)
    steps = torch.zeros(n, dtype=I64)
    sk, stk, sr, str_ = state.clone(), steps.clone(), state.clone(), steps.clone()
    ended = 0
    for _ in range(80):
        action = torch.randint(0, 2, (n,), generator=g)
        u = torch.rand(n, 4, generator=g, dtype=F64)
        ok = cartpole_step(sk, stk, action, u, 500, backend="triton")
        orr = cartpole_step(sr, str_, action, u, 500, backend="torch")
        assert torch.equal(ok.done, orr.done)
        ended += int(orr.done.sum())
        assert_close_report(sk, sr, rtol=1e-12, atol=1e-14, name="state")
        assert torch.equal(stk, str_)
    assert ended > 0


def test_action_other_than_one_pushes_left():
    state = torch.zeros(4, 4, dtype=F64)
    steps = torch.zeros(4, dtype=I64)
    u = torch.zeros(4, 4, dtype=F64)
    out = cartpole_step(state, steps, torch.tensor([1, 0, -3, 7]), u, 500, F64, backend="triton")
    x_dot = out.next_obs[:, 1]
    # from rest: x_dot' = tau * x_acc, with x_acc = +-force / M minus the pole's reaction
    assert x_dot[0] > 0 and x_dot[1] < 0 and x_dot[2] == x_dot[1] and x_dot[3] == x_dot[1]
    assert math.isclose(float(x_dot[0]), -float(x_dot[1]), rel_tol=1e-12)


def test_argument_errors():
    state, steps, action, u = _case(5, 0)
    with pytest.raises(ValueError, match="state must be a contiguous float64"):
        cartpole_step(state.float(), steps, action, u, 500)
    with pytest.raises(ValueError, match="steps must be"):
        cartpole_step(state, steps.int(), action, u, 500)
    with pytest.raises(ValueError, match="action must be"):
        cartpole_step(state, steps, action[:4], u, 500)
    with pytest.raises(ValueError, match="u must be"):
        cartpole_step(state, steps, action, u.t().contiguous().t(), 500)
    with pytest.raises(ValueError, match="max_episode_steps"):
        cartpole_step(state, steps, action, u, 0)
    with pytest.raises(ValueError, match="obs_dtype"):
        cartpole_step(state, steps, action, u, 500, torch.int64)
    with pytest.raises(ValueError, match="backend"):
        cartpole_step(state, steps, action, u, 500, backend="cuda")


def test_reference_is_the_cpu_path():
    state, steps, action, u = _case(9, 1)
    a, b = state.clone(), steps.clone()
    auto = cartpole_step(a, b, action, u, 500)
    ref = cartpole_step_reference(state, steps, action, u, 500, torch.float32)
    assert torch.equal(a, state) and torch.equal(b, steps) and torch.equal(auto.obs, ref.obs)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 10, 1000])
def test_compiled_kernel_matches_reference_on_cuda(n):
    kern, ref = _both(n, seed=11 + n, obs_dtype=torch.float32, device="cuda", triton_backend="auto")
    _compare(kern, ref, torch.float32)


@pytest.mark.gpu
def test_captured_kernel_matches_reference():
    state, steps, action, u = _case(300, 5, "cuda")
    s_g, st_g = state.clone(), steps.clone()
    graph, out = capture_graph(lambda: cartpole_step(s_g, st_g, action, u, 500), warmup=0)
    s_g.copy_(state)
    st_g.copy_(steps)
    graph.replay()
    s_r, st_r = state.clone(), steps.clone()
    ref = cartpole_step(s_r, st_r, action, u, 500, backend="torch")
    _compare((s_g, st_g, out), (s_r, st_r, ref), torch.float32)
