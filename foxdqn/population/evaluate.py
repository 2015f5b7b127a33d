"""Validation and evaluation of a population's members, all members at once.

The same evaluations as a single run's (:mod:`foxdqn.run.finish`, docs/backtest.md), batched over the
members: a trading split is walked by one eval env, a row per member and one each for buy-and-hold
and flat (:func:`foxdqn.analysis.backtest.evaluate_agents`); the greedy episodes of CartPole and
bit flipping run E envs per member in one env, member p's resets drawn from its own seed (``seed +
offset``, as a single run's evaluation seeds its generator; Gymnasium envs: their seeds, from
``seed + offset`` as a single run's on the CPU, foxdqn.population.gym_env), so member p's episodes do not
depend on P.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from foxdqn.analysis.backtest import capture_default, episode_env_count, episode_metrics, evaluate_agents, finished_episodes
from foxdqn.population.envs import build_member_env
from foxdqn.population.network import MemberQNetwork
from foxdqn.population.random import MemberRandom
from foxdqn.run.finish import VAL_EPISODES, VAL_SEED_OFFSET


class MemberGreedy(nn.Module):
    """The members' Q as one flat network: obs ``[P·M, D]`` (member p's rows ``p·M .. (p+1)·M − 1``)
    → Q ``[P·M, A]``."""

    def __init__(self, online: MemberQNetwork):
        super().__init__()
        self.online = online

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        p = self.online.num_members
        return self.online(obs.view(p, -1, obs.shape[-1])).reshape(obs.shape[0], -1)


def member_validation(s, market) -> list[dict]:
    """Each member's validation metrics, all members at once: trading, the agent's metrics on the
    val split (:func:`member_walks`); episodes, ``min(20, eval.episodes)`` greedy episodes from
    ``seed + 2`` (the single run's :data:`foxdqn.run.finish.VAL_EPISODES` and ``VAL_SEED_OFFSET``)."""
    if s.cfg.env.name == "trading":
        return [r["metrics"]["agent"] for r in member_walks(s, market, "val", ("agent",))]
    return member_episodes(s, min(VAL_EPISODES, s.cfg.eval.episodes), seed_offset=VAL_SEED_OFFSET)


def member_walks(s, market, split: str, policies: tuple[str, ...]) -> list[dict]:
    """Each member's :func:`foxdqn.analysis.backtest.evaluate` result on ``split`` (one walk per member)."""
    return evaluate_agents(s.cfg, market, MemberGreedy(s.online), s.device, s.members, split, s.action_mode, policies,
                           reward_scales=[c.loss.reward_scale for c in s.cfgs])


def member_gated_walks(s, market, split: str, policies: tuple[str, ...]) -> tuple[list[dict], list[dict]]:
    """Each member's :func:`member_walks` result behind the deployment gate (``eval.gate``,
    :func:`foxdqn.analysis.gate.gated_agents`: every member's candidates walk validation and ``split`` in
    one eval env each), and its summary entry ``gate``."""
    from foxdqn.analysis.gate import gated_agents

    return gated_agents(s.cfg, market, MemberGreedy(s.online), s.device, s.members, split, s.action_mode, policies,
                        reward_scales=[c.loss.reward_scale for c in s.cfgs])


def member_episodes(s, episodes: int, seed_offset: int, graph: bool | None = None) -> list[dict]:
    """Each member's greedy episode metrics (:func:`foxdqn.analysis.backtest.evaluate_episodes`): the first
    ``episodes / E`` finished episodes of each of its E envs (:func:`foxdqn.analysis.backtest.finished_episodes`;
    ``graph`` as in :func:`foxdqn.analysis.backtest.evaluate`: on CUDA, capture the loop in a CUDA graph), with
    the success rate of a goal-conditioned env (bit flipping) as a single run's."""
    per = episode_env_count(episodes)
    env = build_member_env(s.cfgs, None, MemberRandom([c.seed + seed_offset for c in s.cfgs], s.device), s.device,
                           envs_per_member=per, seed_offset=seed_offset)
    greedy = MemberGreedy(s.online)
    try:
        done = finished_episodes(env, lambda obs: s.action_mode.to_env(greedy(obs).argmax(dim=1), env),
                                 episodes // per, capturable=capture_default(s.cfg) if graph is None else bool(graph),
                                 generators=() if env.generator is None else (env.generator,))
    finally:
        if env.on_host:  # a Gymnasium vector env (env=gym): its envs, threads or processes
            env.close()
    member = done["env"] // per
    lengths = done["lengths"].astype(np.float64)
    success = done.get("success")
    return [episode_metrics(done["returns"][member == m].tolist(), lengths[member == m].tolist(),
                            [] if success is None else success[member == m].tolist(), episodes)
            for m in range(s.members)]
