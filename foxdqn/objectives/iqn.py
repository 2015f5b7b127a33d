"""IQN quantile Huber loss (Dabney, Ostrovski, Silver & Munos 2018, §3.1, eq. 3).

For a sampled transition (s, a, R, s', discount), discount = γ^m (0 if the episode ended):

    τ_i  ~ U(0, 1), i < N;    τ'_j ~ U(0, 1), j < N'      (fresh per sample, from ``generator``)
    a*   = argmax_a' (1/K) Σ_k Z^online_{τ_k}(s', a')      (Double DQN; τ_k the K fixed midpoints)
           argmax_a' (1/K) Σ_k Z^target_{τ_k}(s', a')      (double=False)
           (minus the switch penalty of s' inside the argmax with action.switch_margin > 0)
    T_j  = R + discount · Z^target_{τ'_j}(s', a*)           (detached)
    loss = Σ_i (1/N') Σ_j ρ^κ_{τ_i}(T_j − Z^online_{τ_i}(s, a))   (eq. 3)

ρ^κ is the quantile Huber loss, computed by :func:`foxdqn.ops.quantile_huber_loss.quantile_huber_loss`
(Triton forward/backward kernels on CUDA, torch reference on CPU). The PER priority
(``td_abs``) is that per-sample loss (detached), the distributional analogue of |TD|.
The paper's action selection at s' uses sampled τ̃; the fixed midpoints used here are the
policy of :class:`foxdqn.nn.iqn.IQNNetwork` (see its module docstring).

Randomness: τ [B, N] is drawn first, then τ' [B, N'], both with ``torch.rand`` on the batch's
device from ``generator`` (a ``torch.Generator`` on that device, registered with the CUDA graph
by the caller). Tests may pass ``taus`` / ``target_taus`` instead.
"""
from __future__ import annotations

import math

import torch

from foxdqn.nn.iqn import check_positive_int
from foxdqn.objectives.base import LossOutput, Objective, weighted_mean
from foxdqn.ops.quantile_huber_loss import quantile_huber_loss


def iqn_quantile_loss(online, target, obs: torch.Tensor, next_obs: torch.Tensor, action: torch.Tensor,
                      reward: torch.Tensor, discount: torch.Tensor, taus: torch.Tensor, target_taus: torch.Tensor,
                      kappa: float | torch.Tensor, *, double: bool, penalty: torch.Tensor | None = None,
                      q_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(ρ float32 ``[..., B]``, expected Q float32 ``[..., B, A]``) of eq. 3 (module docstring) for
    every sample, with any leading axes: one run's ``[B]`` batch, or a population's ``[P, B]``
    (members never mix: every op is per row, and the loss takes each member's own κ).

    Args:
        online, target: networks with ``encoder(obs [..., B, D]) → [..., B, H]``,
            ``head(h, τ [..., B, N]) → [..., B, N, A]``, ``policy_q(h) → [..., B, A]`` and
            ``obs → expected Q [..., B, A]`` (:class:`foxdqn.nn.iqn.IQNNetwork`,
            :class:`foxdqn.population.distributional.MemberIQNNetwork`).
        obs, next_obs: s and s' ``[..., B, D]``.
        action: int64 ``[..., B]``. reward, discount: float32 ``[..., B]``.
        taus, target_taus: float32 ``[..., B, N]`` and ``[..., B, N']``, the quantile fractions τ, τ'.
        kappa: κ >= 0, a float, or float32 ``[P]`` (one per member: leading axis P).
        double: Double DQN selection of a* at s'.
        penalty: None, or float32 with the elements of ``[..., B, A]``: the switch penalty of s',
            subtracted from the Q that picks a*.
        q_grad: the expected Q keeps its gradient (CQL); False: computed without one.
    """
    N, Np = taus.shape[-1], target_taus.shape[-1]
    h = online.encoder(obs)  # (..., B, H), with grad
    z = online.head(h, taus)  # (..., B, N, A)
    z_sa = z.gather(-1, action[..., None, None].expand(*action.shape, N, 1)).squeeze(-1)  # (..., B, N)
    with torch.set_grad_enabled(q_grad and torch.is_grad_enabled()):
        q_all = online.policy_q(h)  # (..., B, A) expected Q over the K midpoints
    with torch.no_grad():
        h_next = target.encoder(next_obs)  # (..., B, H)
        select = online(next_obs) if double else target.policy_q(h_next)  # (..., B, A)
        if penalty is not None:  # action.switch_margin: a* pays for leaving the position held at s'
            select = select - penalty.view_as(select)
        a_star = select.argmax(dim=-1)  # (..., B)
        z_next = target.head(h_next, target_taus)  # (..., B, N', A)
        z_next_a = z_next.gather(-1, a_star[..., None, None].expand(*a_star.shape, Np, 1)).squeeze(-1)  # (..., B, N')
        t = reward[..., None] + discount[..., None] * z_next_a  # (..., B, N') targets T_j
    per_sample = quantile_huber_loss(z_sa.reshape(-1, N), t.reshape(-1, Np), taus.reshape(-1, N), kappa)  # eq. 3
    return per_sample.view(reward.shape), q_all


class IQNObjective(Objective):
    """Quantile Huber loss of IQN with sampled quantile fractions.

    Args:
        online, target: :class:`foxdqn.nn.iqn.IQNNetwork` (``encoder``, ``head(h, taus)``,
            ``quantiles(obs, taus) -> [B, N, A]``, ``policy_q(h) -> [B, A]``).
        num_quantiles: N >= 1, online τ samples per transition (``head.num_quantiles``; 64 in the paper).
        num_target_quantiles: N' >= 1, target τ' samples (``head.num_target_quantiles``; 64).
        kappa: Huber threshold κ >= 0 in return units (``head.kappa``; 1 in the paper; 0 gives the
            plain quantile-regression loss).
        generator: ``torch.Generator`` on the training device; may be None only if every call
            passes ``taus`` and ``target_taus``.
        double: Double DQN action selection at s' (``head.double``).
        switch: None, or a :class:`foxdqn.actions.switch.NextStatePenalty` (``action.switch_margin``
            > 0): a* is the argmax of the expected Q minus ``switch(batch)``, the [B, A] switch
            penalty of s'.

    ``forward(batch, taus=None, target_taus=None) -> LossOutput``: loss float32 0-d =
    Σ_b weight_b · ρ_b / B; td_abs float32 [B] = ρ_b (detached); q_values float32 [B, A] the online
    expected Q at s over the K midpoints (detached). ``forward_with_q`` also returns that
    expected Q with its gradient [B, A] (for CQL). ``taus`` float32 [B, N], ``target_taus``
    float32 [B, N'] override the draws.

    Raises:
        ValueError: ``num_quantiles``, ``num_target_quantiles`` < 1; ``kappa`` < 0 or not finite.
        ValueError: ``generator`` is None and a call does not pass both τ tensors.
    """

    def __init__(self, online, target, num_quantiles: int = 64, num_target_quantiles: int = 64,
                 kappa: float = 1.0, generator: torch.Generator | None = None, double: bool = True, switch=None):
        super().__init__(online, target)
        check_positive_int("IQNObjective: num_quantiles", num_quantiles)
        check_positive_int("IQNObjective: num_target_quantiles", num_target_quantiles)
        if isinstance(kappa, bool) or not isinstance(kappa, (int, float)) or not (math.isfinite(kappa) and kappa >= 0):
            raise ValueError(f"IQNObjective: kappa must be a finite number >= 0, got {kappa!r}")
        self.num_quantiles = num_quantiles
        self.num_target_quantiles = num_target_quantiles
        self.kappa = float(kappa)
        self.generator = generator
        self.double = bool(double)
        self.switch = switch

    def _sample(self, shape: tuple[int, int], device: torch.device) -> torch.Tensor:
        if self.generator is None:
            raise ValueError("IQNObjective: pass a torch.Generator (or both taus and target_taus)")
        return torch.rand(shape, generator=self.generator, device=device)

    def _run(self, batch, taus, target_taus, q_grad: bool) -> tuple[LossOutput, torch.Tensor]:
        B, device = batch.obs.shape[0], batch.obs.device
        if taus is None:
            taus = self._sample((B, self.num_quantiles), device)  # (B, N)
        if target_taus is None:
            target_taus = self._sample((B, self.num_target_quantiles), device)  # (B, N')
        per_sample, q_all = iqn_quantile_loss(
            self.online, self.target, batch.obs, batch.next_obs, batch.action, batch.reward, batch.discount, taus,
            target_taus, self.kappa, double=self.double, penalty=None if self.switch is None else self.switch(batch),
            q_grad=q_grad)
        out = LossOutput(weighted_mean(per_sample, batch.weight), per_sample.detach(), q_all.detach())
        return out, q_all

    def forward_with_q(self, batch, taus: torch.Tensor | None = None,
                       target_taus: torch.Tensor | None = None) -> tuple[LossOutput, torch.Tensor]:
        return self._run(batch, taus, target_taus, q_grad=True)

    def forward(self, batch, taus: torch.Tensor | None = None, target_taus: torch.Tensor | None = None) -> LossOutput:
        # the Q monitor needs no gradient: skip the K-midpoint branch in backward
        return self._run(batch, taus, target_taus, q_grad=False)[0]
