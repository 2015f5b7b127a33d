"""Market data as the environment sees it, and the pipeline that builds it.

:func:`load_market_data` reads a built-in dataset or a CSV/Parquet file (refusing a header that
names a used column twice) and hands the frame to :func:`market_data_from_frame`, which runs, in
order: column matching -> timestamp parsing (numbers only with ``data.time_unit``) -> value checks
-> strictly increasing timestamps -> train/val/test split -> bar spacing (a frequency change
part-way through: ``data.on_frequency_change``; gaps longer than ``data.max_gap_bars`` bars:
``data.on_gaps``; see :mod:`foxdqn.data.calendar`) -> minimum rows per split -> features
(train-split normalisation) -> spread and volatility -> training medians -> bars per year. Any
problem with the data raises :class:`~foxdqn.errors.DataError`; any bad setting raises
:class:`~foxdqn.errors.ConfigError`; a spacing problem set to ``warn`` is logged as one warning
line (logger ``foxdqn.data.market``).
"""
import dataclasses
import logging
from dataclasses import dataclass
from numbers import Integral
from typing import Optional

import numpy as np
import pandas as pd

from foxdqn.data import builtin, calendar, features, frequency, io, splits, validate
from foxdqn.data.config import DataConfig
from foxdqn.data.spread import estimate_spread
from foxdqn.errors import ConfigError, DataError

log = logging.getLogger(__name__)


@dataclass
class MarketData:
    """Validated bars with features, per-bar costs inputs and the chronological split.

    All arrays have one entry per bar (``T`` rows, oldest first).

    Attributes:
        source: built-in dataset name (with its file) or the file path.
        timestamps: ``[T]`` bar times, strictly increasing.
        open, high, low, close: float64 ``[T]`` prices (> 0, ``low <= open, close <= high``).
        volume: float64 ``[T]`` (>= 0) or None when the file has no volume column.
        features: float32 ``[T, F]`` causal features normalised with training-split statistics
            and clipped (see :mod:`foxdqn.data.features`); names in ``feature_names``.
        spread: float64 ``[T]`` Corwin-Schultz relative spread (fraction of price, >= 0), causal
            rolling mean over ``data.spread_window`` bars (see :mod:`foxdqn.data.spread`). No floor
            applied.
        volatility: float64 ``[T]`` rolling std (ddof=1) of 1-bar log returns over
            ``data.vol_window`` bars, per bar (not annualised); during warm-up it uses the returns
            available so far (at least 2) and is 0 on rows 0 and 1.
        median_spread, median_volatility: medians of ``spread`` / ``volatility`` over the training rows.
        splits: ``"train"/"val"/"test"`` -> ``[start, end)`` row ranges, contiguous, in order,
            covering ``[0, T)``.
        bars_per_year: annualisation factor (inferred, see :mod:`foxdqn.data.frequency`, or from
            ``data.bars_per_year``).
        expected_return, expected_future_return: float64 ``[T]`` for a generated market (the
            oracle's inputs, known at the close of each bar to whoever knows the market's latent
            state; :class:`foxdqn.data.synthetic.SyntheticMarket`), None for data read from a file.
    """

    source: str
    timestamps: pd.DatetimeIndex
    open: np.ndarray
    high: np.ndarray
    low: np.ndarray
    close: np.ndarray
    volume: Optional[np.ndarray]
    features: np.ndarray
    feature_names: list[str]
    spread: np.ndarray
    volatility: np.ndarray
    median_spread: float
    median_volatility: float
    splits: dict[str, tuple[int, int]]
    bars_per_year: float
    expected_return: Optional[np.ndarray] = None
    expected_future_return: Optional[np.ndarray] = None

    def split_timestamps(self, name: str) -> pd.DatetimeIndex:
        """Timestamps of split ``name`` (``"train"``, ``"val"`` or ``"test"``)."""
        if name not in self.splits:
            raise KeyError(f"unknown split {name!r}; splits are {', '.join(self.splits)}")
        start, end = self.splits[name]
        return self.timestamps[start:end]


def load_market_data(cfg: DataConfig, window: int, episode_length: int = 1) -> MarketData:
    """Load, validate and featurise the bars named by ``cfg`` (``cfg.path`` if set, else ``cfg.name``).

    Args:
        cfg: data settings; validated first.
        window: bars in one observation (>= 1).
        episode_length: steps in one training episode (>= 1); with ``window`` it sets the
            minimum size of the train split (see :func:`foxdqn.data.splits.required_rows`).

    Raises:
        ConfigError: a bad setting (names the field).
        DataError: a missing, unparsable or invalid file (names the file and column/row), or bars
            whose spacing breaks a rule set to ``error`` (see :mod:`foxdqn.data.calendar`).
    """
    cfg.validate()
    if cfg.path is not None:
        frame = io.read_table(cfg.path, cfg.timestamp_column)
        return market_data_from_frame(frame, cfg, window, episode_length, source=cfg.path)
    spec = builtin.BUILTIN_DATASETS[cfg.name]
    if spec.make is not None:  # a generated market, with what its oracle needs
        generated, params = builtin.generate(cfg.name, cfg.synthetic)
        cfg = dataclasses.replace(cfg, timestamp_column=spec.timestamp_column)
        settings = ", ".join(f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"
                             for key, value in params.items())
        market = market_data_from_frame(generated.bars, cfg, window, episode_length,
                                        source=f"{cfg.name} (generated: {spec.description}; {settings})")
        keep = len(market.close)  # walk-forward: the fold's rows
        return dataclasses.replace(market, expected_return=generated.expected_return[:keep],
                                   expected_future_return=generated.expected_future_return[:keep])
    path = builtin.builtin_path(cfg.name)
    source = f"{cfg.name} ({path})"
    frame = io.read_table(path, spec.timestamp_column)
    if spec.timestamp_column in frame.columns:
        frame[spec.timestamp_column] = io.parse_timestamps(
            frame[spec.timestamp_column], source, spec.timestamp_column, spec.timestamp_format)
    cfg = dataclasses.replace(cfg, timestamp_column=spec.timestamp_column)
    return market_data_from_frame(frame, cfg, window, episode_length, source=source)


def market_data_from_frame(df: pd.DataFrame, cfg: DataConfig, window: int, episode_length: int = 1,
                           source: str = "frame") -> MarketData:
    """Build :class:`MarketData` from an in-memory frame laid out like a bar file.

    ``df`` holds open/high/low/close (+ optional volume) columns in any case and the timestamps
    as a column (``cfg.timestamp_column`` or auto-detected) or a datetime index. ``source`` names
    the data in error messages. Raises as :func:`load_market_data`.
    """
    cfg.validate()
    _check_positive_int("window", window, "bars in one observation")
    _check_positive_int("episode_length", episode_length, "steps in one episode")
    if len(df) == 0:
        raise DataError(f"{source}: no data rows")

    columns = io.find_columns(df, source, cfg.timestamp_column)
    timestamps = io.parse_timestamps(columns.timestamp_values, source, columns.timestamp_name,
                                     unit=cfg.time_unit)
    names = {key: str(series.name) for key, series in columns.prices.items()}
    prices = {key: validate.to_float_array(series, source, names[key], timestamps)
              for key, series in columns.prices.items()}
    volume = None
    if columns.volume is not None:
        names["volume"] = str(columns.volume.name)
        volume = validate.to_float_array(columns.volume, source, names["volume"], timestamps)
    validate.check_ohlcv(prices, volume, source, timestamps, names)
    validate.check_log_returns(prices, cfg.max_abs_log_return, source, timestamps, names)
    validate.check_increasing(timestamps, source, columns.timestamp_name)
    rows = splits.split_rows(timestamps, cfg.split, source)
    keep = splits.fold_end(rows)  # walk-forward: the rows after this fold's test block are dropped
    if keep < len(timestamps):
        timestamps = timestamps[:keep]
        prices = {key: values[:keep] for key, values in prices.items()}
        volume = None if volume is None else volume[:keep]
    for warning in calendar.check_spacing(
            timestamps, source, columns.timestamp_name, on_frequency_change=cfg.on_frequency_change,
            on_gaps=cfg.on_gaps, max_gap_bars=cfg.max_gap_bars, splits=rows):
        log.warning(warning)

    splits.check_split_sizes(rows, timestamps, window, episode_length, source)
    train = rows["train"]

    open_, high, low, close = prices["open"], prices["high"], prices["low"], prices["close"]
    raw, feature_names = features.raw_features(open_, high, low, close, volume, train,
                                               cfg.vol_window, cfg.volume_window)
    spread = estimate_spread(high, low, close, cfg.spread_window)
    volatility = np.nan_to_num(features.rolling_volatility(close, cfg.vol_window, min_periods=2), nan=0.0)
    bars_per_year = (float(cfg.bars_per_year) if cfg.bars_per_year is not None
                     else frequency.infer_bars_per_year(timestamps))
    return MarketData(
        source=str(source),
        timestamps=timestamps,
        open=open_, high=high, low=low, close=close,
        volume=volume,
        features=features.normalise(raw, train, cfg.clip),
        feature_names=feature_names,
        spread=spread,
        volatility=volatility,
        median_spread=float(np.median(spread[train[0]:train[1]])),
        median_volatility=float(np.median(volatility[train[0]:train[1]])),
        splits=rows,
        bars_per_year=bars_per_year,
    )


def _check_positive_int(name: str, value: object, meaning: str) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1 ({meaning}), got {value!r}")
