"""Hindsight experience replay of a population (``replay.her``): each member relabels its own rows.

The single run's relabelling (:class:`foxdqn.replay.her.HindsightRelabeler`, "future" strategy,
Andrychowicz et al. 2017, §3.3 and §4.5) on a member-major batch of P·B rows of the population's
ring (:class:`~foxdqn.population.replay.MemberReplay`): a row's future step is looked up in its own
env column (member p's columns are its own envs), its two uniforms are the member's next values
(``MemberRandom.uniform(2·B)``: B for the future steps, then B for the relabel tests, the order of a
single run's ``torch.rand(2, B)``), and its reward and discount are recomputed with the member's own
reward scale and γ. ``replay.her_k`` is shared (a group key).
"""
from __future__ import annotations

import torch

from foxdqn.population.random import MemberRandom
from foxdqn.replay.buffer import Batch
from foxdqn.replay.her import HindsightRelabeler


class MemberHindsightRelabeler(HindsightRelabeler):
    """Relabels the member-major batches of a goal-conditioned population env.

    Args:
        env: the population's goal-conditioned env (e.g.
            :class:`~foxdqn.population.envs.MemberBitFlipEnv`).
        k: relabelled goals per original goal (``replay.her_k``).
        gamma: float32 ``[P]``, each member's γ.
        reward_scale: float32 ``[P]``, each member's reward scale (applied at insertion).
        rng: the members' random source.

    Raises:
        ValueError: as :class:`~foxdqn.replay.her.HindsightRelabeler`.
    """

    def __init__(self, env, k: int, gamma: torch.Tensor, reward_scale: torch.Tensor, rng: MemberRandom):
        super().__init__(env, k, gamma, reward_scale)
        self.rng = rng

    def relabel(self, buf, batch: Batch, generator=None) -> Batch:
        """``batch`` (P·B rows, member-major, from ``buf``'s ring) with each member's hindsight goals:
        obs and next_obs ``[P·B, D]``, or ``[P, B, D]`` halves of one ``[P, 2, B, D]`` tensor when the
        batch's were (:meth:`~foxdqn.replay.her.HindsightRelabeler.relabel_with`), reward and discount
        ``[P·B]``; the rest unchanged. The uniforms are the members' (``generator`` is not read)."""
        p = self.rng.num_members
        u = self.rng.uniform(2 * (batch.reward.shape[0] // p)).view(p, 2, -1)
        return self.relabel_with(buf, batch, u, self.gamma, self.reward_scale)
