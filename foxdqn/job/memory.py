"""The replay memory of a job and how many replays fit on its device (the pre-run check and the
population launcher's plan both size replays here), and a population member's resampled training
paths (``data.augment``), which the plan counts too."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from foxdqn.config.schema import TrainConfig


#: the share of the device's free memory the replays may take (the precheck's rule, and foxdqn.population.grouping)
REPLAY_SHARE = 0.8


def replays_that_fit(need: int, free: int | None) -> int | None:
    """How many replays of ``need`` bytes fit in :data:`REPLAY_SHARE` of ``free`` bytes (None:
    the free memory is unknown)."""
    return None if free is None else int(REPLAY_SHARE * free // max(need, 1))


def replay_row(tc: TrainConfig, market, members: int = 1) -> tuple[int, int]:
    """(values, bytes per value) of one stored obs / next_obs row of a device env's replay: the
    trading env's state code (:mod:`foxdqn.ops.trading_code`: 4 values of its code dtype,
    docs/design/replay.md#windowed-trading-replay), a Gymnasium env's observation in its own dtype
    (uint8 frames: 1 byte; :func:`foxdqn.envs.gym_adapter.describe`, which raises its ConfigError for
    an env it refuses), else the float32 observation. ``members``: the
    population's size; with ``data.augment`` its env walks every member's paths (``members ×
    paths × training bars``), which widens the codes to float64 past 2**24 bars."""
    if tc.env.name == "trading":  # start-up: job.check imports this module on the path of --help
        from foxdqn.data.augment import training_bars
        from foxdqn.ops.trading_code import CODE_WIDTH, state_code_dtype
        from foxdqn.step.build import ENV_DTYPES

        dtype = ENV_DTYPES[tc.env.dtype]
        num_bars = training_bars(tc.data, market) if market is not None else 0  # data.augment: paths × train bars
        if str(tc.data.augment.method) != "none":
            num_bars *= members
        return CODE_WIDTH, state_code_dtype(dtype, num_bars).itemsize
    if tc.env.name == "gym":  # the env's observation (Atari: uint8 frames); gymnasium for env=gym only
        import math

        from foxdqn.envs.gym_adapter import describe

        spaces = describe(tc.env)
        return math.prod(spaces["obs_shape"]), spaces["obs_dtype"].itemsize
    return {"cartpole": 4, "bitflip": 2 * tc.env.n_bits}[tc.env.name], 4  # the float32 observation


def training_path_bytes(tc: TrainConfig, market) -> int:
    """Bytes one run (one population member) keeps on its device for its resampled training paths
    (``data.augment``, :mod:`foxdqn.data.augment`): ``paths × training bars × (features + 6)``
    values of ``env.dtype`` (open, high, low, close, spread, volatility and the features of every
    path bar, as the trading env holds them); 0 without augmentation or market."""
    if tc.env.name != "trading" or str(tc.data.augment.method) == "none" or market is None:
        return 0
    from foxdqn.data.augment import training_bars
    from foxdqn.step.build import ENV_DTYPES

    values = len(market.feature_names) + 6
    return training_bars(tc.data, market) * values * ENV_DTYPES[tc.env.dtype].itemsize


def members_that_fit(tc: TrainConfig, market, free: int | None) -> int | None:
    """The most members of a population of ``tc``'s settings whose device memory fits in
    :data:`REPLAY_SHARE` of ``free`` bytes (the precheck's rule, times P), 0 when not one does;
    None when ``free`` is unknown. A member needs its replay (:func:`replay_row` of the population,
    whose codes may widen with P, and with ``regime.enabled`` its volatility ratios) and its resampled
    training paths (:func:`training_path_bytes`)."""
    from foxdqn.replay.buffer import replay_bytes

    def fit(members: int) -> int | None:
        need = (replay_bytes(tc.replay.capacity, *replay_row(tc, market, members), tc.regime.enabled)
                + training_path_bytes(tc, market))
        return replays_that_fit(need, free)

    most = fit(1)
    if most is None:
        return None
    low, high = 0, most  # the largest n with n <= fit(n); fit never grows with n, so it is one search
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if mid <= fit(mid) else (low, mid - 1)
    return low


def available_bytes(device: str) -> int | None:
    """Free memory of the run's device (CUDA: free GPU memory; CPU: MemAvailable on Linux)."""
    import torch

    if str(device).startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        return int(torch.cuda.mem_get_info(None if str(device) in ("cuda", "auto") else torch.device(str(device)))[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def memory_cap(tc: TrainConfig, market) -> int | None:
    """The most members of ``tc``'s settings whose replays and resampled training paths
    (``data.augment``: each member keeps its own) fit in 80 % of the device's free memory (the
    single-run precheck's rule, foxdqn.job.check.preflight, times P: :func:`members_that_fit`), at
    least 1; None when the free memory is unknown. The population launcher's cap of a group
    (:func:`foxdqn.population.grouping.plan`)."""
    fit = members_that_fit(tc, market, available_bytes(str(tc.device)))
    return None if fit is None else max(1, fit)
