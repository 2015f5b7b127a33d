r"""One step of N bit-flipping envs with auto-reset and counter-based reset draws, in one kernel.

The environment is the bit flipping of Andrychowicz et al. (2017), "Hindsight Experience Replay"
(§3.1, §4.1), as :mod:`foxdqn.envs.bitflip` documents it; a population's env
(:class:`foxdqn.population.envs.MemberBitFlipEnv`) calls this op with its members' uniforms. The
reference (:func:`bitflip_step_reference`) is that env's torch step and start draw (about 36 small
tensor ops, each a kernel launch on CUDA); the Triton kernel does the same in one launch, one
program per ``BLOCK`` envs, a ``[BLOCK, next_pow2(n)]`` tile of bits each.

Per env ``i`` (``n`` bits; state ``s``, goal ``g``; ``steps`` taken in the episode)::

    s'         = s XOR onehot(action)            (an action outside 0..n-1 flips no bit)
    terminated = (s' == g)                       (all n bits)
    steps'     = steps + 1
    truncated  = steps' >= n and not terminated  (episode length n, as in the paper)
    done       = terminated or truncated
    reward     = 0 if terminated else -1;   episode_return = reward - (steps' - 1) where done, else 0
    next_obs   = [s', g];   s, g, steps ← start, goal, 0 where done, else s', g, steps'
    obs        = [s, g] after that

The reset draw of env ``i`` is its row ``u[i]`` of ``(1 + K)·n`` uniforms in [0, 1), each a fair
bit (``u < 0.5``): the first ``n`` the start state, then ``K`` candidate masks of ``n`` bits; the
goal is ``start XOR`` the first non-zero candidate (uniform over the ``2^n − 1`` non-zero masks),
or ``start XOR`` bit 0 where all ``K`` are zero (:func:`start_and_goal`; the population draws
``K = ceil(64 / n)``, so that case has probability at most 2^-64). Every env draws, whether or
not it resets. Everything is integer or a small integer in the obs dtype (exact in float16 and
up while ``n`` ≤ 2048), so kernel and reference agree bit for bit.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.library import compile_disabled, device_op, wrap_triton

BLOCK = 32  # envs per program


class BitFlipStep(NamedTuple):
    """Outputs of one step (fresh tensors; ``state``, ``goal`` and ``steps`` are updated in place).

    next_obs, obs: ``[N, 2n]`` obs dtype, ``[state, goal]`` (0.0 / 1.0) before / after the auto-reset.
    reward: ``[N]`` obs dtype, 0 where the goal was reached, else −1.
    terminated, truncated, done: ``[N]`` bool.
    episode_return: ``[N]`` obs dtype, the finished episode's undiscounted return where done, else 0.
    episode_length: ``[N]`` int64, its length where done, else 0.
    is_success: ``[N]`` obs dtype, 1.0 where the goal was reached (``terminated``), else 0.
    """

    next_obs: Tensor
    obs: Tensor
    reward: Tensor
    terminated: Tensor
    truncated: Tensor
    done: Tensor
    episode_return: Tensor
    episode_length: Tensor
    is_success: Tensor


# ---------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def _bitflip_step_kernel(
    state_ptr, goal_ptr, steps_ptr, action_ptr, u_ptr,
    next_obs_ptr, obs_ptr, reward_ptr, term_ptr, trunc_ptr, done_ptr, ret_ptr, len_ptr, success_ptr,
    N, n, K,
    BLOCK: tl.constexpr, BITS: tl.constexpr,
):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    j = tl.arange(0, BITS)
    mrow = i < N
    m2 = mrow[:, None] & (j < n)[None, :]
    row = i.to(tl.int64)
    bit = row[:, None] * n + j[None, :]  # [BLOCK, BITS] offsets into [N, n]
    s = tl.load(state_ptr + bit, mask=m2, other=0).to(tl.int32)
    g = tl.load(goal_ptr + bit, mask=m2, other=0).to(tl.int32)
    s = tl.where(s != 0, 1, 0)
    g = tl.where(g != 0, 1, 0)
    action = tl.load(action_ptr + i, mask=mrow, other=-1)
    s1 = s ^ tl.where(j[None, :].to(tl.int64) == action[:, None], 1, 0)
    differ = tl.max(tl.where(m2 & (s1 != g), 1, 0), axis=1)  # 0: every bit equals the goal's
    terminated = differ == 0
    steps1 = tl.load(steps_ptr + i, mask=mrow, other=0) + 1
    truncated = (steps1 >= n) & (differ != 0)
    done = terminated | truncated

    # the reset draw: start bits, then the first non-zero of K candidate masks (bit 0 where none is)
    urow = row * ((K + 1) * n)
    start = tl.where(tl.load(u_ptr + urow[:, None] + j[None, :], mask=m2, other=1.0) < 0.5, 1, 0)
    mask = tl.zeros([BLOCK, BITS], dtype=tl.int32)
    found = tl.zeros([BLOCK], dtype=tl.int32)
    for k in range(0, K):
        c = tl.load(u_ptr + urow[:, None] + (k + 1) * n + j[None, :], mask=m2, other=1.0)
        c = tl.where(c < 0.5, 1, 0)
        nonzero = tl.max(c, axis=1)
        mask = tl.where(((found == 0) & (nonzero != 0))[:, None], c, mask)
        found = found | nonzero
    mask = tl.where((found == 0)[:, None] & (j == 0)[None, :], 1, mask)
    goal0 = start ^ mask

    reset = done[:, None]
    s2 = tl.where(reset, start, s1)
    g2 = tl.where(reset, goal0, g)
    tl.store(state_ptr + bit, s2.to(tl.uint8), mask=m2)
    tl.store(goal_ptr + bit, g2.to(tl.uint8), mask=m2)
    tl.store(steps_ptr + i, tl.where(done, 0, steps1), mask=mrow)

    obs_t = next_obs_ptr.dtype.element_ty
    o = row[:, None] * (2 * n) + j[None, :]
    tl.store(next_obs_ptr + o, s1.to(obs_t), mask=m2)
    tl.store(next_obs_ptr + o + n, g.to(obs_t), mask=m2)
    tl.store(obs_ptr + o, s2.to(obs_t), mask=m2)
    tl.store(obs_ptr + o + n, g2.to(obs_t), mask=m2)
    reward = tl.where(terminated, 0, -1)
    tl.store(reward_ptr + i, reward.to(obs_t), mask=mrow)
    tl.store(ret_ptr + i, tl.where(done, reward - (steps1 - 1), 0).to(obs_t), mask=mrow)
    tl.store(len_ptr + i, tl.where(done, steps1, 0), mask=mrow)
    tl.store(success_ptr + i, tl.where(terminated, 1, 0).to(obs_t), mask=mrow)
    tl.store(term_ptr + i, terminated.to(tl.uint8), mask=mrow)
    tl.store(trunc_ptr + i, truncated.to(tl.uint8), mask=mrow)
    tl.store(done_ptr + i, done.to(tl.uint8), mask=mrow)


# ---------------------------------------------------------------------------------------------
# Launcher (a device_op: registered with torch.library by register_ops(), foxdqn/ops/library.py)
# ---------------------------------------------------------------------------------------------
@device_op("foxdqn::bitflip_step", mutates_args={"state", "goal", "steps", "next_obs", "obs", "reward", "flags",
                                                 "episode_return", "episode_length", "is_success"})
def _bitflip_step_op(state: Tensor, goal: Tensor, steps: Tensor, action: Tensor, u: Tensor, next_obs: Tensor,
                     obs: Tensor, reward: Tensor, flags: Tensor, episode_return: Tensor, episode_length: Tensor,
                     is_success: Tensor) -> None:
    num, n = state.shape
    wrap_triton(_bitflip_step_kernel)[(triton.cdiv(num, BLOCK),)](
        state, goal, steps, action, u, next_obs, obs, reward, flags[0], flags[1], flags[2], episode_return,
        episode_length, is_success, num, n, u.shape[1] // n - 1,
        BLOCK=BLOCK, BITS=triton.next_power_of_2(n), num_warps=4,
    )


def _bitflip_step_triton(state, goal, steps, action, u, obs_dtype) -> BitFlipStep:
    num, n = state.shape
    dev = state.device
    next_obs = torch.empty(num, 2 * n, device=dev, dtype=obs_dtype)
    obs = torch.empty(num, 2 * n, device=dev, dtype=obs_dtype)
    floats = torch.empty(3, num, device=dev, dtype=obs_dtype)  # reward, episode return, success
    flags = torch.empty(3, num, device=dev, dtype=torch.uint8)  # terminated, truncated, done
    episode_length = torch.empty(num, device=dev, dtype=torch.int64)
    reward, episode_return, is_success = floats.unbind(0)
    _bitflip_step_op(state.view(torch.uint8), goal.view(torch.uint8), steps, action, u, next_obs, obs, reward,
                     flags, episode_return, episode_length, is_success)
    term, trunc, done = flags.view(torch.bool).unbind(0)
    return BitFlipStep(next_obs, obs, reward, term, trunc, done, episode_return, episode_length, is_success)


# ---------------------------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------------------------
def start_and_goal(u: Tensor, n_bits: int) -> tuple[Tensor, Tensor]:
    """Start states and goals from uniform draws (module docstring): ``u`` float ``[N, (1 + K)·n]``
    in [0, 1), ``K`` ≥ 1 → ``(start, goal)``, each bool ``[N, n]``, ``goal != start``."""
    num, n = u.shape[0], n_bits
    bits = u.view(num, -1, n) < 0.5
    state, masks = bits[:, 0], bits[:, 1:]
    nonzero = masks.any(dim=2)  # [N, K]
    first = nonzero.to(torch.int32).argmax(dim=1)  # the first non-zero candidate (0 where none is)
    mask = masks.gather(1, first.view(-1, 1, 1).expand(-1, 1, n)).squeeze(1)
    bit0 = torch.arange(n, device=u.device) == 0
    mask = torch.where(nonzero.any(dim=1, keepdim=True), mask, bit0)
    return state, state ^ mask


def bitflip_step_reference(state: Tensor, goal: Tensor, steps: Tensor, action: Tensor, u: Tensor,
                           obs_dtype: torch.dtype = torch.float32) -> BitFlipStep:
    """Plain-torch reference of :func:`bitflip_step` (same arguments, same in-place writes)."""
    n = state.shape[1]
    flip = torch.arange(n, device=state.device) == action.unsqueeze(1)  # [N, n]
    state1 = state ^ flip
    terminated = (state1 == goal).all(dim=1)
    steps1 = steps + 1
    truncated = (steps1 >= n) & ~terminated
    done = terminated | truncated
    reward = terminated.to(obs_dtype) - 1.0
    episode_return = reward - (steps1 - 1).to(obs_dtype)  # −1 on each of the first steps1 − 1 steps
    zero = torch.zeros((), device=state.device, dtype=obs_dtype)
    next_obs = torch.cat([state1, goal], dim=1).to(obs_dtype)
    start, goal0 = start_and_goal(u, n)
    reset = done.unsqueeze(1)
    state.copy_(torch.where(reset, start, state1))
    goal.copy_(torch.where(reset, goal0, goal))
    steps.copy_(steps1.masked_fill(done, 0))
    return BitFlipStep(
        next_obs=next_obs, obs=torch.cat([state, goal], dim=1).to(obs_dtype), reward=reward,
        terminated=terminated, truncated=truncated, done=done,
        episode_return=torch.where(done, episode_return, zero),
        episode_length=torch.where(done, steps1, torch.zeros_like(steps1)),
        is_success=terminated.to(obs_dtype),
    )


# ---------------------------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------------------------
@compile_disabled
def bitflip_step(state: Tensor, goal: Tensor, steps: Tensor, action: Tensor, u: Tensor,
                 obs_dtype: torch.dtype = torch.float32, backend: str = "auto") -> BitFlipStep:
    """Step N bit-flipping envs of n bits once and auto-reset the ones that end, their new start
    states and goals from ``u`` (rules in the module docstring). Device ops only (no host reads):
    capturable in a CUDA graph.

    Args:
        state, goal: bool ``[N, n]`` contiguous, the current bits and the goal bits; updated in place.
        steps: int64 ``[N]`` contiguous, steps taken in the current episode (the time limit is n);
            updated in place.
        action: int64 ``[N]``, the bit to flip (outside ``0..n-1``: none).
        u: float32 or float64 ``[N, (1 + K)·n]`` contiguous, ``K`` ≥ 1, uniform [0, 1) draws: env
            ``i``'s start bits, then its ``K`` candidate goal masks.
        obs_dtype: floating dtype of the observations, reward, episode return and success.
        backend: "auto" (Triton for CUDA tensors, torch for CPU), "triton", "torch".

    Returns:
        :class:`BitFlipStep`.

    Raises:
        ValueError: wrong dtype, shape, layout or device of an argument, or an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check_args(state, goal, steps, action, u, obs_dtype)
    if resolve_backend("bitflip_step", backend, state) == "torch":
        return bitflip_step_reference(state, goal, steps, action, u, obs_dtype)
    return _bitflip_step_triton(state, goal, steps, action, u, obs_dtype)


def _check_args(state, goal, steps, action, u, obs_dtype) -> None:
    ok = (isinstance(state, Tensor) and state.dim() == 2 and state.dtype == torch.bool and state.is_contiguous()
          and state.shape[0] >= 1 and state.shape[1] >= 1)
    if not ok:
        raise ValueError(f"bitflip_step: state must be a contiguous bool tensor [N, n], got {describe(state)}")
    num, n = state.shape
    for name, t, dtypes, shape in (("goal", goal, (torch.bool,), (num, n)), ("steps", steps, (torch.int64,), (num,)),
                                   ("action", action, (torch.int64,), (num,)),
                                   ("u", u, (torch.float32, torch.float64), None)):
        if not isinstance(t, Tensor) or t.dtype not in dtypes or not t.is_contiguous() or (
                shape is not None and tuple(t.shape) != shape):
            want = f"{list(shape)}" if shape is not None else "[N, (1 + K)·n]"
            raise ValueError(f"bitflip_step: {name} must be a contiguous {'/'.join(map(str, dtypes))} tensor {want}, "
                             f"got {describe(t)}")
        if t.device != state.device:
            raise ValueError(f"bitflip_step: {name} is on {t.device}, state on {state.device}")
    if u.dim() != 2 or u.shape[0] != num or u.shape[1] % n or u.shape[1] < 2 * n:
        raise ValueError(f"bitflip_step: u must be [N, (1 + K)·n] = [{num}, k·{n}] with k >= 2, got {describe(u)}")
    if not isinstance(obs_dtype, torch.dtype) or not obs_dtype.is_floating_point:
        raise ValueError(f"bitflip_step: obs_dtype must be a floating torch dtype, got {obs_dtype!r}")
