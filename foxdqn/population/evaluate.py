"""Validation and evaluation of a population's members, all members at once.

The same evaluations as a single run's (:mod:`foxdqn.finish`, docs/backtest.md), batched over the
members: a trading split is walked by P envs of one eval env, one per member, and buy-and-hold
and flat once (:func:`foxdqn.evaluate.evaluate_agents`); the greedy episodes of CartPole run
E envs per member in one env, member p's resets drawn from its own seed (``seed + offset``, as a
single run's evaluation seeds its generator), so member p's episodes do not depend on P.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from foxdqn.evaluate import episode_env_count, episode_metrics, evaluate_agents
from foxdqn.population.envs import MemberCartPoleEnv
from foxdqn.population.network import MemberQNetwork
from foxdqn.population.random import MemberRandom


class MemberGreedy(nn.Module):
    """The members' Q as one flat network: obs ``[P·M, D]`` (member p's rows ``p·M .. (p+1)·M − 1``)
    → Q ``[P·M, A]``."""

    def __init__(self, online: MemberQNetwork):
        super().__init__()
        self.online = online

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        p = self.online.num_members
        return self.online(obs.view(p, -1, obs.shape[-1])).reshape(obs.shape[0], -1)


def member_walks(s, market, split: str, policies: tuple[str, ...]) -> list[dict]:
    """Each member's :func:`foxdqn.evaluate.evaluate` result on ``split`` (one walk per member)."""
    return evaluate_agents(s.cfg, market, MemberGreedy(s.online), s.device, s.members, split, s.action_mode, policies)


def member_episodes(s, episodes: int, seed_offset: int) -> list[dict]:
    """Each member's greedy episode metrics (:func:`foxdqn.evaluate.evaluate_episodes`): the first
    ``episodes / E`` finished episodes of each of its E envs; reads the done flags every step."""
    per = episode_env_count(episodes)
    quota, p = episodes // per, s.members
    env = MemberCartPoleEnv(MemberRandom([c.seed + seed_offset for c in s.cfgs], s.device), per, s.device)
    greedy = MemberGreedy(s.online)
    obs = env.reset_all().to(torch.float32)
    returns, lengths = [[] for _ in range(p)], [[] for _ in range(p)]
    taken = np.zeros(p * per, dtype=np.int64)
    with torch.no_grad():
        for _ in range(max(1, quota * int(env.max_episode_steps) + 1)):
            out = env.step(s.action_mode.to_env(greedy(obs).argmax(dim=1), env))
            obs = out.obs.to(torch.float32)
            done = out.info["episode_done"].cpu().numpy() & (taken < quota)
            if done.any():
                taken += done
                ret, length = out.info["episode_return"].cpu().numpy(), out.info["episode_length"].cpu().numpy()
                for e in np.flatnonzero(done):
                    returns[e // per].append(float(ret[e]))
                    lengths[e // per].append(float(length[e]))
            if (taken >= quota).all():
                break
    return [episode_metrics(returns[m], lengths[m], [], episodes) for m in range(p)]
