"""The ensemble policy of a population: the members of one setting act as one agent.

Members of a population that differ only in their seed (:func:`settings`) are one setting trained
P times. Their ensemble acts on each bar with the action that :data:`RULES` picks from all their
Q-values at once (Osband et al. 2016, "Deep Exploration via Bootstrapped DQN", §3, acts with one
head; here every member votes or their Q-values are averaged, as in their ensemble evaluation):

- ``mean``: argmax over actions of the members' mean Q, ``argmax_a (1/P) Σ_p Q_p(s, a)``;
- ``vote``: the action most members choose greedily; a tie goes to the tied action with the
  highest mean Q.

The ensemble is walked through the same eval env, execution model and metrics as each member
(:func:`foxdqn.analysis.backtest.evaluate_agents`, docs/backtest.md), on validation and on ``eval.split``.
Trading only: CartPole's greedy episodes have no ensemble.
"""
from __future__ import annotations

import json
from typing import Sequence

import torch
from torch import nn

from foxdqn.config.schema import to_plain

#: eval.ensemble values other than ``none``
RULES = ("mean", "vote")


class EnsembleGreedy(nn.Module):
    """Q of the ensemble of members ``idx`` of ``online`` (a :class:`~foxdqn.population.network.MemberQNetwork`
    of P members): obs ``[M, D]`` (one walk per row) → ``[M, A]`` float32 scores whose argmax is
    the ensemble's action (``mean``: the mean Q; ``vote``: the vote count plus the mean Q scaled
    into [0, 1), so that the argmax is the most chosen action and ties go to the higher mean Q).

    Args:
        online: the population's online network, member axis first.
        idx: the members of the ensemble (indices into the population; at least one).
        rule: one of :data:`RULES`.

    Raises:
        ValueError: an unknown rule or no member.
    """

    def __init__(self, online: nn.Module, idx: Sequence[int], rule: str = "mean"):
        super().__init__()
        if rule not in RULES:
            raise ValueError(f"ensemble rule {rule!r}: choose one of {', '.join(RULES)}")
        if not idx:
            raise ValueError("an ensemble needs at least one member")
        self.online, self.rule = online, rule
        device = next(online.parameters(), torch.empty(0)).device  # on the device already: walks are captured
        self.register_buffer("idx", torch.as_tensor(list(idx), dtype=torch.int64, device=device), persistent=False)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        p = self.online.num_members
        q = self.online(obs.unsqueeze(0).expand(p, *obs.shape).contiguous())  # [P, M, A]: every member sees every walk
        q = q.index_select(0, self.idx)
        mean = q.mean(dim=0)
        if self.rule == "mean":
            return mean
        votes = torch.zeros_like(mean).scatter_add_(1, q.argmax(dim=2).t(), torch.ones_like(mean[:, :1]).expand(
            -1, q.shape[0]).contiguous())
        low, high = mean.min(dim=1, keepdim=True).values, mean.max(dim=1, keepdim=True).values
        return votes + 0.5 * (mean - low) / (high - low).clamp_min(1e-30)  # tie-break in [0, 0.5]


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
    format) and ``val_metrics``; members of a one-member setting get no entry."""
    from foxdqn.analysis.backtest import evaluate_agents

    out: dict[int, dict] = {}
    for members in settings(s.cfgs):
        members = [p for p in members if s.guard.reason(p) is None]  # a halted member has no say
        if len(members) < 2:
            continue
        greedy = EnsembleGreedy(s.online, members, rule)
        scale = [s.cfgs[members[0]].loss.reward_scale]  # one setting: one reward scale (its switch penalty's)
        val = evaluate_agents(s.cfg, market, greedy, s.device, 1, "val", s.action_mode, ("agent",),
                              reward_scales=scale)[0]
        test = evaluate_agents(s.cfg, market, greedy, s.device, 1, s.cfg.eval.split, s.action_mode, ("agent",),
                               reward_scales=scale)[0]
        entry = {"rule": rule, "members": [jobs[p] for p in members], "split": str(s.cfg.eval.split),
                 "metrics": test["metrics"]["agent"], "val_metrics": val["metrics"]["agent"]}
        for p in members:
            out[p] = entry
    return out
