"""Market data: built-in datasets and CSV/Parquet bar files, validated, featurised and split.

Entry point: :func:`load_market_data` (``DataConfig`` -> :class:`MarketData`). See
:mod:`foxdqn.data.market` for the pipeline, :mod:`foxdqn.data.features` for the features,
:mod:`foxdqn.data.spread` for the spread estimate, :mod:`foxdqn.data.splits` for the split rules
and :mod:`foxdqn.data.frequency` for bars per year.

The names below are this package's; all but :data:`BUILTIN_DATASETS` are loaded on first use
(PEP 562): composing a config imports :mod:`foxdqn.data.builtin` and :mod:`foxdqn.data.config`
only, so that a run without market data (CartPole, a sweep's parent process) never imports pandas.
"""
import importlib

from foxdqn.data.builtin import BUILTIN_DATASETS

__all__ = [
    "BUILTIN_DATASETS",
    "DataConfig",
    "MarketData",
    "SplitConfig",
    "load_market_data",
    "market_data_from_frame",
]

_LAZY = {"DataConfig": "foxdqn.data.config", "SplitConfig": "foxdqn.data.config",
         "MarketData": "foxdqn.data.market", "load_market_data": "foxdqn.data.market",
         "market_data_from_frame": "foxdqn.data.market"}


def __getattr__(name: str):
    """``foxdqn.data.<name>`` of :data:`__all__`, imported from its module on first use."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'foxdqn.data' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
