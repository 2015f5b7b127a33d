"""Configuration of the market-data pipeline (the ``data`` group of the run config).

Both classes are plain dataclasses so they work as Hydra/OmegaConf structured configs.
:meth:`DataConfig.validate` checks every field and raises :class:`~foxdqn.errors.ConfigError`
naming the field (``data.vol_window``, ``data.split.train``, ...) and what is allowed.
Checks that need the data itself (dates inside the data range, enough rows per split) are done
when loading and raise :class:`~foxdqn.errors.DataError`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from numbers import Integral, Real
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # imported where a date is parsed: composing a config never loads pandas
    import pandas as pd

from foxdqn.data.builtin import BUILTIN_DATASETS, generated_names
from foxdqn.errors import ConfigError

#: Tolerance on ``train + val + test == 1``.
FRACTION_SUM_TOL = 1e-6
#: Allowed values of ``data.on_frequency_change``, ``data.on_gaps`` and ``data.time_unit``.
ON_FREQUENCY_CHANGE = ("error", "warn")
ON_GAPS = ("error", "warn", "ignore")
TIME_UNITS = ("s", "ms", "us", "ns")
#: Allowed values of ``data.augment.method``.
AUGMENT_METHODS = ("none", "block_bootstrap")


@dataclass
class SplitConfig:
    """Chronological train/val/test split.

    By fractions of the rows (each > 0, summing to 1 within 1e-6), or by dates: when both
    ``val_start`` and ``test_start`` are set (ISO date/time strings) they win over the
    fractions; the validation split then starts at the first bar at or after ``val_start``
    and the test split at the first bar at or after ``test_start``.

    Walk-forward (``folds`` K > 1, ``fold`` k in [0, K)): the test split above is cut into K
    blocks of (nearly) equal rows; fold k tests on block k, validates on the val split's number of
    rows just before it, trains on every row before that, and its data ends where block k ends
    (:func:`foxdqn.data.splits.split_rows`; docs/backtest.md#walk-forward).
    """

    train: float = 0.70  # fraction of the rows, chronologically first
    val: float = 0.15  # fraction of the rows after train (model selection)
    test: float = 0.15  # fraction of the rows, last (evaluated once)
    # ISO dates, set both or neither: val / test start at the first bar at or after them (wins over fractions)
    val_start: Optional[str] = None
    test_start: Optional[str] = None  # see val_start
    folds: int = 1  # walk-forward: the test split cut into this many blocks, one per fold (1 = no walk-forward)
    fold: int = 0  # walk-forward: this run's block, 0 .. folds-1 (expanding train, val just before the block)

    @property
    def by_dates(self) -> bool:
        """True when the split is given by ``val_start``/``test_start`` (both set)."""
        return self.val_start is not None and self.test_start is not None

    def validate(self, prefix: str = "data.split") -> None:
        """Raise :class:`ConfigError` naming the first bad field (``<prefix>.<field>``)."""
        if isinstance(self.folds, bool) or not isinstance(self.folds, int) or self.folds < 1:
            raise ConfigError(f"{prefix}.folds must be an integer >= 1 (walk-forward blocks), got {self.folds!r}")
        if isinstance(self.fold, bool) or not isinstance(self.fold, int) or not 0 <= self.fold < self.folds:
            raise ConfigError(f"{prefix}.fold must be an integer from 0 to {prefix}.folds - 1 = {self.folds - 1}, "
                              f"got {self.fold!r}")
        if (self.val_start is None) != (self.test_start is None):
            raise ConfigError(
                f"{prefix}.val_start and {prefix}.test_start must be set together (both ISO "
                f"dates to split by date) or both left unset (to split by fractions); got "
                f"val_start={self.val_start!r}, test_start={self.test_start!r}"
            )
        if self.by_dates:
            val = parse_split_date(self.val_start, f"{prefix}.val_start")
            test = parse_split_date(self.test_start, f"{prefix}.test_start")
            if _naive_utc(val) >= _naive_utc(test):
                raise ConfigError(
                    f"{prefix}.val_start ({self.val_start}) must be earlier than "
                    f"{prefix}.test_start ({self.test_start})"
                )
            return
        for name in ("train", "val", "test"):
            value = getattr(self, name)
            if not _is_real(value) or not math.isfinite(value) or value <= 0:
                raise ConfigError(
                    f"{prefix}.{name} must be a number > 0 (a fraction of the rows), got {value!r}"
                )
        total = self.train + self.val + self.test
        if abs(total - 1.0) > FRACTION_SUM_TOL:
            raise ConfigError(
                f"{prefix}.train + {prefix}.val + {prefix}.test must sum to 1 (within "
                f"{FRACTION_SUM_TOL:g}), got {self.train} + {self.val} + {self.test} = {total:.6g}"
            )


@dataclass
class SyntheticConfig:
    """Parameters of a generated market (``data.name``: ``martingale_1h``, ``ar1_1h``,
    ``regime_1h``, ``trend_1h``; docs/backtest.md#markets-with-a-known-answer).

    null: the market's default (:data:`foxdqn.data.builtin.BUILTIN_DATASETS`). A key that the
    chosen market does not read must stay null, and every key must stay null for a dataset read
    from a file (``data.path``, ``eurusd_1h``, ``googl_1d``).
    """

    bars: Optional[int] = None  # bars generated (null: 6225 for martingale_1h, 40000 for the others)
    seed: Optional[int] = None  # the generator's seed, >= 0 (null: 0)
    # std of one bar's log return, > 0 (null: 0.001 for martingale_1h, 0.002 for the others)
    vol_per_bar: Optional[float] = None
    phi: Optional[float] = None  # AR(1) coefficient, -1 < phi < 1 (ar1_1h; regime_1h: +-phi; null: 0.2)
    regime_length: Optional[float] = None  # mean regime / trend segment length in bars, >= 1 (regime_1h, trend_1h; null: 500)
    drift: Optional[float] = None  # trend_1h: the drift's magnitude, a log return per bar >= 0 (null: 0.0002)

    def set_keys(self) -> list[str]:
        """The keys that are not null, in field order."""
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]

    def validate(self, name: Optional[str], prefix: str = "data.synthetic") -> None:
        """Check the values, and that the market ``name`` reads every key that is set (``name``
        None: the data is read from a file, so none may be set). Raises :class:`ConfigError`
        naming ``<prefix>.<key>``."""
        for key in ("bars", "seed"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, Integral)
                                      or value < (1 if key == "bars" else 0)):
                raise ConfigError(f"{prefix}.{key} must be an integer >= {1 if key == 'bars' else 0} or null, "
                                  f"got {value!r}")
        checks = {"vol_per_bar": (lambda v: v > 0, "a number > 0 (the standard deviation of a bar's log return)"),
                  "phi": (lambda v: -1 < v < 1, "a number in (-1, 1) (a stationary AR(1) process)"),
                  "regime_length": (lambda v: v >= 1, "a number >= 1 (bars)"),
                  "drift": (lambda v: v >= 0, "a number >= 0 (a log return per bar)")}
        for key, (ok, what) in checks.items():
            value = getattr(self, key)
            if value is not None and (not _is_real(value) or not math.isfinite(value) or not ok(value)):
                raise ConfigError(f"{prefix}.{key} must be {what} or null, got {value!r}")
        keys = self.set_keys()
        if not keys:
            return
        spec = BUILTIN_DATASETS.get(name) if name is not None else None
        if spec is None or spec.make is None:
            where = "the bars are read from data.path" if name is None else f"data.name={name} is read from a file"
            raise ConfigError(f"{prefix}.{keys[0]} is set, but {where}; {prefix}.* are the parameters of the "
                              f"generated markets ({', '.join(generated_names())})")
        for key in keys:
            if key not in spec.parameters:
                raise ConfigError(f"{prefix}.{key} is not a parameter of data.name={name} (its parameters: "
                                  f"{', '.join(spec.parameters)})")


@dataclass
class AugmentConfig:
    """Resampled training paths (docs/backtest.md#training-path-augmentation, :mod:`foxdqn.data.augment`).

    ``method: block_bootstrap`` builds ``paths`` series at the start of a run, each the training
    split's bar log returns resampled in stationary-bootstrap blocks (Politis & Romano 1994) of
    mean length ``block_length`` bars, with its bars, spread and features rebuilt; every training
    episode starts on one of them. Validation and test are never augmented.
    """

    # none | block_bootstrap: training episodes on resampled paths of the training split
    #   (docs/backtest.md#training-path-augmentation); validation and test are never resampled
    method: str = "none"
    block_length: float = 50.0  # block_bootstrap: mean block length in bars (>= 1; geometric lengths)
    paths: int = 32  # block_bootstrap: resampled training paths built at start, on the run's device

    def validate(self, prefix: str = "data.augment") -> None:
        """Raise :class:`ConfigError` naming the first bad field (``<prefix>.<field>``)."""
        _check_choice(f"{prefix}.method", self.method, AUGMENT_METHODS)
        if not _is_real(self.block_length) or not math.isfinite(self.block_length) or self.block_length < 1:
            raise ConfigError(f"{prefix}.block_length must be a finite number >= 1 (the mean block length in bars), "
                              f"got {self.block_length!r}")
        if isinstance(self.paths, bool) or not isinstance(self.paths, Integral) or self.paths < 1:
            raise ConfigError(f"{prefix}.paths must be an integer >= 1 (resampled training paths), got {self.paths!r}")


@dataclass
class DataConfig:
    """Where the bars come from and how features are built.

    ``name`` picks a built-in dataset (see :data:`foxdqn.data.BUILTIN_DATASETS`) and is ignored
    when ``path`` (a CSV or Parquet file) is set. Window lengths are in bars; ``clip`` is in
    standard deviations of the training split; ``bars_per_year`` overrides the inferred
    annualisation factor (see :func:`foxdqn.data.frequency.infer_bars_per_year`). ``synthetic``
    holds the parameters of a generated market (:class:`foxdqn.data.config.SyntheticConfig`).

    Bar spacing (see :mod:`foxdqn.data.calendar`): ``on_frequency_change`` (``error`` | ``warn``)
    says what a change of bar frequency part-way through does; ``on_gaps`` (``error`` | ``warn`` |
    ``ignore``) what a gap longer than ``max_gap_bars`` median spacings (>= 1) does.
    ``time_unit`` (null | ``s`` | ``ms`` | ``us`` | ``ns``) is the unit of numeric timestamps
    (Unix epoch times); numeric timestamps other than ``YYYYMMDD`` dates are refused while it is null.
    ``max_abs_log_return`` bounds |log(price / previous close)| of every price of a bar (a typo such
    as a price of 1e300, a unit change part-way); null: no bound. ``augment`` resamples the training
    split into more paths (:class:`foxdqn.data.config.AugmentConfig`).
    """

    # built-in dataset: eurusd_1h | googl_1d | martingale_1h | ar1_1h | regime_1h | trend_1h (ignored with path)
    name: Optional[str] = "eurusd_1h"
    path: Optional[str] = None  # a CSV or Parquet file of OHLCV bars (wins over name)
    # the file's time column (null: the one column named timestamp, datetime, date, time, ...)
    timestamp_column: Optional[str] = None
    split: SplitConfig = field(default_factory=SplitConfig)
    vol_window: int = 20  # bars of the rolling volatility feature (and of the routing rule's volatility)
    volume_window: int = 20  # bars of the rolling volume normalisation
    spread_window: int = 20  # bars of the Corwin-Schultz spread estimate's smoothing
    clip: float = 10.0  # features clipped at ± this many training-split standard deviations
    # annualisation of Sharpe and Sortino (null: inferred from the timestamps)
    bars_per_year: Optional[float] = None
    on_frequency_change: str = "error"  # a bar frequency that changes part-way: error | warn
    on_gaps: str = "warn"  # a gap longer than max_gap_bars median spacings: error | warn | ignore
    max_gap_bars: float = 5.0  # gap threshold, in median bar spacings (>= 1)
    # unit of numeric timestamps: s | ms | us | ns (null: numeric timestamps other than YYYYMMDD are refused)
    time_unit: Optional[str] = None
    # plausibility bound: a price whose log return against the previous close exceeds this is refused (null: none)
    max_abs_log_return: Optional[float] = 1.0
    # parameters of a generated market (data.name=martingale_1h | ar1_1h | regime_1h | trend_1h); null: its default
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)  # resampled training paths (off: method none)

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first bad field (``data.<field>``)."""
        if self.path is not None:
            if not isinstance(self.path, str) or not self.path.strip():
                raise ConfigError(f"data.path must be a non-empty file path string, got {self.path!r}")
        elif self.name is None:
            raise ConfigError(
                "data.name and data.path are both unset; set data.name to a built-in dataset "
                f"({', '.join(sorted(BUILTIN_DATASETS))}) or data.path to a CSV/Parquet file"
            )
        elif self.name not in BUILTIN_DATASETS:
            raise ConfigError(
                f"data.name {self.name!r} is not a built-in dataset; built-ins are: "
                f"{', '.join(sorted(BUILTIN_DATASETS))} (or set data.path to a CSV/Parquet file)"
            )
        if self.timestamp_column is not None and (
            not isinstance(self.timestamp_column, str) or not self.timestamp_column.strip()
        ):
            raise ConfigError(
                "data.timestamp_column must be a column name or null (auto-detect), "
                f"got {self.timestamp_column!r}"
            )
        self.split.validate("data.split")
        _check_int("data.vol_window", self.vol_window, minimum=2)
        _check_int("data.volume_window", self.volume_window, minimum=2)
        _check_int("data.spread_window", self.spread_window, minimum=1)
        if not _is_real(self.clip) or not math.isfinite(self.clip) or self.clip <= 0:
            raise ConfigError(f"data.clip must be a finite number > 0 (standard deviations), got {self.clip!r}")
        if self.bars_per_year is not None and (
            not _is_real(self.bars_per_year)
            or not math.isfinite(self.bars_per_year)
            or self.bars_per_year <= 0
        ):
            raise ConfigError(
                f"data.bars_per_year must be a finite number > 0 or null (infer), got {self.bars_per_year!r}"
            )
        _check_choice("data.on_frequency_change", self.on_frequency_change, ON_FREQUENCY_CHANGE)
        _check_choice("data.on_gaps", self.on_gaps, ON_GAPS)
        if not _is_real(self.max_gap_bars) or not math.isfinite(self.max_gap_bars) or self.max_gap_bars < 1:
            raise ConfigError(
                f"data.max_gap_bars must be a finite number >= 1 (median bar spacings), got {self.max_gap_bars!r}"
            )
        if self.max_abs_log_return is not None and (
                not _is_real(self.max_abs_log_return) or not math.isfinite(self.max_abs_log_return)
                or self.max_abs_log_return <= 0):
            raise ConfigError("data.max_abs_log_return must be a finite number > 0 (a log return per bar) or null "
                              f"(no bound), got {self.max_abs_log_return!r}")
        if self.time_unit is not None:
            _check_choice("data.time_unit", self.time_unit, TIME_UNITS, "or null (timestamps are dates/times)")
        self.synthetic.validate(self.name if self.path is None else None)
        self.augment.validate("data.augment")


def parse_split_date(value: object, field_name: str) -> pd.Timestamp:
    """Parse a split boundary (ISO date/time string) or raise :class:`ConfigError` naming the field."""
    import pandas as pd

    try:
        ts = pd.Timestamp(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"{field_name} must be an ISO date/time such as '2017-10-01' or '2017-10-01 12:00', "
            f"got {value!r} ({exc})"
        ) from None
    if ts is pd.NaT:
        raise ConfigError(f"{field_name} must be an ISO date/time such as '2017-10-01', got {value!r}")
    return ts


def _naive_utc(ts: pd.Timestamp) -> pd.Timestamp:
    return ts.tz_convert("UTC").tz_localize(None) if ts.tzinfo is not None else ts


def _is_real(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _check_int(field_name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ConfigError(f"{field_name} must be an integer >= {minimum} (bars), got {value!r}")


def _check_choice(field_name: str, value: object, allowed: tuple[str, ...], extra: str = "") -> None:
    if not isinstance(value, str) or value not in allowed:
        extra = f" {extra}" if extra else ""
        raise ConfigError(f"{field_name} must be one of {' | '.join(allowed)}{extra}, got {value!r}")
