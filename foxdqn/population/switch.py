"""The switch penalty of ``action.switch_margin`` for a population's members.

Member p's penalty is a single run's (:mod:`foxdqn.actions.switch`) with its own reward scale
``k_p`` (``loss.reward_scale`` is a member key): ``m · k_p · c_t · |x(a) − x_t| · 1{e(a) ≠ e_t}``
for each of its envs (rows ``p·N .. (p+1)·N − 1`` of the population's env) and, in the bootstrap
target, for each of its sampled next states (rows ``p·B .. (p+1)·B − 1`` of a member-major batch).
"""
from __future__ import annotations

import torch

from foxdqn.actions.switch import NextStatePenalty, SwitchPenalty


class MemberSwitch:
    """Switch penalties of P members sharing one margin, each with its reward scale.

    Args:
        margin: ``m > 0``, ``action.switch_margin`` (shared by the population).
        reward_scale: float32 ``[P]``, each member's ``loss.reward_scale``.
        mode_name: ``action.mode``.
        env: the population's trading env (P × N envs).
        device: where the tensors live.

    Raises:
        ValueError: as :class:`foxdqn.actions.switch.SwitchPenalty`.
    """

    def __init__(self, margin: float, reward_scale: torch.Tensor, mode_name: str | None, env, device):
        self.unit = SwitchPenalty(margin, 1.0, mode_name, device)  # m · c · |Δx|; k_p is applied per member
        self.next_state = NextStatePenalty(self.unit, env)
        self.env = env
        self.scale = reward_scale.to(device=device, dtype=torch.float32).view(-1, 1, 1)  # [P, 1, 1]

    def _per_member(self, penalty: torch.Tensor) -> torch.Tensor:
        p = self.scale.shape[0]
        return (penalty.view(p, -1, penalty.shape[-1]) * self.scale).view(penalty.shape)

    def acting(self) -> torch.Tensor:
        """float32 ``[P·N, A]``: the penalty of every action in every env's current state."""
        return self._per_member(self.unit(self.env))

    def target(self, batch) -> torch.Tensor:
        """float32 ``[P·B, A]``: the penalty of every action in each sampled next state s'."""
        return self._per_member(self.next_state(batch))

    def target_exposures(self, batch) -> torch.Tensor:
        """float32 ``[P·B, 5]``: the penalty of each exposure in each sampled next state s' (the
        branching target's exposure branch pays it)."""
        return self._per_member(self.next_state.per_exposure(batch))
