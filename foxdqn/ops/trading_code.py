"""The trading env's state code: what the replay stores per transition instead of the observation.

A trading observation (``[W*F+2]``, :func:`foxdqn.ops.trading_step.observation_reference`) is a
pure function of four values of the account it observes: the bar index ``t`` (the window is
feature rows ``t-W+1 .. t``, the account values read ``close_t``), the position ``units``, its
``entry_price`` and the ``equity``. The code is those four values, in this order, one row
``[CODE_WIDTH]`` per state, of :func:`state_code_dtype`; the replay stores the code of s and of s'
and rebuilds both observations at sample time
(:func:`foxdqn.ops.trading_observation.trading_observation`; docs/design/replay.md#windowed-trading-replay).

No kernel here: the layout only, importable without Triton (the replay-memory precheck,
:func:`foxdqn.job.memory.replay_row`, reads it before anything is built).
"""
from __future__ import annotations

import torch

#: values per code row: t, units, entry price, equity
CODE_WIDTH = 4
CODE_T, CODE_UNITS, CODE_ENTRY, CODE_EQUITY = range(CODE_WIDTH)

#: the largest bar count whose indices float32 holds exactly (every integer up to 2**24)
FLOAT32_EXACT_INT = 2**24


def state_code_dtype(dtype: torch.dtype, num_bars: int) -> torch.dtype:
    """The dtype of the codes of an env computing in ``dtype`` over ``num_bars`` bars.

    The code must hold every value the observation reads exactly, so that the rebuilt observation
    is the stored one bit for bit: ``units``, ``entry_price`` and ``equity`` are env-``dtype``
    values and the bar index an int64 below ``num_bars``. float32 holds both when the env
    computes in float32 and every bar index is at most 2**24 (16.7M bars); otherwise float64
    (an env in float64, or a longer series: float64 holds integers up to 2**53).

    Args:
        dtype: the env's dtype, float32 or float64.
        num_bars: bars of the market series (``T``), >= 1.

    Raises:
        ValueError: ``dtype`` is neither float32 nor float64.
    """
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"state_code_dtype: the env dtype must be float32 or float64, got {dtype}")
    if dtype == torch.float32 and num_bars <= FLOAT32_EXACT_INT:
        return torch.float32
    return torch.float64
