"""The target networks' update: θ' ← θ' + w (θ − θ') once per gradient update, on the device.

``w`` is Polyak τ (``target.update=polyak``) or 1 every ``target.period``
updates and 0 otherwise (``hard``: the hard copy of Mnih et al. 2015), times (1 − skip) so a
skipped update (training guard) leaves the targets unchanged. τ and the period are 0-d device
tensors: change them in place (``fill_``) and a captured graph sees the new values.

On CUDA an update costs one kernel per 8 target tensors (:func:`foxdqn.ops.target_lerp.target_lerp_`):
``w``, the lerp of every target and, with ``advance``, the update counter's ``+= 1``, in place of
the weight's torch expressions and ``torch._foreach_lerp_`` (which, with a tensor weight, is one
kernel per target tensor).
"""
from __future__ import annotations

import torch

from foxdqn.ops.target_lerp import target_lerp_


class TargetUpdate:
    """One job: move the target parameters toward their sources after each update.

    Args:
        mode: ``"polyak"`` or ``"hard"`` (``target.update``).
        tau: Polyak τ in [0, 1].
        hard_period: updates between hard copies (>= 1).
        targets: the target parameters (target network + objective's Polyak pairs).
        sources: what they follow, the same length and shapes.
        device: where the 0-d tensors live.

    Attributes:
        hard: bool, ``mode == "hard"``.  tau: float32 0-d.  hard_period: int64 0-d.
        weight: float32 0-d, the last update's ``w`` (written by :meth:`apply`): τ, or 1 when
        ``(updates + 1) % hard_period == 0`` (hard); 0 when skipped.
        targets, sources: the parameter lists.

    Raises:
        ValueError: ``targets`` and ``sources`` differ in length.
    """

    def __init__(self, mode: str, tau: float, hard_period: int, targets: list[torch.Tensor],
                 sources: list[torch.Tensor], device: torch.device) -> None:
        if len(targets) != len(sources):
            raise ValueError(f"TargetUpdate: {len(targets)} targets but {len(sources)} sources")
        self.hard = mode == "hard"
        self.tau = torch.tensor(tau, device=device, dtype=torch.float32)
        self.hard_period = torch.tensor(hard_period, dtype=torch.int64, device=device)
        self.weight = torch.zeros((), device=device, dtype=torch.float32)
        self.targets, self.sources = targets, sources
        self._sources = [s.detach() for s in sources]  # views of the same memory, made once

    def apply(self, updates: torch.Tensor, skip: torch.Tensor, advance: bool = False) -> None:
        """θ' ← θ' + w (θ − θ') for every target (device ops only, no autograd). With ``advance``,
        ``updates`` (int64 0-d) is incremented by 1 once ``w`` is computed: the update step's
        counter, when nothing after the target update reads it (:func:`foxdqn.step.update.update_step`)."""
        with torch.no_grad():  # else the targets would join the autograd graph (and keep it alive)
            target_lerp_(self.targets, self._sources, updates, skip, self.tau,
                         self.hard_period, hard=self.hard, advance=advance, weight=self.weight)
