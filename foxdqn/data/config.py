"""Configuration of the market-data pipeline (the ``data`` group of the run config).

Both classes are plain dataclasses so they work as Hydra/OmegaConf structured configs.
:meth:`DataConfig.validate` checks every field and raises :class:`~foxdqn.errors.ConfigError`
naming the field (``data.vol_window``, ``data.split.train``, ...) and what is allowed.
Checks that need the data itself (dates inside the data range, enough rows per split) are done
when loading and raise :class:`~foxdqn.errors.DataError`.
"""
import math
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Optional

import pandas as pd

from foxdqn.errors import ConfigError

#: Tolerance on ``train + val + test == 1``.
FRACTION_SUM_TOL = 1e-6
#: Allowed values of ``data.on_frequency_change``, ``data.on_gaps`` and ``data.time_unit``.
ON_FREQUENCY_CHANGE = ("error", "warn")
ON_GAPS = ("error", "warn", "ignore")
TIME_UNITS = ("s", "ms", "us", "ns")


@dataclass
class SplitConfig:
    """Chronological train/val/test split.

    By fractions of the rows (each > 0, summing to 1 within 1e-6), or by dates: when both
    ``val_start`` and ``test_start`` are set (ISO date/time strings) they win over the
    fractions; the validation split then starts at the first bar at or after ``val_start``
    and the test split at the first bar at or after ``test_start``.
    """

    train: float = 0.70  # fraction of the rows, chronologically first
    val: float = 0.15  # fraction of the rows after train (model selection)
    test: float = 0.15  # fraction of the rows, last (evaluated once)
    # ISO dates, set both or neither: val / test start at the first bar at or after them (wins over fractions)
    val_start: Optional[str] = None
    test_start: Optional[str] = None  # see val_start

    @property
    def by_dates(self) -> bool:
        """True when the split is given by ``val_start``/``test_start`` (both set)."""
        return self.val_start is not None and self.test_start is not None

    def validate(self, prefix: str = "data.split") -> None:
        """Raise :class:`ConfigError` naming the first bad field (``<prefix>.<field>``)."""
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
class DataConfig:
    """Where the bars come from and how features are built.

    ``name`` picks a built-in dataset (see :data:`foxdqn.data.BUILTIN_DATASETS`) and is ignored
    when ``path`` (a CSV or Parquet file) is set. Window lengths are in bars; ``clip`` is in
    standard deviations of the training split; ``bars_per_year`` overrides the inferred
    annualisation factor (see :func:`foxdqn.data.frequency.infer_bars_per_year`).

    Bar spacing (see :mod:`foxdqn.data.calendar`): ``on_frequency_change`` (``error`` | ``warn``)
    says what a change of bar frequency part-way through does; ``on_gaps`` (``error`` | ``warn`` |
    ``ignore``) what a gap longer than ``max_gap_bars`` median spacings (>= 1) does.
    ``time_unit`` (null | ``s`` | ``ms`` | ``us`` | ``ns``) is the unit of numeric timestamps
    (Unix epoch times); numeric timestamps other than ``YYYYMMDD`` dates are refused while it is null.
    ``max_abs_log_return`` bounds |log(price / previous close)| of every price of a bar (a typo such
    as a price of 1e300, a unit change part-way); null: no bound.
    """

    name: Optional[str] = "eurusd_1h"  # built-in dataset: eurusd_1h | googl_1d | martingale_1h (ignored with path)
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

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first bad field (``data.<field>``)."""
        from foxdqn.data.builtin import BUILTIN_DATASETS  # local: builtin imports nothing heavy

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


def parse_split_date(value: object, field_name: str) -> pd.Timestamp:
    """Parse a split boundary (ISO date/time string) or raise :class:`ConfigError` naming the field."""
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
