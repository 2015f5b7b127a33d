r"""Batched, device-resident, CUDA-graph-capturable goal-conditioned bit flipping.

The bit-flipping environment of Andrychowicz et al. (2017), "Hindsight Experience Replay"
(NeurIPS; §3.1 motivating example, §4.1 experiment): the state is ``s ∈ {0,1}^n``, the goal
``g ∈ {0,1}^n``; action ``i`` flips bit ``i`` of the state; the reward is ``-1`` on every step
whose resulting state is not the goal and ``0`` on the step that reaches it. With only the
sparse reward, random exploration almost never sees a 0 for ``n`` beyond ~15 bits: the
benchmark for hindsight goal relabelling (HER).

:class:`BitFlipEnv` steps ``N`` independent instances.

Episodes
--------
* reset: ``s`` uniform on ``{0,1}^n``; ``g`` uniform on ``{0,1}^n \ {s}``. The paper draws
  ``s`` and ``g`` uniformly; a goal equal to the start is redrawn here (rejection sampling), so
  that every episode needs at least one flip. The rejection sampling is done without a loop
  (sync-free) as ``g = s XOR m`` with ``m`` uniform over the ``2^n - 1`` non-zero masks (one
  ``randint`` of ``[1, 2^n)`` per env, uniform up to ``torch.randint``'s modulo reduction, a
  total-variation error below ``2^-31``) for ``n <= 62``; for ``n > 62``, ``m`` is ``n``
  uniform bits and an all-zero ``m`` (probability ``2^-n < 2^-62``) is replaced by a uniform
  one-hot mask;
* step: ``s ← s XOR onehot(action)``; ``reward = 0`` if ``s == g`` after the step else ``-1``;
* ``terminated``: ``s == g`` after the step (the only step with reward 0);
* ``truncated``: the step was the episode's ``n``-th and did not reach the goal (episode length
  ``n``, as in the paper; the two flags are never both true).

Envs that end are reset inside the same :meth:`BitFlipEnv.step` (auto-reset, branch-free):
``StepOut.next_obs`` is the observation before the reset (store it in replay), ``StepOut.obs``
the one after (act on it).

Observation and goal interface
------------------------------
``obs = concat(s, g)``, ``[N, 2n]`` in ``dtype`` (0.0 / 1.0 values; state bits first). The
goal-conditioned helpers used by hindsight relabelling work on any leading shape ``[..., 2n]``:
:meth:`~BitFlipEnv.achieved_goal` (state part), :meth:`~BitFlipEnv.desired_goal` (goal part),
:meth:`~BitFlipEnv.with_goal` (replace the goal part), :meth:`~BitFlipEnv.compute_reward` and
:meth:`~BitFlipEnv.is_success`. A bit counts as 1 when its value is ``> 0.5``.

Graph capture
-------------
:meth:`BitFlipEnv.reset_all`, :meth:`BitFlipEnv.observe`, :meth:`BitFlipEnv.step` and the goal
helpers only launch fixed-shape tensor ops on the env device, never read a device value on the
host and update the state tensors in place. Their only randomness is the ``generator`` given to
the constructor: per :meth:`~BitFlipEnv.reset_all` and per :meth:`~BitFlipEnv.step` one
``randint`` of ``[N, n]`` (start states) and one ``randint`` of ``[N]`` (``n <= 62``) or of
``[N, n]`` and ``[N]`` (``n > 62``) for the goal masks, drawn for every env whether or not it
resets. Register the generator before capturing: ``graph.register_generator_state(env.generator)``.
Actions are not range-checked (a sync): an action outside ``0..n-1`` flips no bit.
"""
from __future__ import annotations

import torch
from torch import Tensor

from foxdqn.envs.base import NO_HOOK, StepOut
from foxdqn.envs.cartpole import _set_elapsed_steps
from foxdqn.envs.checks import check_generator, float_dtype, positive_int

__all__ = ["BitFlipEnv"]

_MAX_EXACT_BITS = 62  # randint(1, 2**n) of int64 masks is exact up to here


class BitFlipEnv:
    """``N`` vectorised bit-flipping tasks of ``n`` bits (see the module docstring).

    Args:
        num_envs: ``N >= 1``.
        n_bits: ``n >= 1`` bits of state and goal; also the number of actions and the episode
            length.
        device: where the state tensors live.
        generator: ``torch.Generator`` on ``device``; the only source of randomness.
        dtype: floating dtype of observations and rewards (default float32).

    Raises:
        ValueError: invalid ``num_envs``, ``n_bits``, ``dtype`` or ``generator`` (names the
            parameter).

    Attributes:
        num_envs: ``N``.  n_bits: ``n``.  obs_dim: ``2n``.  obs_shape: ``(2n,)``.  obs_dtype:
        float32 (what the agent stores).  num_actions: ``n`` (action ``i`` flips bit ``i``).
        goal_dim: ``n``.  max_episode_steps: ``n``.  on_host: False.
        collect_hook: :data:`~foxdqn.envs.base.NO_HOOK`.
        device, dtype, generator: as given.
        state, goal: ``[N, n]`` bool, current bits and goal bits.
        steps: ``[N]`` int64, steps taken in the current episode.
        goal_conditioned: ``True`` (class attribute; envs without it are not goal-conditioned).
        her_bit_goals: ``dtype`` is float32: the goal layout hindsight relabelling computes in one
            kernel (:mod:`foxdqn.ops.her_relabel`: the goal is the last ``goal_dim`` entries of the
            observation, the achieved goal its first ``goal_dim``, success when all bits agree, reward
            ``success − 1``); envs without it relabel through their goal methods.
    """

    goal_conditioned = True
    obs_dtype = torch.float32
    on_host = False
    collect_hook = NO_HOOK

    def __init__(
        self,
        num_envs: int,
        n_bits: int,
        device: torch.device | str,
        generator: torch.Generator,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        num_envs = positive_int(num_envs, "num_envs")
        n_bits = positive_int(n_bits, "n_bits")
        dtype = float_dtype(dtype)
        device = torch.device(device)
        check_generator(generator, device)
        self.num_envs = num_envs
        self.n_bits = n_bits
        self.obs_dim = 2 * n_bits
        self.obs_shape = (self.obs_dim,)
        self.num_actions = n_bits
        self.goal_dim = n_bits
        self.max_episode_steps = n_bits
        self.device = device
        self.dtype = dtype
        self.her_bit_goals = dtype == torch.float32
        self.generator = generator
        self._bit_index = torch.arange(n_bits, device=device, dtype=torch.long)
        self.state = torch.zeros(num_envs, n_bits, device=device, dtype=torch.bool)
        # placeholder goal != state (no randomness drawn) until reset_all()
        self.goal = torch.ones(num_envs, n_bits, device=device, dtype=torch.bool)
        self.steps = torch.zeros(num_envs, device=device, dtype=torch.long)

    # ------------------------------------------------------------------ device-side API

    def reset_all(self) -> Tensor:
        """Start a fresh episode in every env (random state, random goal != state). Sync-free.

        Returns:
            ``[N, 2n]`` observation (dtype).
        """
        state, goal = self._draw_starts()
        self.state.copy_(state)
        self.goal.copy_(goal)
        self.steps.zero_()
        return self.observe()

    def observe(self) -> Tensor:
        """Observation ``concat(state, goal)``, ``[N, 2n]`` dtype (no side effects, sync-free)."""
        return self._observation(self.state, self.goal)

    def set_state(self, state: Tensor, goal: Tensor, elapsed_steps: Tensor | None = None) -> Tensor:
        """Overwrite state and goal of every env (for tests and custom starts). Sync-free.

        Args:
            state, goal: ``[N, n]`` bool or 0/1 numbers (nonzero = 1); copied. ``goal == state``
                is allowed here (the next step then flips away from it).
            elapsed_steps: optional ``[N]`` integer steps already taken (default 0).

        Returns:
            ``[N, 2n]`` observation (dtype).

        Raises:
            ValueError: a tensor of the wrong shape.
        """
        shape = (self.num_envs, self.n_bits)
        for name, t in (("state", state), ("goal", goal)):
            if tuple(t.shape) != shape:
                raise ValueError(f"{name}: must have shape {shape}, got {tuple(t.shape)}")
        self.state.copy_(state != 0)
        self.goal.copy_(goal != 0)
        _set_elapsed_steps(self.steps, elapsed_steps, self.num_envs)
        return self.observe()

    def step(self, action: Tensor) -> StepOut:
        """Flip bit ``action[i]`` of env ``i`` (``action`` ``[N]`` int64 in ``0..n-1``).

        Returns:
            :class:`~foxdqn.envs.StepOut`: ``next_obs`` / ``obs`` ``[N, 2n]`` dtype (before /
            after auto-reset), ``reward`` ``[N]`` dtype (0 if the goal is reached, else -1),
            ``terminated`` / ``truncated`` ``[N]`` bool, ``info`` with ``[N]`` tensors
            ``episode_return`` (dtype, undiscounted return of the episode that ended, else 0),
            ``episode_done`` (bool), ``episode_length`` (int64, else 0) and ``is_success``
            (dtype, 1 if the episode that ended reached its goal, else 0).
        """
        flip = self._bit_index == action.unsqueeze(1)  # [N, n]
        state1 = self.state ^ flip
        terminated = (state1 == self.goal).all(dim=1)
        steps1 = self.steps + 1
        truncated = (steps1 >= self.max_episode_steps) & ~terminated
        done = terminated | truncated
        reward = terminated.to(self.dtype) - 1.0
        # rewards: -1 on each of the first steps1-1 steps, then reward on this one
        episode_return = reward - (steps1 - 1).to(self.dtype)
        zero = torch.zeros((), device=self.device, dtype=self.dtype)
        info = {
            "episode_return": torch.where(done, episode_return, zero),
            "episode_done": done,
            "episode_length": torch.where(done, steps1, torch.zeros_like(steps1)),
            "is_success": terminated.to(self.dtype),  # success ⇒ done; 0 for envs still running
        }
        next_obs = self._observation(state1, self.goal)

        start, goal = self._draw_starts()
        reset = done.unsqueeze(1)
        self.state.copy_(torch.where(reset, start, state1))
        self.goal.copy_(torch.where(reset, goal, self.goal))
        self.steps.copy_(steps1.masked_fill(done, 0))
        return StepOut(
            next_obs=next_obs, reward=reward, terminated=terminated, truncated=truncated, obs=self.observe(),
            info=info,
        )

    def close(self) -> None:
        """Nothing to release (the env holds only tensors)."""

    # ------------------------------------------------------------------ goal interface (HER)

    def achieved_goal(self, obs: Tensor) -> Tensor:
        """State part of ``obs`` ``[..., 2n]`` → ``[..., n]`` (a view, same dtype)."""
        return obs[..., : self.n_bits]

    def desired_goal(self, obs: Tensor) -> Tensor:
        """Goal part of ``obs`` ``[..., 2n]`` → ``[..., n]`` (a view, same dtype)."""
        return obs[..., self.n_bits :]

    def with_goal(self, obs: Tensor, goal: Tensor) -> Tensor:
        """``obs`` ``[..., 2n]`` with its goal part replaced by ``goal`` ``[..., n]`` (broadcast
        to ``obs``'s leading shape, cast to ``obs.dtype``) → new ``[..., 2n]`` tensor."""
        goal = goal.to(obs.dtype).expand(*obs.shape[:-1], self.n_bits)
        return torch.cat([obs[..., : self.n_bits], goal], dim=-1)

    def is_success(self, achieved: Tensor, goal: Tensor) -> Tensor:
        """``[..., n]`` achieved and desired goals (broadcastable) → bool ``[...]``: all bits equal."""
        return ((achieved > 0.5) == (goal > 0.5)).all(dim=-1)

    def compute_reward(self, achieved: Tensor, goal: Tensor) -> Tensor:
        """Reward of reaching ``achieved`` ``[..., n]`` with goal ``goal`` ``[..., n]`` → ``[...]``
        dtype (float32 by default): 0 if all bits equal, else -1 (the env's step reward)."""
        return self.is_success(achieved, goal).to(self.dtype) - 1.0

    # ------------------------------------------------------------------ internals

    def _observation(self, state: Tensor, goal: Tensor) -> Tensor:
        return torch.cat([state, goal], dim=1).to(self.dtype)

    def _draw_starts(self) -> tuple[Tensor, Tensor]:
        """Fresh ``(state, goal)``, each ``[N, n]`` bool: uniform state, uniform goal != state."""
        N, n, dev, gen = self.num_envs, self.n_bits, self.device, self.generator
        state = torch.randint(0, 2, (N, n), device=dev, generator=gen, dtype=torch.long) != 0
        if n <= _MAX_EXACT_BITS:
            # uniform over the 2^n - 1 non-zero masks
            code = torch.randint(1, 2**n, (N,), device=dev, generator=gen, dtype=torch.long)
            mask = ((code.unsqueeze(1) >> self._bit_index) & 1) != 0
        else:
            mask = torch.randint(0, 2, (N, n), device=dev, generator=gen, dtype=torch.long) != 0
            hot = self._bit_index == torch.randint(0, n, (N, 1), device=dev, generator=gen, dtype=torch.long)
            mask = torch.where(mask.any(dim=1, keepdim=True), mask, hot)
        return state, state ^ mask
