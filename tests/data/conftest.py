"""Fixtures for the market-data tests: small synthetic bar frames and a CSV writer."""
import pandas as pd
import pytest

from foxdqn.data.synthetic import make_synthetic_ohlcv, write_csv


@pytest.fixture
def bars() -> pd.DataFrame:
    """40 hourly bars of a random walk (valid OHLCV), columns timestamp/open/high/low/close/volume."""
    return make_synthetic_ohlcv(40, drift_per_bar=0.0, vol=0.01, seed=1)


@pytest.fixture
def write(tmp_path):
    """``write(df, name="bars.csv") -> path`` writing ``df`` as CSV under tmp_path."""

    def _write(df: pd.DataFrame, name: str = "bars.csv"):
        return write_csv(df, tmp_path / name)

    return _write
