"""The last good weights: a copy of the trained parameters from before the last update that was applied.

A halt of the training guard skips the update that trips it (docs/design/guard.md#skip), so the
weights left on the device are those the tripping update started from: the result of the update
before it, which is often the one that went wrong (a learning rate far too large makes finite but
absurd weights in one update; the next update's loss is then NaN or above the clip). A run that
halts therefore keeps the weights from before that earlier update: Adam's kernel, which reads every
parameter anyway, also stores each parameter's value from before its step where the step is
applied (``prior`` of :func:`foxdqn.ops.adam_step.adam_step_`: no launch, one more store per
element), and leaves the copy alone where the guard's ``skip`` is 1. At a halt the loop copies it
back into the parameters before it writes the checkpoint (:meth:`LastGood.restore`), so
``checkpoints/last.pt`` holds the weights from before the last update applied before the halt.
Cost: one copy of the parameters in memory and one more store per element per update.
"""
from __future__ import annotations

import torch


class LastGood:
    """A copy of ``params`` from before the last applied update (see the module docstring).

    Args:
        params: the trained parameters (``Networks.trainable``, the optimizer's group), float32,
            contiguous, on one device.

    Attributes:
        params: those parameters; weights: the copies (the same shapes), checkpointed with the run;
        of: ``id(param)`` → its copy, what :func:`foxdqn.step.adam.adam_update_` takes as ``prior``.
    """

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = list(params)  # the parameters themselves: a checkpoint saves them once, as the network's
        self.weights = [p.detach().clone() for p in params]
        self.of = {id(p): w for p, w in zip(self.params, self.weights)}

    def reset(self) -> None:
        """Copy the parameters as they are now (after a resume from a checkpoint without the copy)."""
        with torch.no_grad():
            torch._foreach_copy_(self.weights, self.params)

    def restore(self) -> None:
        """Put the copy back into the parameters (after a halt, before the checkpoint)."""
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.weights)
