"""The last good weights: a copy of the trained parameters from before the last update that was applied.

A halt of the training guard skips the update that trips it (docs/design/guard.md#skip), so the
weights left on the device are those the tripping update started from: the result of the update
before it, which is often the one that went wrong (a learning rate far too large makes finite but
absurd weights in one update; the next update's loss is then NaN or above the clip). A run that
halts therefore keeps the weights from before that earlier update: per update, after the guard
has decided ``skip`` and before Adam's step,

    copy ← θ   where skip == 0      (this update is applied: θ is what it starts from)
    copy      unchanged where skip == 1

(:func:`foxdqn.ops.target_lerp.target_lerp_` with τ = 1: an exact copy, or nothing at all where
skipped, bit for bit, NaN and Inf included). At a halt the loop copies ``copy`` back into the
parameters before it writes the checkpoint (:meth:`LastGood.restore`), so ``checkpoints/last.pt``
holds the weights from before the last update applied before the halt. Cost on CUDA: one kernel
per update per 8 tensors (one read and one write of the parameters) and one copy of them.
"""
from __future__ import annotations

import torch

from foxdqn.ops.target_lerp import target_lerp_


class LastGood:
    """A copy of ``params`` from before the last applied update (see the module docstring).

    Args:
        params: the trained parameters (``Networks.trainable``), float32, contiguous, on one device.

    Attributes:
        params: those parameters; weights: the copies (the same shapes), checkpointed with the run.
    """

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = list(params)  # the parameters themselves: a checkpoint saves them once, as the network's
        self.weights = [p.detach().clone() for p in params]
        device = self.weights[0].device
        self._tau = torch.ones((), dtype=torch.float32, device=device)  # w = 1 - skip: a copy or nothing
        self._period = torch.ones((), dtype=torch.int64, device=device)  # unread (Polyak rule)

    def keep(self, updates: torch.Tensor, skip: torch.Tensor) -> None:
        """Before Adam's step of this update: copy the parameters unless ``skip`` (float32 0-d,
        the guard's flag) is 1. Device ops only; capturable."""
        with torch.no_grad():
            target_lerp_(self.weights, [p.detach() for p in self.params], updates, skip, self._tau, self._period, hard=False,
                         advance=False)

    def reset(self) -> None:
        """Copy the parameters as they are now (after a resume from a checkpoint without the copy)."""
        with torch.no_grad():
            torch._foreach_copy_(self.weights, self.params)

    def restore(self) -> None:
        """Put the copy back into the parameters (after a halt, before the checkpoint)."""
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.weights)
