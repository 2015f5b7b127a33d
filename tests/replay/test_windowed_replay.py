"""The windowed trading replay (docs/design/replay.md#windowed-trading-replay): a training run whose
replay stores the trading env's state codes samples the same batches, bit for bit, as the same
run with a replay of observations, for a single run (a population of one: uniform n-step, PER) and a
population of two; the replay memory counts the codes."""
from __future__ import annotations

import pytest
import torch

from foxdqn.replay.buffer import replay_bytes
from foxdqn.job.memory import replay_row
from support import iterate, small_state

CPU = torch.device("cpu")
#: eurusd_dqn (the defaults) shrunk: 4 envs, window 8, 2 collect-only and 6 full iterations
RUN = ["env.num_envs=4", "env.window=8", "env.episode_length=16", "replay.capacity=256", "agent.batch_size=16",
       "agent.learning_starts=16", "model.hidden=[16]"]
ROWS = ("obs", "next_obs", "action", "reward", "terminal", "ended", "episode")  # the [T, N, ...] columns


def _obs_replay(s):
    """A replay of observations like ``s.replay`` (same kind, capacity, n-step, γ, PER settings), without a decoder."""
    from foxdqn.population.replay import build_member_replay

    return build_member_replay(s.cfg, s.params, s.rng, s.device, s.updates, s.env.obs_dim, torch.float32)


def _recording(replay, sample="sample"):
    """Record every batch ``replay.<sample>`` returns."""
    batches, real = [], getattr(replay, sample)

    def record(*args, **kwargs):
        batch = real(*args, **kwargs)
        batches.append(batch)
        return batch
    setattr(replay, sample, record)
    return batches


def _assert_same_batches(coded, plain):
    assert len(coded) == len(plain) > 0
    for k, (a, b) in enumerate(zip(coded, plain)):
        assert a.obs.dtype == b.obs.dtype == torch.float32 and a.obs.numel() == b.obs.numel(), f"batch {k}"
        assert a.next_code is not None and b.next_code is None  # the decoded batch keeps the codes of s'
        for name in a._fields[:-1]:  # a population's plain obs are [P, B, D] views, its decoded ones [P·B, D]
            x, y = getattr(a, name), getattr(b, name)
            assert torch.equal(x.reshape(-1, *x.shape[-1:]), y.reshape(-1, *y.shape[-1:])), f"batch {k}: {name} differs"


def _train_alike(coded, plain, collect_iters, full_iters):
    """Give ``plain`` a replay of observations, train both states alike, and check that every
    sampled batch and the trained weights are equal bit for bit."""
    plain.replay = _obs_replay(plain)
    plain.env.step_next_obs = True  # this replay stores the observations: the step must return next_obs
    a, b = _recording(coded.replay, "sample_members"), _recording(plain.replay, "sample_members")
    for s in (coded, plain):
        iterate(s, False, collect_iters, full_iters)
    _assert_same_batches(a, b)
    for x, y in zip(coded.online.parameters(), plain.online.parameters()):
        assert torch.equal(x, y)


@pytest.mark.parametrize("overrides", [["replay.n_step=3"], ["replay=per"]], ids=["uniform-n3", "per"])
def test_training_run_samples_the_observations_an_obs_replay_samples(overrides):
    """Two identical runs, one with the code replay (decoded by the Triton kernel in the
    interpreter), one with a replay of observations: every sampled batch and the trained weights
    are equal bit for bit, and the code replay holds 4 values per state."""
    coded, market = small_state([*RUN, *overrides], bars=400)
    plain, _ = small_state([*RUN, *overrides], bars=400)
    assert coded.replay.decoder is not None and coded.replay.obs.shape[-1] == 4
    assert coded.replay.obs.dtype == coded.env.code_dtype == torch.float32
    assert coded.env.step_next_obs is False  # the code replay needs no next_obs from the step
    coded.env.decode_backend = "triton"
    _train_alike(coded, plain, 2, 6)
    assert not torch.equal(coded.replay.obs, torch.zeros_like(coded.replay.obs))


def test_replay_memory_counts_the_codes():
    """replay_row / replay_bytes (the precheck and the population's memory cap) count what the built
    replay holds: 4 code values of 4 bytes (float32 env) or 8 bytes (float64 env) per state,
    instead of the W*F+2 float32 observation."""
    for dtype, itemsize in (("float32", 4), ("float64", 8)):
        s, market = small_state([*RUN, f"env.dtype={dtype}"], bars=400)
        assert replay_row(s.cfg, market) == (4, itemsize)
        held = sum(getattr(s.replay, name).nbytes for name in ROWS)
        assert held == replay_bytes(s.replay.capacity, *replay_row(s.cfg, market))
        obs_replay = replay_bytes(s.replay.capacity, s.env.obs_dim)
        assert held < obs_replay


def test_population_samples_the_observations_an_obs_replay_samples():
    """Two members of a trading population (n-step 3): the code replay and a replay of observations
    give the same member batches and the same member weights."""
    from foxdqn.population import step as P
    from foxdqn.population.replay import MemberReplay
    from foxdqn.population.state import build_population

    from population.test_population import TRADING, configs, market_for

    cfgs = configs(TRADING, [["seed=5"], ["seed=6", "agent.gamma=0.9"]])
    coded = build_population(cfgs, market_for(cfgs[0]), CPU)
    plain = build_population(cfgs, market_for(cfgs[0]), CPU)
    assert coded.replay.decoder is not None and coded.replay.obs.shape[-1] == 4
    r = coded.replay
    plain.replay = MemberReplay(cfgs[0].replay.capacity, r.envs_per_member, plain.env.obs_dim, plain.params.gamma,
                                plain.rng, CPU, r.n_step)
    plain.env.step_next_obs = True  # this replay stores the observations: the step must return next_obs
    a, b = _recording(coded.replay, "sample_members"), _recording(plain.replay, "sample_members")
    for s in (coded, plain):
        iterate(s, False, 4, 4, collect=P.collect_step, update=P.update_step, after_updates=P.publish_guard)
    _assert_same_batches(a, b)
    assert torch.equal(torch.cat([w.flatten() for w in coded.online.parameters()]),
                       torch.cat([w.flatten() for w in plain.online.parameters()]))


@pytest.mark.gpu
def test_gpu_training_run_samples_the_observations_an_obs_replay_samples():
    """eurusd_dqn at 4,096 envs on CUDA (compiled step and decode kernels), eagerly: the code replay
    and a replay of observations sample the same batches and train the same weights."""
    from foxdqn.config.compose import load_config
    from foxdqn.data import load_market_data
    from foxdqn.population.state import build_population

    cfg = load_config(["+experiment=eurusd_dqn", "device=cuda", "log.progress=false", "env.num_envs=4096",
                       "agent.learning_starts=16384", "replay.capacity=65536"])
    market = load_market_data(cfg.data, cfg.env.window, cfg.env.episode_length)
    coded, plain = (build_population([cfg], market, torch.device("cuda")) for _ in range(2))
    assert coded.replay.decoder is not None
    _train_alike(coded, plain, 1, 8)


def test_trading_hook_stores_codes_only_in_a_decoding_replay():
    """The trading hook's codec is the env's 4-value code (none in eval mode, whose steps return no
    codes); it hands the replay the step's codes when the replay decodes, else the observations."""
    from foxdqn.step.build import build_env

    s, market = small_state(RUN, bars=400)
    env, hook = s.env, s.env.collect_hook
    codec = hook.replay_codec(env)
    assert (codec.dim, codec.dtype) == (4, torch.float32)
    assert env.step_next_obs is False  # the built replay decodes: the step skips next_obs ...
    env.step_next_obs = True  # ... which this test compares the decoded codes with
    obs = s.obs.clone()
    out = env.step(torch.zeros(env.num_envs, dtype=torch.int64))
    rows = hook.replay_rows(env, s.replay, obs, out)
    assert rows[0] is out.info["state_code"] and rows[1] is out.info["next_state_code"]
    plain = _obs_replay(s)
    rows_plain = hook.replay_rows(env, plain, obs, out)
    assert rows_plain[0] is obs and rows_plain[1] is out.next_obs
    decoded = env.decode_observations(*rows, torch.arange(env.num_envs))
    assert torch.equal(decoded[0], obs) and torch.equal(decoded[1], out.next_obs.float())
    walk = build_env(s.cfg, market, "train", CPU, torch.Generator(), eval_mode=True)
    assert walk.collect_hook.replay_codec(walk) is None
    walk.reset_all()
    assert "state_code" not in walk.step(torch.zeros(1, dtype=torch.int64)).info
