"""Market data: built-in datasets and CSV/Parquet bar files, validated, featurised and split.

Entry point: :func:`load_market_data` (``DataConfig`` -> :class:`MarketData`). See
:mod:`foxdqn.data.market` for the pipeline, :mod:`foxdqn.data.features` for the features,
:mod:`foxdqn.data.spread` for the spread estimate, :mod:`foxdqn.data.splits` for the split rules
and :mod:`foxdqn.data.frequency` for bars per year.
"""
from foxdqn.data.builtin import BUILTIN_DATASETS
from foxdqn.data.config import DataConfig, SplitConfig
from foxdqn.data.market import MarketData, load_market_data, market_data_from_frame

__all__ = [
    "BUILTIN_DATASETS",
    "DataConfig",
    "MarketData",
    "SplitConfig",
    "load_market_data",
    "market_data_from_frame",
]
