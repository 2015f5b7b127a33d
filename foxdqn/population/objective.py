"""(Double) DQN loss of P members at once, each with its own Huber δ.

The loss of :class:`foxdqn.objectives.dqn.DQNObjective` (van Hasselt et al. 2016, eq. 4; Huber
"error clipping" of Mnih et al. 2015) computed on ``[P, B]`` batches: member p's loss is
``mean_b Huber_δp(Q_p(s, a) − y)`` with ``y = R + discount · Q'_p(s', argmax_a Q_p(s', a))``
(``max_a Q'_p(s', a)`` without Double DQN). The members' losses are returned separately; their
sum is back-propagated, which gives each member exactly the gradient of its own loss (members
share no parameters).
"""
from __future__ import annotations

import torch

from foxdqn.objectives.dqn_forward import dqn_forward
from foxdqn.ops.dqn_td_loss import dqn_td_loss
from foxdqn.population.network import MemberQNetwork
from foxdqn.replay.buffer import Batch


def member_dqn_loss(online: MemberQNetwork, target: MemberQNetwork, batch: Batch, members: int,
                    huber_delta: torch.Tensor, double: bool, *, stack_double: bool = True,
                    penalty: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss float32 ``[P]``, Q float32 ``[P, B, A]`` detached) of a member-major batch of ``P·B``
    rows (:meth:`MemberReplay.sample_members`; uniform replay: the importance weights are ones and
    are not applied).

    The loss, its |TD| and its gradient are one kernel (:func:`foxdqn.ops.dqn_td_loss.dqn_td_loss`
    with a δ per member). The forwards are :func:`foxdqn.objectives.dqn_forward.dqn_forward`: with
    Double DQN and ``stack_double`` the online Q of s and of s' come from one forward of the
    ``[P, 2B, D]`` stacked batch (the replay's ``stacked`` pair when the batch is one, else a
    concatenation; the s' rows get no gradient), else from two forwards (s' under no_grad). The
    online network computes each row on its own, so both equal each other to float rounding (the
    GEMM shapes differ).

    ``penalty``: None, or float32 ``[P·B, A]``, the switch penalty of each s' (``action.switch_margin``,
    :meth:`foxdqn.population.switch.MemberSwitch.target`): the target's action is then
    ``argmax_a [Q_online(s', a) − penalty]`` (Double DQN; ``Q_target`` without it) through the
    kernel's explicit selection, from two online forwards; the value bootstrapped is the
    unpenalised ``Q_target(s', a*)``."""
    if penalty is None:
        f = dqn_forward(online, target, batch.obs, batch.next_obs, double=double, stack=stack_double,
                        members=members)
        loss, _ = dqn_td_loss(f.q, f.q_next_target, batch.action, batch.reward, batch.discount,
                              q_next_online=f.q_next_online, double=double, huber_delta=huber_delta)
        return loss, f.q_s.detach()
    f = dqn_forward(online, target, batch.obs, batch.next_obs, double=double, stack=False, members=members)
    chooser = f.q_next_online if double else f.q_next_target
    loss, _ = dqn_td_loss(f.q, f.q_next_target, batch.action, batch.reward, batch.discount,
                          q_next_online=chooser - penalty.view_as(chooser), double=True, huber_delta=huber_delta)
    return loss, f.q_s.detach()
