"""The greedy-episode loop (foxdqn.analysis.backtest.finished_episodes), shared by evaluate_episodes and the
population's member_episodes, in chunks of K steps: the same episodes as the per-step loop it
replaced, whatever K (CPU); captured in a CUDA graph, the same as eager (GPU)."""
import numpy as np
import pytest
import torch

from foxdqn.envs.bitflip import BitFlipEnv
from foxdqn.envs.cartpole import CartPoleEnv
from foxdqn.analysis.backtest import finished_episodes
from foxdqn.device.chunk_graph import CHUNK_STEPS


def cartpole(device="cpu", n=5, seed=3):
    return CartPoleEnv(n, device, torch.Generator(device=device).manual_seed(seed), max_episode_steps=25)


def bitflip(device="cpu", n=6, seed=3):
    return BitFlipEnv(n, 4, device, torch.Generator(device=device).manual_seed(seed))


def push_by_angle(obs):
    """CartPole: push towards the pole's lean, except envs 0 and 1 always push left (short episodes)."""
    e = torch.arange(obs.shape[0], device=obs.device)
    return torch.where(e < 2, 0, (obs[:, 2] + 0.3 * obs[:, 3] > 0).long())


def flip_first_wrong_bit(obs):
    """Bit flipping (4 bits): even envs flip the first bit that differs from the goal (they succeed),
    odd envs always flip bit 0 (they fail unless the goal is one flip of bit 0 away)."""
    state, goal = obs[:, :4] > 0.5, obs[:, 4:] > 0.5
    first = (state != goal).long().argmax(dim=1)
    e = torch.arange(obs.shape[0], device=obs.device)
    return torch.where(e % 2 == 0, first, 0)


def per_step_episodes(env, act, quota):
    """The per-step loop that evaluate_episodes and member_episodes ran before the chunks."""
    obs = env.reset_all().to(torch.float32)
    taken = np.zeros(env.num_envs, dtype=np.int64)
    got = {"env": [], "returns": [], "lengths": [], "success": []}
    with torch.no_grad():
        for _ in range(max(1, quota * int(env.max_episode_steps) + 1)):
            out = env.step(act(obs))
            obs = out.obs.to(torch.float32)
            done = out.info["episode_done"].cpu().numpy() & (taken < quota)
            if done.any():
                taken += done
                got["env"] += np.flatnonzero(done).tolist()
                got["returns"] += out.info["episode_return"].cpu().numpy()[done].tolist()
                got["lengths"] += out.info["episode_length"].cpu().numpy()[done].tolist()
                if "is_success" in out.info:
                    got["success"] += out.info["is_success"].cpu().numpy()[done].tolist()
            if (taken >= quota).all():
                break
    return got


def assert_same(result, expected):
    assert set(result) == {k for k, v in expected.items() if v or k != "success"}
    for k in result:
        assert result[k].tolist() == expected[k], k


@pytest.mark.parametrize("chunk", [1, 4, 7, 64])
def test_cartpole_episodes_equal_the_per_step_loop(chunk):
    expected = per_step_episodes(cartpole(), push_by_angle, 3)
    assert len(expected["env"]) == 15 and len(set(expected["lengths"])) >= 3  # short ones and truncated (25)
    assert 25 in expected["lengths"] and expected["env"] != sorted(expected["env"])
    assert_same(finished_episodes(cartpole(), push_by_angle, 3, chunk=chunk), expected)


@pytest.mark.parametrize("chunk", [2, 5])
def test_bitflip_success_equals_the_per_step_loop(chunk):
    expected = per_step_episodes(bitflip(), flip_first_wrong_bit, 4)
    assert 0 < sum(expected["success"]) < len(expected["success"]) == 24
    assert_same(finished_episodes(bitflip(), flip_first_wrong_bit, 4, chunk=chunk, capturable=True), expected)


def test_bad_quota():
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="^quota: episodes per env must be an integer >= 1"):
            finished_episodes(cartpole(), push_by_angle, bad)


def population(device):
    """Two untrained CartPole members (seeds 1 and 2) on ``device``."""
    from foxdqn.config.compose import load_config
    from foxdqn.population.state import build_population

    base = ["+experiment=cartpole_cleanrl", "debug=smoke", f"device={device}", "log.progress=false",
            "env.num_envs=2", "replay.capacity=64", "agent.batch_size=8", "model.hidden=[8]"]
    return build_population([load_config([*base, f"seed={k}"]) for k in (1, 2)], None, torch.device(device))


def test_member_episodes_equal_the_per_step_loop():
    """member_episodes: member p's metrics from its own envs' first episodes, as the loop it replaced."""
    from foxdqn.analysis.backtest import episode_metrics
    from foxdqn.population.envs import MemberCartPoleEnv
    from foxdqn.population.evaluate import MemberGreedy, member_episodes
    from foxdqn.population.random import MemberRandom

    s = population("cpu")
    episodes, per = 8, 8
    env = MemberCartPoleEnv(MemberRandom([c.seed + 1 for c in s.cfgs], s.device), per, s.device)
    greedy = MemberGreedy(s.online)
    got = per_step_episodes(env, lambda obs: s.action_mode.to_env(greedy(obs).argmax(dim=1), env), 1)
    member = np.array(got["env"]) // per
    expected = [episode_metrics(np.array(got["returns"])[member == m].tolist(),
                                np.array(got["lengths"], dtype=np.float64)[member == m].tolist(), [], episodes)
                for m in range(2)]
    assert max(got["lengths"]) > 2 * CHUNK_STEPS  # member 0's episodes span several chunks
    result = member_episodes(s, episodes, seed_offset=1)
    assert result == expected and result[0] != result[1]


@pytest.mark.gpu
@pytest.mark.parametrize("make, act, quota", [(cartpole, push_by_angle, 3), (bitflip, flip_first_wrong_bit, 30)])
def test_gpu_captured_episodes_equal_eager(make, act, quota):
    cuda = torch.device("cuda")
    eager = finished_episodes(make(cuda, n=32), act, quota, chunk=7)
    env = make(cuda, n=32)
    graphed = finished_episodes(env, act, quota, chunk=7, capturable=True, generators=(env.generator,))
    assert eager.keys() == graphed.keys()
    for k in eager:
        np.testing.assert_array_equal(graphed[k], eager[k], err_msg=k)
    assert_same(eager, per_step_episodes(make(cuda, n=32), act, quota))


@pytest.mark.gpu
def test_gpu_captured_member_episodes_equal_eager():
    from foxdqn.population.evaluate import member_episodes

    s = population("cuda")
    graphed, eager = member_episodes(s, 64, 1, graph=True), member_episodes(s, 64, 1, graph=False)
    assert graphed == eager and graphed[0] != graphed[1]
