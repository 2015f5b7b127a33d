r"""Batched, device-resident, CUDA-graph-capturable CartPole (Gymnasium ``CartPole-v1``).

:class:`CartPoleEnv` steps ``N`` independent cart-pole systems with the dynamics, termination,
reward, time limit and reset distribution of Gymnasium's ``CartPole-v1``
(``gymnasium/envs/classic_control/cartpole.py``, ``CartPoleEnv`` with the default ``"euler"``
kinematics integrator and ``sutton_barto_reward=False``, wrapped by ``TimeLimit`` with
``max_episode_steps=500``), itself the cart-pole of Barto, Sutton & Anderson (1983),
"Neuronlike adaptive elements that can solve difficult learning control problems", with the
equations of motion of Florian (2007), "Correct equations for the dynamics of the cart-pole
system" (frictionless case).

State and observation
---------------------
The state of env ``i`` is ``(x, x_dot, theta, theta_dot)``: cart position (m), cart velocity
(m/s), pole angle from upright (rad, positive = clockwise) and pole angular velocity (rad/s).
Like Gymnasium, the state is kept and integrated in float64 whatever the env ``dtype``; the
observation ``[N, 4]`` is the state cast to ``dtype`` (Gymnasium returns it cast to float32,
which is what ``dtype=torch.float32``, the default, gives).

Dynamics (one step, ``tau = 0.02`` s, explicit Euler)
----------------------------------------------------
Action 1 pushes the cart right with ``force = +10`` N, any other action pushes it left with
``-10`` N (Gymnasium asserts ``action in {0, 1}``; no range check is done here since it would
need a sync). With gravity ``g = 9.8`` m/s², cart mass 1.0 kg, pole mass ``m_p = 0.1`` kg,
half-pole length ``l = 0.5`` m, total mass ``M = 1.1`` kg::

    temp      = (force + m_p*l * theta_dot**2 * sin(theta)) / M
    theta_acc = (g*sin(theta) - cos(theta)*temp) / (l * (4/3 - m_p*cos(theta)**2 / M))
    x_acc     = temp - m_p*l * theta_acc * cos(theta) / M
    x += tau*x_dot;  x_dot += tau*x_acc;  theta += tau*theta_dot;  theta_dot += tau*theta_acc

(the same operations in the same order as Gymnasium, so float64 results agree to rounding).
The step, its termination, time limit and auto-reset are one op, :mod:`foxdqn.ops.cartpole_step`:
one Triton kernel on CUDA, its plain-torch reference on CPU.

Episodes
--------
* reward: ``+1`` on every step, including the terminating one (Gymnasium's default reward);
* ``terminated``: after the step ``|x| > 2.4`` m or ``|theta| > 12 * 2*pi/360`` rad (12°);
* ``truncated``: the step was the episode's ``max_episode_steps``-th (500) and the episode did
  not terminate on it. Gymnasium's ``TimeLimit`` reports ``truncated=True`` on that step even
  when it also terminates; here, as in :class:`foxdqn.envs.TradingEnv`, termination takes
  precedence and the two flags are never both true (so ``terminated`` alone decides the
  bootstrap mask);
* reset: each of the 4 state variables uniform in ``[-0.05, 0.05]`` (Gymnasium:
  ``np_random.uniform(-0.05, 0.05, size=4)``), drawn from the env's generator.

Envs that end are reset inside the same :meth:`CartPoleEnv.step` (auto-reset, branch-free with
``torch.where``): ``StepOut.next_obs`` is the observation before the reset (store it in
replay), ``StepOut.obs`` the one after (act on it).

Graph capture
-------------
:meth:`CartPoleEnv.reset_all`, :meth:`CartPoleEnv.observe`, :meth:`CartPoleEnv.step` and
:meth:`CartPoleEnv.set_state` only launch fixed-shape tensor ops on the env device, never read
a device value on the host and update the state tensors in place. Their only randomness is the
``generator`` given to the constructor: one ``rand`` of ``[N, 4]`` float64 per
:meth:`~CartPoleEnv.reset_all` and per :meth:`~CartPoleEnv.step` (drawn for every env, whether
or not it resets, so the generator advances by the same amount on every step). To capture
them in a ``torch.cuda.CUDAGraph`` register the generator first:
``graph.register_generator_state(env.generator)``.
"""
from __future__ import annotations

import torch
from torch import Tensor

from foxdqn.ops.cartpole_step import cartpole_step, start_states

from foxdqn.envs.base import DRAW, NO_HOOK, StepOut
from foxdqn.envs.checks import check_generator, float_dtype, positive_int

__all__ = ["CartPoleEnv"]

# Gymnasium CartPole-v1 constants live with the step op (foxdqn.ops.cartpole_step).
MAX_EPISODE_STEPS = 500  # CartPole-v1 TimeLimit

_STATE_DTYPE = torch.float64  # Gymnasium integrates in float64


class CartPoleEnv:
    """``N`` vectorised ``CartPole-v1`` systems (see the module docstring).

    Args:
        num_envs: ``N >= 1``.
        device: where the state tensors live.
        generator: ``torch.Generator`` on ``device``; the only source of randomness (resets).
        dtype: floating dtype of observations and rewards (the state is float64 regardless).
        max_episode_steps: time limit ``>= 1`` (``CartPole-v1``: 500).

    Raises:
        ValueError: invalid ``num_envs``, ``dtype``, ``generator`` or ``max_episode_steps`` (names
            the parameter).

    Attributes:
        num_envs: ``N``.  obs_dim: 4.  obs_shape: ``(4,)``.  obs_dtype: float32 (what the agent
        stores).  num_actions: 2 (0 = push left, 1 = push right).  on_host: False.
        collect_hook: :data:`~foxdqn.envs.base.NO_HOOK`.
        device, dtype, generator, max_episode_steps: as given.
        state: ``[N, 4]`` float64 ``(x [m], x_dot [m/s], theta [rad], theta_dot [rad/s])``.
        steps: ``[N]`` int64, steps taken in the current episode.
    """

    obs_dim = 4
    obs_shape = (4,)
    obs_dtype = torch.float32
    num_actions = 2
    on_host = False
    collect_hook = NO_HOOK

    def __init__(
        self,
        num_envs: int,
        device: torch.device | str,
        generator: torch.Generator,
        dtype: torch.dtype = torch.float32,
        max_episode_steps: int = MAX_EPISODE_STEPS,
    ) -> None:
        num_envs = positive_int(num_envs, "num_envs")
        max_episode_steps = positive_int(max_episode_steps, "max_episode_steps")
        dtype = float_dtype(dtype)
        device = torch.device(device)
        check_generator(generator, device)
        self.num_envs = num_envs
        self.device = device
        self.dtype = dtype
        self.generator = generator
        self.max_episode_steps = max_episode_steps
        self.state = torch.zeros(num_envs, 4, device=device, dtype=_STATE_DTYPE)
        self.steps = torch.zeros(num_envs, device=device, dtype=torch.long)
        # state stays all-zero (upright, at rest, no randomness drawn) until reset_all()

    # ------------------------------------------------------------------ device-side API

    def reset_all(self) -> Tensor:
        """Start a fresh episode in every env (state uniform in ``[-0.05, 0.05]^4``). Sync-free.

        Returns:
            ``[N, 4]`` observation (dtype).
        """
        self.state.copy_(self._draw_starts())
        self.steps.zero_()
        return self.observe()

    def observe(self) -> Tensor:
        """Observation of the current state, ``[N, 4]`` dtype (no side effects, sync-free)."""
        return self.state.to(dtype=self.dtype, copy=True)

    def set_state(self, state: Tensor, elapsed_steps: Tensor | None = None) -> Tensor:
        """Overwrite the state of every env (for tests and custom starts). Sync-free.

        Args:
            state: ``[N, 4]`` float ``(x [m], x_dot [m/s], theta [rad], theta_dot [rad/s])``;
                copied (converted to float64).
            elapsed_steps: optional ``[N]`` integer steps already taken in the episode (the
                time limit counts from it); default 0, a fresh episode.

        Returns:
            ``[N, 4]`` observation (dtype) of the new state.

        Raises:
            ValueError: ``state`` / ``elapsed_steps`` of the wrong shape.
        """
        if tuple(state.shape) != (self.num_envs, 4):
            raise ValueError(f"state: must have shape ({self.num_envs}, 4), got {tuple(state.shape)}")
        self.state.copy_(state)
        _set_elapsed_steps(self.steps, elapsed_steps, self.num_envs)
        return self.observe()

    def draw_step(self) -> Tensor:
        """The random draws of the next :meth:`step`, made now: the ``[N, 4]`` uniforms of the
        reset start states (one ``rand`` from the env's generator). Pass them to ``step(action,
        draws)``; the collect step draws them on a second stream beside the action selection
        (:func:`foxdqn.device.side_stream.beside`)."""
        return self._uniform()

    def step(self, action: Tensor, draws: Tensor | object = DRAW) -> StepOut:
        """Apply ``action`` (``[N]`` int64; 1 = push right, anything else = push left) to every env;
        ``draws``: what :meth:`draw_step` returned for this step (left out, :data:`~foxdqn.envs.base.DRAW`:
        the step draws them).

        Returns:
            :class:`~foxdqn.envs.StepOut`: ``next_obs`` / ``obs`` ``[N, 4]`` dtype (before / after
            auto-reset), ``reward`` ``[N]`` dtype (1 on every step), ``terminated`` /
            ``truncated`` ``[N]`` bool, ``info`` with ``[N]`` tensors ``episode_return`` (dtype,
            the finished episode's undiscounted return = its length, else 0), ``episode_done``
            (bool) and ``episode_length`` (int64, else 0).
        """
        uniform = self._uniform() if draws is DRAW else draws
        out = cartpole_step(self.state, self.steps, action, uniform, self.max_episode_steps, self.dtype)
        info = {
            "episode_return": out.episode_return,
            "episode_done": out.done,
            "episode_length": out.episode_length,
        }
        return StepOut(
            next_obs=out.next_obs, reward=out.reward, terminated=out.terminated, truncated=out.truncated,
            obs=out.obs, info=info,
        )

    def close(self) -> None:
        """Nothing to release (the env holds only tensors)."""

    # ------------------------------------------------------------------ internals

    def _uniform(self) -> Tensor:
        return torch.rand(self.num_envs, 4, device=self.device, dtype=_STATE_DTYPE, generator=self.generator)

    def _draw_starts(self) -> Tensor:
        return start_states(self._uniform())


def _set_elapsed_steps(steps: Tensor, elapsed_steps: Tensor | None, num_envs: int) -> None:
    """``steps.copy_(elapsed_steps)``, or ``steps.zero_()`` when ``elapsed_steps`` is None. Sync-free.

    Raises:
        ValueError: ``elapsed_steps`` is not of shape ``[num_envs]``.
    """
    if elapsed_steps is None:
        steps.zero_()
    else:
        if tuple(elapsed_steps.shape) != (num_envs,):
            raise ValueError(f"elapsed_steps: must have shape ({num_envs},), got {tuple(elapsed_steps.shape)}")
        steps.copy_(elapsed_steps)

