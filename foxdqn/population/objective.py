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

from foxdqn.objectives.dqn import double_dqn_target
from foxdqn.population.network import MemberQNetwork
from foxdqn.replay.buffer import Batch


def huber(x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Huber penalty of ``x`` (float32 ``[P, B]``) with threshold ``delta`` (float32 ``[P, 1]``):
    ½x² where |x| ≤ δ, else δ(|x| − ½δ) (torch.nn.functional.huber_loss with a per-member δ)."""
    a = x.abs()
    return torch.where(a <= delta, 0.5 * x * x, delta * (a - 0.5 * delta))


def member_dqn_loss(online: MemberQNetwork, target: MemberQNetwork, batch: Batch, members: int,
                    huber_delta: torch.Tensor, double: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss float32 ``[P]``, Q float32 ``[P, B, A]`` detached) of a member-major batch of ``P·B``
    rows (:meth:`MemberReplay.sample_members`; uniform replay: the importance weights are ones and
    are not applied)."""
    p = members
    obs = batch.obs.view(p, -1, batch.obs.shape[-1])
    next_obs = batch.next_obs.view(p, -1, batch.next_obs.shape[-1])
    q_all = online(obs)  # [P, B, A]
    q_sa = q_all.gather(2, batch.action.view(p, -1, 1)).squeeze(2)
    y = double_dqn_target(online, target, next_obs, batch.reward.view(p, -1), batch.discount.view(p, -1), double)
    return huber(q_sa - y, huber_delta[:, None]).mean(dim=1), q_all.detach()
