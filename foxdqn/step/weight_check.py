"""The post-step weight check: Adam's step computed on a copy first, so a step that would blow the
weights up is rejected before it is applied (``guard.max_weight``; docs/design/guard.md#after-the-step).

Why a trial step and not "apply, check, undo": undoing a step on the device means a conditional
copy of the parameters and of Adam's state, and the arithmetic ways of selecting with a 0/1 flag
(``lerp``, ``a * (1 - f) + b * f``) turn into NaN when the rejected values are Inf or NaN, which is
exactly the case to undo. A trial needs no undo: the Adam kernel
(:func:`foxdqn.ops.adam_step.adam_step_`) already leaves the parameters, both moments and the step
counts untouched when the guard's ``skip`` is 1.

Per update, before the training guard and the real optimizer step (all device work, capturable):

1. one ``torch._foreach_copy_`` copies the parameters, ``exp_avg``, ``exp_avg_sq`` and ``step`` of
   the real Adam into scratch tensors (the real state is created first if Adam has not stepped
   yet, as :func:`foxdqn.step.adam.adam_state` does for the real step);
2. the same Adam kernel, with the real optimizer's hyperparameters (the same learning-rate tensor),
   the real gradients and the clip coefficient, steps the scratch copy, unconditionally (no skip);
3. :func:`foxdqn.ops.max_abs_bits.max_abs_bits` reduces the scratch weights, which are views into
   one flat buffer, to max |w| (NaN / Inf aware) in the guard's ``weight_bits``.

The training guard then reads ``weight_bits`` against ``max_weight`` (flag ``halt_weight``), folds
it into ``skip`` and the latch, and the real Adam step, the target update, the pruning masks and
the PER priorities all read that ``skip`` after it, as for the other flags. The real step runs the
same kernel on the same inputs (elementwise arithmetic, so the scratch's addresses do not matter),
so the weights it writes are the ones that were checked, bit for bit.

Cost with the check on: 3 kernel launches per update (copy, Adam, reduction), one more read and
write of parameters and moments, and scratch memory of 3x the parameters. With
``guard.max_weight`` null or 0 nothing of this exists.
"""
from __future__ import annotations

import torch

from foxdqn.ops.adam_step import adam_step_
from foxdqn.ops.max_abs_bits import max_abs_bits
from foxdqn.step.adam import Adam, adam_hyperparameters, adam_state, group_lr

#: Scratch views start at multiples of this many elements (256 bytes of float32, as the allocator
#: aligns the parameters).
ALIGN = 64


def _flat_views(shapes: list[torch.Size], device: torch.device) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A zeroed float32 buffer and views of it shaped ``shapes`` (each at an ALIGN multiple;
    the gaps stay 0)."""
    offsets, total = [], 0
    for shape in shapes:
        offsets.append(total)
        n = shape.numel()
        total += -(-n // ALIGN) * ALIGN
    flat = torch.zeros(total, dtype=torch.float32, device=device)
    return flat, [flat[o:o + s.numel()].view(s) for o, s in zip(offsets, shapes)]


class WeightCheck:
    """Trial step of ``optimizer`` on scratch copies and the max |w| of its result.

    Args:
        optimizer: the run's :class:`foxdqn.step.adam.Adam` (or a ``torch.optim.Adam``: one group,
            no amsgrad; stepped by :func:`foxdqn.step.adam.adam_update_`), every parameter float32
            on one device.
        weight_bits: int32 0-d on that device (``TrainingGuard.weight_bits``), max-accumulated
            by :meth:`run`; the guard reads and resets it.

    Attributes:
        params: the real parameters (the optimizer's group, in order).
        flat: float32 ``[M]``, the scratch weights' buffer (the views and zero padding).
        weights, exp_avgs, exp_avg_sqs, steps: the scratch tensors (views / 0-d float32).

    The scratch is overwritten at every update, so it is not checkpointed
    (:func:`foxdqn.run.checkpoint.state_tensors` passes over this object: ``checkpointed = False``).

    Raises:
        ValueError: not an Adam, several groups or amsgrad
            (:func:`foxdqn.step.adam.adam_hyperparameters`), a parameter that is not float32, or
            parameters on several devices.
    """

    checkpointed = False

    def __init__(self, optimizer: Adam | torch.optim.Adam, weight_bits: torch.Tensor) -> None:
        if not isinstance(optimizer, (Adam, torch.optim.Adam)):
            raise ValueError("WeightCheck: the post-step weight check needs foxdqn.step.adam.Adam or torch.optim.Adam, "
                             f"got {type(optimizer).__name__}")
        adam_hyperparameters(optimizer)
        self.optimizer = optimizer
        self.params = list(optimizer.param_groups[0]["params"])
        devices = {p.device for p in self.params}
        if len(devices) > 1:
            raise ValueError(f"WeightCheck: parameters on several devices {sorted(map(str, devices))}")
        bad = [i for i, p in enumerate(self.params) if p.dtype != torch.float32]
        if bad:
            raise ValueError(f"WeightCheck: parameters must be float32; parameter {bad[0]} is "
                             f"{self.params[bad[0]].dtype}")
        device = weight_bits.device
        shapes = [p.shape for p in self.params]
        self.weight_bits = weight_bits
        self.flat, self.weights = _flat_views(shapes, device)
        self._flat_m, self.exp_avgs = _flat_views(shapes, device)
        self._flat_v, self.exp_avg_sqs = _flat_views(shapes, device)
        self.steps = [torch.zeros((), dtype=torch.float32, device=device) for _ in self.params]

    @torch.no_grad()
    def run(self, grad_scale: torch.Tensor | None = None) -> None:
        """After the gradients are final (masked) and the clip coefficient ``grad_scale`` (float32
        0-d, or None) is known, before the guard: copy, trial step, max |w| into ``weight_bits``.
        Device ops only; no sync."""
        live = [k for k, p in enumerate(self.params) if p.grad is not None]  # Adam steps only these
        live_params = [self.params[k] for k in live]
        exp_avgs, exp_avg_sqs, steps = adam_state(self.optimizer, live_params)
        dst = [*self.weights, *(self.exp_avgs[k] for k in live), *(self.exp_avg_sqs[k] for k in live),
               *(self.steps[k] for k in live)]
        src = [*(p.detach() for p in self.params), *exp_avgs, *exp_avg_sqs, *steps]
        torch._foreach_copy_(dst, src)
        if live:
            beta1, beta2, eps = adam_hyperparameters(self.optimizer)
            adam_step_([self.weights[k] for k in live], [p.grad for p in live_params],
                       [self.exp_avgs[k] for k in live], [self.exp_avg_sqs[k] for k in live],
                       [self.steps[k] for k in live], lr=group_lr(self.optimizer), beta1=beta1,
                       beta2=beta2, eps=eps, grad_scale=grad_scale)
        max_abs_bits(self.flat, self.weight_bits)
