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
        online, target = self.online, self.target
        B, K = batch.obs.shape[0], online.atoms
        logits = online.logits(batch.obs)  # (B, A, K), with grad
        log_p_all = F.log_softmax(logits, dim=-1)  # (B, A, K)
        q_all = (log_p_all.exp() * online.support).sum(dim=-1)  # (B, A) expected Q, with grad
        log_p = log_p_all.gather(1, batch.action.view(B, 1, 1).expand(B, 1, K)).squeeze(1)  # (B, K)
        with torch.no_grad():
            p_next_all = F.softmax(target.logits(batch.next_obs), dim=-1)  # (B, A, K)
            select = online(batch.next_obs) if self.double else (p_next_all * target.support).sum(dim=-1)  # (B, A)
            if self.switch is not None:  # action.switch_margin: a* pays for leaving the position held at s'
                select = select - self.switch(batch)
            a_star = select.argmax(dim=1)  # (B,)
            p_next = p_next_all.gather(1, a_star.view(B, 1, 1).expand(B, 1, K)).squeeze(1)  # (B, K)
            m = c51_project(p_next, batch.reward, batch.discount, online.v_min, online.v_max)  # (B, K)
        ce = -(m * log_p).sum(dim=-1)  # (B,) cross-entropy
        out = LossOutput(weighted_mean(ce, batch.weight), ce.detach(), q_all.detach())
        return out, q_all

    def forward(self, batch) -> LossOutput:
        return self.forward_with_q(batch)[0]
