"""Schedules evaluated on the device from a device step counter.

Every value that changes during training is computed inside the step from device tensors
(docs/design/hot_loop.md#device-resident-values): a Python float used inside a CUDA-graph capture would be
frozen forever. The schedule's parameters are 0-d device tensors too, so changing them in place
(``copy_``) takes effect at the next replay without a recapture.
"""
from __future__ import annotations

import torch


def linear_value(step: torch.Tensor, start: torch.Tensor | float, end: torch.Tensor | float,
                 duration: torch.Tensor | float) -> torch.Tensor:
    """``start + (end − start) · min(float32(step) / duration, 1)``, float32, device ops only.

    The linear decay of Mnih et al. 2015 (Methods, "Training details": ε annealed linearly, then
    fixed). Broadcasts: a 0-d ``step`` with 0-d parameters gives 0-d (:class:`LinearSchedule`),
    with ``[G]`` parameters gives ``[G]`` (a population's ε per member,
    :func:`foxdqn.ops.epsilon_greedy.epsilon_schedule_reference`).

    Args:
        step: int64 (or float) counter, in the units of ``duration``.
        start, end: float32 values at step 0 and at ``duration`` and after.
        duration: float32 steps of the linear part, > 0 (not checked: a device value).
    """
    frac = torch.clamp(step.to(torch.float32) / duration, max=1.0)
    return start + (end - start) * frac


class LinearSchedule:
    """value(step) = start + (end − start) · min(step / duration, 1) (:func:`linear_value`).

    Args:
        start, end: values at step 0 and at ``duration`` and after: floats, or float32 ``[G]``
            device tensors (a population's values per member, e.g. PER's β₀), kept as they are
            (not copied), so that changing them in place changes the schedule.
        duration: steps of the linear part (> 0), in the counter's units.
        device: where the parameters live.

    ``__call__(step)``: step int64 0-d device tensor → float32 0-d device tensor (``[G]`` with a
    ``[G]`` start or end).
    """

    def __init__(self, start: float | torch.Tensor, end: float | torch.Tensor, duration: float,
                 device: torch.device):
        f32 = dict(device=device, dtype=torch.float32)
        self.start = start if isinstance(start, torch.Tensor) else torch.tensor(float(start), **f32)
        self.end = end if isinstance(end, torch.Tensor) else torch.tensor(float(end), **f32)
        self.duration = torch.tensor(max(float(duration), 1.0), **f32)

    def __call__(self, step: torch.Tensor) -> torch.Tensor:
        return linear_value(step, self.start, self.end, self.duration)
