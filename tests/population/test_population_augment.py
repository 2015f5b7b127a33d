"""``data.augment.method=block_bootstrap`` in a population (CPU, eager): each member walks its own
resampled training paths, drawn from its own seed as a single run of that seed draws them, and its
episodes pick paths and starts from its own counter-based stream; P members equal P populations of
one bit for bit, and members never share paths or draws."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from foxdqn.data import augment
from foxdqn.data.augment import build_training_paths
from foxdqn.population.envs import MemberTradingEnv, member_paths
from foxdqn.population.random import MemberRandom
from foxdqn.population.state import build_population
from test_population import CPU, TRADING, assert_member_equal, configs, market_for, run

AUG = [*TRADING, "data.augment.method=block_bootstrap", "data.augment.paths=3", "data.augment.block_length=6"]
SEEDS = [["seed=5"], ["seed=6"], ["seed=7", "data.augment.block_length=2"]]


def member_block(env, p):
    """Member p's bars (close, features) of a population's env: its paths, laid end to end."""
    bars = env.paths_per_member * env.path_bars
    return env._close[p * bars:(p + 1) * bars], env._features[p * bars:(p + 1) * bars]


def test_members_equal_runs_of_one_member():
    """P = 3 (different seeds, one with another block length) equal three populations of one: the
    weights after training, the observations acted on, and the paths each walks."""
    together = run(configs(AUG, SEEDS))
    assert together.env.num_paths == 9 and together.env.paths_per_member == 3
    n = together.cfg.env.num_envs
    for p, extra in enumerate(SEEDS):
        alone = run(configs(AUG, [extra]))
        assert_member_equal(together, p, alone, 0)
        assert torch.equal(together.obs.view(3, n, -1)[p], alone.obs)
        close, features = member_block(together.env, p)
        assert torch.equal(close, alone.env._close) and torch.equal(features, alone.env._features)
        # the same episodes: member p's envs stand on the same bars of its own paths
        assert torch.equal(together.env.t[p * n:(p + 1) * n] - p * close.shape[0], alone.env.t)


def test_a_members_paths_are_the_single_runs_of_its_seed(monkeypatch):
    """Member p's paths are bit for bit those :func:`build_training_paths` builds for a single run of
    its seed and block length (the same draws, so the same block structure), also when the
    population's paths are built in chunks that cut across members."""
    cfgs = configs(AUG, SEEDS)
    market = market_for(cfgs[0])
    monkeypatch.setattr(augment, "CHUNK_BARS", 2 * (market.splits["train"][1]))  # 2 paths per chunk: 5 chunks
    together = member_paths(cfgs, market, CPU)
    length = together.path_bars
    for p, c in enumerate(cfgs):
        single = build_training_paths(market, c.data, c.seed, CPU)
        rows = slice(3 * p, 3 * p + 3)
        bars = slice(3 * p * length, 3 * (p + 1) * length)
        assert torch.equal(together.source_bar[rows], single.source_bar)
        for name in ("open", "high", "low", "close", "spread", "volatility", "features"):
            assert torch.equal(getattr(together, name)[bars], getattr(single, name)), (p, name)


def test_members_with_different_seeds_walk_different_paths():
    cfgs = configs(AUG, [["seed=5"], ["seed=6"]])
    paths = member_paths(cfgs, market_for(cfgs[0]), CPU)
    first, second = paths.source_bar[:3], paths.source_bar[3:]
    assert not torch.equal(first, second)
    assert (first != second).float().mean() > 0.9  # not a shifted or partly shared draw
    # and their episodes draw different paths and starts from the two members' streams
    s = build_population(cfgs, market_for(cfgs[0]), CPU)
    starts = torch.stack([s.env._starts() for _ in range(50)]).view(50, 2, -1)
    local = starts - torch.tensor([0, 3 * paths.path_bars]).view(1, 2, 1)
    assert not torch.equal(local[:, 0], local[:, 1])


def test_block_structure_of_a_members_paths_matches_the_single_runs_bootstrap():
    """A member's paths are a stationary bootstrap of mean block length ``data.augment.block_length``:
    inside a block each bar copies the source bar after the previous one; the mean block length of
    member 0 (block length 6) and member 2 (block length 2) is each its own, within 4 standard errors."""
    cfgs = configs([*AUG, "data.augment.paths=64"], SEEDS)
    market = market_for(cfgs[0])
    paths = member_paths(cfgs, market, CPU)
    length = paths.path_bars
    for p, mean_block in ((0, 6.0), (1, 6.0), (2, 2.0)):
        source = paths.source_bar[64 * p:64 * (p + 1), 1:] - 1  # the bootstrap's indices of the L - 1 returns
        starts = torch.ones_like(source, dtype=torch.bool)
        starts[:, 1:] = source[:, 1:] != (source[:, :-1] + 1) % (length - 1)
        lengths = np.concatenate([np.diff(np.flatnonzero(row)) for row in starts.numpy()])
        q = 1.0 / mean_block  # a block that continues by chance past a draw (probability 1/(L-1)) is rare
        se = np.sqrt((1 - q) / q**2 / lengths.size)
        assert abs(lengths.mean() - mean_block) <= 4 * se + 0.02 * mean_block, (p, lengths.mean(), mean_block)


def test_member_episodes_stay_on_the_members_own_paths():
    """Every start of member p's envs lies on one of member p's paths, at a bar whose window and
    episode stay inside that path, and every one of its paths is drawn; no env ever steps across
    a path's end."""
    cfgs = configs(AUG, [["seed=5"], ["seed=6"], ["seed=7"]])
    market = market_for(cfgs[0])
    paths = member_paths(cfgs, market, CPU)
    cfg = cfgs[0]
    env = MemberTradingEnv(MemberRandom([c.seed for c in cfgs], CPU), 16, paths, cfg, CPU, paths_per_member=3)
    length, w, ep = paths.path_bars, cfg.env.window, cfg.env.episode_length
    starts = torch.stack([env._starts() for _ in range(100)]).view(100, 3, 16)
    path = starts // length
    for p in range(3):
        assert sorted(set(path[:, p].flatten().tolist())) == [3 * p, 3 * p + 1, 3 * p + 2]
    offset = starts % length
    assert offset.min().item() == w - 1 and offset.max().item() == length - 1 - ep
    env.reset_all()
    on = env.t // length
    for _ in range(3 * ep):
        before = env.t.clone()
        out = env.step(torch.randint(0, 45, (48,), generator=torch.Generator().manual_seed(0)))
        assert torch.equal(out.info["next_state_code"][:, 0].long(), before + 1)
        assert torch.equal((before + 1) // length, on)  # never into the next path
        on = torch.where(out.info["episode_done"], env.t // length, on)
        assert torch.equal(on.view(3, 16) // 3, torch.arange(3).view(3, 1).expand(3, 16))


def test_member_env_refuses_paths_that_do_not_split_into_members():
    cfgs = configs(AUG, [["seed=5"], ["seed=6"]])
    paths = member_paths(cfgs, market_for(cfgs[0]), CPU)
    with pytest.raises(ValueError, match="paths_per_member"):
        MemberTradingEnv(MemberRandom([5, 6, 7], CPU), 2, paths, cfgs[0], CPU, paths_per_member=1)


def test_one_start_per_member_still_draws():
    """A member with one path and one start per path draws anyway (2·N values per reset), so the
    stream's counter, and with it every later draw, does not depend on P or the path sizes; its
    resets go to its own path."""
    cfgs = configs(AUG, [["seed=5"], ["seed=6"]])
    market = market_for(cfgs[0])
    length = market.splits["train"][1]
    one = [*AUG, "data.augment.paths=1", f"env.episode_length={length - cfgs[0].env.window}"]
    cfgs = configs(one, [["seed=5"], ["seed=6"]])
    rng = MemberRandom([5, 6], CPU)
    env = MemberTradingEnv(rng, 2, member_paths(cfgs, market, CPU), cfgs[0], CPU, paths_per_member=1)
    assert env._path_starts == 1
    before = int(rng.counter)
    starts = env._draw_starts()
    assert int(rng.counter) - before == 2 * 2
    assert starts.tolist() == [env.first_valid] * 2 + [length + env.first_valid] * 2
    # a population of one whose single path has a single start draws as much as any other
    rng1 = MemberRandom([5], CPU)
    alone = MemberTradingEnv(rng1, 2, member_paths(cfgs[:1], market, CPU), cfgs[0], CPU, paths_per_member=1)
    assert alone.start_high == alone.first_valid  # the classic env would not draw here
    assert alone._draw_starts().tolist() == [alone.first_valid] * 2 and int(rng1.counter) == 2 * 2


# ------------------------------------------------------------------------------------ memory
def test_memory_counts_each_members_paths_and_the_population_code_dtype():
    """job.memory counts what a built population holds per member: its paths
    (training_path_bytes: the env's bar tensors over P) and its replay codes of the population's
    code dtype (replay_row with P members: float64 once P members' paths pass 2**24 bars, made
    small here)."""
    import foxdqn.ops.trading_code as trading_code
    from foxdqn.job.memory import replay_row, training_path_bytes

    cfgs = configs(AUG, SEEDS)
    market = market_for(cfgs[0])
    s = build_population(cfgs, market, CPU)
    env = s.env
    held = sum(t.nbytes for t in (env._open, env._high, env._low, env._close, env._spread, env._vol, env._features))
    assert training_path_bytes(cfgs[0], market) == held // 3 > 0
    assert replay_row(cfgs[0], market, members=3) == (4, torch.finfo(env.code_dtype).bits // 8) == (4, 4)
    assert training_path_bytes(configs(TRADING, [[]])[0], market) == 0  # unaugmented: the market is shared
    bars = 3 * market.splits["train"][1]  # one member's path bars
    plain = configs(TRADING, [[]])[0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trading_code, "FLOAT32_EXACT_INT", 2 * bars)  # two members' paths keep float32 codes
        assert replay_row(cfgs[0], market, members=2) == (4, 4) and replay_row(cfgs[0], market, members=3) == (4, 8)
        assert replay_row(plain, market, members=3) == (4, 4)  # unaugmented: one market for every member
        wide = build_population(cfgs, market, CPU)
        assert wide.env.code_dtype == torch.float64 and wide.replay.obs.dtype == torch.float64


@pytest.mark.parametrize("free_members", [1.5, 2.5, 3.5, 40.0])
def test_members_that_fit_counts_paths_and_wider_codes(free_members, monkeypatch):
    """members_that_fit (the population's memory cap) is the largest P whose P replays, codes of
    the population's dtype, and P members' paths fit in 80 % of the free memory: checked against
    counting every P, with the codes widened past two members."""
    import foxdqn.ops.trading_code as trading_code
    from foxdqn.job.memory import REPLAY_SHARE, members_that_fit, replay_row, replays_that_fit, training_path_bytes
    from foxdqn.replay.buffer import replay_bytes

    cfg = configs(AUG, [["seed=5"]])[0]
    market = market_for(cfg)
    monkeypatch.setattr(trading_code, "FLOAT32_EXACT_INT", 2 * 3 * market.splits["train"][1])

    def need(p):
        return p * (replay_bytes(cfg.replay.capacity, *replay_row(cfg, market, p)) + training_path_bytes(cfg, market))

    free = int(need(1) * free_members / REPLAY_SHARE)
    fit = members_that_fit(cfg, market, free)
    assert fit == max(p for p in range(0, 100) if need(p) <= REPLAY_SHARE * free)
    assert need(3) / 3 > need(2) / 2  # past two members every member's codes take 8 bytes a value
    if free_members == 40.0:  # the naive count (one member's need, times P) would overfill the device
        assert fit < replays_that_fit(need(1), free)
    assert members_that_fit(cfg, market, None) is None
