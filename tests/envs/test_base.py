"""foxdqn.envs.base: every env satisfies BatchedEnv itself (members, types, shapes), and the collect hooks."""
import math

import numpy as np
import pytest
import torch

from foxdqn.config.schema import EnvConfig
from foxdqn.envs import BatchedEnv, CollectHook, ExecutionConfig, StepOut, TradingEnv
from foxdqn.envs.base import NO_HOOK
from foxdqn.envs.bitflip import BitFlipEnv
from foxdqn.envs.cartpole import CartPoleEnv
from foxdqn.envs.gym_adapter import GymVectorEnv
from foxdqn.envs.trading_hook import TRADING_HOOK
from foxdqn.replay import ReplayBuffer
from foxdqn.replay.regime import RegimeWeights, volatility_ratio

from support import market_from_arrays

CPU = torch.device("cpu")
N = 3
MEMBERS = ("num_envs", "obs_dim", "obs_shape", "obs_dtype", "num_actions", "max_episode_steps", "device", "on_host",
           "collect_hook", "reset_all", "step", "close")


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _trading(make_arrays, eval_mode=False, **kw):
    arrays = make_arrays(60)
    market = market_from_arrays(**arrays, features=np.ones((60, 3), np.float32), split=(10, 50),
                                 median_volatility=1e-3)
    args = dict(num_envs=1 if eval_mode else N, window=4, episode_length=7, execution=ExecutionConfig(),
                device=CPU, dtype=torch.float64, generator=_gen(), eval_mode=eval_mode)
    return TradingEnv(market, "train", **{**args, **kw})


ENVS = {
    "trading": lambda make_arrays: _trading(make_arrays),
    "cartpole": lambda make_arrays: CartPoleEnv(N, CPU, _gen(), dtype=torch.float64),
    "bitflip": lambda make_arrays: BitFlipEnv(N, 5, CPU, _gen()),
    "gym": lambda make_arrays: GymVectorEnv(EnvConfig(name="gym", id="CartPole-v1"), N, CPU, seed=0),
}
EXPECTED = {  # obs_shape, obs_dtype, num_actions, max_episode_steps, on_host, hook
    "trading": ((4 * 3 + 2,), torch.float32, 45, 7, False, TRADING_HOOK),
    "cartpole": ((4,), torch.float32, 2, 500, False, NO_HOOK),
    "bitflip": ((10,), torch.float32, 5, 5, False, NO_HOOK),
    "gym": ((4,), torch.float32, 2, 500, True, NO_HOOK),
}


@pytest.mark.parametrize("name", list(ENVS))
def test_every_env_satisfies_the_protocol(name, make_arrays):
    env = ENVS[name](make_arrays)
    try:
        assert isinstance(env, BatchedEnv)
        missing = [m for m in MEMBERS if not hasattr(type(env), m) and m not in vars(env)]
        assert not missing, f"{type(env).__name__} lacks {missing}"
        shape, obs_dtype, num_actions, max_steps, on_host, hook = EXPECTED[name]
        assert type(env.num_envs) is int and env.num_envs == N
        assert type(env.obs_shape) is tuple and env.obs_shape == shape and all(type(d) is int for d in shape)
        assert type(env.obs_dim) is int and env.obs_dim == math.prod(env.obs_shape)
        assert isinstance(env.obs_dtype, torch.dtype) and env.obs_dtype == obs_dtype
        assert type(env.num_actions) is int and env.num_actions == num_actions
        assert type(env.max_episode_steps) is int and env.max_episode_steps == max_steps
        assert isinstance(env.device, torch.device) and env.device == CPU
        assert type(env.on_host) is bool and env.on_host is on_host
        assert isinstance(env.collect_hook, CollectHook) and env.collect_hook is hook

        obs = env.reset_all()
        assert obs.shape == (N, env.obs_dim) and obs.device == env.device
        assert obs.to(env.obs_dtype).dtype == env.obs_dtype
        out = env.step(torch.zeros(N, dtype=torch.int64))
        assert isinstance(out, StepOut)
        for o in (out.next_obs, out.obs):
            assert o.shape == (N, env.obs_dim) and o.dtype == obs.dtype
        assert out.reward.shape == (N,) and out.reward.is_floating_point()
        assert out.terminated.dtype == out.truncated.dtype == torch.bool
        assert out.terminated.shape == out.truncated.shape == (N,)
        info = out.info
        assert info["episode_done"].dtype == torch.bool and info["episode_length"].dtype == torch.int64
        assert info["episode_return"].is_floating_point()
        assert all(info[k].shape == (N,) for k in ("episode_done", "episode_length", "episode_return"))
        assert torch.equal(info["episode_done"], out.terminated | out.truncated)
    finally:
        assert env.close() is None


def test_an_object_without_the_members_is_not_a_batched_env():
    class Partial:
        num_envs, obs_dim, num_actions = 1, 4, 2

        def reset_all(self):
            return torch.zeros(1, 4)

        def step(self, action):
            raise NotImplementedError

    assert not isinstance(Partial(), BatchedEnv)


def test_trading_max_episode_steps_bounds_every_episode(make_arrays):
    env = _trading(make_arrays, episode_length=40)  # longer than the split allows: 49 - 10 = 39 steps
    assert env.max_episode_steps == env.last_bar - env.first_valid == 39
    env = _trading(make_arrays)
    env.reset_all()
    gen = _gen(1)
    lengths = []
    for _ in range(50):
        out = env.step(torch.randint(0, 45, (N,), generator=gen))
        lengths += out.info["episode_length"][out.info["episode_done"]].tolist()
    assert lengths and max(lengths) == env.max_episode_steps == 7
    walk = _trading(make_arrays, eval_mode=True).run_policy(lambda obs, env: torch.tensor([19]))  # flat
    assert walk["actions"].size == _trading(make_arrays, eval_mode=True).max_episode_steps == 39


def test_base_hook_adds_nothing():
    out = StepOut(*(torch.zeros(2),) * 5, info={"fill": torch.ones(2, dtype=torch.bool)})
    assert NO_HOOK.replay_extras(None, None) == {}
    assert NO_HOOK.trades(out) is None


def test_trading_hook_gives_the_regime_ratio_only_to_a_regime_replay(make_arrays):
    env = _trading(make_arrays)
    env.reset_all()
    replay = ReplayBuffer(16, N, env.obs_dim, CPU, 1, 0.99)
    assert env.collect_hook.replay_extras(env, replay) == {}
    replay.set_regime(RegimeWeights(0.5, 1.5, [1.0, 1.0, 1.0], CPU))
    extras = env.collect_hook.replay_extras(env, replay)
    assert list(extras) == ["vol_ratio"]
    expected = volatility_ratio(env.market_state()[1], env.median_volatility)
    assert extras["vol_ratio"].dtype == torch.float32 and torch.equal(extras["vol_ratio"], expected)
    assert not torch.equal(expected, torch.ones_like(expected))  # a real ratio, not the m_v <= 0 fallback
    out = env.step(torch.full((N,), 4 * 9, dtype=torch.int64))  # long at market: every env fills
    assert torch.equal(env.collect_hook.trades(out), out.info["fill"]) and out.info["fill"].all()


@pytest.mark.parametrize("name", ["trading", "cartpole"])
def test_draw_step_ahead_gives_the_step_it_would_draw(name, make_arrays):
    """``step(action, draw_step())`` is ``step(action)`` from the same generator state, over steps
    that reset (the drawn start bars / start states are used); an env in eval mode draws nothing."""
    a, b = ENVS[name](make_arrays), ENVS[name](make_arrays)
    a.reset_all(), b.reset_all()
    gen = torch.Generator().manual_seed(1)
    resets = 0
    for _ in range(40):  # past the trading episode length (7) and CartPole's random-action failures
        action = torch.randint(0, a.num_actions, (N,), generator=gen)
        out_a = a.step(action)
        out_b = b.step(action, b.draw_step())
        for x, y in zip(out_a[:5], out_b[:5]):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
        resets += int(out_a.info["episode_done"].sum())
    assert resets >= N  # the drawn values were used
    if name == "trading":
        assert _trading(make_arrays, eval_mode=True).draw_step() is None
