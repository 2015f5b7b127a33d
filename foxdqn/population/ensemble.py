"""The ensemble policy of a population: the members of one setting act as one agent.

Members of a population that differ only in their seed (:func:`settings`) are one setting trained
P times. Their ensemble acts on each bar with the action that :data:`RULES` picks from all their
Q-values at once (Osband et al. 2016, "Deep Exploration via Bootstrapped DQN", §3, acts with one
head; here every member votes or their Q-values are averaged, as in their ensemble evaluation):

- ``mean``: argmax over actions of the members' mean Q, ``argmax_a (1/P) Σ_p Q_p(s, a)``;
- ``vote``: the action most members choose greedily; a tie goes to the tied action with the
  highest mean Q;
- ``consensus``: the position is kept unless the members agree on leaving it. Each member's
  greedy action targets an exposure (:func:`foxdqn.actions.switch.action_exposures`); when at
  least ``⌈agreement · K⌉`` of the K members target one exposure other than the one held
  (``eval.ensemble_agreement`` > 0.5, so at most one exposure can have that many), the ensemble
  moves there, else it keeps the exposure held; in either case it takes the action of that
  exposure with the highest mean Q. Disagreement among members trained alike on the same bars is
  what they memorised differently, not an edge (docs/bench.md#learnability), so it sends no
  order;
- ``lcb``: the position is kept unless a switch gains with confidence. Member p's advantage of
  action a over keeping, ``d_p(a) = Q_p(s, a) − max_{a': e(a') = e_held} Q_p(s, a')``, gives each
  action that leaves the held exposure the lower confidence bound ``mean_p d_p(a) − κ · std_p
  d_p(a)`` over the K members (``eval.ensemble_kappa``; std with Bessel's correction); the ensemble
  takes the action of the highest bound where it is > 0, else the held exposure's action of the
  highest mean Q. The ensemble's spread as a measure of what the members do not know, and its
  lower bound as the pessimistic value, are those of ensemble-based offline RL (An et al. 2021,
  "Uncertainty-Based Offline Reinforcement Learning with Diversified Q-Ensemble"; Bai et al.
  2022, "Pessimistic Bootstrapping for Uncertainty-Driven Offline RL"), applied here to the
  decision to trade.

``consensus`` and ``lcb`` decide the exposure themselves: all the actions they allow target one
exposure, so ``action.switch_margin``'s penalty (subtracted in the walk) changes nothing among
them. Both read the exposure index each walk holds from the eval env's accounts
(:meth:`foxdqn.envs.trading.TradingEnv.account`), not from the observation's rounded exposure.

The ensemble is walked through the same eval env, execution model and metrics as each member
(:func:`foxdqn.analysis.backtest.evaluate_agents`, docs/backtest.md), on validation and on ``eval.split``.
Trading only: CartPole's greedy episodes have no ensemble.
"""
from __future__ import annotations

import json
import math
from typing import Sequence

import torch
from torch import nn

from foxdqn.config.schema import to_plain
from foxdqn.execution.orders import NUM_EXPOSURES

#: eval.ensemble values other than ``none``
RULES = ("mean", "vote", "consensus", "lcb")


class EnsembleGreedy(nn.Module):
    """Q of the ensemble of members ``idx`` of ``online`` (a :class:`~foxdqn.population.network.MemberQNetwork`
    of P members): obs ``[M, D]`` (one walk per row) → ``[M, A]`` float32 scores whose argmax is
    the ensemble's action (``mean``: the mean Q; ``vote``: the vote count plus the mean Q scaled
    into [0, 1), so that the argmax is the most chosen action and ties go to the higher mean Q;
    ``consensus`` and ``lcb``: the mean Q on the actions the rule allows, −inf elsewhere; they
    need ``held``, the walks' exposure indices held, int64 ``[M]``: :attr:`needs_held`).

    Args:
        online: the population's online network, member axis first.
        idx: the members of the ensemble (indices into the population; at least one).
        rule: one of :data:`RULES`.
        agreement: ``consensus`` only: the fraction of the members, in (0.5, 1], that must target
            one new exposure for the ensemble to move (``eval.ensemble_agreement``).
        action_exposure: ``consensus`` and ``lcb``: int64 ``[A]``, the exposure index each action
            targets (:func:`foxdqn.actions.switch.action_exposures`).
        kappa: ``lcb`` only: κ >= 0, the standard deviations below the mean (``eval.ensemble_kappa``).

    Raises:
        ValueError: an unknown rule, no member; for ``consensus`` an agreement outside (0.5, 1];
            for ``lcb`` a κ that is not a finite number >= 0; for either, no ``action_exposure``.
    """

    def __init__(self, online: nn.Module, idx: Sequence[int], rule: str = "mean", agreement: float = 0.8,
                 action_exposure: torch.Tensor | None = None, kappa: float = 1.0):
        super().__init__()
        if rule not in RULES:
            raise ValueError(f"ensemble rule {rule!r}: choose one of {', '.join(RULES)}")
        if not idx:
            raise ValueError("an ensemble needs at least one member")
        self.online, self.rule = online, rule
        self.needs_held = rule in ("consensus", "lcb")
        device = next(online.parameters(), torch.empty(0)).device  # on the device already: walks are captured
        self.register_buffer("idx", torch.as_tensor(list(idx), dtype=torch.int64, device=device), persistent=False)
        if self.needs_held:
            if rule == "consensus" and not 0.5 < agreement <= 1.0:
                raise ValueError(f"ensemble agreement must be in (0.5, 1], got {agreement!r}")
            if rule == "lcb" and not (math.isfinite(kappa) and kappa >= 0):
                raise ValueError(f"ensemble kappa must be a finite number >= 0, got {kappa!r}")
            if action_exposure is None:
                raise ValueError(f"the {rule} rule needs action_exposure (the exposure index of each action)")
            self.kappa = float(kappa)  # lcb
            self.need = math.ceil(agreement * len(idx) - 1e-9)  # consensus: members that must agree
            self.register_buffer("action_exposure", action_exposure.to(device=device, dtype=torch.int64),
                                 persistent=False)

    def forward(self, obs: torch.Tensor, held: torch.Tensor | None = None) -> torch.Tensor:
        p = self.online.num_members
        q = self.online(obs.unsqueeze(0).expand(p, *obs.shape).contiguous())  # [P, M, A]: every member sees every walk
        q = q.index_select(0, self.idx)
        mean = q.mean(dim=0)
        if self.rule == "mean":
            return mean
        if self.needs_held:
            if held is None:
                raise ValueError(f"the {self.rule} rule needs held, the exposure index each walk holds")
            held = held.to(torch.int64)
        if self.rule == "lcb":
            return self._lcb(q, mean, held)
        if self.rule == "consensus":
            targets = self.action_exposure[q.argmax(dim=2)]  # [K, M]: each member's greedy exposure
            counts = torch.zeros(mean.shape[0], NUM_EXPOSURES, dtype=torch.int64, device=mean.device)
            counts.scatter_add_(1, targets.t(), torch.ones_like(targets.t()))  # [M, E]
            counts.scatter_(1, held.unsqueeze(1), -1)  # staying needs no agreement
            best, where = counts.max(dim=1)
            target = torch.where(best >= self.need, where, held)  # [M]
            allowed = self.action_exposure.unsqueeze(0) == target.unsqueeze(1)  # [M, A]
            return torch.where(allowed, mean, torch.full_like(mean, float("-inf")))
        votes = torch.zeros_like(mean).scatter_add_(1, q.argmax(dim=2).t(), torch.ones_like(mean[:, :1]).expand(
            -1, q.shape[0]).contiguous())
        low, high = mean.min(dim=1, keepdim=True).values, mean.max(dim=1, keepdim=True).values
        return votes + 0.5 * (mean - low) / (high - low).clamp_min(1e-30)  # tie-break in [0, 0.5]

    def _lcb(self, q: torch.Tensor, mean: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
        """The ``lcb`` rule's scores (module docstring) of the members' Q ``q`` ``[K, M, A]``."""
        neg_inf = torch.full_like(mean, float("-inf"))
        keep = self.action_exposure.unsqueeze(0) == held.unsqueeze(1)  # [M, A]: the held exposure's actions
        q_keep = torch.where(keep.unsqueeze(0), q, neg_inf.unsqueeze(0)).amax(dim=2, keepdim=True)  # [K, M, 1]
        d = q - q_keep  # [K, M, A]: each member's advantage over keeping
        spread = d.std(dim=0) if d.shape[0] > 1 else torch.zeros_like(mean)
        bound = torch.where(keep, neg_inf, d.mean(dim=0) - self.kappa * spread)  # [M, A]
        best, action = bound.max(dim=1)
        switch = best > 0
        chosen = torch.arange(mean.shape[1], device=mean.device).unsqueeze(0) == action.unsqueeze(1)
        allowed = torch.where(switch.unsqueeze(1), chosen, keep)
        return torch.where(allowed, mean, neg_inf)


def settings(cfgs: Sequence) -> list[list[int]]:
    """The members of ``cfgs`` (validated configs of one population) grouped by setting: members
    whose configs are equal but for ``seed`` (and the data's own seed, which a population shares)
    share a setting. Groups in order of their first member; members in order."""
    groups: dict[str, list[int]] = {}
    for p, cfg in enumerate(cfgs):
        plain = to_plain(cfg)
        plain.pop("seed", None)
        groups.setdefault(json.dumps(plain, sort_keys=True, default=str), []).append(p)
    return list(groups.values())


def ensemble_walks(s, market, jobs: Sequence[int], rule: str) -> dict[int, dict]:
    """Walk the ensemble of every setting of population ``s`` with two or more members, on
    validation and on ``eval.split``; members the guard halted are left out (a setting with fewer
    than two others has no ensemble). Returns, per member of such a setting, the summary entry
    ``ensemble_policy``: ``rule``, ``members`` (its setting's job numbers), ``split``,
    ``metrics`` (the ensemble's agent metrics on ``eval.split``, :func:`foxdqn.analysis.backtest.evaluate`'s
    format; behind the deployment gate with ``eval.gate.enabled``, whose choice is then in ``gate``) and
    ``val_metrics`` (the ensemble as trained); members of a one-member setting get no entry."""
    from foxdqn.actions.switch import action_exposures
    from foxdqn.analysis.backtest import evaluate_agents
    from foxdqn.analysis.gate import gate_enabled, gated_agents

    out: dict[int, dict] = {}
    for members in settings(s.cfgs):
        members = [p for p in members if s.guard.reason(p) is None]  # a halted member has no say
        if len(members) < 2:
            continue
        greedy = EnsembleGreedy(s.online, members, rule, float(s.cfg.eval.ensemble_agreement),
                                action_exposures(None if s.action_mode is None else s.action_mode.name, s.device),
                                float(s.cfg.eval.ensemble_kappa))
        scale = [s.cfgs[members[0]].loss.reward_scale]  # one setting: one reward scale (its switch penalty's)
        val = evaluate_agents(s.cfg, market, greedy, s.device, 1, "val", s.action_mode, ("agent",),
                              reward_scales=scale)[0]
        gate = None
        if gate_enabled(s.cfg):  # the ensemble behind the deployment gate too (foxdqn.analysis.gate)
            tests, gates = gated_agents(s.cfg, market, greedy, s.device, 1, s.cfg.eval.split, s.action_mode,
                                        ("agent",), reward_scales=scale)
            test, gate = tests[0], gates[0]
        else:
            test = evaluate_agents(s.cfg, market, greedy, s.device, 1, s.cfg.eval.split, s.action_mode, ("agent",),
                                   reward_scales=scale)[0]
        entry = {"rule": rule, "members": [jobs[p] for p in members], "split": str(s.cfg.eval.split),
                 "metrics": test["metrics"]["agent"], "val_metrics": val["metrics"]["agent"]}
        if gate is not None:
            entry["gate"] = gate
        for p in members:
            out[p] = entry
    return out
