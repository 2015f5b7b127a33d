r"""Branching Dueling Q-network loss (BDQ): Tavakoli, Pardo & Kormushev 2018, "Action Branching
Architectures for Deep Reinforcement Learning".

The batch action is the joint (factored) index; it is split into one sub-action per branch,
``a = Σ_d a_d · stride_d`` (trading: ``exposure·9 + order_type·3 + urgency``). With D branches:

Target, the paper's mean operator (eq. 6), with Double-DQN action selection per branch::

    y = R + discount · (1/D) Σ_d Q_d^target(s', argmax_{a'_d} Q_d^online(s', a'_d))

(``double=False``: ``max_{a'_d} Q_d^target(s', a'_d)``). R is the n-step discounted reward sum
and ``discount = γ^m``, 0 where the episode terminated in the window (no bootstrap). One shared
target y for all branches.

Loss per sample: ``(1/D) Σ_d Huber_δ(Q_d(s, a_d) − y)``. The paper (eq. 7) averages the
*squared* error over branches; here the squared error is replaced by the Huber penalty with
threshold δ (``loss.huber_delta``; quadratic ``½x²`` for ``|x| ≤ δ`` and ``δ(|x| − ½δ)``
beyond, ``torch.nn.functional.huber_loss``), as in the project's other TD losses (Mnih et al.
2015 error clipping). The batch loss is ``Σ_b weight_b · per_sample_b / B``.

The PER signal is ``td_abs = (1/D) Σ_d |Q_d(s, a_d) − y|`` (detached); the monitored Q values
are the joint ``[B, Π n_d]`` mean-over-branches Q of the sampled states (detached), the same as
``online(obs)``.
"""
from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F

from foxdqn.nn.branching import combine_branches, factor_branches
from foxdqn.objectives.base import LossOutput, Objective, weighted_mean

__all__ = ["BranchingObjective", "branching_target"]


def branching_target(online, target, next_obs, reward, discount, double: bool = True,
                     exposure_penalty: torch.Tensor | None = None) -> torch.Tensor:
    """Mean-operator TD target y (paper eq. 6), float32 ``[B]``, no grad.

    Args:
        online, target: :class:`foxdqn.nn.branching.BranchingNetwork` (``branch_q(obs)`` → list
            of ``[B, n_d]``), or a population's
            (:class:`foxdqn.population.branching.MemberBranchingNetwork`: every tensor here with a
            leading member axis, ``[P, B, ...]``; each row's own argmax).
        next_obs: float32 ``[B, D_obs]``; reward, discount: float32 ``[B]``.
        double: per-branch argmax of the online network evaluated by the target network.
        exposure_penalty: None, or float32 ``[B, n_1]`` (``[P, B, n_1]``), the switch penalty of each exposure at s'
            (``action.switch_margin``, :mod:`foxdqn.actions.switch`), a penalty of the joint Q
            ``(1/D) Σ_d Q_d``: the first (exposure) branch's selection is the argmax of
            ``Q_1 − D · exposure_penalty``, which picks the exposure of the joint argmax of
            ``Q − penalty``; the values bootstrapped stay unpenalised.
    """
    with torch.no_grad():
        q_next_target = target.branch_q(next_obs)                                   # D × (B, n_d)
        select = online.branch_q(next_obs) if double else list(q_next_target)       # D × (B, n_d)
        if exposure_penalty is not None:
            select[0] = select[0] - len(select) * exposure_penalty
        if double or exposure_penalty is not None:
            q_next = [qt.gather(-1, qs.argmax(dim=-1, keepdim=True)).squeeze(-1)
                      for qt, qs in zip(q_next_target, select)]                     # D × (B,)
        else:
            q_next = [qt.max(dim=-1).values for qt in q_next_target]
        return reward + discount * torch.stack(q_next, dim=0).mean(dim=0)


class BranchingObjective(Objective):
    """BDQ loss for :class:`foxdqn.nn.branching.BranchingNetwork` (``action.mode=branching``).

    Args:
        online, target: branching networks obs ``[B, D_obs]`` → ``branch_q``: D × ``[B, n_d]``.
        double: Double-DQN action selection per branch (``objective.double``).
        huber_delta: Huber threshold δ > 0 in reward units (``loss.huber_delta``).
        switch: None, or a :class:`foxdqn.actions.switch.NextStatePenalty` (``action.switch_margin``
            > 0): the exposure branch's selection at s' pays its ``per_exposure(batch)`` penalty
            (:func:`branching_target`).

    ``forward(batch)`` → :class:`~foxdqn.objectives.base.LossOutput`: loss float32 0-d,
    td_abs float32 ``[B]`` = mean over branches of ``|Q_d(s, a_d) − y|``, q_values float32
    ``[B, Π n_d]`` (45 for trading). ``batch.action`` is the joint index (int64 ``[B]``).

    Raises:
        ValueError: ``huber_delta`` not a finite number > 0.
    """

    def __init__(self, online, target, double: bool = True, huber_delta: float = 1.0, switch=None):
        super().__init__(online, target)
        if (isinstance(huber_delta, bool) or not isinstance(huber_delta, numbers.Real)
                or not math.isfinite(huber_delta) or huber_delta <= 0):
            raise ValueError(f"BranchingObjective: huber_delta must be a finite number > 0, got {huber_delta!r}")
        self.double = bool(double)
        self.huber_delta = float(huber_delta)
        self.branch_sizes = tuple(online.branch_sizes)
        self.switch = switch

    def forward_with_q(self, batch):
        """(LossOutput, joint Q ``[B, Π n_d]`` with grad) — like ``DQNObjective.forward_with_q``."""
        q_branches = self.online.branch_q(batch.obs)                                # D × (B, n_d), grad
        actions = factor_branches(batch.action, self.branch_sizes)                  # D × (B,)
        q_sa = torch.stack([q.gather(1, a[:, None]).squeeze(1)
                            for q, a in zip(q_branches, actions)], dim=0)           # (D, B)
        penalty = None if self.switch is None else self.switch.per_exposure(batch)  # (B, 5) of s'
        y = branching_target(self.online, self.target, batch.next_obs, batch.reward, batch.discount,
                             self.double, penalty)                                  # (B,)
        y_b = y.unsqueeze(0).expand_as(q_sa)                                        # (D, B)
        per_sample = F.huber_loss(q_sa, y_b, reduction="none", delta=self.huber_delta).mean(dim=0)  # (B,)
        td_abs = (q_sa.detach() - y_b).abs().mean(dim=0)                           # (B,)
        q_all = combine_branches(q_branches)                                        # (B, Π n_d)
        loss = weighted_mean(per_sample, batch.weight)
        return LossOutput(loss, td_abs, q_all.detach()), q_all

    def forward(self, batch) -> LossOutput:
        return self.forward_with_q(batch)[0]
