"""BitFlipEnv: hand-written episodes, time limit, goal interface for HER, randomness, no syncs."""
import collections

import pytest
import torch

from foxdqn.envs.bitflip import BitFlipEnv

from support import capture_env_step, forbid_syncs


def _env(N, n, seed=0, device="cpu", **kw):
    return BitFlipEnv(N, n, device, torch.Generator(device=device).manual_seed(seed), **kw)


def _bits(rows):
    return torch.tensor(rows, dtype=torch.bool)


def test_attributes_and_observation_layout():
    env = _env(3, 5)
    assert (env.num_envs, env.obs_dim, env.num_actions, env.goal_dim, env.max_episode_steps) == (3, 10, 5, 5, 5)
    assert BitFlipEnv.goal_conditioned is True
    state = _bits([[1, 0, 0, 1, 1], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    goal = _bits([[0, 0, 0, 0, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]])
    obs = env.set_state(state, goal)
    assert obs.dtype == torch.float32 and obs.shape == (3, 10)
    assert torch.equal(obs, torch.cat([state, goal], 1).float())
    assert torch.equal(env.achieved_goal(obs), state.float())
    assert torch.equal(env.desired_goal(obs), goal.float())
    assert torch.equal(env.observe(), obs)


def test_hand_written_episodes_reach_the_goal():
    # three envs, each flipping the differing bits in turn: 3, 1 and 4 flips needed
    env = _env(3, 4)
    state = _bits([[0, 0, 0, 0], [1, 1, 0, 1], [0, 1, 0, 1]])
    goal = _bits([[1, 0, 1, 1], [1, 0, 0, 1], [1, 0, 1, 0]])
    env.set_state(state, goal)
    plans = [[0, 2, 3, 0], [1, 2, 2, 3], [3, 2, 1, 0]]  # env 1 then wanders off after success
    expected_rewards = [[-1, -1, 0], [0], [-1, -1, -1, 0]]
    rewards = [[], [], []]
    done_at = [None, None, None]
    for k in range(4):
        before = env.state.clone()
        out = env.step(torch.tensor([p[k] for p in plans]))
        # next_obs: the flipped state and the unchanged goal
        for i in range(3):
            flipped = before[i].clone()
            flipped[plans[i][k]] ^= True
            if done_at[i] is None:
                assert torch.equal(out.next_obs[i, :4], flipped.float())
                assert torch.equal(out.next_obs[i, 4:], goal[i].float())
                rewards[i].append(out.reward[i].item())
                if out.info["episode_done"][i]:
                    done_at[i] = k
                    assert out.terminated[i] and not out.truncated[i]
                    assert out.info["is_success"][i].item() == 1.0
                    assert out.info["episode_length"][i].item() == k + 1
                    assert out.info["episode_return"][i].item() == -float(k)
                    # auto-reset: a fresh episode with goal != state
                    assert not torch.equal(out.obs[i, :4], out.obs[i, 4:])
                    assert env.steps[i].item() == 0
                else:
                    assert not out.terminated[i] and not out.truncated[i]
                    assert out.info["is_success"][i].item() == 0.0
                    assert out.info["episode_length"][i].item() == 0
                    assert out.info["episode_return"][i].item() == 0.0
                    assert torch.equal(out.obs[i], out.next_obs[i])
        assert out.reward.dtype == torch.float32
        assert "fill" not in out.info and env.collect_hook.trades(out) is None  # never trades
    assert rewards == expected_rewards
    assert done_at == [2, 0, 3]


def test_truncation_after_n_steps():
    n = 5
    env = _env(2, n)
    # env 0 toggles bit 0 forever (goal never reached); env 1 reaches the goal on step n exactly
    env.set_state(_bits([[0] * n, [0] * n]), _bits([[1] * n, [1] * n]))
    for k in range(n):
        out = env.step(torch.tensor([0, k]))
        last = k == n - 1
        assert out.reward.tolist() == [-1.0, 0.0 if last else -1.0]
        assert out.truncated.tolist() == [last, False]
        assert out.terminated.tolist() == [False, last]
        assert out.info["episode_length"].tolist() == ([n, n] if last else [0, 0])
        assert out.info["episode_return"].tolist() == ([-5.0, -4.0] if last else [0.0, 0.0])
        assert out.info["is_success"].tolist() == ([0.0, 1.0] if last else [0.0, 0.0])
    assert env.steps.tolist() == [0, 0]

    # random play: no episode is longer than n, every truncation comes at step n
    env = _env(256, 6, seed=1)
    env.reset_all()
    gen = torch.Generator().manual_seed(0)
    lengths = collections.Counter()
    for _ in range(60):
        out = env.step(torch.randint(0, 6, (256,), generator=gen))
        assert (env.steps < 6).all()
        assert (out.info["episode_length"][out.truncated] == 6).all()
        assert not (out.terminated & out.truncated).any()
        # the step reward is compute_reward on the step's own next_obs
        assert torch.equal(out.reward, env.compute_reward(env.achieved_goal(out.next_obs),
                                                         env.desired_goal(out.next_obs)))
        assert torch.equal(out.terminated, env.is_success(env.achieved_goal(out.next_obs),
                                                         env.desired_goal(out.next_obs)))
        assert torch.equal(out.info["is_success"], out.terminated.float())
        ended = out.info["episode_done"]
        assert torch.equal(out.info["episode_return"][ended],
                           out.reward[ended] - (out.info["episode_length"][ended] - 1).float())
        lengths.update(out.info["episode_length"][ended].tolist())
    assert set(lengths) <= set(range(1, 7)) and lengths[6] > 0 and out.terminated.dtype == torch.bool


def test_goal_interface_round_trips():
    n = 7
    env = _env(1, n)
    gen = torch.Generator().manual_seed(3)
    obs = torch.randint(0, 2, (5, 4, 2 * n), generator=gen).float()  # any leading shape
    new_goal = torch.randint(0, 2, (5, 4, n), generator=gen).float()
    relabelled = env.with_goal(obs, new_goal)
    assert relabelled.shape == obs.shape and relabelled.dtype == obs.dtype
    assert torch.equal(env.achieved_goal(relabelled), env.achieved_goal(obs))
    assert torch.equal(env.desired_goal(relabelled), new_goal)
    assert torch.equal(env.with_goal(obs, env.desired_goal(obs)), obs)
    assert torch.equal(env.achieved_goal(obs), obs[..., :n]) and torch.equal(env.desired_goal(obs), obs[..., n:])
    obs_copy = obs.clone()
    env.with_goal(obs, new_goal)
    assert torch.equal(obs, obs_copy)  # with_goal does not write into obs
    # a single goal broadcasts over the batch
    g = torch.ones(n)
    assert torch.equal(env.desired_goal(env.with_goal(obs, g)), torch.ones(5, 4, n))

    # hindsight relabelling with the achieved goal: success, reward 0
    achieved = env.achieved_goal(obs)
    hindsight = env.with_goal(obs, achieved)
    r = env.compute_reward(env.achieved_goal(hindsight), env.desired_goal(hindsight))
    assert r.shape == (5, 4) and r.dtype == torch.float32 and (r == 0).all()
    assert env.is_success(achieved, achieved).all()
    # one differing bit is enough for -1
    other = achieved.clone()
    other[..., 2] = 1 - other[..., 2]
    assert (env.compute_reward(achieved, other) == -1).all()
    assert not env.is_success(achieved, other).any()
    assert env.is_success(achieved, other).dtype == torch.bool
    expect = torch.where((achieved == new_goal).all(-1), 0.0, -1.0)
    assert torch.equal(env.compute_reward(achieved, new_goal), expect)
    # bool and float64 goals compare by bit value
    assert (env.compute_reward(achieved.double(), achieved.bool()) == 0).all()


def test_random_starts_reproducible_and_goal_differs():
    N, n = 512, 3
    a, b, c = _env(N, n, seed=7), _env(N, n, seed=7), _env(N, n, seed=8)
    oa, ob, oc = a.reset_all(), b.reset_all(), c.reset_all()
    assert torch.equal(oa, ob) and not torch.equal(oa, oc)
    gen = torch.Generator().manual_seed(0)
    pairs = collections.Counter()
    for _ in range(30):
        act = torch.randint(0, n, (N,), generator=gen)
        outa, outb = a.step(act), b.step(act)
        for name in ("next_obs", "reward", "terminated", "truncated", "obs"):
            assert torch.equal(getattr(outa, name), getattr(outb, name))
        fresh = outa.obs[outa.info["episode_done"]]
        assert not (fresh[:, :n] == fresh[:, n:]).all(1).any()  # goal != start state
        pairs.update(map(tuple, fresh.long().tolist()))
    # starts: (state, goal) uniform over the 2^n * (2^n - 1) = 56 pairs with goal != state
    assert len(pairs) == 56
    total = sum(pairs.values())
    assert max(pairs.values()) < 2 * total / 56 and min(pairs.values()) > total / 56 / 2


@pytest.mark.parametrize("n", [1, 40, 62, 63, 80])
def test_goal_never_equals_start_any_width(n):
    env = _env(1024, n, seed=n)
    obs = env.reset_all()
    assert not (env.state == env.goal).all(1).any()
    assert torch.equal(obs, torch.cat([env.state, env.goal], 1).float())
    if n > 1:
        assert abs(env.state.float().mean().item() - 0.5) < 0.02
        assert abs(env.goal.float().mean().item() - 0.5) < 0.02


def test_invalid_arguments():
    with pytest.raises(ValueError, match="^num_envs"):
        _env(0, 3)
    with pytest.raises(ValueError, match="^n_bits"):
        _env(2, 0)
    with pytest.raises(ValueError, match="^dtype"):
        _env(2, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="^generator"):
        BitFlipEnv(2, 3, "cpu", None)
    with pytest.raises(ValueError, match="goal"):
        _env(2, 3).set_state(torch.zeros(2, 3), torch.zeros(2, 4))


@pytest.mark.parametrize("n", [4, 70])  # exact non-zero mask draw, and the wide-goal fallback
def test_env_never_syncs(monkeypatch, n):
    N, T = 32, 20
    env = _env(N, n)
    gen = torch.Generator().manual_seed(0)
    actions = torch.randint(0, n, (T, N), generator=gen)

    forbid_syncs(monkeypatch)
    for probe in (lambda t: t.item(), lambda t: bool(t), lambda t: float(t), lambda t: [0, 1][t]):
        with pytest.raises(AssertionError, match="host sync"):
            probe(torch.tensor(1))
    obs = env.reset_all()
    env.set_state(env.state, env.goal, elapsed_steps=env.steps)
    done = torch.zeros(N, dtype=torch.long)
    for k in range(T):
        env.observe()
        out = env.step(actions[k])
        nxt = out.next_obs
        env.compute_reward(env.achieved_goal(nxt), env.desired_goal(nxt))
        env.is_success(env.achieved_goal(nxt), env.desired_goal(nxt))
        env.with_goal(nxt, env.achieved_goal(nxt))
        done += out.info["episode_done"].long()
        obs = out.obs
    env.reset_all()
    monkeypatch.undo()

    assert obs.shape == (N, 2 * n)
    assert int(done.min()) >= T // n


@pytest.mark.gpu
@pytest.mark.parametrize("n", [8, 70])
def test_graph_replay_matches_eager(n):
    N = 256
    env = _env(N, n, device="cuda")
    ref = _env(N, n, device="cuda", seed=1)
    env.reset_all()
    action = torch.zeros(N, dtype=torch.long, device="cuda")
    graph, out = capture_env_step(env, action)
    gen = torch.Generator(device="cuda").manual_seed(0)
    done = torch.zeros(N, dtype=torch.long, device="cuda")
    starts = []
    for _ in range(3 * n):
        action.copy_(torch.randint(0, n, (N,), device="cuda", generator=gen))
        ref.set_state(env.state, env.goal, elapsed_steps=env.steps)
        graph.replay()
        expect = ref.step(action)
        for name in ("next_obs", "reward", "terminated", "truncated"):
            torch.testing.assert_close(getattr(out, name), getattr(expect, name))
        for name in ("episode_return", "episode_done", "episode_length", "is_success"):
            torch.testing.assert_close(out.info[name], expect.info[name])
        d = out.info["episode_done"]
        torch.testing.assert_close(out.obs[~d], out.next_obs[~d])
        done += d.long()
        starts.append(out.obs[d])
    starts = torch.cat(starts)
    assert not (starts[:, :n] == starts[:, n:]).all(1).any()
    assert starts.unique(dim=0).shape[0] > 100  # replays draw new starts
    assert (done >= 2).all()
