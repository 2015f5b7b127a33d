"""The post-step weight check: Adam's step computed on a copy first, so a step that would blow the
weights up is rejected before it is applied (``guard.max_weight``; docs/design/guard.md#after-the-step).

Why a trial step and not "apply, check, undo": undoing a step on the device means a conditional
copy of the parameters and of Adam's state, and the arithmetic ways of selecting with a 0/1 flag
(``lerp``, ``a * (1 - f) + b * f``) turn into NaN when the rejected values are Inf or NaN, which is
exactly the case to undo. A trial needs no undo: fused Adam already leaves the parameters, both
moments and its step count untouched when its ``found_inf`` (the guard's ``skip``) is 1.

Per update, before the training guard and the real optimizer step (all device work, capturable):

1. one ``torch._foreach_copy_`` copies the parameters, ``exp_avg``, ``exp_avg_sq`` and ``step`` of
   the real Adam into scratch tensors (before Adam's first step, when it has no state yet, the
   scratch moments and steps are zeroed instead: what Adam's lazy initialisation will create);
2. a shadow fused Adam with the real optimizer's hyperparameters (the same learning-rate tensor)
   and the real gradients steps the scratch copy (``_foreach_add_`` of the steps and one fused
   Adam kernel, unconditionally: no ``found_inf``);
3. :func:`foxdqn.ops.max_abs_bits.max_abs_bits` reduces the scratch weights, which are views into
   one flat buffer, to max |w| (NaN / Inf aware) in the guard's ``weight_bits``.

The training guard then reads ``weight_bits`` against ``max_weight`` (flag ``halt_weight``), folds
it into ``skip`` and the latch, and the real fused Adam, the target update, the pruning masks and
the PER priorities all read that ``skip`` after it, as for the other flags. The real step runs the
same fused kernel on the same inputs (same shapes, every scratch view 256-byte aligned like the
parameters), so the weights it writes are the ones that were checked, bit for bit.

Cost with the check on: 4 kernel launches per update (copy, step increment, fused Adam,
reduction), one more read and write of parameters and moments, and scratch memory of 3x the
parameters. With ``guard.max_weight`` null or 0 nothing of this exists.
"""
from __future__ import annotations

import torch

from foxdqn.ops.max_abs_bits import max_abs_bits

#: Scratch views start at multiples of this many elements (256 bytes of float32): the fused
#: Adam kernel takes the same (vectorised, aligned) path on the scratch as on the parameters.
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
        optimizer: the run's fused ``torch.optim.Adam`` (``fused=True``, no amsgrad), every
            parameter float32 on one device.
        weight_bits: int32 0-d on that device (``TrainingGuard.weight_bits``), max-accumulated
            by :meth:`run`; the guard reads and resets it.

    Attributes:
        params: the real parameters (all of the optimizer's groups, in order).
        flat: float32 ``[M]``, the scratch weights' buffer (the views and zero padding).
        weights, exp_avgs, exp_avg_sqs, steps: the scratch tensors (views / 0-d float32).
        shadow: the fused Adam that steps them.

    The scratch is overwritten at every update, so it is not checkpointed
    (:func:`foxdqn.checkpoint.state_tensors` passes over this object: ``checkpointed = False``).

    Raises:
        ValueError: not fused Adam, amsgrad, a parameter that is not float32, or parameters on
            several devices.
    """

    checkpointed = False

    def __init__(self, optimizer: torch.optim.Optimizer, weight_bits: torch.Tensor) -> None:
        groups = optimizer.param_groups
        if not isinstance(optimizer, torch.optim.Adam) or not all(g.get("fused") for g in groups):
            raise ValueError("WeightCheck: the post-step weight check needs torch.optim.Adam with fused=True "
                             f"(its found_inf skips a step), got {type(optimizer).__name__}")
        if any(g.get("amsgrad") for g in groups):
            raise ValueError("WeightCheck: amsgrad is not supported")
        self.optimizer = optimizer
        self.params = [p for g in groups for p in g["params"]]
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
        # the shadow optimizer: the same groups and hyperparameters (lr is the same tensor), its
        # parameters are Parameters sharing the scratch views' memory, its state the scratch
        shadow_params = [torch.nn.Parameter(w, requires_grad=True) for w in self.weights]
        it = iter(shadow_params)
        shadow_groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [next(it) for _ in g["params"]]}
                         for g in groups]
        first = groups[0]
        self.shadow = torch.optim.Adam(shadow_groups, lr=first["lr"], fused=True,
                                       capturable=bool(first.get("capturable", False)))
        self._shadow_params = shadow_params
        for sp, m, v, st in zip(shadow_params, self.exp_avgs, self.exp_avg_sqs, self.steps):
            self.shadow.state[sp] = {"step": st, "exp_avg": m, "exp_avg_sq": v}

    @torch.no_grad()
    def run(self) -> None:
        """After the gradients are final (clipped, masked), before the guard: copy, trial step,
        max |w| into ``weight_bits``. Device ops only; no sync."""
        dst, src, fresh = [], [], []
        state = self.optimizer.state
        for p, sp, w, m, v, st in zip(self.params, self._shadow_params, self.weights, self.exp_avgs,
                                      self.exp_avg_sqs, self.steps):
            sp.grad = p.grad  # the real gradient tensor (None: Adam skips the parameter in both)
            dst.append(w)
            src.append(p.detach())
            live = state.get(p)
            if live and "exp_avg" in live:
                dst += [m, v, st]
                src += [live["exp_avg"], live["exp_avg_sq"], live["step"]]
            else:  # before Adam's first step: the state its lazy initialisation creates
                fresh += [m, v, st]
        torch._foreach_copy_(dst, src)
        if fresh:
            torch._foreach_zero_(fresh)
        self.shadow.step()
        max_abs_bits(self.flat, self.weight_bits)
