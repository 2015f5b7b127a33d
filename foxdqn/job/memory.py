"""The replay memory of a job and how many replays fit on its device (the pre-run check and the
population launcher's plan both size replays here)."""
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


def replay_row(tc: TrainConfig, market) -> tuple[int, int]:
    """(values, bytes per value) of one stored obs / next_obs row of a device env's replay: the
    trading env's state code (:mod:`foxdqn.ops.trading_code`: 4 values of its code dtype,
    docs/design/replay.md#windowed-trading-replay), else the float32 observation."""
    if tc.env.name == "trading":  # start-up: job.check imports this module on the path of --help
        from foxdqn.data.augment import training_bars
        from foxdqn.ops.trading_code import CODE_WIDTH, state_code_dtype
        from foxdqn.step.build import ENV_DTYPES

        dtype = ENV_DTYPES[tc.env.dtype]
        num_bars = training_bars(tc.data, market) if market is not None else 0  # data.augment: paths × train bars
        return CODE_WIDTH, state_code_dtype(dtype, num_bars).itemsize
    return {"cartpole": 4, "bitflip": 2 * tc.env.n_bits}[tc.env.name], 4  # the float32 observation


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


