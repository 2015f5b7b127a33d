"""Conservative Q-Learning regulariser for discrete actions (Kumar, Zhou, Tucker & Levine 2020).

CQL(H) (eq. 4, the variant used for their discrete-action Atari experiments on top of QR-DQN):

    min_Q  α · E_{s,a ~ D}[ log Σ_a' exp Q(s, a') − Q(s, a) ]  +  (the base TD / distributional loss)

The first term pushes down a soft maximum of Q over all actions and pushes up Q of the dataset
action. :class:`CQLObjective` wraps any objective: its loss plus α times the importance-weighted
mean of :func:`cql_term`. For C51 / IQN heads, Q(s, ·) are the online network's expected Q values.

Design (how the wrapper gets Q(s, ·) with gradient). Every objective in foxdqn.objectives has
``forward_with_q(batch) -> (LossOutput, q_all)`` returning, next to the usual output, the online
expected Q of the sampled states [B, A] *with* its autograd graph, computed in the same forward
pass as the loss (no second network evaluation). ``LossOutput`` keeps its three fields.
:func:`loss_and_q` calls it, and for an objective without that method falls back to one more
forward ``objective.online(batch.obs)``.

A population (:func:`foxdqn.population.objective.member_loss`) adds the same
:func:`cql_regulariser` to its members' losses with a leading member axis (Q ``[P, B, A]``, α a
``[P]`` tensor): member p's term is the mean over its own B rows only.
"""
from __future__ import annotations

import math

import torch

from foxdqn.objectives.base import LossOutput, Objective, weighted_mean


def cql_term(q_all: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """CQL(H) regulariser per sample (CQL eq. 4): logsumexp_a Q(s, a) − Q(s, a_data).

    Args:
        q_all: float32 [B, A] Q values of the sampled states, with gradient (any leading axes: a
            population's [P, B, A]; actions are the last axis).
        action: int64 [B] dataset actions (``q_all``'s shape without its last axis).

    Returns:
        float32 [B] (or [P, B]), >= 0 (logsumexp >= max >= Q(s, a_data)); differentiable w.r.t.
        ``q_all``.
    """
    q_data = q_all.gather(-1, action[..., None]).squeeze(-1)  # (B,)
    return torch.logsumexp(q_all, dim=-1) - q_data


def cql_regulariser(q_all: torch.Tensor, action: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The importance-weighted mean of :func:`cql_term` (CQL eq. 4's first term, before α).

    Args:
        q_all: float32 [B, A] with gradient, or a population's [P, B, A] (member-major).
        action: int64 [B], or the population's [P·B] rows (viewed as [P, B]).
        weight: float32 [B] importance weights (ones for uniform replay), or [P·B].

    Returns:
        float32 0-d Σ_b w_b · cql_b / B for [B, A]; [P] for [P, B, A], member p's own mean over its
        B samples (:func:`~foxdqn.objectives.base.weighted_mean`; members never mix).
    """
    rows = q_all.shape[:-1]
    return weighted_mean(cql_term(q_all, action.view(rows)), weight.view(rows))


def loss_and_q(objective, batch) -> tuple[LossOutput, torch.Tensor]:
    """(LossOutput, online Q of ``batch.obs`` [B, A] with gradient) for any objective."""
    forward_with_q = getattr(objective, "forward_with_q", None)
    if forward_with_q is not None:
        return forward_with_q(batch)
    return objective(batch), objective.online(batch.obs)


class CQLObjective(Objective):
    """Base objective + α · CQL(H).

    Args:
        base: any objective (DQN, C51, IQN, IQL, ...). It is registered as a submodule, so modules
            it owns (IQL's value network) move with ``.to()``; its ``extra_parameters`` and
            ``polyak_pairs`` are passed through.
        alpha: α >= 0, regulariser weight (``objective.cql_alpha``), a run constant.

    ``forward(batch) -> LossOutput``: loss = base.loss + α · Σ_b weight_b · cql_b / B (float32 0-d);
    td_abs and q_values are the base's (the PER priority stays the TD signal).
    ``forward_with_q`` also returns the base's Q [B, A] with gradient.

    Raises:
        ValueError: ``alpha`` negative or not finite.
    """

    def __init__(self, base: Objective, alpha: float = 1.0):
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (math.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"CQLObjective: alpha must be a finite number >= 0, got {alpha!r}")
        super().__init__(base.online, base.target)
        self.base = base
        self.alpha = float(alpha)

    def forward_with_q(self, batch) -> tuple[LossOutput, torch.Tensor]:
        out, q_all = loss_and_q(self.base, batch)
        reg = cql_regulariser(q_all, batch.action, batch.weight)  # 0-d
        return LossOutput(out.loss + self.alpha * reg, out.td_abs, out.q_values), q_all

    def forward(self, batch) -> LossOutput:
        return self.forward_with_q(batch)[0]

    def extra_parameters(self) -> list:
        return self.base.extra_parameters()

    def polyak_pairs(self) -> list:
        return self.base.polyak_pairs()
