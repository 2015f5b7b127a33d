"""CartPoleEnv agrees with Gymnasium's CartPole-v1 step for step, and never syncs."""
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from foxdqn.envs import TradingEnv
from foxdqn.envs.cartpole import CartPoleEnv

from support import capture_env_step, forbid_syncs

# a linear balancing controller (push right when w·obs > 0) that keeps every start upright for
# 500 steps: it drives episodes to the time limit
BALANCE_W = (0.1, 0.5, 1.0, 0.5)


def _env(N, dtype=torch.float64, seed=0, device="cpu", **kw):
    return CartPoleEnv(N, device, torch.Generator(device=device).manual_seed(seed), dtype=dtype, **kw)


def _gym_envs(N):
    envs = [gym.make("CartPole-v1") for _ in range(N)]
    for i, e in enumerate(envs):
        e.reset(seed=i)
    return envs


def _lockstep(env, envs, steps, policy, rng):
    """Step ours and the Gymnasium envs with the same actions; when an episode ends, both restart
    from our auto-reset state. Returns per-step arrays of both sides."""
    N = env.num_envs
    rec = {k: [] for k in ("state", "gym_state", "obs", "gym_obs", "term", "gym_term", "trunc", "gym_trunc",
                           "reward", "gym_reward", "ep_len", "ep_ret", "done")}
    gym_len = np.zeros(N, dtype=np.int64)
    gym_ep_len = []
    obs = env.observe()
    for _ in range(steps):
        action = policy(obs, rng)
        out = env.step(action)
        g_state, g_obs = np.zeros((N, 4)), np.zeros((N, 4), dtype=np.float32)
        g_term, g_trunc, g_rew = np.zeros(N, bool), np.zeros(N, bool), np.zeros(N)
        ended = np.zeros(N, dtype=np.int64)
        for i, e in enumerate(envs):
            o, r, term, trunc, _ = e.step(int(action[i]))
            g_state[i], g_obs[i], g_term[i], g_trunc[i], g_rew[i] = e.unwrapped.state, o, term, trunc, r
            gym_len[i] += 1
            if term or trunc:
                ended[i] = gym_len[i]
                gym_len[i] = 0
                e.reset()
                e.unwrapped.state = env.state[i].numpy().copy()  # the same new start on both sides
        gym_ep_len.append(ended)
        for k, v in (("state", out.next_obs), ("obs", out.next_obs), ("term", out.terminated),
                     ("trunc", out.truncated), ("reward", out.reward), ("ep_len", out.info["episode_length"]),
                     ("ep_ret", out.info["episode_return"]), ("done", out.info["episode_done"])):
            rec[k].append(v.numpy().copy())
        for k, v in (("gym_state", g_state), ("gym_obs", g_obs), ("gym_term", g_term), ("gym_trunc", g_trunc),
                     ("gym_reward", g_rew)):
            rec[k].append(v)
        obs = out.obs
    rec = {k: np.stack(v) for k, v in rec.items()}
    rec["gym_ep_len"] = np.stack(gym_ep_len)
    return rec


def _check_agreement(rec, dtype):
    if dtype == torch.float64:
        np.testing.assert_allclose(rec["state"], rec["gym_state"], rtol=0, atol=1e-6)
    else:  # float32 observations: the float64 state cast, as Gymnasium returns it
        np.testing.assert_allclose(rec["obs"], rec["gym_obs"], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(rec["term"], rec["gym_term"])
    # Gymnasium's TimeLimit may also set truncated on a terminating step; ours never does
    np.testing.assert_array_equal(rec["trunc"], rec["gym_trunc"] & ~rec["gym_term"])
    np.testing.assert_array_equal(rec["reward"], rec["gym_reward"])
    np.testing.assert_array_equal(rec["done"], rec["gym_term"] | rec["gym_trunc"])
    np.testing.assert_array_equal(rec["ep_len"], rec["gym_ep_len"])
    np.testing.assert_array_equal(rec["ep_ret"], rec["gym_ep_len"].astype(np.float64))  # +1 per step


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_gymnasium_random_actions(dtype):
    N, T = 64, 300
    rng = np.random.default_rng(0)
    env = _env(N, dtype=dtype)
    envs = _gym_envs(N)
    # wider starts than the reset distribution: more terminations, on both bounds
    init = rng.uniform(-0.15, 0.15, (N, 4))
    init[:, 0] = rng.uniform(-2.3, 2.3, N)
    for i, e in enumerate(envs):
        e.unwrapped.state = init[i].copy()
    obs = env.set_state(torch.tensor(init))
    assert obs.dtype == dtype and obs.shape == (N, 4)

    rec = _lockstep(env, envs, T, lambda obs, rng: torch.as_tensor(rng.integers(0, 2, N)), rng)
    _check_agreement(rec, dtype)
    assert rec["term"].sum() > 500  # many episodes, all compared
    x, theta = rec["state"][..., 0], rec["state"][..., 2]
    ended = rec["term"]
    assert (np.abs(x[ended]) > 2.4).any() and (np.abs(theta[ended]) > 12 * 2 * math.pi / 360).any()
    assert not rec["trunc"].any()


def test_truncation_at_500_matches_gymnasium():
    N, T = 16, 520
    env = _env(N, seed=3)
    envs = _gym_envs(N)
    env.reset_all()
    for i, e in enumerate(envs):
        e.unwrapped.state = env.state[i].numpy().copy()
    w = torch.tensor(BALANCE_W, dtype=torch.float64)
    rec = _lockstep(env, envs, T, lambda obs, rng: (obs @ w > 0).long(), None)
    _check_agreement(rec, torch.float64)
    assert not rec["term"].any()
    assert rec["trunc"][499].all() and rec["trunc"].sum() == N  # the 500th step, once per env
    assert (rec["ep_len"][499] == 500).all() and (rec["ep_ret"][499] == 500.0).all()
    assert (rec["ep_len"][:499] == 0).all() and (rec["ep_ret"][:499] == 0).all()


def test_time_limit_and_termination_precedence():
    env = _env(3, max_episode_steps=500)
    state = torch.zeros(3, 4, dtype=torch.float64)
    state[2, 0] = 2.4  # moving right at the bound: terminates on the next step
    state[2, 1] = 1.0
    env.set_state(state, elapsed_steps=torch.tensor([0, 498, 499]))
    out = env.step(torch.tensor([1, 1, 1]))
    assert out.terminated.tolist() == [False, False, True]
    assert out.truncated.tolist() == [False, False, False]  # Gymnasium would also say truncated on env 2
    assert out.info["episode_length"].tolist() == [0, 0, 500]
    assert env.steps.tolist() == [1, 499, 0]
    out = env.step(torch.tensor([0, 0, 0]))
    assert out.truncated.tolist() == [False, True, False] and not out.terminated.any()
    assert out.info["episode_length"].tolist() == [0, 500, 0]
    assert out.info["episode_return"].tolist() == [0.0, 500.0, 0.0]
    assert env.steps.tolist() == [2, 0, 1]

    short = _env(4, max_episode_steps=7)
    short.set_state(torch.zeros(4, 4, dtype=torch.float64))
    for k in range(7):
        out = short.step(torch.tensor([0, 1, 0, 1]))
    assert out.truncated.all() and (out.info["episode_length"] == 7).all()


def test_step_outputs_and_auto_reset():
    N = 32
    env = _env(N, dtype=torch.float32, seed=5)
    obs = env.reset_all()
    assert obs.dtype == torch.float32 and obs.shape == (N, env.obs_dim)
    assert (env.obs_dim, env.num_actions, env.num_envs) == (4, 2, N)
    gen = torch.Generator().manual_seed(0)
    seen_done = torch.zeros(N, dtype=torch.bool)
    for _ in range(60):
        before = env.state.clone()
        out = env.step(torch.randint(0, 2, (N,), generator=gen))
        done = out.info["episode_done"]
        assert out.reward.dtype == torch.float32 and (out.reward == 1).all()
        assert "fill" not in out.info and env.collect_hook.trades(out) is None  # never trades
        assert out.info["episode_length"].dtype == torch.int64
        assert torch.equal(done, out.terminated | out.truncated)
        assert not (out.terminated & out.truncated).any()
        # not done: obs continues next_obs; done: a fresh start in the reset box
        assert torch.equal(out.obs[~done], out.next_obs[~done])
        assert (out.obs[done].abs() <= 0.05).all()
        assert not torch.equal(out.next_obs, before.float())
        assert torch.equal(out.obs, env.observe())
        seen_done |= done
    assert seen_done.all()
    # observations never alias the state tensors
    snap = out.obs.clone()
    env.step(torch.zeros(N, dtype=torch.long))
    assert torch.equal(out.obs, snap)


def test_reset_distribution():
    N = 4096
    env = _env(N, seed=1)
    obs = env.reset_all()
    assert (obs >= -0.05).all() and (obs <= 0.05).all()
    assert (obs.min(0).values < -0.049).all() and (obs.max(0).values > 0.049).all()
    assert obs.mean(0).abs().max() < 0.003  # uniform: mean 0, std 0.1/sqrt(12)/sqrt(N) = 0.00045
    assert (obs.std(0) - 0.1 / math.sqrt(12)).abs().max() < 0.002
    assert (env.steps == 0).all()
    # the generator is the only randomness: same seed → same starts, different seed → different
    assert torch.equal(_env(N, seed=1).reset_all(), obs)
    assert not torch.equal(_env(N, seed=2).reset_all(), obs)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="^num_envs"):
        _env(0)
    with pytest.raises(ValueError, match="^max_episode_steps"):
        _env(2, max_episode_steps=0)
    with pytest.raises(ValueError, match="^dtype"):
        _env(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="^generator"):
        CartPoleEnv(2, "cpu", None)
    with pytest.raises(ValueError, match="state"):
        _env(2).set_state(torch.zeros(3, 4))


def test_not_goal_conditioned():
    assert not getattr(CartPoleEnv, "goal_conditioned", False)
    assert not getattr(TradingEnv, "goal_conditioned", False)


def test_env_never_syncs(monkeypatch):
    N, T = 32, 40
    env = _env(N, dtype=torch.float32, max_episode_steps=8)  # truncations as well as terminations
    gen = torch.Generator().manual_seed(0)
    actions = torch.randint(0, 2, (T, N), generator=gen)
    elapsed = torch.zeros(N, dtype=torch.long)

    forbid_syncs(monkeypatch)
    for probe in (lambda t: t.item(), lambda t: bool(t), lambda t: float(t), lambda t: [0, 1][t]):
        with pytest.raises(AssertionError, match="host sync"):
            probe(torch.tensor(1))
    obs = env.reset_all()
    env.set_state(obs.double(), elapsed_steps=elapsed)
    done = torch.zeros(N, dtype=torch.long)
    for k in range(T):
        env.observe()
        out = env.step(actions[k])
        done += out.info["episode_done"].long()
        obs = out.obs
    env.reset_all()
    monkeypatch.undo()

    assert obs.shape == (N, 4)
    assert int(done.min()) >= 5


@pytest.mark.gpu
def test_graph_replay_matches_eager_dynamics():
    N = 256
    env = _env(N, dtype=torch.float32, device="cuda", max_episode_steps=50)
    ref = _env(N, dtype=torch.float32, device="cuda", seed=1, max_episode_steps=50)
    env.reset_all()
    action = torch.zeros(N, dtype=torch.long, device="cuda")
    graph, out = capture_env_step(env, action)
    gen = torch.Generator(device="cuda").manual_seed(0)
    done = torch.zeros(N, dtype=torch.long, device="cuda")
    starts = []
    for _ in range(120):
        action.copy_(torch.randint(0, 2, (N,), device="cuda", generator=gen))
        ref.set_state(env.state, elapsed_steps=env.steps)
        graph.replay()
        expect = ref.step(action)
        for name in ("next_obs", "reward", "terminated", "truncated"):
            torch.testing.assert_close(getattr(out, name), getattr(expect, name))
        for name in ("episode_return", "episode_done", "episode_length"):
            torch.testing.assert_close(out.info[name], expect.info[name])
        d = out.info["episode_done"]
        torch.testing.assert_close(out.obs[~d], out.next_obs[~d])
        done += d.long()
        starts.append(out.obs[d])
    starts = torch.cat(starts)
    assert (starts.abs() <= 0.05).all() and starts.unique().numel() > 100  # replays draw new starts
    assert (done >= 2).all()
