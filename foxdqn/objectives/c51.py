"""C51 categorical distributional loss (Bellemare, Dabney & Munos 2017, Algorithm 1).

For a sampled transition (s, a, R, s', discount) with discount = γ^m (0 if the episode ended):

    a*   = argmax_a' Q_online(s', a')            (Double DQN selection, Hessel et al. 2018)
           argmax_a' Q_target(s', a')            (double=False: the paper's greedy target)
           (minus the switch penalty of s' inside the argmax with action.switch_margin > 0)
    m    = Φ( p_target(s', a*) ; R + discount · z )   (projection onto the support, Algorithm 1)
    loss = −Σ_k m_k log p_k(s, a)                (cross-entropy, Algorithm 1's last line)

with Q(s, a) = Σ_k p_k(s, a) z_k. Φ is :func:`foxdqn.ops.c51_project.c51_project` (Triton kernel
on CUDA, torch reference on CPU); m carries no gradient.

PER priority (``td_abs``): the per-sample cross-entropy, as in Rainbow (Hessel et al. 2018,
"Prioritized replay": "our variant prioritizes transitions by the KL loss"). The KL and the
cross-entropy differ by the entropy of m, which does not depend on the online network; the
cross-entropy is what the loss already computes, is >= 0, and is 0 only when both
distributions are the same point mass.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from foxdqn.objectives.base import LossOutput, Objective, weighted_mean
from foxdqn.ops.c51_project import c51_project


def c51_cross_entropy(online, target, obs: torch.Tensor, next_obs: torch.Tensor, action: torch.Tensor,
                      reward: torch.Tensor, discount: torch.Tensor, *, double: bool,
                      penalty: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(CE float32 ``[..., B]``, expected Q float32 ``[..., B, A]`` with gradient) of Algorithm 1
    (module docstring) for every sample, with any leading axes: one run's ``[B]`` batch, or a
    population's ``[P, B]`` (members never mix: every op is per row, and the projection uses each
    member's own support).

    Args:
        online, target: ``obs [..., B, D] → expected Q [..., B, A]`` networks with
            ``logits(obs) → [..., B, A, K]``, a ``support`` that broadcasts against the logits
            (``[K]``; a population's ``[P, 1, 1, K]``) and the bounds ``v_min``, ``v_max`` that
            :func:`foxdqn.ops.c51_project.c51_project` takes (floats; float ``[P]`` tensors, one
            support per member). :class:`foxdqn.nn.c51.C51Network`,
            :class:`foxdqn.population.distributional.MemberC51Network`.
        obs, next_obs: s and s' ``[..., B, D]``.
        action: int64 ``[..., B]``. reward, discount: float32 ``[..., B]`` (R and γ^m, 0 at a terminal).
        double: Double DQN selection of a* at s'.
        penalty: None, or float32 with the elements of ``[..., B, A]``: the switch penalty of s',
            subtracted from the Q that picks a*.
    """
    K = online.atoms
    logits = online.logits(obs)  # (..., B, A, K), with grad
    log_p_all = F.log_softmax(logits, dim=-1)  # (..., B, A, K)
    q_all = (log_p_all.exp() * online.support).sum(dim=-1)  # (..., B, A) expected Q, with grad
    log_p = log_p_all.gather(-2, action[..., None, None].expand(*action.shape, 1, K)).squeeze(-2)  # (..., B, K)
    with torch.no_grad():
        p_next_all = F.softmax(target.logits(next_obs), dim=-1)  # (..., B, A, K)
        select = online(next_obs) if double else (p_next_all * target.support).sum(dim=-1)  # (..., B, A)
        if penalty is not None:  # action.switch_margin: a* pays for leaving the position held at s'
            select = select - penalty.view_as(select)
        a_star = select.argmax(dim=-1)  # (..., B)
        p_next = p_next_all.gather(-2, a_star[..., None, None].expand(*a_star.shape, 1, K)).squeeze(-2)  # (..., B, K)
        m = c51_project(p_next.reshape(-1, K), reward.reshape(-1), discount.reshape(-1), online.v_min,
                        online.v_max).view_as(p_next)  # (..., B, K)
    return -(m * log_p).sum(dim=-1), q_all  # (..., B) cross-entropy


class C51Objective(Objective):
    """Categorical cross-entropy to the projected distributional Bellman target.

    Args:
        online, target: :class:`foxdqn.nn.c51.C51Network` with the same support
            (``logits(obs) -> [B, A, K]``, ``support`` [K], ``v_min``, ``v_max``).
        double: Double DQN action selection at s' (``head.double``).

    ``forward(batch) -> LossOutput``: loss float32 0-d = Σ_b weight_b · CE_b / B;
    td_abs float32 [B] = CE_b (detached); q_values float32 [B, A] expected Q of the online net at s
    (detached). ``forward_with_q(batch) -> (LossOutput, q_all)`` also returns that expected Q
    with its gradient (for the CQL regulariser).

    ``switch``: None, or a :class:`foxdqn.actions.switch.NextStatePenalty` (``action.switch_margin``
    > 0): a* is the argmax of the expected Q minus ``switch(batch)``, the [B, A] switch penalty of s'.

    Raises:
        ValueError: online and target have different supports.
    """

    def __init__(self, online, target, double: bool = True, switch=None):
        super().__init__(online, target)
        if (online.atoms, online.v_min, online.v_max) != (target.atoms, target.v_min, target.v_max):
            raise ValueError("C51Objective: online and target networks must have the same support")
        self.double = bool(double)
        self.switch = switch

    def forward_with_q(self, batch) -> tuple[LossOutput, torch.Tensor]:
        ce, q_all = c51_cross_entropy(self.online, self.target, batch.obs, batch.next_obs, batch.action, batch.reward,
                                      batch.discount, double=self.double,
                                      penalty=None if self.switch is None else self.switch(batch))
        out = LossOutput(weighted_mean(ce, batch.weight), ce.detach(), q_all.detach())
        return out, q_all

    def forward(self, batch) -> LossOutput:
        return self.forward_with_q(batch)[0]
