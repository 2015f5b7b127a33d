"""Hindsight Experience Replay, "future" strategy (Andrychowicz et al. 2017, §3.3 and §4.5).

For each sampled transition, with probability k/(k+1) the goal is replaced by the goal achieved
at a uniformly chosen later step of the same episode (the step itself included), and the reward
and terminal flag are recomputed against the new goal; otherwise the original goal stays (the
paper's ratio of k relabelled goals per original one). The future step is found with a fixed
gather of the next ``max_episode_steps`` rows of the env's column in the time-major replay: the
rows of one episode are consecutive, so the valid future rows are a prefix of that window
(same episode number, already written). Only 1-step transitions (``replay.n_step=1``).
"""
from __future__ import annotations

import torch


class HindsightRelabeler:
    """Relabels sampled batches of a goal-conditioned env.

    Args:
        env: a goal-conditioned env (``goal_conditioned = True``; ``achieved_goal(obs)``,
            ``desired_goal(obs)``, ``with_goal(obs, goal)``, ``compute_reward(achieved, goal)``,
            ``is_success(achieved, goal)``, ``max_episode_steps``).
        k: relabelled goals per original goal (``replay.her_k`` ≥ 1).
        gamma: discount γ.
        reward_scale: the scale applied to env rewards at insertion.

    Raises:
        ValueError: ``env`` is not goal-conditioned, or ``k`` < 1.
    """

    def __init__(self, env, k: int, gamma: float, reward_scale: float = 1.0):
        if not getattr(env, "goal_conditioned", False):
            raise ValueError(f"HindsightRelabeler: env must be goal-conditioned (goal_conditioned = True); "
                             f"env={getattr(env, 'name', type(env).__name__)!r} is not")
        if k < 1:
            raise ValueError(f"HindsightRelabeler: k must be >= 1, got k={k}")
        self.env, self.gamma, self.reward_scale = env, gamma, reward_scale
        self.p_relabel = k / (k + 1.0)
        self.window = int(env.max_episode_steps)

    def relabel(self, buf, batch, generator: torch.Generator):
        """Batch with hindsight goals; ``buf`` is the ReplayBuffer the batch came from. Draws
        ``torch.rand(2, B)`` from ``generator``, then :meth:`relabel_with` with this relabeler's γ
        and reward scale."""
        u = torch.rand(2, batch.index.shape[0], device=buf.device, generator=generator)
        return self.relabel_with(buf, batch, u, self.gamma, self.reward_scale)

    def relabel_with(self, buf, batch, u: torch.Tensor, gamma, reward_scale):
        """``batch`` (``[B, D]`` obs and next_obs, ``batch.index`` its flat rows ``t·N + e`` of
        ``buf``) with hindsight goals, from the uniforms ``u`` (float32 ``[2, B]``: row 0 picks the
        future step, row 1 decides whether the goal is relabelled). ``gamma`` and ``reward_scale``:
        floats, or float32 ``[B]`` tensors of one value per row (a population's members,
        :class:`foxdqn.population.her.MemberHindsightRelabeler`). Device ops only."""
        env = self.env
        t, e = batch.index // buf.num_envs, batch.index % buf.num_envs
        j = torch.arange(self.window, device=buf.device)
        tj = (t[:, None] + j[None, :]) % buf.rows  # (B, L)
        ej = e[:, None].expand_as(tj)
        same = (buf.episode[tj, ej] == buf.episode[t, e][:, None]) & (j[None, :] <= buf.age(t)[:, None])
        count = same.to(torch.int64).sum(dim=1)  # ≥ 1: j = 0 is always valid; valid j form a prefix
        pick = (u[0] * count.to(torch.float32)).to(torch.int64).clamp(max=count - 1)
        future = tj.gather(1, pick[:, None]).squeeze(1)
        achieved_future = env.achieved_goal(buf.next_obs[future, e])
        relabel = (u[1] < self.p_relabel)[:, None]
        goal = torch.where(relabel, achieved_future, env.desired_goal(batch.obs))
        obs, next_obs = env.with_goal(batch.obs, goal), env.with_goal(batch.next_obs, goal)
        achieved_next = env.achieved_goal(batch.next_obs)
        reward = env.compute_reward(achieved_next, goal) * reward_scale
        terminal = env.is_success(achieved_next, goal).to(torch.float32)
        return batch._replace(obs=obs, next_obs=next_obs, reward=reward, discount=gamma * (1.0 - terminal))
