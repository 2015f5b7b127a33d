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
from foxdqn.objectives.dqn_forward import dqn_forward
from foxdqn.ops.dqn_td_loss import dqn_td_loss


def double_dqn_target(online, target, next_obs, reward, discount, double: bool = True,
                      penalty: torch.Tensor | None = None) -> torch.Tensor:
    """y float32 [B] (no grad). next_obs [B, D]; reward, discount [B]. Any leading axes work the same
    (a population's [P, B, D] → [P, B]): actions are the last axis. The plain definition of the
    target that the fused loss is tested against (tests/objectives/test_dqn.py).

    ``penalty``: None, or float32 [B, A], the switch penalty of s' (``action.switch_margin``,
    :mod:`foxdqn.actions.switch`): a* = argmax_a [Q_online(s', a) − penalty] (double) or argmax_a
    [Q_target(s', a) − penalty], and y bootstraps the unpenalised Q_target(s', a*)."""
    with torch.no_grad():
        q_next_target = target(next_obs)  # (B, A)
        if penalty is not None:
            select = online(next_obs) if double else q_next_target
            a_star = (select - penalty).argmax(dim=-1, keepdim=True)  # (B, 1)
            q_next = q_next_target.gather(-1, a_star).squeeze(-1)
        elif double:
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
        stack_double: with ``double``, one online forward of the stacked [s; s'] batch (fewer
            kernels); False: two forwards. False for image encoders, where stacking would double
            the convolutions' backward compute and activation memory.

    The target, the Huber loss, its weighted mean, |TD| and the gradient w.r.t. Q are one kernel on
    CUDA (:func:`foxdqn.ops.dqn_td_loss.dqn_td_loss`; its reference is the arithmetic of
    :func:`double_dqn_target` + ``F.huber_loss`` + :func:`~foxdqn.objectives.base.weighted_mean`).
    The forwards are :func:`foxdqn.objectives.dqn_forward.dqn_forward`: with ``double`` and
    ``stack_double`` the online Q of s and of s' come from ONE forward of the stacked [2B, D] batch
    (the replay's stacked pair, :func:`foxdqn.ops.replay_gather.stacked_pair`, else a
    concatenation; the loss gives the s' rows zero gradient); with ``stack_double=False`` from two
    forwards, s' under no_grad. Every online network foxdqn builds computes each row on its own and
    draws no random numbers in its forward (the attention encoder's dropout is not configurable),
    so the two equal each other to float rounding: the GEMMs see 2B rows instead of B and may
    round differently, which can flip an argmax only between Q values equal to rounding.

    ``switch``: None, or a :class:`foxdqn.actions.switch.NextStatePenalty` (``action.switch_margin``
    > 0): ``switch(batch)`` is the float32 [B, A] penalty of s', subtracted from the Q that picks
    a* (the online Q of s' with ``double``, else the target Q), which the same kernel is then given
    as its Double DQN selection (``q_next_online``; the target value stays unpenalised).
    """

    def __init__(self, online, target, double: bool = True, huber_delta: float = 1.0, stack_double: bool = True,
                 switch=None):
        super().__init__(online, target)
        self.double = double
        self.huber_delta = huber_delta
        self.stack_double = stack_double
        self.switch = switch

    def forward_with_q(self, batch):
        f = dqn_forward(self.online, self.target, batch.obs, batch.next_obs, double=self.double,
                        stack=self.stack_double)
        q, select, double = f.q, f.q_next_online, self.double
        if self.switch is not None:  # a* = argmax (Q − penalty): the s rows of q and an explicit selection
            rows = f.q_s.shape[0]
            online_next = f.q.detach()[rows:] if select is None and double else select
            q, select, double = f.q_s, (online_next if double else f.q_next_target) - self.switch(batch), True
        loss, td_abs = dqn_td_loss(q, f.q_next_target, batch.action, batch.reward, batch.discount, batch.weight,
                                   q_next_online=select, double=double, huber_delta=self.huber_delta)
        return LossOutput(loss, td_abs, f.q_s.detach()), f.q_s

    def forward(self, batch) -> LossOutput:
        return self.forward_with_q(batch)[0]
