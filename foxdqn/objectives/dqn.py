"""(Double) DQN temporal-difference loss with the Huber penalty.

Target (van Hasselt, Guez & Silver 2016, eq. 4, "Double DQN"):
    y = R + discount · Q_target(s', argmax_a Q_online(s', a))
and with ``double=False`` the target of Mnih et al. 2015: y = R + discount · max_a Q_target(s', a).
R is the (n-step) discounted reward sum and discount = γⁿ, 0 where the episode terminated.
Loss: Huber(Q_online(s, a) − y) with threshold δ (Mnih et al. 2015 "error clipping"), weighted
per sample (PER importance weights; ones for uniform replay) and averaged.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from foxdqn.objectives.base import LossOutput, Objective, weighted_mean


def double_dqn_target(online, target, next_obs, reward, discount, double: bool = True) -> torch.Tensor:
    """y float32 [B] (no grad). next_obs [B, D]; reward, discount [B]. Any leading axes work the same
    (a population's [P, B, D] → [P, B]): actions are the last axis."""
    with torch.no_grad():
        q_next_target = target(next_obs)  # (B, A)
        if double:
            a_star = online(next_obs).argmax(dim=-1, keepdim=True)  # (B, 1)
            q_next = q_next_target.gather(-1, a_star).squeeze(-1)
        else:
            q_next = q_next_target.max(dim=-1).values
        return reward + discount * q_next


class DQNObjective(Objective):
    """Huber TD loss for scalar Q heads (``head: q | dueling``).

    Args:
        online, target: networks obs [B, D] → Q [B, A].
        double: Double DQN action selection.
        huber_delta: Huber threshold δ (> 0), in reward units.
    """

    def __init__(self, online, target, double: bool = True, huber_delta: float = 1.0):
        super().__init__(online, target)
        self.double = double
        self.huber_delta = huber_delta

    def forward_with_q(self, batch):
        q_all = self.online(batch.obs)  # (B, A), with grad
        q_sa = q_all.gather(1, batch.action[:, None]).squeeze(1)
        y = double_dqn_target(self.online, self.target, batch.next_obs, batch.reward, batch.discount, self.double)
        per_sample = F.huber_loss(q_sa, y, reduction="none", delta=self.huber_delta)
        out = LossOutput(weighted_mean(per_sample, batch.weight), (q_sa - y).detach().abs(), q_all.detach())
        return out, q_all

    def forward(self, batch) -> LossOutput:
        return self.forward_with_q(batch)[0]
