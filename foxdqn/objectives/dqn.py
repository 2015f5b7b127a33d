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

from foxdqn.objectives.base import LossOutput, Objective
from foxdqn.ops.dqn_td_loss import dqn_td_loss
from foxdqn.ops.replay_gather import stacked_pair


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

    The target, the Huber loss, its weighted mean, |TD| and the gradient w.r.t. Q are one kernel on
    CUDA (:func:`foxdqn.ops.dqn_td_loss.dqn_td_loss`; its reference is the arithmetic of
    :func:`double_dqn_target` + ``F.huber_loss`` + :func:`~foxdqn.objectives.base.weighted_mean`).
    With ``double`` the online Q of s and of s' come from ONE forward of the stacked [2B, D] batch
    (the replay's stacked pair, :func:`foxdqn.ops.replay_gather.stacked_pair`, else a
    concatenation); the loss gives the s' rows zero gradient. Every online network foxdqn builds
    computes each row on its own and draws no random numbers in its forward (the attention
    encoder's dropout is not configurable), so this equals two forwards to float rounding: the
    GEMMs see 2B rows instead of B and may round differently, which can flip an argmax only
    between Q values equal to rounding.
    """

    def __init__(self, online, target, double: bool = True, huber_delta: float = 1.0):
        super().__init__(online, target)
        self.double = double
        self.huber_delta = huber_delta

    def forward_with_q(self, batch):
        b = batch.action.shape[0]
        if self.double:
            pair = stacked_pair(batch.obs, batch.next_obs)
            both = pair.view(2 * b, -1) if pair is not None else torch.cat([batch.obs, batch.next_obs])
            q = self.online(both)  # (2B, A), with grad: rows of s, then of s'
            q_all = q[:b]
        else:
            q = q_all = self.online(batch.obs)  # (B, A), with grad
        with torch.no_grad():
            q_next_target = self.target(batch.next_obs)
        loss, td_abs = dqn_td_loss(q, q_next_target, batch.action, batch.reward, batch.discount, batch.weight,
                                   double=self.double, huber_delta=self.huber_delta)
        return LossOutput(loss, td_abs, q_all.detach()), q_all

    def forward(self, batch) -> LossOutput:
        return self.forward_with_q(batch)[0]
