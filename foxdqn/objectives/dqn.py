"""(Double) DQN temporal-difference loss with the Huber penalty.

Target (van Hasselt, Guez & Silver 2016, eq. 4, "Double DQN"):
    y = r + γ (1 − done) Q_target(s', argmax_a Q_online(s', a))
and with ``double=False`` the DQN target of Mnih et al. 2015: y = r + γ (1 − done) max_a Q_target(s', a).
Loss: Huber(Q_online(s, a) − y) with threshold δ (Mnih et al. 2015 "error clipping"),
weighted per sample (importance weights for PER; 1 for uniform replay) and averaged.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class TDOutput(NamedTuple):
    """loss: float32 0-d (weighted mean); td_error: float32 [B] (Q − y, detached);
    q_online: float32 [B, A] Q values of the sampled states (detached, for the Q monitor)."""

    loss: torch.Tensor
    td_error: torch.Tensor
    q_online: torch.Tensor


def double_dqn_loss(online, target, obs, action, reward, next_obs, done, gamma: float,
                    huber_delta: float = 1.0, double: bool = True,
                    weights: torch.Tensor | None = None) -> TDOutput:
    """TD loss for one batch.

    Args:
        online, target: networks obs [B, D] → Q [B, A].
        obs, next_obs: float32 [B, D]; action: int64 [B]; reward: float32 [B];
        done: float32 [B], 1.0 where s' is terminal.
        gamma: discount γ (γⁿ for n-step returns).
        weights: float32 [B] per-sample loss weights or None.
    """
    q_all = online(obs)  # (B, A)
    q_sa = q_all.gather(1, action[:, None]).squeeze(1)  # (B,)
    with torch.no_grad():
        q_next_target = target(next_obs)  # (B, A)
        if double:
            a_star = online(next_obs).argmax(dim=1, keepdim=True)  # (B, 1)
            q_next = q_next_target.gather(1, a_star).squeeze(1)
        else:
            q_next = q_next_target.max(dim=1).values
        y = reward + gamma * (1.0 - done) * q_next
    per_sample = F.huber_loss(q_sa, y, reduction="none", delta=huber_delta)
    if weights is not None:
        per_sample = per_sample * weights
    return TDOutput(per_sample.mean(), (q_sa - y).detach(), q_all.detach())
