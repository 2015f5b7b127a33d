import numpy as np
import pytest
import torch

from foxdqn.data import DataConfig, market_data_from_frame
from foxdqn.data.synthetic import make_synthetic_ohlcv
from foxdqn.envs import ExecutionConfig, TradingEnv
from foxdqn.errors import ConfigError, DataError

from support import market_from_arrays

ROWS = [(100.0, 101.0, 99.0, 100.0, 1e-4)] * 6


@pytest.mark.parametrize(
    "field, value",
    [
        ("spread_floor_bps", -0.1),
        ("taker_fee_bps", -1.0),
        ("maker_fee_bps", float("nan")),
        ("market_slippage_bps", (0.1, 0.2)),
        ("limit_offset_half_spreads", (1.0, -0.5, 0.0)),
        ("ioc_offset_bps", "1,2,3"),
        ("initial_equity", 0.0),
        ("taker_fee_bps", "0.3"),
    ],
)
def test_execution_config_errors_name_the_field(field, value):
    cfg = ExecutionConfig(**{field: value})
    with pytest.raises(ConfigError, match=rf"^env\.execution\.{field}"):
        cfg.validate()


def test_execution_config_defaults_valid_and_from_mapping():
    ExecutionConfig().validate()
    cfg = ExecutionConfig.from_mapping({"taker_fee_bps": 0.5, "ioc_offset_bps": [1, 2, 3]}, prefix="x")
    assert cfg.taker_fee_bps == 0.5
    with pytest.raises(ConfigError, match=r"^x\.bogus"):
        ExecutionConfig.from_mapping({"bogus": 1}, prefix="x")


def test_env_argument_errors_name_the_parameter(make_env):
    with pytest.raises(ValueError, match="^num_envs"):
        make_env(ROWS, num_envs=0)
    with pytest.raises(ValueError, match="^window"):
        make_env(ROWS, window=0)
    with pytest.raises(ValueError, match="^episode_length"):
        make_env(ROWS, episode_length=0)
    with pytest.raises(ValueError, match="^dtype"):
        make_env(ROWS, dtype=torch.int64)
    # window 6 -> first valid bar 5 = last bar: no step possible
    with pytest.raises(ValueError, match="^split: 'train' = \\(0, 6\\) leaves no step"):
        make_env(ROWS, window=6)
    with pytest.raises(ConfigError, match=r"^execution\.taker_fee_bps"):
        make_env(ROWS, cfg=ExecutionConfig(taker_fee_bps=-1.0))
    with pytest.raises(ValueError, match="^execution: must be an ExecutionConfig"):
        make_env(ROWS, cfg={"taker_fee_bps": 1.0})


def _market():
    a = np.asarray(ROWS)
    return market_from_arrays(a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4], np.zeros((6, 2), np.float32))


def test_env_split_must_be_a_split_of_the_market():
    with pytest.raises(ValueError, match="^split: 'val' is not a split of the market data \\(it has train\\)"):
        TradingEnv(_market(), "val", num_envs=1, window=1, episode_length=5, execution=ExecutionConfig(),
                   device=torch.device("cpu"), generator=torch.Generator())


def test_generator_must_be_a_torch_generator():
    with pytest.raises(ValueError, match="^generator: must be a torch.Generator"):
        TradingEnv(_market(), "train", num_envs=1, window=1, episode_length=5, execution=ExecutionConfig(),
                   device=torch.device("cpu"), generator=0)


def test_market_data_refuses_bars_the_env_cannot_read():
    """The env reads :class:`MarketData` without checking it again: the data pipeline refuses a price
    <= 0 or a missing price, naming the column, and gives finite features (warm-up rows 0), spreads
    and volatilities >= 0 on every row."""
    frame = make_synthetic_ohlcv(300, seed=3)
    data = DataConfig(name=None, path="bars")
    market = market_data_from_frame(frame, data, window=4, episode_length=10, source="bars")
    assert np.isfinite(market.features).all() and (market.features[0] == 0).any()
    for name in ("spread", "volatility"):
        values = getattr(market, name)
        assert values.shape == market.close.shape and np.isfinite(values).all() and (values >= 0).all()
    bad = frame.copy()
    bad.loc[bad.index[3], "close"] = 0.0
    with pytest.raises(DataError, match="column 'close' has a price <= 0"):
        market_data_from_frame(bad, data, window=4, episode_length=10, source="bars")
    bad = frame.copy()
    bad.loc[bad.index[3], "close"] = np.nan
    with pytest.raises(DataError, match="column 'close' has a missing or non-finite value"):
        market_data_from_frame(bad, data, window=4, episode_length=10, source="bars")
