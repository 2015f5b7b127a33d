"""Training-path augmentation (``data.augment``): the training split resampled into many bar series.

With ``data.augment.method: block_bootstrap`` a run builds, at its start and on its device,
``P = data.augment.paths`` series of the training split's length ``L`` (the split's bars
``0 .. L-1``; a split of the pipeline always starts at bar 0):

* **Returns.** Bar ``t >= 1`` of path ``k`` takes the log return ``r_j = ln(close_j / close_{j-1})``
  and the bar shape of source bar ``j = 1 + index[k, t-1]``, ``index`` a stationary bootstrap of the
  ``L - 1`` source returns (:func:`foxdqn.data.bootstrap.stationary_bootstrap_indices`, blocks of
  mean length ``data.augment.block_length`` bars, circular). Bar 0 is source bar 0.
* **Bars.** ``close_0`` is the source's; ``close_t = close_0 · exp(r_{j_1} + ... + r_{j_t})``; open,
  high and low keep their ratio to the close of their source bar (``open_t = close_t · open_j /
  close_j``, ...), volume is the source bar's. So every path bar is a scaled copy of a source bar,
  its gap from the previous close included, and ``low <= open, close <= high`` holds exactly.
* **Per-bar quantities.** Features, spread and volatility are computed on each path with the
  pipeline's definitions (:mod:`foxdqn.data.path_features`); the features are normalised with the
  source training split's statistics (:func:`foxdqn.data.features.normalisation`), and the routing
  medians are the source's, as for the unaugmented run.

The draws come from a CPU ``torch.Generator`` seeded from the run's seed (:func:`path_seed`,
:func:`source_bars`): the same source bars on every machine for one seed; the arithmetic runs on
the run's device (:func:`paths_of`). A population stacks its members' draws, each from its own
seed, and builds them at once (:func:`foxdqn.population.envs.member_paths`): member p's paths are
a single run's of its seed. Validation and
test walk the source market (:func:`foxdqn.step.build.build_env` augments only the training env).
The training env (:class:`foxdqn.envs.trading.TradingEnv`) lays the paths end to end and starts
each episode on one path drawn uniformly, at a bar from which its ``L``-step episode stays inside
the path (docs/backtest.md#training-path-augmentation).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from foxdqn.data import features as np_features
from foxdqn.data import path_features
from foxdqn.data.bootstrap import stationary_bootstrap_indices

__all__ = ["TrainingPaths", "build_training_paths", "path_seed", "paths_of", "resample_bars",
           "source_bars", "training_bars"]

#: Mixed with the run's seed into the seed of the path draws (so they are not the run generator's).
AUGMENT_STREAM = 0xA6
#: Path bars whose per-bar quantities are computed at once (a [P, L, window] float64 window view each).
CHUNK_BARS = 2**20


@dataclass
class TrainingPaths:
    """``P`` resampled training series laid end to end: what :class:`foxdqn.envs.trading.TradingEnv`
    reads of a market, as device tensors.

    Attributes:
        open, high, low, close: float64 ``[P·L]`` prices (path ``k`` is bars ``k·L .. k·L+L-1``).
        spread, volatility: float64 ``[P·L]``, the pipeline's quantities on each path.
        features: float32 ``[P·L, F]``, normalised with the source training split's statistics.
        feature_names: the source's.
        median_spread, median_volatility: the source training split's.
        splits: ``{"train": (0, P·L)}``.
        path_bars: ``L``.  paths: ``P``.
        source_bar: int64 ``[P, L]``: the source bar each path bar copies (column 0: bar 0).
    """

    open: Tensor
    high: Tensor
    low: Tensor
    close: Tensor
    spread: Tensor
    volatility: Tensor
    features: Tensor
    feature_names: list[str]
    median_spread: float
    median_volatility: float
    splits: dict[str, tuple[int, int]]
    path_bars: int
    paths: int
    source_bar: Tensor


def path_seed(seed: int) -> int:
    """The seed of a run's path draws: a 63-bit integer from ``(seed, AUGMENT_STREAM)``
    (``numpy.random.SeedSequence``), so the draws are not the start of the run generator's stream."""
    return int(np.random.SeedSequence([int(seed), AUGMENT_STREAM]).generate_state(1, np.uint64)[0] >> np.uint64(1))


def training_bars(data_cfg, market) -> int:
    """Bars of the series the training env walks: ``paths × L`` with augmentation, else the market's."""
    if data_cfg.augment.method == "none":
        return len(market.close)
    start, end = market.splits["train"]
    return int(data_cfg.augment.paths) * (end - start)


def resample_bars(market, source_bar: Tensor, device: torch.device) -> dict[str, Tensor | None]:
    """Bars of the paths whose bar ``t`` copies source bar ``source_bar[k, t]`` (module docstring):
    ``open, high, low, close, volume`` float64 ``[P, L]`` on ``device`` (``volume`` None when the
    market has none). ``source_bar``: int64 ``[P, L]`` in ``1 .. L-1`` except column 0, which is 0."""
    def dev(a):
        return torch.as_tensor(np.ascontiguousarray(a[:length]), dtype=torch.float64, device=device)

    length = source_bar.shape[1]
    close = dev(market.close)
    j = source_bar.to(device)
    returns = torch.zeros(length, dtype=torch.float64, device=device)
    returns[1:] = torch.log(close[1:] / close[:-1])
    path_close = close[0] * torch.exp(torch.cumsum(returns[j[:, 1:]], dim=1))
    path_close = torch.cat([close[0].expand(j.shape[0], 1), path_close], dim=1)
    bars = {name: path_close * (dev(getattr(market, name)) / close)[j] for name in ("open", "high", "low")}
    bars["close"] = path_close
    bars["volume"] = None if market.volume is None else dev(market.volume)[j]
    return bars


def source_bars(market, aug, seed: int) -> Tensor:
    """The draws of one run's paths: int64 ``[paths, L]`` on the CPU, the source bar each path bar
    copies (column 0: bar 0; columns ``1 ..``: ``1 + index`` of
    :func:`foxdqn.data.bootstrap.stationary_bootstrap_indices` of the ``L - 1`` training returns, mean
    block ``aug.block_length``, from a CPU ``torch.Generator`` seeded with :func:`path_seed` of
    ``seed``). A function of ``(seed, aug, L)`` only: a population's member draws its own paths with
    it, exactly as a single run of its seed does.

    Args:
        market: the source :class:`foxdqn.data.MarketData` (only its training split's length is read).
        aug: ``data.augment`` (:class:`foxdqn.data.config.AugmentConfig`), validated.
        seed: the run's (the member's) seed.
    """
    start, end = market.splits["train"]
    length = end - start
    generator = torch.Generator().manual_seed(path_seed(seed))
    index, _ = stationary_bootstrap_indices(length - 1, length - 1, int(aug.paths), float(aug.block_length), generator)
    return torch.cat([torch.zeros(index.shape[0], 1, dtype=torch.int64), index + 1], dim=1)


def build_training_paths(market, data_cfg, seed: int, device: torch.device) -> TrainingPaths:
    """The training paths of ``data_cfg.augment`` for ``market`` (module docstring):
    :func:`paths_of` the run's draws, :func:`source_bars`.

    Args:
        market: the validated source :class:`foxdqn.data.MarketData` (its training split is
            resampled; it is not changed).
        data_cfg: the run's ``data`` settings (:class:`foxdqn.data.config.DataConfig`), validated,
            with ``augment.method == "block_bootstrap"``.
        seed: the run's seed.
        device: where the paths are built and kept.

    Raises:
        ValueError: ``augment.method`` is not ``block_bootstrap``.
    """
    aug = data_cfg.augment
    if aug.method != "block_bootstrap":
        raise ValueError(f"build_training_paths: data.augment.method must be block_bootstrap, got {aug.method!r}")
    return paths_of(market, data_cfg, source_bars(market, aug, seed), device)


def paths_of(market, data_cfg, source_bar: Tensor, device: torch.device) -> TrainingPaths:
    """The paths whose bar ``t`` of path ``k`` copies source bar ``source_bar[k, t]``, laid end to end,
    with their per-bar quantities (module docstring). Each path is computed on its own (every op
    reads one path's row), so path ``k`` does not depend on the other rows: a population's
    ``P·paths`` rows (its members' :func:`source_bars`, stacked) give each member the paths a single
    run of its seed builds, bit for bit on one device.

    Args:
        market: the validated source :class:`foxdqn.data.MarketData`.
        data_cfg: the ``data`` settings (windows, clip; ``augment`` is not read).
        source_bar: int64 ``[K, L]`` (:func:`source_bars`; ``L`` the training split's length).
        device: where the paths are built and kept.
    """
    start, end = market.splits["train"]
    length = end - start
    raw_source, _ = np_features.raw_features(market.open, market.high, market.low, market.close, market.volume,
                                             (start, end), data_cfg.vol_window, data_cfg.volume_window)
    mean, std = (torch.as_tensor(v, device=device) for v in np_features.normalisation(raw_source, (start, end)))
    parts = []
    for chunk in source_bar.split(max(1, CHUNK_BARS // length)):  # bounds the rolling windows' memory
        bars = resample_bars(market, chunk, device)
        volume = bars["volume"] if "volume_z" in market.feature_names else None
        raw = path_features.raw_features(bars["high"], bars["low"], bars["close"], volume, data_cfg.vol_window,
                                         data_cfg.volume_window)
        parts.append({**bars, "features": path_features.normalise(raw, mean, std, float(data_cfg.clip)),
                      "spread": path_features.spread(bars["high"], bars["low"], bars["close"], data_cfg.spread_window),
                      "volatility": path_features.volatility(bars["close"], data_cfg.vol_window)})
    paths = int(source_bar.shape[0])

    def joined(name: str) -> Tensor:
        return torch.cat([p[name] for p in parts]).reshape(paths * length, *parts[0][name].shape[2:])

    return TrainingPaths(
        open=joined("open"), high=joined("high"), low=joined("low"), close=joined("close"), spread=joined("spread"),
        volatility=joined("volatility"), features=joined("features"), feature_names=list(market.feature_names),
        median_spread=float(market.median_spread), median_volatility=float(market.median_volatility),
        splits={"train": (0, paths * length)}, path_bars=length, paths=paths, source_bar=source_bar)
