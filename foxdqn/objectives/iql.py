"""Implicit Q-Learning for discrete actions (Kostrikov, Nair & Levine 2021, §4, eqs. 5–6).

    L_V(ψ) = E_{(s,a)~D}[ L₂^τ( Q_θ̂(s, a) − V_ψ(s) ) ],   L₂^τ(u) = |τ − 1{u < 0}| u²     (eq. 5)
    L_Q(θ) = E_{(s,a,s')~D}[ ( R + discount · V_ψ(s') − Q_θ(s, a) )² ]                    (eq. 6)

Q_θ̂ is the target network (Polyak copy of Q_θ), so L_V sends no gradient to Q; V_ψ(s') in L_Q is
detached, so L_Q sends none to V. The total loss is L_Q + L_V and one optimizer step trains
both (V's parameters come from :meth:`IQLObjective.extra_parameters`). The expectile τ → 1
makes V approach max_a over the dataset's actions (in-sample maximum, no out-of-data action is
ever queried). Eq. 7 (advantage-weighted policy extraction) is not needed for discrete
actions: acting stays greedy on Q.

Both terms use the replay importance weights (Σ_b w_b · ℓ_b / B): each is an expectation over
the replay distribution. For distributional heads, Q is the network's expected Q
(``forward(obs)``), trained by the squared error of eq. 6.

The arithmetic is :func:`iql_loss`, which a population (:func:`foxdqn.population.objective.member_loss`)
calls with a leading member axis: each member's own Q, target and value networks, its own
expectile τ (a ``[P]`` tensor) and means over its own B rows. After the networks' forwards, the
loss, |td| and the gradients w.r.t. Q(s, a) and V(s) are one op, :func:`foxdqn.ops.iql_loss.iql_loss`
(one kernel on CUDA; its reference, the torch arithmetic, on the CPU).
"""
from __future__ import annotations

import math

import torch

from foxdqn.objectives.base import LossOutput, Objective
from foxdqn.ops.iql_loss import expectile_loss, iql_loss as fused_iql_loss
from foxdqn.ops.replay_gather import stacked_pair

__all__ = ["IQLObjective", "expectile_loss", "iql_loss"]


def iql_loss(online, target, value_net, batch, expectile_tau: float | torch.Tensor,
             members: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """IQL's loss L_Q + L_V (eqs. 5–6) of one run's batch, or of a population's (``members=P``).

    Args:
        online, target: Q networks obs → Q (``[B, D] → [B, A]``; with ``members`` ``[P, B, D] →
            [P, B, A]``, :class:`foxdqn.population.network.MemberQNetwork`).
        value_net: V network obs → V (``[B, D] → [B]``; with ``members`` ``[P, B, D] → [P, B]``,
            :class:`foxdqn.population.network.MemberValueNetwork`).
        batch: a replay :class:`~foxdqn.replay.buffer.Batch` of B rows, or of P·B rows member-major
            (``MemberReplay.sample_members``: obs ``[P, B, D]`` or ``[P·B, D]``, the rest ``[P·B]``).
        expectile_tau: τ in (0, 1), a float; with ``members`` also a float32 ``[P]`` tensor (each
            member's ``objective.iql_expectile``).
        members: P for a population batch; None for one run.

    Returns:
        ``(loss, td_abs, q_all)``: loss float32 0-d = Σ_b w_b (L_Q,b + L_V,b) / B (``[P]`` with
        ``members``: member p's own mean over its B rows; members never mix); td_abs float32 ``[B]``
        (``[P, B]``) = |R + discount · V(s') − Q(s, a)|, detached (PER's priority signal); q_all
        float32 ``[B, A]`` (``[P, B, A]``) online Q at s, with gradient.

    Raises:
        ValueError: a float ``expectile_tau`` not in (0, 1); shapes or dtypes that
            :func:`foxdqn.ops.iql_loss.iql_loss` refuses.
    """
    obs, next_obs = batch.obs, batch.next_obs
    if members is not None:
        obs, next_obs = obs.view(members, -1, obs.shape[-1]), next_obs.view(members, -1, next_obs.shape[-1])
        if not isinstance(expectile_tau, torch.Tensor):  # one τ for every member: loss [P] all the same
            expectile_tau = torch.full((members,), float(expectile_tau), device=obs.device)
    q_all = online(obs)  # (B, A), with grad
    pair_forward = getattr(value_net, "forward_pair", None) if members is not None else None
    if pair_forward is not None:  # a population's V(s) (grad) and V(s') (eq. 6 target) in one pass
        pair = stacked_pair(batch.obs, batch.next_obs)
        pair = pair if pair is not None and pair.shape[0] == members else None  # member-major only
        v_s, v_next = pair_forward(obs, next_obs, pair)
        with torch.no_grad():
            q_target = target(obs)  # (B, A) Q_θ̂(s, ·)
    else:
        v_s = value_net(obs)  # (B,), with grad
        with torch.no_grad():
            q_target = target(obs)  # (B, A) Q_θ̂(s, ·)
            v_next = value_net(next_obs)  # (B,) V(s'), eq. 6 target
    loss, td_abs = fused_iql_loss(q_all, q_target, v_s, v_next, batch.action, batch.reward, batch.discount,
                                  batch.weight, expectile_tau)
    return loss, td_abs.view(q_all.shape[:-1]), q_all


class IQLObjective(Objective):
    """IQL value (expectile) and Q (TD to V(s')) losses.

    Args:
        online, target: Q networks obs [B, D] → Q [B, A].
        value_net: :class:`foxdqn.nn.iql_value.IQLValueNetwork`, obs [B, D] → V [B]
            (registered as a submodule; trained via :meth:`extra_parameters`, no target copy).
        expectile_tau: τ in (0, 1) (``objective.iql_expectile``; 0.7 for the paper's locomotion
            tasks, 0.9 for AntMaze).

    ``forward(batch) -> LossOutput``: loss float32 0-d = Σ_b w_b (L_Q,b + L_V,b) / B;
    td_abs float32 [B] = |R + discount · V(s') − Q(s, a)| (detached); q_values float32 [B, A]
    online Q at s (detached). ``forward_with_q`` also returns that Q with gradient (for CQL).

    Raises:
        ValueError: ``expectile_tau`` not in (0, 1).
    """

    def __init__(self, online, target, value_net: torch.nn.Module, expectile_tau: float = 0.7):
        if isinstance(expectile_tau, bool) or not isinstance(expectile_tau, (int, float)) \
                or not (math.isfinite(expectile_tau) and 0.0 < expectile_tau < 1.0):
            raise ValueError(f"IQLObjective: expectile_tau must be in (0, 1), got {expectile_tau!r}")
        super().__init__(online, target)
        self.value_net = value_net
        self.expectile_tau = float(expectile_tau)

    def forward_with_q(self, batch) -> tuple[LossOutput, torch.Tensor]:
        loss, td_abs, q_all = iql_loss(self.online, self.target, self.value_net, batch, self.expectile_tau)
        return LossOutput(loss, td_abs, q_all.detach()), q_all

    def forward(self, batch) -> LossOutput:
        return self.forward_with_q(batch)[0]

    def extra_parameters(self) -> list:
        return list(self.value_net.parameters())
