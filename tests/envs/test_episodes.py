"""Episodes: random starts, truncation, auto-reset, batching, eval mode."""
import math

import numpy as np
import pytest
import torch

from foxdqn.envs import NUM_ACTIONS, ExecutionConfig
from foxdqn.execution.orders import compose
from foxdqn.errors import ConfigError


def window_rows(obs_row, W, F=2):
    """Bar index of each window row, from the test features (feature f of bar t = 10*t + f)."""
    return [int(round(float(v) / 10.0)) for v in obs_row[: W * F : F]]


def test_random_starts_within_bounds_and_reproducible(make_env, make_arrays):
    arrays = make_arrays(80)
    # split (20, 60), window 8 -> first valid 20; last bar 59; L = 10 -> starts in [20, 49]
    env = make_env(arrays=arrays, window=8, split=(20, 60), num_envs=3000, episode_length=10,
                   eval_mode=False, seed=123)
    assert (env.first_valid, env.last_bar, env.start_high) == (20, 59, 49)
    env.reset_all()
    starts = env.t.clone()
    assert int(starts.min()) == 20 and int(starts.max()) == 49
    assert len(torch.unique(starts)) == 30
    again = make_env(arrays=arrays, window=8, split=(20, 60), num_envs=3000, episode_length=10,
                     eval_mode=False, seed=123)
    again.reset_all()
    assert torch.equal(again.t, starts)
    other = make_env(arrays=arrays, window=8, split=(20, 60), num_envs=3000, episode_length=10,
                     eval_mode=False, seed=124)
    other.reset_all()
    assert not torch.equal(other.t, starts)
    # the window may reach before the split: split (0, 40) with window 8 starts at bar 7
    early = make_env(arrays=arrays, window=8, split=(0, 40), num_envs=500, episode_length=10, eval_mode=False)
    obs = early.reset_all()
    assert int(early.t.min()) == 7
    for i in range(5):
        t = int(early.t[i])
        assert window_rows(obs[i], 8) == list(range(t - 7, t + 1))


def test_truncation_at_episode_length_and_auto_reset(make_env, make_arrays):
    env = make_env(arrays=make_arrays(60), window=2, split=(0, 60), num_envs=16, episode_length=3,
                   eval_mode=False, seed=7)
    gen = torch.Generator().manual_seed(1)
    env.reset_all()
    starts = env.t.clone()
    rewards = torch.zeros(16, dtype=torch.float64)
    for k in range(1, 4):
        out = env.step(torch.randint(0, NUM_ACTIONS, (16,), generator=gen))
        rewards += out.reward
        assert not out.terminated.any()
        if k < 3:
            assert not out.truncated.any() and not out.info["episode_done"].any()
            assert torch.equal(env.t, starts + k)
            assert torch.equal(out.obs, out.next_obs)
            assert (out.info["episode_return"] == 0).all()
    assert out.truncated.all() and out.info["episode_done"].all()
    # next_obs is the pre-reset observation at bar start + 3
    for i in range(16):
        t = int(starts[i]) + 3
        assert window_rows(out.next_obs[i], 2) == [t - 1, t]
    torch.testing.assert_close(out.info["episode_return"], rewards, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.info["episode_return"], torch.log(out.info["equity"]), rtol=0, atol=1e-12)
    # auto-reset: fresh episodes, flat, equity 1, new random starts; obs is the post-reset observation
    assert (env.steps == 0).all() and (env.units == 0).all() and (env.exposure_idx == 2).all()
    assert (env.equity == 1.0).all() and (env.cash == 1.0).all() and (env.episode_return == 0).all()
    assert ((env.t >= env.first_valid) & (env.t <= env.start_high)).all()
    assert not torch.equal(env.t, starts)
    assert torch.equal(out.obs, env.observe())
    assert (out.obs[:, -2:] == 0).all()


def test_truncation_at_split_end(make_env, make_arrays):
    # split (0, 6), window 2: first valid 1, last bar 5; L = 10 is longer than the split
    env = make_env(arrays=make_arrays(10), window=2, split=(0, 6), episode_length=10, eval_mode=False, num_envs=2)
    assert env.start_high == env.first_valid == 1
    env.reset_all()
    action = torch.tensor([compose(4, 0, 0), compose(0, 2, 1)])
    for k in range(1, 9):
        out = env.step(action)
        assert (env.t <= 5).all()
        expect_done = k % 4 == 0  # 4 steps from bar 1 to bar 5
        assert bool(out.truncated.all()) is expect_done and bool(out.truncated.any()) is expect_done
        assert int(env.t[0]) == (1 if expect_done else 1 + k % 4)


def test_long_runs_stay_inside_the_split(make_env, make_arrays):
    env = make_env(arrays=make_arrays(50), window=4, split=(10, 30), num_envs=64, episode_length=7,
                   eval_mode=False, seed=3)
    gen = torch.Generator().manual_seed(0)
    env.reset_all()
    dones = 0
    for _ in range(60):
        t_before = env.t.clone()
        out = env.step(torch.randint(0, NUM_ACTIONS, (64,), generator=gen))
        assert ((env.t >= 10) & (env.t <= 29)).all()
        assert (t_before + 1 <= 29).all()  # the bar an order executes in is inside the split
        assert (env.steps < 7).all()
        dones += int(out.info["episode_done"].sum())
    assert dones >= 64 * 60 // 7 - 64


def test_batched_envs_equal_single_env_runs(make_env, make_arrays):
    # split (0, 8), window 3, L = 5: every episode starts at bar 2 (deterministic), so N envs and
    # N single envs see the same bars; truncation and auto-reset happen along the way
    arrays = make_arrays(12, seed=5)
    N, steps = 5, 14
    gen = torch.Generator().manual_seed(11)
    actions = torch.randint(0, NUM_ACTIONS, (steps, N), generator=gen)
    kw = dict(arrays=arrays, window=3, split=(0, 8), episode_length=5, eval_mode=False)
    batched = make_env(num_envs=N, **kw)
    assert batched.start_high == batched.first_valid
    singles = [make_env(num_envs=1, **kw) for _ in range(N)]
    obs_b = batched.reset_all()
    obs_s = [s.reset_all() for s in singles]
    state = ("t", "steps", "cash", "units", "entry_price", "equity", "exposure_idx", "episode_return")
    n_done = n_fills = 0
    for k in range(steps):
        out_b = batched.step(actions[k])
        n_done += int(out_b.info["episode_done"].sum())
        n_fills += int(out_b.info["fill"].sum())
        for i, env in enumerate(singles):
            assert torch.equal(obs_b[i], obs_s[i][0])
            out = env.step(actions[k, i : i + 1])
            for name in ("next_obs", "reward", "terminated", "truncated", "obs"):
                torch.testing.assert_close(getattr(out_b, name)[i], getattr(out, name)[0], rtol=0, atol=1e-13)
            for name, value in out.info.items():
                torch.testing.assert_close(out_b.info[name][i], value[0], rtol=0, atol=1e-13)
            for name in state:
                torch.testing.assert_close(getattr(batched, name)[i], getattr(env, name)[0], rtol=0, atol=1e-13)
            obs_s[i] = out.obs
        obs_b = out_b.obs
    assert n_done == 2 * N  # two truncations per env in 14 steps of 5-step episodes
    assert n_fills >= N  # the comparison covered filled orders, not only no-ops


def _policy(obs, env):
    """A deterministic policy cycling over targets and order types."""
    k = int(env.t[0])
    return torch.tensor([compose((k // 3) % 5, k % 3, (k // 2) % 3)])


def test_eval_mode_walks_the_split_once_deterministically(make_env, make_arrays):
    arrays = make_arrays(70, seed=2)
    env = make_env(arrays=arrays, window=4, split=(10, 60), episode_length=5, eval_mode=True)
    assert env.first_valid == 10 and env.last_bar == 59
    res = env.run_policy(_policy)
    S = 49
    assert res["index"].tolist() == list(range(10, 60))
    assert res["equity"].shape == (S + 1,) and res["equity"][0] == 1.0
    for name in ("exposure", "fills", "costs", "fees", "rewards", "actions", "traded_units", "fill_price"):
        assert res[name].shape == (S,), name
    assert int(res["trades"]) == int(res["fills"].sum()) > 5
    assert not bool(res["terminated"])
    np.testing.assert_allclose(np.log(res["equity"][1:]) - np.log(res["equity"][:-1]), res["rewards"], atol=1e-12)
    # the exposure held changes exactly on fills
    held = np.concatenate([[0.0], res["exposure"]])
    assert ((held[1:] != held[:-1]) == res["fills"]).all()
    # deterministic: a second walk (same env, and a fresh env with another seed) is identical
    again = env.run_policy(_policy)
    other = make_env(arrays=arrays, window=4, split=(10, 60), episode_length=5, eval_mode=True, seed=99)
    for r in (again, other.run_policy(_policy)):
        for name, value in res.items():
            np.testing.assert_array_equal(r[name], value, err_msg=name)
    # same numbers as stepping by hand
    obs = env.reset_all()
    curve = [1.0]
    for _ in range(S):
        out = env.step(_policy(obs, env))
        obs = out.obs
        curve.append(float(out.info["equity"][0]))
    np.testing.assert_array_equal(np.array(curve), res["equity"])
    assert bool(out.truncated[0]) and int(env.t[0]) == 59
    # after the end: frozen, keeps returning truncated with reward 0
    before = (env.cash.clone(), env.units.clone(), env.equity.clone())
    for _ in range(3):
        out = env.step(torch.tensor([compose(0, 0, 2)]))
        assert bool(out.truncated[0]) and not bool(out.terminated[0]) and bool(out.info["episode_done"][0])
        assert float(out.reward[0]) == 0.0 and not bool(out.info["fill"][0])
        assert int(env.t[0]) == 59
    assert all(torch.equal(a, b) for a, b in zip(before, (env.cash, env.units, env.equity)))
    # reset_all starts the walk again
    env.reset_all()
    assert int(env.t[0]) == 10 and not bool(env.step(torch.tensor([22])).truncated[0])


def test_max_eval_bars_ends_an_eval_walk_early(make_env, make_arrays):
    """debug.max_eval_bars (a smoke run's evaluation): an eval walk of N bars at most is the first
    N steps of the whole walk, bit for bit; a cap past the split's end walks the whole split;
    training mode ignores it; a cap that is not an integer >= 1 is refused, naming it."""
    arrays = make_arrays(70, seed=2)
    whole = make_env(arrays=arrays, window=4, split=(10, 60), eval_mode=True).run_policy(_policy)
    env = make_env(arrays=arrays, window=4, split=(10, 60), eval_mode=True, max_eval_bars=12)
    assert (env.first_valid, env.last_bar, env.max_episode_steps) == (10, 22, 12)
    short = env.run_policy(_policy)
    assert short["index"].tolist() == list(range(10, 23)) and short["equity"].shape == (13,)
    for name in ("equity", "exposure", "fills", "costs", "fees", "rewards", "actions", "traded_units", "fill_price"):
        np.testing.assert_array_equal(short[name], whole[name][:short[name].shape[0]], err_msg=name)
    assert short["trades"] == int(short["fills"].sum())
    longer = make_env(arrays=arrays, window=4, split=(10, 60), eval_mode=True, max_eval_bars=500)
    assert longer.last_bar == 59
    np.testing.assert_array_equal(longer.run_policy(_policy)["equity"], whole["equity"])
    train = make_env(arrays=arrays, window=4, split=(10, 60), eval_mode=False, episode_length=5, max_eval_bars=3)
    assert train.last_bar == 59
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_eval_bars"):
            make_env(arrays=arrays, window=4, split=(10, 60), eval_mode=True, max_eval_bars=bad)


def test_eval_run_policy_stops_at_ruin(make_env):
    rows = [(100.0, 101.0, 99.0, 100.0, 2e-4)] * 3 + [(100.0, 400.0, 99.0, 400.0, 2e-4)] + \
           [(400.0, 401.0, 399.0, 400.0, 2e-4)] * 4
    env = make_env(rows)
    res = env.run_policy(lambda obs, env: torch.tensor([compose(0, 0, 0)]))  # always short 1.0
    assert bool(res["terminated"])
    assert res["equity"].shape == (4,) and res["index"].tolist() == [0, 1, 2, 3]
    assert res["equity"][-1] < 0
    assert int(res["trades"]) == 1
    assert res["rewards"][-1] == pytest.approx(math.log(1e-6) - math.log(res["equity"][-2]), abs=1e-12)


def test_eval_mode_rules(make_env, make_arrays):
    with pytest.raises(ConfigError, match="^env.num_envs: run_policy walks one env, this env has 4"):
        make_env(arrays=make_arrays(20), num_envs=4, eval_mode=True).run_policy(_policy)
    env = make_env(arrays=make_arrays(20), num_envs=4, eval_mode=False)
    with pytest.raises(ConfigError, match="eval_mode"):
        env.run_policy(_policy)


def test_run_policies_equal_separate_walks(make_env, make_arrays):
    """N walks at once (a population's evaluation) equal N walks of one env each."""
    actions = [compose(4, 0, 1), compose(0, 1, 0), compose(2, 0, 1)]  # long, short (limit), flat
    arrays = make_arrays(40)
    env = make_env(arrays=arrays, window=3, num_envs=3, eval_mode=True)
    together = env.run_policies(lambda obs, e: torch.tensor(actions))
    assert len(together) == 3
    for a, walk in zip(actions, together):
        alone = make_env(arrays=arrays, window=3, num_envs=1, eval_mode=True).run_policy(lambda obs, e, a=a: a)
        assert walk.keys() == alone.keys()
        for k in walk:
            np.testing.assert_array_equal(walk[k], alone[k], err_msg=k)
    assert together[0]["trades"] >= 1 and not np.array_equal(together[0]["equity"], together[2]["equity"])


def test_float32_default_dtype_runs(make_env, make_arrays):
    env = make_env(arrays=make_arrays(40), window=5, num_envs=8, episode_length=10, eval_mode=False,
                   dtype=torch.float32, cfg=ExecutionConfig())
    obs = env.reset_all()
    assert obs.dtype == torch.float32 and obs.shape == (8, env.obs_dim) == (8, 5 * 2 + 2)
    out = env.step(torch.full((8,), compose(4, 0, 1)))
    assert out.reward.dtype == torch.float32 and out.info["fill"].all()
    assert out.terminated.dtype == torch.bool and out.truncated.dtype == torch.bool
