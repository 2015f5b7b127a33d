"""Hindsight Experience Replay, "future" strategy (Andrychowicz et al. 2017, §3.3 and §4.5).

For each sampled transition, with probability k/(k+1) the goal is replaced by the goal achieved
at a uniformly chosen later step of the same episode (the step itself included), and the reward
and terminal flag are recomputed against the new goal; otherwise the original goal stays (the
paper's ratio of k relabelled goals per original one). The future step is found with a fixed
gather of the next ``max_episode_steps`` rows of the env's column in the time-major replay: the
rows of one episode are consecutive, so the valid future rows are a prefix of that window
(same episode number, already written). Only 1-step transitions (``replay.n_step=1``).

The arithmetic is :func:`foxdqn.ops.her_relabel.her_relabel`: one kernel for an env that declares the
bit-goal layout (``her_bit_goals``, the bit-flipping env), its torch reference (the env's own goal
methods) for any other goal-conditioned env and on the CPU.
"""
from __future__ import annotations

import torch

from foxdqn.ops.her_relabel import her_relabel
from foxdqn.ops.replay_gather import stacked_pair


class HindsightRelabeler:
    """Relabels sampled batches of a goal-conditioned env.

    Args:
        env: a goal-conditioned env (``goal_conditioned = True``; ``achieved_goal(obs)``,
            ``desired_goal(obs)``, ``with_goal(obs, goal)``, ``compute_reward(achieved, goal)``,
            ``is_success(achieved, goal)``, ``max_episode_steps``; optionally ``her_bit_goals``
            and ``goal_dim``: the layout :mod:`foxdqn.ops.her_relabel`'s kernel computes).
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
        #: the relabelling runs as one kernel (env with the bit-goal layout, foxdqn/ops/her_relabel.py)
        self.fused = bool(getattr(env, "her_bit_goals", False))

    def relabel(self, buf, batch, generator: torch.Generator):
        """Batch with hindsight goals; ``buf`` is the ReplayBuffer the batch came from. Draws
        ``torch.rand(2, B)`` from ``generator``, then :meth:`relabel_with` with this relabeler's γ
        and reward scale."""
        u = torch.rand(2, batch.index.shape[0], device=buf.device, generator=generator)
        return self.relabel_with(buf, batch, u, self.gamma, self.reward_scale)

    def relabel_with(self, buf, batch, u: torch.Tensor, gamma, reward_scale):
        """``batch`` (obs and next_obs ``[R, D]``, or ``[P, B, D]`` member-major, ``batch.index`` its
        flat rows ``t·N + e`` of ``buf``) with hindsight goals, from the uniforms ``u`` (float32
        ``[2, R]`` or ``[P, 2, B]``: row 0 picks the future step, row 1 decides whether the goal is
        relabelled). ``gamma`` and ``reward_scale``: floats, or float32 ``[G]`` tensors with G
        dividing R, row r taking entry r // (R / G) (``[P]``: a population's members,
        :class:`foxdqn.population.her.MemberHindsightRelabeler`). Obs and next_obs come back as the
        two halves of one ``[P, 2, B, D]`` tensor when they came so
        (:func:`foxdqn.ops.replay_gather.stacked_pair`), else ``[R, D]``.

        One kernel for an env with the bit-goal layout (``her_bit_goals``), else the env's own goal
        methods (:func:`foxdqn.ops.her_relabel.her_relabel`). Device ops only."""
        stacked = stacked_pair(batch.obs, batch.next_obs) is not None
        out = her_relabel(self.env, buf.episode, buf.ptr, buf.next_obs, batch.index, batch.obs, batch.next_obs, u,
                          gamma, reward_scale, self.window, self.p_relabel, stacked=stacked,
                          backend="auto" if self.fused else "torch")
        return batch._replace(obs=out.obs, next_obs=out.next_obs, reward=out.reward, discount=out.discount)
