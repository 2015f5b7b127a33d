"""Shared builders for the trading-env tests (CPU, float64)."""
import numpy as np
import pytest
import torch

from foxdqn.envs import ExecutionConfig, TradingEnv

from support import market_from_arrays

# Round numbers so the expected values can be written out by hand in the tests.
HAND_CFG = ExecutionConfig(
    spread_floor_bps=0.5,
    taker_fee_bps=1.0,
    maker_fee_bps=-0.5,
    market_slippage_bps=(0.5, 1.0, 2.0),
    limit_offset_half_spreads=(1.0, 0.5, 0.0),
    ioc_offset_bps=(1.0, 2.0, 4.0),
    initial_equity=1.0,
)


def build_env(rows=None, *, arrays=None, features=None, window=1, split=None, num_envs=1, episode_length=1000,
              eval_mode=True, cfg=HAND_CFG, seed=0, dtype=torch.float64, device="cpu", max_eval_bars=None, **market):
    """Env from explicit bars ``rows = [(open, high, low, close, spread), ...]`` or ``arrays`` dict, on the
    bar range ``split`` (default all); ``market`` (volatility, medians) goes to :func:`market_from_arrays`."""
    if rows is not None:
        a = np.asarray(rows, dtype=np.float64)
        arrays = dict(open=a[:, 0], high=a[:, 1], low=a[:, 2], close=a[:, 3], spread=a[:, 4])
    T = arrays["close"].shape[0]
    if features is None:
        # feature f of bar t = 10*t + f: identifies the rows in an observation window
        features = (10.0 * np.arange(T)[:, None] + np.arange(2)[None, :]).astype(np.float32)
    return TradingEnv(
        market_from_arrays(**arrays, features=features, split=split, vol_window=max(window, 2), **market),
        "train",
        num_envs=num_envs,
        window=window,
        episode_length=episode_length,
        execution=cfg,
        device=torch.device(device),
        dtype=dtype,
        generator=torch.Generator(device=torch.device(device)).manual_seed(seed),
        eval_mode=eval_mode,
        max_eval_bars=max_eval_bars,
    )


def random_arrays(T, seed=0):
    """A random-walk bar series with consistent OHLC and 0.5–3 bp spreads."""
    rng = np.random.default_rng(seed)
    close = 100.0 * np.exp(np.cumsum(rng.normal(0.0, 2e-3, T)))
    open_ = np.concatenate([[100.0], close[:-1]]) * np.exp(rng.normal(0.0, 5e-4, T))
    high = np.maximum(open_, close) * (1 + rng.uniform(0, 2e-3, T))
    low = np.minimum(open_, close) * (1 - rng.uniform(0, 2e-3, T))
    spread = rng.uniform(0.5e-4, 3e-4, T)
    return dict(open=open_, high=high, low=low, close=close, spread=spread)


@pytest.fixture
def make_env():
    return build_env


@pytest.fixture
def make_arrays():
    return random_arrays


@pytest.fixture
def hand_cfg():
    return HAND_CFG
