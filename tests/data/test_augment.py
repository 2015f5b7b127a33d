"""Training-path augmentation (data.augment, foxdqn.data.augment): the stationary bootstrap's
draws, the torch per-bar quantities against the pipeline, the resampled paths (returns drawn from
the source, consistent bars, determinism), the training env's episodes on them, and validation /
test left as they are."""
import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch

from foxdqn.data import DataConfig, market_data_from_frame
from foxdqn.data import path_features as pf
from foxdqn.data.augment import build_training_paths, path_seed, resample_bars, training_bars
from foxdqn.data.bootstrap import stationary_bootstrap_indices
from foxdqn.data.config import AugmentConfig
from foxdqn.data.features import log_returns, normalisation, raw_features, rolling_volatility
from foxdqn.data.spread import estimate_spread
from foxdqn.data.synthetic import make_martingale_ohlcv

CPU = torch.device("cpu")


def market(bars=700, window=8, episode_length=20, seed=0, **data):
    """A martingale market whose bars gap at the open (the spread estimate's gap rule is exercised)."""
    frame = make_martingale_ohlcv(bars, vol_per_bar=2e-3, seed=seed)
    rng = np.random.default_rng(seed + 1)
    gap = np.exp(rng.normal(0, 5e-4, bars))
    frame["open"] = frame["open"] * gap
    frame["high"] = np.maximum(frame["high"], frame["open"])
    frame["low"] = np.minimum(frame["low"], frame["open"])
    cfg = DataConfig(name=None, path="bars.csv", timestamp_column="timestamp", vol_window=6, volume_window=5,
                     spread_window=4, **data)
    return market_data_from_frame(frame, cfg, window, episode_length), cfg


def augmented(cfg, paths=5, block=7.0):
    return dataclasses.replace(cfg, augment=AugmentConfig("block_bootstrap", block, paths))


# ------------------------------------------------------------------------------------ the bootstrap
def test_bootstrap_indices_continue_each_block_around_the_circle():
    index, starts = stationary_bootstrap_indices(13, 500, 6, 4.0, torch.Generator().manual_seed(0))
    assert index.shape == starts.shape == (6, 500) and index.dtype == torch.int64
    assert ((index >= 0) & (index < 13)).all() and starts[:, 0].all()
    inside = ~starts[:, 1:]
    assert torch.equal(index[:, 1:][inside], ((index[:, :-1] + 1) % 13)[inside])
    assert (index[:, 1:][inside] == 0).any()  # a block wrapped from the last item to the first


@pytest.mark.parametrize("mean_block", [1.0, 3.0, 25.0])
def test_block_lengths_have_the_configured_mean(mean_block):
    _, starts = stationary_bootstrap_indices(1000, 20_000, 32, mean_block, torch.Generator().manual_seed(1))
    lengths = []
    for row in starts.numpy():
        at = np.flatnonzero(row)
        lengths.append(np.diff(at))  # complete blocks (the last one is cut by the path's end)
    lengths = np.concatenate(lengths)
    p = 1.0 / mean_block
    se = math.sqrt((1 - p) / p**2 / lengths.size)  # geometric lengths: variance (1 - p) / p²
    assert abs(lengths.mean() - mean_block) <= 4 * se + 1e-12, (lengths.mean(), mean_block, se)
    if mean_block == 1.0:
        assert (lengths == 1).all()


@pytest.mark.parametrize("args, name", [((0, 5, 1, 2.0), "n"), ((5, 0, 1, 2.0), "length"), ((5, 5, 0, 2.0), "paths"),
                                        ((5, 5, 1, 0.5), "mean_block"), ((5, 5, 1, float("inf")), "mean_block")])
def test_bootstrap_refuses_bad_arguments(args, name):
    with pytest.raises(ValueError, match=name):
        stationary_bootstrap_indices(*args, torch.Generator())


# ------------------------------------------------------------------------------------ torch vs the pipeline
@pytest.mark.parametrize("window, min_periods", [(2, 2), (5, 5), (7, 2), (7, 1)])
def test_rolling_statistics_match_pandas(window, min_periods):
    rng = np.random.default_rng(window)
    x = rng.normal(size=(3, 37))
    x[:, 0] = np.nan
    x[1, 10] = np.nan
    t = torch.as_tensor(x)
    for ours, name in ((pf.rolling_mean, "mean"), (pf.rolling_std, "std")):
        want = np.stack([getattr(pd.Series(r).rolling(window, min_periods=min_periods), name)().to_numpy() for r in x])
        np.testing.assert_allclose(ours(t, window, min_periods).numpy(), want, rtol=1e-12, atol=1e-15)


def test_the_identity_resample_is_the_training_split():
    m, cfg = market()
    start, end = m.splits["train"]
    length = end - start
    bars = resample_bars(m, torch.arange(length)[None], CPU)
    for name in ("open", "high", "low", "close", "volume"):
        np.testing.assert_allclose(bars[name][0].numpy(), getattr(m, name)[:length], rtol=1e-12, atol=0)
    b = bars
    raw = pf.raw_features(b["high"], b["low"], b["close"], b["volume"], cfg.vol_window, cfg.volume_window)[0]
    want_raw, names = raw_features(m.open[:length], m.high[:length], m.low[:length], m.close[:length],
                                   m.volume[:length], (0, length), cfg.vol_window, cfg.volume_window)
    assert names == m.feature_names and "volume_z" in names
    np.testing.assert_allclose(raw.numpy(), want_raw, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(pf.spread(b["high"], b["low"], b["close"], cfg.spread_window)[0].numpy(),
                               m.spread[:length], rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(pf.volatility(b["close"], cfg.vol_window)[0].numpy(), m.volatility[:length],
                               rtol=1e-9, atol=1e-15)
    mean, std = (torch.as_tensor(v) for v in normalisation(want_raw, (0, length)))
    np.testing.assert_allclose(pf.normalise(raw[None], mean, std, cfg.clip)[0].numpy(), m.features[:length],
                               rtol=0, atol=2e-6)


def test_features_of_the_paths_are_the_pipelines_on_the_same_bars():
    m, cfg = market()
    paths = build_training_paths(m, augmented(cfg), 3, CPU)
    length = paths.path_bars
    source_raw, _ = raw_features(m.open, m.high, m.low, m.close, m.volume, m.splits["train"], cfg.vol_window,
                                 cfg.volume_window)
    mean, std = normalisation(source_raw, m.splits["train"])  # the source's training statistics
    for k in range(paths.paths):
        rows = slice(k * length, (k + 1) * length)
        close, high, low = (getattr(paths, n)[rows].numpy() for n in ("close", "high", "low"))
        volume = m.volume[paths.source_bar[k].numpy()]
        raw, _ = raw_features(paths.open[rows].numpy(), high, low, close, volume, (0, length), cfg.vol_window,
                              cfg.volume_window)
        want = np.nan_to_num(np.clip((raw - mean) / std, -cfg.clip, cfg.clip), nan=0.0).astype(np.float32)
        np.testing.assert_allclose(paths.features[rows].numpy(), want, rtol=0, atol=2e-6)
        np.testing.assert_allclose(paths.spread[rows].numpy(), estimate_spread(high, low, close, cfg.spread_window),
                                   rtol=1e-9, atol=1e-15)
        np.testing.assert_allclose(paths.volatility[rows].numpy(),
                                   np.nan_to_num(rolling_volatility(close, cfg.vol_window, min_periods=2)),
                                   rtol=1e-9, atol=1e-15)


# ------------------------------------------------------------------------------------ the paths
def test_path_returns_are_drawn_from_the_source_returns():
    m, cfg = market()
    paths = build_training_paths(m, augmented(cfg), 0, CPU)
    length = paths.path_bars
    source_returns = log_returns(m.close[:length])
    bar = paths.source_bar.numpy()
    assert bar.shape == (5, length) and (bar[:, 0] == 0).all() and ((bar[:, 1:] >= 1) & (bar[:, 1:] < length)).all()
    for k in range(paths.paths):
        close = paths.close[k * length:(k + 1) * length].numpy()
        np.testing.assert_allclose(np.diff(np.log(close)), source_returns[bar[k, 1:]], rtol=0, atol=1e-12)
        for name in ("open", "high", "low"):  # each bar keeps its source bar's shape around its close
            ratio = getattr(paths, name)[k * length:(k + 1) * length].numpy() / close
            np.testing.assert_allclose(ratio, (getattr(m, name) / m.close)[bar[k]], rtol=1e-12, atol=0)
    # as a multiset: every path return is one of the source's, and blocks copy consecutive returns
    assert np.isin(bar[:, 1:], np.arange(1, length)).all()
    assert len(np.unique(bar[:, 1:])) > 0.5 * (length - 1)


def test_paths_have_consistent_bars():
    m, cfg = market(bars=1500)
    paths = build_training_paths(m, augmented(cfg, paths=9, block=3.0), 11, CPU)
    o, h, lo, c = paths.open, paths.high, paths.low, paths.close
    assert ((lo <= o) & (lo <= c) & (o <= h) & (c <= h) & (lo > 0)).all()
    assert torch.isfinite(paths.features).all() and (paths.spread >= 0).all() and (paths.volatility >= 0).all()
    for dt in (torch.float32, torch.float64):  # the env's rounding keeps the order
        o, h, lo, c = (x.to(dt) for x in (paths.open, paths.high, paths.low, paths.close))
        assert ((lo <= o) & (lo <= c) & (o <= h) & (c <= h)).all()


def test_paths_are_the_same_for_one_seed_and_differ_across_seeds():
    m, cfg = market()
    a, b, c = (build_training_paths(m, augmented(cfg), seed, CPU) for seed in (4, 4, 5))
    for name in ("close", "high", "features", "spread", "source_bar"):
        assert torch.equal(getattr(a, name), getattr(b, name))
        assert not torch.equal(getattr(a, name), getattr(c, name))
    assert path_seed(4) != path_seed(5) and path_seed(4) != 4


def test_training_bars_counts_the_paths():
    m, cfg = market()
    length = m.splits["train"][1]
    assert training_bars(cfg, m) == len(m.close)
    assert training_bars(augmented(cfg, paths=7), m) == 7 * length


def test_build_refuses_method_none():
    m, cfg = market()
    with pytest.raises(ValueError, match="block_bootstrap"):
        build_training_paths(m, cfg, 0, CPU)


@pytest.mark.parametrize("field, value", [("method", "shuffle"), ("block_length", 0.5), ("block_length", float("nan")),
                                          ("paths", 0), ("paths", 2.5)])
def test_augment_config_names_the_bad_key(field, value):
    from foxdqn.errors import ConfigError

    with pytest.raises(ConfigError, match=f"data.augment.{field}"):
        dataclasses.replace(AugmentConfig(), **{field: value}).validate()


# ------------------------------------------------------------------------------------ the training env
def paths_env(paths, window=8, episode_length=20, num_envs=64, eval_mode=False):
    from foxdqn.envs import ExecutionConfig, TradingEnv

    return TradingEnv(paths, "train", num_envs=num_envs, window=window, episode_length=episode_length,
                      execution=ExecutionConfig(), device=CPU, dtype=torch.float32,
                      generator=torch.Generator().manual_seed(0), eval_mode=eval_mode)


def test_episodes_start_on_every_path_and_stay_inside_it():
    m, cfg = market()
    paths = build_training_paths(m, augmented(cfg, paths=4), 0, CPU)
    length = paths.path_bars
    env = paths_env(paths)
    assert env.path_bars == length and env.num_paths == 4 and env.max_episode_steps == 20
    starts = torch.cat([env._starts() for _ in range(200)])
    offset = starts % length
    assert offset.min().item() == 7 and offset.max().item() == length - 1 - 20  # window 8, 20 steps
    assert sorted(set((starts // length).tolist())) == [0, 1, 2, 3]
    env.reset_all()
    path, g = env.t // length, torch.Generator().manual_seed(1)
    for _ in range(120):
        before = env.t.clone()
        out = env.step(torch.randint(0, 45, (64,), generator=g))
        code_t = out.info["next_state_code"][:, 0].long()  # the bar stepped to, before any reset
        assert torch.equal(code_t, before + 1)
        assert torch.equal(code_t // length, path)  # never into the next path
        path = torch.where(out.info["episode_done"], env.t // length, path)


def test_an_eval_env_refuses_paths_and_short_paths_are_refused():
    m, cfg = market()
    paths = build_training_paths(m, augmented(cfg, paths=2), 0, CPU)
    with pytest.raises(ValueError, match="market"):
        paths_env(paths, eval_mode=True)
    with pytest.raises(ValueError, match="episode_length"):
        paths_env(paths, episode_length=paths.path_bars - 7)


def test_a_run_trains_on_paths_and_validates_and_tests_on_the_market():
    from foxdqn.population.checkpoint import member_tensors
    from foxdqn.step.build import build_env

    from support import small_state

    s, m = small_state(["data.augment.method=block_bootstrap", "data.augment.paths=3"])
    before = {name: np.array(getattr(m, name), copy=True) for name in ("open", "close", "features", "spread")}
    env = s.env
    length = m.splits["train"][1]
    assert env.path_bars == length and env.num_bars == 3 * length
    assert not torch.equal(env._close[:length].double(), torch.as_tensor(m.close[:length]))  # resampled
    for name, value in before.items():  # the market itself is untouched
        assert np.array_equal(getattr(m, name), value)
    plain, _ = small_state()
    for split in ("val", "test"):
        gen = torch.Generator().manual_seed(0)
        a, b = (build_env(state.cfg, m, split, CPU, gen, eval_mode=True) for state in (s, plain))
        for name in ("_open", "_close", "_features", "_spread", "_vol"):
            assert torch.equal(getattr(a, name), getattr(b, name)), (split, name)
        assert a.path_bars is None
    saved = member_tensors(s, 0, save_replay=False)  # the run's checkpoint: its paths are rebuilt, not saved
    assert not any(name.startswith("env._close") or name.startswith("env._features") for name in saved)
    assert "env.t" in saved and "env._close" in member_tensors(plain, 0, save_replay=False)


def test_a_checkpoint_of_an_augmented_run_resumes_on_the_same_paths(tmp_path):
    from foxdqn.population.checkpoint import member_checkpoint, restore_member
    from foxdqn.population.step import collect_step
    from foxdqn.run.checkpoint import load_checkpoint

    from support import small_state

    over = ["data.augment.method=block_bootstrap", "data.augment.paths=2", "data.augment.block_length=5"]
    s, _ = small_state(over)
    for _ in range(30):
        collect_step(s)
    member_checkpoint(s, 0, tmp_path / "last.pt", loop={})
    fresh, _ = small_state(over)
    assert torch.equal(fresh.env._close, s.env._close)  # rebuilt from the seed, not loaded
    assert not torch.equal(fresh.env.t, s.env.t)
    state = load_checkpoint(tmp_path / "last.pt")["member_state"]
    restore_member(fresh, 0, state["tensors"], state["replay_saved"], "last.pt")
    for name in ("t", "steps", "units", "equity", "exposure_idx"):
        assert torch.equal(getattr(fresh.env, name), getattr(s.env, name)), name
    assert torch.equal(fresh.obs, s.obs)
