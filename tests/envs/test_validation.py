import numpy as np
import pytest

from foxdqn.envs import ExecutionConfig
from foxdqn.errors import ConfigError, DataError

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


def test_env_config_errors(make_env):
    with pytest.raises(ConfigError, match="env.num_envs"):
        make_env(ROWS, num_envs=2, eval_mode=True)
    with pytest.raises(ConfigError, match="env.window"):
        make_env(ROWS, window=0)
    with pytest.raises(ConfigError, match="split"):
        make_env(ROWS, split=(0, 7))
    # window 6 -> first valid bar 5 = last bar: no step possible
    with pytest.raises(ConfigError, match="split"):
        make_env(ROWS, window=6)
    with pytest.raises(ConfigError, match="env.execution.taker_fee_bps"):
        make_env(ROWS, cfg=ExecutionConfig(taker_fee_bps=-1.0))


def test_env_data_errors_name_array_and_row(make_env):
    rows = [list(r) for r in ROWS]
    rows[3][3] = 0.0
    with pytest.raises(DataError, match="close: row 3"):
        make_env(rows)
    rows = [list(r) for r in ROWS]
    rows[2][4] = -1e-4
    with pytest.raises(DataError, match="spread: row 2"):
        make_env(rows)
    feats = np.zeros((6, 2), dtype=np.float32)
    feats[4, 1] = np.nan
    with pytest.raises(DataError, match="features: row 4"):
        make_env(ROWS, features=feats)
    # rows outside the split are not read, so they are not checked
    rows = [list(r) for r in ROWS]
    rows[5][3] = float("nan")
    make_env(rows, split=(0, 5))
