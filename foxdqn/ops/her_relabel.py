"""Hindsight relabelling of a sampled batch in one kernel: the future step's lookup in the replay
ring, the goal swap, and the reward and discount against the new goal.

Source: Hindsight Experience Replay, "future" strategy (Andrychowicz et al. 2017, §3.3 and §4.5),
as :class:`foxdqn.replay.her.HindsightRelabeler` applies it (its module docstring). For batch row r with
flat ring row ``t·N + e`` (a ring of T time rows and N envs, ``ptr`` the next time row to write),
window L (the env's ``max_episode_steps``), uniforms u₀, u₁ and goals of G entries:

    age     = (ptr − 1 − t) mod T                                  (rows written after t)
    count   = Σ_{j<L} [episode[(t+j) mod T, e] = episode[t, e]] · [j ≤ age]      (≥ 1)
    future  = (t + min(⌊u₀ · count⌋, count − 1)) mod T             (product in float32)
    goal    = achieved(ring_next_obs[future, e]) if u₁ < p_relabel else desired(obs)
    obs', next_obs' = obs, next_obs with their goal replaced by goal
    success = is_success(achieved(next_obs), goal)
    reward  = compute_reward(achieved(next_obs), goal) · reward_scale_r
    discount = γ_r · (1 − success)

(the comparison u₁ < p_relabel in float32, p_relabel rounded to float32, as torch compares a
float32 tensor with a Python float).

The kernel is specific to the goal layout of the bit-flipping env (:class:`foxdqn.envs.bitflip.BitFlipEnv`,
which declares it with ``her_bit_goals = True``): observations of D float32 entries whose last
G = ``env.goal_dim`` entries are the desired goal and whose first G entries are the achieved goal
(``with_goal`` keeps the first D − G entries and replaces the last G), success when every bit
agrees (a bit is 1 when its value is > 0.5), reward ``success − 1`` (0 or −1). Any other
goal-conditioned env runs the torch path, :func:`her_relabel_reference`, which calls the env's own
``achieved_goal``, ``desired_goal``, ``with_goal``, ``compute_reward`` and ``is_success``.

Device ops only: ``ptr`` and the episode numbers are read by the kernel, shapes are fixed, so the
op runs inside a CUDA graph (docs/design/hot_loop.md#the-contract). One kernel launch per call.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.library import device_op, wrap_triton
from foxdqn.ops.replay_gather import _pair_views

__all__ = ["HerRelabel", "her_relabel", "her_relabel_reference"]

BLOCK_R = 16  # batch rows per program on the GPU (not swept: the op is one small launch)
MAX_BLOCK_D = 64  # goal / observation columns per tile on the GPU
NUM_WARPS = 4


class HerRelabel(NamedTuple):
    """What :func:`her_relabel` returns (on the batch's device).

    obs, next_obs: float ``[R, D]`` with the new goals (``stacked``: ``[P, B, D]`` views of
    ``pair``, ``[B, D]`` for P = 1); reward, discount: float32 ``[R]``; pair: ``[P, 2, B, D]``
    (``stacked``) or None.
    """

    obs: Tensor
    next_obs: Tensor
    reward: Tensor
    discount: Tensor
    pair: Tensor | None


# ----------------------------------------------------------------------------- kernel
@triton.jit
def _her_relabel_kernel(
    episode_ptr,  # i64 [T, N] contiguous
    ptr_ptr,  # i64 0-d
    ring_next_ptr,  # f32 [T, N, D] contiguous
    index_ptr,  # i64 [R]
    obs_ptr, next_ptr,  # f32, row (p, b) at p * sp + b * sb, unit column stride
    u_ptr,  # f32 [Pu, 2, Bu] contiguous
    gamma_ptr, scale_ptr,  # f32 [Gγ], [Gs] (GAMMA_ROWS, SCALE_ROWS)
    out_obs_ptr, out_next_ptr,  # row (p, b) at (p * out_group_rows + b) * D
    reward_ptr, discount_ptr,  # f32 [R]
    R, T, N, D, G, window, b_in, obs_sp, obs_sb, next_sp, next_sb, b_u, b_out, out_group_rows, gamma_per, scale_per,
    gamma_value, scale_value, p_relabel,
    GAMMA_ROWS: tl.constexpr, SCALE_ROWS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):
    zero = tl.zeros([], dtype=tl.int64)  # int arguments to int64 (an argument equal to 1 arrives as a constexpr)
    T, N, D, G, b_in, b_u, b_out = T + zero, N + zero, D + zero, G + zero, b_in + zero, b_u + zero, b_out + zero
    obs_sp, obs_sb, next_sp, next_sb = obs_sp + zero, obs_sb + zero, next_sp + zero, next_sb + zero
    out_group_rows, window = out_group_rows + zero, window + zero
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    ok = rows < R
    idx = tl.load(index_ptr + rows, mask=ok, other=0)
    t = idx // N
    e = idx % N
    ptr = tl.load(ptr_ptr)
    age = (ptr - 1 - t + T) % T  # ptr - 1 - t in [-T, T - 1): a non-negative remainder
    episode = tl.load(episode_ptr + t * N + e, mask=ok, other=0)
    count = tl.zeros([BLOCK_R], dtype=tl.int64)
    for j in range(0, window):
        ep_j = tl.load(episode_ptr + ((t + j) % T) * N + e, mask=ok, other=0)
        count += ((ep_j == episode) & (j <= age)).to(tl.int64)
    u0 = tl.load(u_ptr + (rows // b_u) * (2 * b_u) + rows % b_u, mask=ok, other=0.0)
    u1 = tl.load(u_ptr + (rows // b_u) * (2 * b_u) + b_u + rows % b_u, mask=ok, other=0.0)
    pick = tl.minimum((u0 * count.to(tl.float32)).to(tl.int64), count - 1)
    future = (t + pick) % T
    relabel = u1 < p_relabel
    # goals: the last G columns; the achieved goal: the first G
    obs_row = (rows // b_in) * obs_sp + (rows % b_in) * obs_sb
    next_row = (rows // b_in) * next_sp + (rows % b_in) * next_sb
    out_row = ((rows // b_out) * out_group_rows + rows % b_out) * D
    future_row = (future * N + e) * D
    mismatch = tl.zeros([BLOCK_R], dtype=tl.int32)
    for g0 in range(0, G, BLOCK_D):
        cols = g0 + tl.arange(0, BLOCK_D)
        mask = ok[:, None] & (cols < G)[None, :]
        achieved_future = tl.load(ring_next_ptr + future_row[:, None] + cols[None, :], mask=mask, other=0.0)
        desired = tl.load(obs_ptr + obs_row[:, None] + (D - G + cols)[None, :], mask=mask, other=0.0)
        goal = tl.where(relabel[:, None], achieved_future, desired)
        tl.store(out_obs_ptr + out_row[:, None] + (D - G + cols)[None, :], goal, mask=mask)
        tl.store(out_next_ptr + out_row[:, None] + (D - G + cols)[None, :], goal, mask=mask)
        achieved_next = tl.load(next_ptr + next_row[:, None] + cols[None, :], mask=mask, other=0.0)
        differ = ((achieved_next > 0.5) != (goal > 0.5)) & mask
        mismatch += tl.sum(differ.to(tl.int32), axis=1)
    for c0 in range(0, D - G, BLOCK_D):  # the rest of the observation, unchanged
        cols = c0 + tl.arange(0, BLOCK_D)
        mask = ok[:, None] & (cols < D - G)[None, :]
        o = tl.load(obs_ptr + obs_row[:, None] + cols[None, :], mask=mask)
        tl.store(out_obs_ptr + out_row[:, None] + cols[None, :], o, mask=mask)
        nx = tl.load(next_ptr + next_row[:, None] + cols[None, :], mask=mask)
        tl.store(out_next_ptr + out_row[:, None] + cols[None, :], nx, mask=mask)
    success = (mismatch == 0).to(tl.float32)
    if GAMMA_ROWS:
        gamma = tl.load(gamma_ptr + rows // gamma_per, mask=ok, other=0.0)
    else:
        gamma = gamma_value
    if SCALE_ROWS:
        scale = tl.load(scale_ptr + rows // scale_per, mask=ok, other=0.0)
    else:
        scale = scale_value
    tl.store(reward_ptr + rows, (success - 1.0) * scale, mask=ok)
    tl.store(discount_ptr + rows, gamma * (1.0 - success), mask=ok)


# ----------------------------------------------------------------------------- launcher
# (a device_op: registered with torch.library by register_ops(), foxdqn/ops/library.py)
@device_op("foxdqn::her_relabel", mutates_args={"out_obs", "out_next", "reward", "discount"})
def _her_relabel_op(episode: Tensor, ptr: Tensor, ring_next_obs: Tensor, index: Tensor, obs: Tensor,
                    next_obs: Tensor, u: Tensor, gamma: Tensor, reward_scale: Tensor, out_obs: Tensor,
                    out_next: Tensor, reward: Tensor, discount: Tensor, gamma_value: float, scale_value: float,
                    gamma_rows: bool, scale_rows: bool, window: int, p_relabel: float, goal_dim: int,
                    out_group_rows: int) -> None:
    rows = index.shape[0]
    t_rows, n_envs, d = ring_next_obs.shape
    interpret = not ring_next_obs.is_cuda
    block_r = min(triton.next_power_of_2(max(rows, 1)), 256) if interpret else BLOCK_R
    block_d = triton.next_power_of_2(max(goal_dim, d - goal_dim, 1))
    block_d = block_d if interpret else min(block_d, MAX_BLOCK_D)
    wrap_triton(_her_relabel_kernel)[(triton.cdiv(rows, block_r),)](
        episode, ptr, ring_next_obs, index, obs, next_obs, u, gamma, reward_scale, out_obs, out_next, reward,
        discount, rows, t_rows, n_envs, d, goal_dim, window, obs.shape[1], obs.stride(0), obs.stride(1),
        next_obs.stride(0), next_obs.stride(1), u.shape[2], out_obs.shape[1], out_group_rows,
        rows // gamma.shape[0], rows // reward_scale.shape[0], gamma_value, scale_value, p_relabel,
        GAMMA_ROWS=gamma_rows, SCALE_ROWS=scale_rows, BLOCK_R=block_r, BLOCK_D=block_d, num_warps=NUM_WARPS)


def _relabel_triton(env, episode, ptr, ring_next_obs, index, obs, next_obs, u, gamma, reward_scale, window,
                    p_relabel, stacked) -> HerRelabel:
    rows, d = index.shape[0], obs.shape[-1]
    members = obs.shape[0] if obs.dim() == 3 else 1
    b = rows // members
    dev, f32 = obs.device, dict(device=obs.device, dtype=torch.float32)
    reward, discount = torch.empty(rows, **f32), torch.empty(rows, **f32)
    if stacked:
        pair = torch.empty(members, 2, b, d, device=dev, dtype=obs.dtype)
        out_obs, out_next, group_rows = pair[:, 0], pair[:, 1], 2 * b
    else:
        pair = None
        out_obs, out_next = (torch.empty(1, rows, d, device=dev, dtype=obs.dtype) for _ in range(2))
        group_rows = rows
    if rows:
        obs3, next3 = (x[None] if x.dim() == 2 else x for x in (obs, next_obs))
        obs3, next3 = (x if x.stride(2) == 1 else x.contiguous() for x in (obs3, next3))
        u3 = (u[None] if u.dim() == 2 else u).contiguous()
        tensors = [v.to(torch.float32).contiguous() if isinstance(v, Tensor) else u3 for v in (gamma, reward_scale)]
        values = [0.0 if isinstance(v, Tensor) else float(v) for v in (gamma, reward_scale)]
        _her_relabel_op(episode, ptr, ring_next_obs, index.contiguous(), obs3, next3, u3, *tensors, out_obs,
                        out_next, reward, discount, *values, isinstance(gamma, Tensor),
                        isinstance(reward_scale, Tensor), window, p_relabel, int(env.goal_dim), group_rows)
    if stacked:
        o, nx = _pair_views(pair)
    else:
        o, nx = out_obs[0], out_next[0]
    return HerRelabel(o, nx, reward, discount, pair)


# ----------------------------------------------------------------------------- reference
def _per_row(value, rows: int):
    """A float as it is; a float32 ``[G]`` tensor as ``[rows]``, row r taking value r // (rows / G)
    (expanded on the device: no host read)."""
    if not isinstance(value, Tensor):
        return value
    return value.to(torch.float32)[:, None].expand(value.shape[0], rows // value.shape[0]).reshape(rows)


def _relabel_torch(env, episode, ptr, ring_next_obs, index, obs, next_obs, u, gamma, reward_scale, window,
                   p_relabel, stacked) -> HerRelabel:
    """The torch path of :func:`her_relabel` on checked arguments (its reference; the CPU backend; any
    goal-conditioned env through its own goal methods)."""
    rows, d = index.shape[0], obs.shape[-1]
    members = obs.shape[0] if obs.dim() == 3 else 1
    obs, next_obs = obs.reshape(rows, d), next_obs.reshape(rows, d)
    if u.dim() == 3:  # [P, 2, B] → [2, P·B]
        u = u.transpose(0, 1).reshape(2, rows)
    gamma, reward_scale = _per_row(gamma, rows), _per_row(reward_scale, rows)
    t_rows, n_envs = episode.shape
    t, e = index // n_envs, index % n_envs
    j = torch.arange(window, device=index.device)
    tj = (t[:, None] + j[None, :]) % t_rows  # (R, L)
    ej = e[:, None].expand_as(tj)
    age = (ptr - 1 - t) % t_rows  # ReplayBuffer.age
    same = (episode[tj, ej] == episode[t, e][:, None]) & (j[None, :] <= age[:, None])
    count = same.to(torch.int64).sum(dim=1)  # ≥ 1: j = 0 is always valid; valid j form a prefix
    pick = (u[0] * count.to(torch.float32)).to(torch.int64).clamp(max=count - 1)
    future = tj.gather(1, pick[:, None]).squeeze(1)
    achieved_future = env.achieved_goal(ring_next_obs[future, e])
    relabel = (u[1] < p_relabel)[:, None]
    goal = torch.where(relabel, achieved_future, env.desired_goal(obs))
    obs, next_obs_goal = env.with_goal(obs, goal), env.with_goal(next_obs, goal)
    achieved_next = env.achieved_goal(next_obs)
    reward = env.compute_reward(achieved_next, goal) * reward_scale
    terminal = env.is_success(achieved_next, goal).to(torch.float32)
    discount = gamma * (1.0 - terminal)
    if not stacked:
        return HerRelabel(obs, next_obs_goal, reward, discount, None)
    pair = torch.stack([obs.view(members, -1, d), next_obs_goal.view(members, -1, d)], dim=1)  # [P, 2, B, D]
    o, nx = _pair_views(pair)
    return HerRelabel(o, nx, reward, discount, pair)


def her_relabel_reference(env, episode, ptr, ring_next_obs, index, obs, next_obs, u, gamma, reward_scale,
                          window, p_relabel, *, stacked=False) -> HerRelabel:
    """Plain-torch :func:`her_relabel` (same arguments and results; the relabelling that
    :meth:`foxdqn.replay.her.HindsightRelabeler.relabel_with` ran before the kernel, with the env's own
    goal methods)."""
    _check(env, episode, ptr, ring_next_obs, index, obs, next_obs, u, gamma, reward_scale, window, p_relabel)
    return _relabel_torch(env, episode, ptr, ring_next_obs, index, obs, next_obs, u, gamma, reward_scale, window,
                          p_relabel, stacked)


# ----------------------------------------------------------------------------- checks
def _check(env, episode, ptr, ring_next_obs, index, obs, next_obs, u, gamma, reward_scale, window, p_relabel):
    op = "her_relabel"
    if not getattr(env, "goal_conditioned", False):
        raise ValueError(f"{op}: env must be goal-conditioned (goal_conditioned = True), got {type(env).__name__}")
    if episode.dim() != 2 or episode.dtype != torch.int64:
        raise ValueError(f"{op}: episode must be int64 [T, N], got {describe(episode)}")
    t_rows, n_envs = episode.shape
    if ptr.dim() != 0 or ptr.dtype != torch.int64:
        raise ValueError(f"{op}: ptr must be a 0-d int64 tensor, got {describe(ptr)}")
    if ring_next_obs.dim() != 3 or tuple(ring_next_obs.shape[:2]) != (t_rows, n_envs):
        raise ValueError(f"{op}: ring_next_obs must be [T={t_rows}, N={n_envs}, D], got {describe(ring_next_obs)}")
    d = ring_next_obs.shape[2]
    if index.dim() != 1 or index.dtype != torch.int64:
        raise ValueError(f"{op}: index must be int64 [R], got {describe(index)}")
    rows = index.shape[0]
    shapes = ((rows, d),) + (((obs.shape[0], rows // obs.shape[0], d),) if obs.dim() == 3 and obs.shape[0] else ())
    for name, x in (("obs", obs), ("next_obs", next_obs)):
        if tuple(x.shape) not in shapes or x.dtype != ring_next_obs.dtype:
            raise ValueError(f"{op}: {name} must be {ring_next_obs.dtype} [R={rows}, D={d}] or [P, B, D] with "
                             f"P·B = R, got {describe(x)}")
    if next_obs.shape != obs.shape:
        raise ValueError(f"{op}: next_obs must have obs's shape {list(obs.shape)}, got {describe(next_obs)}")
    if u.dtype != torch.float32 or not (u.dim() == 2 and tuple(u.shape) == (2, rows) or u.dim() == 3
                                        and u.shape[1] == 2 and u.shape[0] * u.shape[2] == rows and u.shape[0] > 0):
        raise ValueError(f"{op}: u must be float32 [2, R={rows}] or [P, 2, B] with P·B = R, got {describe(u)}")
    for name, v in (("gamma", gamma), ("reward_scale", reward_scale)):
        if isinstance(v, Tensor):
            if v.dim() != 1 or v.dtype != torch.float32 or v.shape[0] < 1 or rows % v.shape[0]:
                raise ValueError(f"{op}: {name} must be a float or float32 [G] with G dividing R={rows}, "
                                 f"got {describe(v)}")
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"{op}: {name} must be a float or float32 [G] with G dividing R={rows}, "
                             f"got {describe(v)}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"{op}: window must be an int >= 1, got {window!r}")
    if isinstance(p_relabel, bool) or not isinstance(p_relabel, (int, float)) or not 0.0 <= p_relabel <= 1.0:
        raise ValueError(f"{op}: p_relabel must be a float in [0, 1], got {p_relabel!r}")
    for name, x in (("ptr", ptr), ("ring_next_obs", ring_next_obs), ("index", index), ("obs", obs),
                    ("next_obs", next_obs), ("u", u), ("gamma", gamma), ("reward_scale", reward_scale)):
        if isinstance(x, Tensor) and x.device != episode.device:
            raise ValueError(f"{op}: {name} is on {x.device}, episode on {episode.device}")


def _check_fused(env, episode, ring_next_obs):
    """What the kernel needs beyond :func:`_check`: the bit-goal layout (module docstring)."""
    op = "her_relabel"
    if not getattr(env, "her_bit_goals", False):
        raise ValueError(f"{op}: the Triton backend needs an env with the bit-goal layout (her_bit_goals = True), "
                         f"got {type(env).__name__}; use backend='torch'")
    goal_dim, d = int(env.goal_dim), ring_next_obs.shape[2]
    if ring_next_obs.dtype != torch.float32 or not 1 <= goal_dim <= d - goal_dim:
        raise ValueError(f"{op}: the Triton backend needs float32 observations of D >= 2·goal_dim, got "
                         f"{describe(ring_next_obs)} and goal_dim={goal_dim}")
    for name, x in (("episode", episode), ("ring_next_obs", ring_next_obs)):
        if not x.is_contiguous():
            raise ValueError(f"{op}: {name} must be contiguous for the Triton backend")


# ----------------------------------------------------------------------------- public
def her_relabel(env, episode: Tensor, ptr: Tensor, ring_next_obs: Tensor, index: Tensor, obs: Tensor,
                next_obs: Tensor, u: Tensor, gamma: float | Tensor, reward_scale: float | Tensor, window: int,
                p_relabel: float, *, stacked: bool = False, backend: str = "auto") -> HerRelabel:
    """Relabel a sampled batch with hindsight goals ("future" strategy; formulas: module docstring).

    One kernel (bit-goal envs, ``env.her_bit_goals``); device ops only (capturable in a CUDA graph).

    Args:
        env: the goal-conditioned env (``goal_dim``; the torch backend calls its ``achieved_goal``,
            ``desired_goal``, ``with_goal``, ``compute_reward``, ``is_success``).
        episode: int64 ``[T, N]``, the ring's per-env episode numbers.
        ptr: int64 0-d, the ring's next time row to write.
        ring_next_obs: the ring's next observations ``[T, N, D]``.
        index: int64 ``[R]``, the batch rows' flat ring rows ``t·N + e`` (not checked: device values).
        obs, next_obs: the batch ``[R, D]``, or ``[P, B, D]`` (P·B = R, member-major), of
            ``ring_next_obs``'s dtype.
        u: float32 ``[2, R]`` or ``[P, 2, B]`` in [0, 1): row 0 picks the future step, row 1
            decides whether the goal is relabelled (member p's rows p·B + b).
        gamma, reward_scale: floats, or float32 ``[G]`` with G dividing R, row r taking entry
            r // (R / G) (``[R]``: one per row; ``[P]``: one per member).
        window: L ≥ 1, the future steps looked at (the env's ``max_episode_steps``).
        p_relabel: the probability of a relabelled goal, in [0, 1].
        stacked: write obs and next_obs into one ``pair`` ``[P, 2, B, D]`` (P of a ``[P, B, D]``
            obs, else 1), the layout of :func:`foxdqn.ops.replay_gather.replay_gather`'s pair.
        backend: ``"auto"`` (Triton for CUDA tensors, else torch), ``"triton"``, ``"torch"``.

    Returns:
        :class:`HerRelabel`.

    Raises:
        ValueError: a wrong shape, dtype or device of an argument, a window < 1, a p_relabel outside
            [0, 1], an unknown backend; for the Triton backend also an env without the bit-goal
            layout, non-float32 observations, D < 2·goal_dim, a non-contiguous ring.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    args = (env, episode, ptr, ring_next_obs, index, obs, next_obs, u, gamma, reward_scale, window, p_relabel)
    _check(*args)
    if resolve_backend("her_relabel", backend, episode) == "torch":
        return _relabel_torch(*args, stacked)
    _check_fused(env, episode, ring_next_obs)
    return _relabel_triton(*args, stacked)
