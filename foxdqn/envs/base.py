"""What every batched environment provides: :class:`StepOut`, :class:`BatchedEnv` and :class:`CollectHook`.

The training loop (:mod:`foxdqn.step`), the builders and :mod:`foxdqn.analysis.backtest` use an env only
through :class:`BatchedEnv`; :class:`~foxdqn.envs.TradingEnv`,
:class:`~foxdqn.envs.cartpole.CartPoleEnv`, :class:`~foxdqn.envs.bitflip.BitFlipEnv` and
:class:`~foxdqn.envs.gym_adapter.GymVectorEnv` each define all of its members themselves.
What only one kind of env adds to a transition (the trading env: the state codes its replay
stores instead of observations, the state's volatility regime, its order fills for the monitor)
comes through the env's :class:`CollectHook`, so the generic collect step
(:func:`foxdqn.population.step.collect_step`) and the replay builders have no env-specific branch.
"""
from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

import torch
from torch import Tensor

__all__ = ["NO_HOOK", "BatchedEnv", "CollectHook", "StepOut"]


class StepOut(NamedTuple):
    """Result of ``env.step``; every tensor is on the env device with leading dim ``N``.

    Attributes:
        next_obs: ``[N, *obs_shape]`` (``[N, obs_dim]``, or ``[N, C, H, W]`` images): observation after the step, before auto-reset (replay's s'); None from an env told that the replay stores its codes (:meth:`CollectHook.replay_stores_codes`).
        reward: ``[N]`` float: the step's reward.
        terminated: ``[N]`` bool: a true terminal state (no bootstrap from ``next_obs``).
        truncated: ``[N]`` bool: the episode was cut (time limit, end of data) and did not
            terminate; never true together with ``terminated``.
        obs: ``[N, *obs_shape]``: observation to act on next (after auto-reset).
        info: dict of ``[N]`` tensors; every env gives ``episode_done`` (bool,
            ``terminated | truncated``), ``episode_return`` (float, undiscounted return of the
            episode that ended on this step, else 0) and ``episode_length`` (int64, steps of the
            episode that ended on this step, else 0); an env documents any further keys.

    The observations are in the env's own dtype (a device env's ``dtype``; ``obs_dtype`` for
    :class:`~foxdqn.envs.gym_adapter.GymVectorEnv`).
    """

    next_obs: Tensor | None
    reward: Tensor
    terminated: Tensor
    truncated: Tensor
    obs: Tensor
    info: dict


class CollectHook:
    """What an env adds to one generic collect step; this base adds nothing (every env but trading).

    The replay builders call :meth:`replay_codec` once; the collect step calls
    :meth:`replay_extras` before ``env.step``, :meth:`replay_rows` and :meth:`trades` after it,
    for every env. A hook keeps no state: the env is passed in.
    """

    def replay_codec(self, env: BatchedEnv):
        """How the replay stores this env's observations: a
        :class:`foxdqn.replay.buffer.ReplayCodec` (rows of its ``dim`` and ``dtype``, decoded at
        sample time), or None: the observations themselves (``env.obs_dim`` values of
        ``env.obs_dtype``; here)."""
        return None

    def replay_stores_codes(self, env: BatchedEnv) -> None:
        """Told by the replay builders once the replay stores :meth:`replay_codec`'s codes for ``env``
        (so the env may stop computing what only the stored observations needed); nothing here."""

    def replay_rows(self, env: BatchedEnv, replay, obs: Tensor, out: StepOut) -> tuple[Tensor, Tensor]:
        """What ``replay.add`` stores as s and s' of the step ``out`` taken from observations ``obs``.

        Args:
            env: the env that stepped.
            replay: the :class:`foxdqn.replay.ReplayBuffer` the transition goes into.
            obs: ``[N, *obs_shape]`` the observations acted on.
            out: the step's result.

        Returns:
            ``(obs, out.next_obs)`` here; a hook with a :meth:`replay_codec` returns its rows when
            ``replay`` decodes them (``replay.decoder`` set).
        """
        return obs, out.next_obs

    def replay_extras(self, env: BatchedEnv, replay) -> dict[str, Tensor]:
        """Extra keyword arguments of ``replay.add`` describing the state about to be acted on.

        Args:
            env: the env whose state it is (read before it steps).
            replay: the :class:`foxdqn.replay.ReplayBuffer` the transition goes into.

        Returns:
            ``{}`` here; a subclass returns ``[N]`` device tensors keyed by ``replay.add``'s names.
        """
        return {}

    def trades(self, out: StepOut) -> Tensor | None:
        """``[N]`` bool: envs whose step traded (counted by the ``fill_rate`` monitor), or None:
        this env never trades (here)."""
        return None


NO_HOOK = CollectHook()  # the hook of the envs that add nothing

#: the default of ``step``'s ``draws`` in an env with ``draw_step``: the step makes its own draws
#: (``None`` is a value ``draw_step`` may return: nothing to draw)
DRAW = object()


@runtime_checkable
class BatchedEnv(Protocol):
    """``N`` independent copies of one environment, stepped together with auto-reset.

    Attributes:
        num_envs: ``N >= 1``, envs stepped together.
        obs_dim: ``D``, values in one flattened observation (``prod(obs_shape)``).
        obs_shape: shape of one observation before flattening (``(D,)`` for vectors,
            ``(C, H, W)`` for image frames).
        obs_dtype: dtype the agent stores observations in (replay) and casts them to before
            acting: ``torch.uint8`` for image frames, else ``torch.float32`` (a device env may
            compute them in float64; they are cast).
        num_actions: ``A``, size of the discrete action space; actions are int64 ``0..A-1``.
        max_episode_steps: the most steps one episode can last (evaluation budgets, HER windows).
        device: where ``reset_all``/``step`` take actions from and return tensors to.
        on_host: True when ``step`` runs on the CPU and reads the actions back (the collect
            step cannot then be captured in a CUDA graph); False for the device envs.
        collect_hook: the env's :class:`CollectHook` (:data:`NO_HOOK` when it adds nothing).

    A device env may also define ``draw_step()``, the random draws of its next step made ahead
    (device tensors or None, no host read), which ``step(action, draws)`` then takes in place of
    drawing them (a caller that draws them beside its action selection, on a second stream:
    :func:`foxdqn.device.side_stream.beside`). ``step(action)`` alone (``draws`` = :data:`DRAW`)
    still draws them itself.
    """

    num_envs: int
    obs_dim: int
    obs_shape: tuple[int, ...]
    obs_dtype: torch.dtype
    num_actions: int
    max_episode_steps: int
    device: torch.device
    on_host: bool
    collect_hook: CollectHook

    def reset_all(self) -> Tensor:
        """Start a fresh episode in every env; returns the observations ``[N, *obs_shape]``."""
        ...

    def step(self, action: Tensor) -> StepOut:
        """Apply ``action`` (int64 ``[N]`` on ``device``) to every env, auto-resetting the envs whose
        episode ended; see :class:`StepOut`."""
        ...

    def close(self) -> None:
        """Release what the env holds outside tensors (worker processes, threads); a no-op for the
        device envs, which hold nothing else."""
        ...
