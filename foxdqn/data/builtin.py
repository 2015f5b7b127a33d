"""Built-in datasets: the two CSV files shipped inside the ``gym-anytrading`` package.

The files are read in place from the installed package (never copied into this repository):

* ``eurusd_1h`` -- ``gym_anytrading/datasets/data/FOREX_EURUSD_1H_ASK.csv``: EUR/USD hourly ask
  bars, 2017-01-01 22:00 .. 2017-12-29 21:00, 6,225 rows; columns ``Time,Open,High,Low,Close,Volume``
  with ``Time`` like ``01.01.2017 22:00:00.000`` (day first).
* ``googl_1d`` -- ``gym_anytrading/datasets/data/STOCKS_GOOGL.csv``: Alphabet class A daily bars,
  2009-05-22 .. 2018-08-29, 2,335 rows; columns ``Date,Open,High,Low,Close,Adj Close,Volume``
  (``Adj Close`` is ignored; the unadjusted OHLC are used).
"""
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from foxdqn.errors import DataError


@dataclass(frozen=True)
class BuiltinDataset:
    """One built-in dataset: file inside ``gym_anytrading/datasets/data``, timestamp column and format."""

    filename: str
    timestamp_column: str
    timestamp_format: str
    description: str


#: Built-in datasets by name (``data.name``).
BUILTIN_DATASETS: dict[str, BuiltinDataset] = {
    "eurusd_1h": BuiltinDataset(
        filename="FOREX_EURUSD_1H_ASK.csv",
        timestamp_column="Time",
        timestamp_format="%d.%m.%Y %H:%M:%S.%f",
        description="EUR/USD hourly ask bars, 2017 (6,225 rows), from gym-anytrading",
    ),
    "googl_1d": BuiltinDataset(
        filename="STOCKS_GOOGL.csv",
        timestamp_column="Date",
        timestamp_format="%Y-%m-%d",
        description="GOOGL daily bars, 2009-05-22 .. 2018-08-29 (2,335 rows), from gym-anytrading",
    ),
}


def builtin_path(name: str) -> Path:
    """Path of built-in dataset ``name`` inside the installed gym-anytrading package.

    Raises:
        DataError: unknown name (lists the built-ins), gym-anytrading not installed, or the file
            missing from the installed package.
    """
    if name not in BUILTIN_DATASETS:
        raise DataError(
            f"unknown built-in dataset {name!r}; built-ins are: {', '.join(sorted(BUILTIN_DATASETS))}"
        )
    # find_spec locates the package without importing it (its __init__ pulls in gymnasium).
    spec = importlib.util.find_spec("gym_anytrading")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            f"built-in dataset {name!r} is read from the gym-anytrading package, which is not "
            "installed: pip install gym-anytrading (or set data.path to your own CSV/Parquet file)"
        )
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    path = package_dir / "datasets" / "data" / BUILTIN_DATASETS[name].filename
    if not path.is_file():
        raise DataError(
            f"built-in dataset {name!r}: file {path} is missing from the installed gym-anytrading "
            "package; reinstall it (pip install --force-reinstall gym-anytrading)"
        )
    return path
