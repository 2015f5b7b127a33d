"""Model selection of a population's members during training: early stoppers and kept best weights.

With ``early_stop.enabled`` (docs/design/monitors.md#early-stopping) each member keeps one
:class:`foxdqn.run.early_stop.EarlyStopper`: member p has its own stopper (its
own ``early_stop.*`` values) and its best weights are kept on the device, in a copy of the
population's networks whose slice p is overwritten when p improves (:meth:`MemberSelection.keep`).
The copies are written as each member's ``best.pt`` and loaded for its final evaluation at the end
(:meth:`MemberSelection.restore`). Everything here runs on the host between iterations; nothing in
the captured iteration reads it.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from foxdqn.run.early_stop import EarlyStopper


def copy_member(dst: nn.Module, src: nn.Module, p: int) -> None:
    """Copy member ``p``'s slices of every parameter of ``src`` into ``dst`` (both member networks of
    the same shapes, every parameter ``[P, ...]``); the other members' slices are untouched."""
    with torch.no_grad():
        for d, s in zip(dst.parameters(), src.parameters()):
            d[p].copy_(s[p])


class MemberSelection:
    """Per-member early stopping and best weights of a population ``s``
    (:class:`foxdqn.population.state.PopulationState`).

    Attributes:
        stoppers: one :class:`EarlyStopper` per member (``early_stop.enabled``, a shared key), else
            one None per member.
        best: device copies of (online, target[, IQL value]) holding each member's best weights so far
            (None without early stopping).
        best_counts: per member, (env steps, updates) of its kept weights; None: nothing kept yet.
    """

    def __init__(self, s) -> None:
        enabled = bool(s.cfg.early_stop.enabled)
        self.stoppers: list[EarlyStopper | None] = [
            EarlyStopper(c.early_stop, c.env.name) if enabled else None for c in s.cfgs]
        nets = (s.online, s.target) + (() if s.value is None else (s.value,))
        self.best = tuple(copy.deepcopy(n).requires_grad_(False) for n in nets) if enabled else None
        self.best_counts: list[tuple[int, int] | None] = [None] * s.members

    @property
    def enabled(self) -> bool:
        return self.best is not None

    def keep(self, s, p: int, env_steps: int, updates: int) -> None:
        """Member ``p``'s current weights become its kept best ones (``env_steps``, ``updates``: their counts)."""
        nets = (s.online, s.target) + (() if s.value is None else (s.value,))
        for dst, src in zip(self.best, nets):
            copy_member(dst, src, p)
        self.best_counts[p] = (int(env_steps), int(updates))

    def restore(self, s, p: int) -> None:
        """Load member ``p``'s kept best online weights into ``s.online`` (for its final evaluation)."""
        copy_member(s.online, self.best[0], p)
