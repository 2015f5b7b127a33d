"""One step of N CartPole-v1 systems with auto-reset, fused into one kernel.

Source: Gymnasium ``CartPole-v1`` (``gymnasium/envs/classic_control/cartpole.py``, Euler
integrator, default reward, ``TimeLimit(500)``), as documented in :mod:`foxdqn.envs.cartpole`,
whose :class:`~foxdqn.envs.cartpole.CartPoleEnv` calls this op. The reference
(:func:`cartpole_step_reference`) is that module's torch step: about 60 small tensor ops (each a
kernel launch on CUDA; their time: docs/bench.md#launch-constants); the Triton kernel does the same
in one launch, one program per ``BLOCK`` envs.

Per env ``i`` (float64 state ``(x, x_dot, theta, theta_dot)``, ``tau = 0.02`` s)::

    force     = +10 if action == 1 else -10
    temp      = (force + m_p*l*theta_dot**2*sin(theta)) / M
    theta_acc = (g*sin(theta) - cos(theta)*temp) / (l*(4/3 - m_p*cos(theta)**2 / M))
    x_acc     = temp - m_p*l*theta_acc*cos(theta) / M
    x' = x + tau*x_dot;  x_dot' = x_dot + tau*x_acc;  theta' = theta + tau*theta_dot;  theta_dot' = theta_dot + tau*theta_acc
    terminated = |x'| > 2.4 or |theta'| > 12°;   steps' = steps + 1
    truncated  = steps' >= max_episode_steps and not terminated;   done = terminated or truncated
    state ← starts if done else state';   steps ← 0 if done else steps'

with ``starts = -0.05 + 0.1 * u`` from the caller's uniform draw ``u`` (the reset distribution).
The kernel evaluates the same expressions in the same order; the GPU compiler may contract
a multiply and an add into one FMA, so kernel and reference agree to float64 rounding (about
1e-15 relative), not bit for bit.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from foxdqn.ops.backend import resolve_backend
from foxdqn.ops.library import compile_disabled, device_op, wrap_triton

# Gymnasium CartPole-v1 constants (gymnasium/envs/classic_control/cartpole.py).
GRAVITY = 9.8  # m/s^2
MASSCART = 1.0  # kg
MASSPOLE = 0.1  # kg
TOTAL_MASS = MASSPOLE + MASSCART  # kg
LENGTH = 0.5  # m, half the pole's length
POLEMASS_LENGTH = MASSPOLE * LENGTH  # kg m
FORCE_MAG = 10.0  # N
TAU = 0.02  # s between state updates
THETA_THRESHOLD_RADIANS = 12 * 2 * math.pi / 360  # 12 degrees
X_THRESHOLD = 2.4  # m
RESET_LOW, RESET_HIGH = -0.05, 0.05  # uniform reset bounds of every state variable

BLOCK = 128


class CartPoleStep(NamedTuple):
    """Outputs of one step (fresh tensors; ``state`` and ``steps`` are updated in place).

    next_obs, obs: ``[N, 4]`` obs dtype, the state after the step before / after auto-reset.
    reward: ``[N]`` obs dtype, 1.  terminated, truncated, done: ``[N]`` bool.
    episode_return: ``[N]`` obs dtype, the finished episode's length where done, else 0.
    episode_length: ``[N]`` int64, likewise.
    """

    next_obs: torch.Tensor
    obs: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    done: torch.Tensor
    episode_return: torch.Tensor
    episode_length: torch.Tensor


# ---------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def _cartpole_step_kernel(
    state_ptr, steps_ptr, action_ptr, u_ptr,
    next_obs_ptr, obs_ptr, reward_ptr, term_ptr, trunc_ptr, done_ptr, ret_ptr, len_ptr,
    N, max_steps,
    GRAVITY: tl.constexpr, MASSPOLE: tl.constexpr, TOTAL_MASS: tl.constexpr, LENGTH: tl.constexpr,
    POLEMASS_LENGTH: tl.constexpr, FORCE_MAG: tl.constexpr, TAU: tl.constexpr,
    THETA_T: tl.constexpr, X_T: tl.constexpr, LOW: tl.constexpr, HIGH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # Python-float constexprs would be rounded to float32 inside expressions: make float64 scalars
    f64 = tl.float64
    g, mp, mt, ln = tl.full([], GRAVITY, f64), tl.full([], MASSPOLE, f64), tl.full([], TOTAL_MASS, f64), tl.full(
        [], LENGTH, f64)
    mpl, fm, tau = tl.full([], POLEMASS_LENGTH, f64), tl.full([], FORCE_MAG, f64), tl.full([], TAU, f64)
    th_t, x_t = tl.full([], THETA_T, f64), tl.full([], X_T, f64)
    four_thirds = tl.full([], 4.0, f64) / tl.full([], 3.0, f64)
    low, span = tl.full([], LOW, f64), tl.full([], HIGH, f64) - tl.full([], LOW, f64)

    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    row = i.to(tl.int64) * 4
    x = tl.load(state_ptr + row + 0, mask=m, other=0.0)
    x_dot = tl.load(state_ptr + row + 1, mask=m, other=0.0)
    theta = tl.load(state_ptr + row + 2, mask=m, other=0.0)
    theta_dot = tl.load(state_ptr + row + 3, mask=m, other=0.0)
    action = tl.load(action_ptr + i, mask=m, other=0)
    force = tl.where(action == 1, fm, -fm)
    costheta = tl.cos(theta)
    sintheta = tl.sin(theta)
    temp = (force + mpl * (theta_dot * theta_dot) * sintheta) / mt
    thetaacc = (g * sintheta - costheta * temp) / (ln * (four_thirds - mp * (costheta * costheta) / mt))
    xacc = temp - mpl * thetaacc * costheta / mt
    x1 = x + tau * x_dot
    x_dot1 = x_dot + tau * xacc
    theta1 = theta + tau * theta_dot
    theta_dot1 = theta_dot + tau * thetaacc

    terminated = (x1 < -x_t) | (x1 > x_t) | (theta1 < -th_t) | (theta1 > th_t)
    steps1 = tl.load(steps_ptr + i, mask=m, other=0) + 1
    truncated = (steps1 >= max_steps) & (terminated == 0)
    done = terminated | truncated

    obs_t = next_obs_ptr.dtype.element_ty
    tl.store(next_obs_ptr + row + 0, x1.to(obs_t), mask=m)
    tl.store(next_obs_ptr + row + 1, x_dot1.to(obs_t), mask=m)
    tl.store(next_obs_ptr + row + 2, theta1.to(obs_t), mask=m)
    tl.store(next_obs_ptr + row + 3, theta_dot1.to(obs_t), mask=m)

    s0 = tl.where(done, low + span * tl.load(u_ptr + row + 0, mask=m, other=0.0), x1)
    s1 = tl.where(done, low + span * tl.load(u_ptr + row + 1, mask=m, other=0.0), x_dot1)
    s2 = tl.where(done, low + span * tl.load(u_ptr + row + 2, mask=m, other=0.0), theta1)
    s3 = tl.where(done, low + span * tl.load(u_ptr + row + 3, mask=m, other=0.0), theta_dot1)
    tl.store(state_ptr + row + 0, s0, mask=m)
    tl.store(state_ptr + row + 1, s1, mask=m)
    tl.store(state_ptr + row + 2, s2, mask=m)
    tl.store(state_ptr + row + 3, s3, mask=m)
    tl.store(obs_ptr + row + 0, s0.to(obs_t), mask=m)
    tl.store(obs_ptr + row + 1, s1.to(obs_t), mask=m)
    tl.store(obs_ptr + row + 2, s2.to(obs_t), mask=m)
    tl.store(obs_ptr + row + 3, s3.to(obs_t), mask=m)
    tl.store(steps_ptr + i, tl.where(done, 0, steps1), mask=m)

    tl.store(reward_ptr + i, tl.full([BLOCK], 1.0, tl.float64).to(obs_t), mask=m)
    tl.store(term_ptr + i, terminated.to(tl.int8), mask=m)
    tl.store(trunc_ptr + i, truncated.to(tl.int8), mask=m)
    tl.store(done_ptr + i, done.to(tl.int8), mask=m)
    tl.store(ret_ptr + i, tl.where(done, steps1, 0).to(obs_t), mask=m)
    tl.store(len_ptr + i, tl.where(done, steps1, 0), mask=m)


# ---------------------------------------------------------------------------------------------
# Launcher (a device_op: registered with torch.library by register_ops(), foxdqn/ops/library.py)
# ---------------------------------------------------------------------------------------------
@device_op("foxdqn::cartpole_step", mutates_args={"state", "steps", "next_obs", "obs", "reward",
                                                                "flags", "episode_return", "episode_length"})
def _cartpole_step_op(state: torch.Tensor, steps: torch.Tensor, action: torch.Tensor, u: torch.Tensor,
                      next_obs: torch.Tensor, obs: torch.Tensor, reward: torch.Tensor, flags: torch.Tensor,
                      episode_return: torch.Tensor, episode_length: torch.Tensor, max_steps: int) -> None:
    n = state.shape[0]
    wrap_triton(_cartpole_step_kernel)[(triton.cdiv(n, BLOCK),)](
        state, steps, action, u, next_obs, obs, reward, flags[0], flags[1], flags[2], episode_return, episode_length,
        n, max_steps,
        GRAVITY=GRAVITY, MASSPOLE=MASSPOLE, TOTAL_MASS=TOTAL_MASS, LENGTH=LENGTH, POLEMASS_LENGTH=POLEMASS_LENGTH,
        FORCE_MAG=FORCE_MAG, TAU=TAU, THETA_T=THETA_THRESHOLD_RADIANS, X_T=X_THRESHOLD, LOW=RESET_LOW,
        HIGH=RESET_HIGH, BLOCK=BLOCK, num_warps=4,
    )


def _cartpole_step_triton(state, steps, action, u, max_episode_steps, obs_dtype) -> CartPoleStep:
    n, dev = state.shape[0], state.device
    next_obs = torch.empty(n, 4, device=dev, dtype=obs_dtype)
    obs = torch.empty(n, 4, device=dev, dtype=obs_dtype)
    reward = torch.empty(n, device=dev, dtype=obs_dtype)
    flags = torch.empty(3, n, device=dev, dtype=torch.uint8)  # terminated, truncated, done
    episode_return = torch.empty(n, device=dev, dtype=obs_dtype)
    episode_length = torch.empty(n, device=dev, dtype=torch.int64)
    _cartpole_step_op(state, steps, action, u, next_obs, obs, reward, flags, episode_return, episode_length,
                      int(max_episode_steps))
    term, trunc, done = flags.view(torch.bool).unbind(0)
    return CartPoleStep(next_obs, obs, reward, term, trunc, done, episode_return, episode_length)


# ---------------------------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------------------------
def start_states(u: torch.Tensor) -> torch.Tensor:
    """Reset states from uniform draws: ``u`` float64 ``[N, 4]`` in [0, 1) → uniform in [-0.05, 0.05)
    (Gymnasium's ``np_random.uniform(-0.05, 0.05, size=4)``), float64 ``[N, 4]``."""
    return RESET_LOW + (RESET_HIGH - RESET_LOW) * u


def cartpole_step_reference(state: torch.Tensor, steps: torch.Tensor, action: torch.Tensor, u: torch.Tensor,
                            max_episode_steps: int, obs_dtype: torch.dtype) -> CartPoleStep:
    """Plain-torch reference of :func:`cartpole_step` (same arguments, same in-place writes)."""
    x, x_dot, theta, theta_dot = state.unbind(1)
    force = torch.where(action == 1, FORCE_MAG, -FORCE_MAG).to(state.dtype)
    costheta = torch.cos(theta)
    sintheta = torch.sin(theta)
    temp = (force + POLEMASS_LENGTH * theta_dot.square() * sintheta) / TOTAL_MASS
    thetaacc = (GRAVITY * sintheta - costheta * temp) / (
        LENGTH * (4.0 / 3.0 - MASSPOLE * costheta.square() / TOTAL_MASS)
    )
    xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS
    state1 = torch.stack([x + TAU * x_dot, x_dot + TAU * xacc, theta + TAU * theta_dot, theta_dot + TAU * thetaacc],
                         dim=1)
    x1, theta1 = state1[:, 0], state1[:, 2]
    terminated = (x1 < -X_THRESHOLD) | (x1 > X_THRESHOLD) | (theta1 < -THETA_THRESHOLD_RADIANS) | (
        theta1 > THETA_THRESHOLD_RADIANS)
    steps1 = steps + 1
    truncated = (steps1 >= max_episode_steps) & ~terminated
    done = terminated | truncated
    starts = start_states(u)
    state.copy_(torch.where(done.unsqueeze(1), starts, state1))
    steps.copy_(steps1.masked_fill(done, 0))
    zero = torch.zeros((), device=state.device, dtype=obs_dtype)
    return CartPoleStep(
        next_obs=state1.to(obs_dtype), obs=state.to(obs_dtype, copy=True),
        reward=torch.ones(state.shape[0], device=state.device, dtype=obs_dtype),
        terminated=terminated, truncated=truncated, done=done,
        episode_return=torch.where(done, steps1.to(obs_dtype), zero),
        episode_length=torch.where(done, steps1, torch.zeros_like(steps1)),
    )


# ---------------------------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------------------------
@compile_disabled
def cartpole_step(state: torch.Tensor, steps: torch.Tensor, action: torch.Tensor, u: torch.Tensor,
                  max_episode_steps: int, obs_dtype: torch.dtype = torch.float32,
                  backend: str = "auto") -> CartPoleStep:
    """Step N CartPole-v1 systems once and auto-reset the ones that end (rules in the module docstring).

    Device ops only (no host reads): capturable in a CUDA graph.

    Args:
        state: float64 ``[N, 4]`` contiguous ``(x [m], x_dot [m/s], theta [rad], theta_dot [rad/s])``;
            updated in place to the post-reset state.
        steps: int64 ``[N]`` contiguous, steps taken in the current episode; updated in place.
        action: int64 ``[N]``; 1 pushes right, anything else pushes left.
        u: float64 ``[N, 4]`` contiguous, uniform [0, 1) draws; env ``i`` resets to
            ``-0.05 + 0.1 * u[i]`` if its episode ends.
        max_episode_steps: the time limit (>= 1; CartPole-v1: 500).
        obs_dtype: floating dtype of the observations, reward and episode return.
        backend: "auto" (Triton for CUDA tensors, torch for CPU), "triton", "torch".

    Returns:
        :class:`CartPoleStep`.

    Raises:
        ValueError: wrong dtype, shape or device of an argument, or an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check_args(state, steps, action, u, max_episode_steps, obs_dtype)
    if resolve_backend("cartpole_step", backend, state) == "torch":
        return cartpole_step_reference(state, steps, action, u, max_episode_steps, obs_dtype)
    return _cartpole_step_triton(state, steps, action, u, max_episode_steps, obs_dtype)


def _check_args(state, steps, action, u, max_episode_steps, obs_dtype) -> None:
    n = state.shape[0] if isinstance(state, torch.Tensor) and state.dim() == 2 else None
    if n is None or state.shape[1] != 4 or state.dtype != torch.float64 or not state.is_contiguous():
        raise ValueError(f"state must be a contiguous float64 tensor [N, 4], got "
                         f"{getattr(state, 'dtype', type(state))} {tuple(getattr(state, 'shape', ()))}")
    for name, t, dtype, shape in (("steps", steps, torch.int64, (n,)), ("action", action, torch.int64, (n,)),
                                  ("u", u, torch.float64, (n, 4))):
        if not isinstance(t, torch.Tensor) or t.dtype != dtype or tuple(t.shape) != shape or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous {dtype} tensor {list(shape)}, got "
                             f"{getattr(t, 'dtype', type(t))} {tuple(getattr(t, 'shape', ()))}")
        if t.device != state.device:
            raise ValueError(f"{name} is on {t.device}, state on {state.device}")
    if isinstance(max_episode_steps, bool) or not isinstance(max_episode_steps, int) or max_episode_steps < 1:
        raise ValueError(f"max_episode_steps must be an int >= 1, got {max_episode_steps!r}")
    if not isinstance(obs_dtype, torch.dtype) or not obs_dtype.is_floating_point:
        raise ValueError(f"obs_dtype must be a floating torch dtype, got {obs_dtype!r}")
