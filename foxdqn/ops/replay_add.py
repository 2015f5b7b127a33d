r"""Write one time row of the replay ring (:class:`foxdqn.replay.buffer.ReplayBuffer`), fused into one kernel.

For the N envs of one collect step, with ``r = ptr`` the row written, ``g = i // (N // G)`` the
group of env ``i`` and ``ended = terminated | truncated``::

    obs_buf[r, i]      = obs[i]                      (cast to the buffer's obs dtype)
    next_obs_buf[r, i] = next_obs[i]                 (likewise)
    action_buf[r, i]   = action[i]
    reward_buf[r, i]   = float32(reward[i] * scale[g])   (scale cast to reward's dtype first)
    terminal_buf[r, i] = float32(terminated[i]);  ended_buf[r, i] = float32(ended)
    episode_buf[r, i]  = episode_now[i];  episode_now[i] += ended
    vol_ratio_buf[r, i] = float32(vol_ratio[i])      (regime weights only)
    rollout[i]         = advance_obs[i]              (optional: the rollout moves to the next state;
                                                     rollout is obs unless given, e.g. when the ring
                                                     stores state codes, not observations)
    ptr = (r + 1) mod rows;  written += 1

The n-step bookkeeping these rows feed is the replay's (foxdqn/replay/buffer.py, Sutton & Barto
2018, §7.1). The reference (:func:`replay_add_reference`) is the buffer's former ``add`` (seven
``index_copy_``, the casts, the episode-counter and pointer updates: about 15 launches on CUDA) plus
the reward scaling and the rollout's observation copy the collect step did around it.

The kernel, one program per ``BLOCK_N`` envs, reads ``ptr`` once at its start. The counters are
advanced by the last program to finish, found with a ticket: every program, after all its reads
of ``ptr``, does ``atomic_add(ticket, 1)``; the one that draws ``num_programs − 1`` writes ``ptr``,
``written`` and zeroes the ticket for the next launch. On the GPU the atomic is acq_rel at GPU
scope, done by one thread of the program after a barrier of its warps (``tl.debug_barrier``), so
its release orders every warp's load of ``ptr`` before the increment; the last
program's acquire on the same address (the increments form one release sequence) orders every
other program's increment, hence its load, before its own stores to ``ptr``: no program reads an
advanced ``ptr``. The next launch reads the counters and the zeroed ticket in stream order. The
interpreter runs the programs one after the other, so there the last program is simply the last.

Population: ``scale`` has one row per group (``G = P`` members with their ``loss.reward_scale``;
``G = 1`` for one run); the rest is per env, so P × N envs need no second kernel.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.library import device_op, wrap_triton

BLOCK_N = 16  # envs per program
BLOCK_D = 64  # observation values per env and loop iteration
OBS_DTYPES = (torch.float32, torch.float64, torch.uint8)


# ---------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def _replay_add_kernel(
    obs_ptr, next_obs_ptr, advance_ptr, rollout_ptr, action_ptr, reward_ptr, scale_ptr, term_ptr, trunc_ptr, vol_ptr,
    obs_buf, next_buf, action_buf, reward_buf, term_buf, ended_buf, episode_buf, vol_buf,
    episode_now_ptr, ptr_ptr, written_ptr, ticket_ptr,
    N, D, AD, rows, envs_per_group, obs_stride, next_stride, advance_stride, rollout_stride,
    HAS_VOL: tl.constexpr, ADVANCE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    i = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = i < N
    i64 = i.to(tl.int64)
    row = tl.load(ptr_ptr)  # the only read of ptr: before this program's ticket
    dst = row * N + i64  # flat index of (row, env) in the [rows, N] columns

    # ---- per-env fields
    action = tl.load(action_ptr + i64, mask=m, other=0)
    reward = tl.load(reward_ptr + i64, mask=m, other=0.0)
    scale = tl.load(scale_ptr + i64 // envs_per_group, mask=m, other=1.0).to(reward.dtype)
    term = tl.load(term_ptr + i64, mask=m, other=0) != 0
    ended = term | (tl.load(trunc_ptr + i64, mask=m, other=0) != 0)
    episode = tl.load(episode_now_ptr + i64, mask=m, other=0)
    tl.store(action_buf + dst, action, mask=m)
    tl.store(reward_buf + dst, (reward * scale).to(tl.float32), mask=m)
    tl.store(term_buf + dst, term.to(tl.float32), mask=m)
    tl.store(ended_buf + dst, ended.to(tl.float32), mask=m)
    tl.store(episode_buf + dst, episode, mask=m)
    tl.store(episode_now_ptr + i64, episode + ended.to(tl.int64), mask=m)
    if HAS_VOL:
        tl.store(vol_buf + dst, tl.load(vol_ptr + i64, mask=m, other=1.0).to(tl.float32), mask=m)

    # ---- observations: [BLOCK_N, BLOCK_D] tiles
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        m2 = m[:, None] & (d < D)[None, :]
        src = i64[:, None] * obs_stride + d[None, :]
        o = tl.load(obs_ptr + src, mask=m2, other=0)
        nx = tl.load(next_obs_ptr + i64[:, None] * next_stride + d[None, :], mask=m2, other=0)
        out = dst[:, None] * D + d[None, :]
        tl.store(obs_buf + out, o.to(obs_buf.dtype.element_ty), mask=m2)
        tl.store(next_buf + out, nx.to(next_buf.dtype.element_ty), mask=m2)

    # ---- the rollout's next states (AD values per env), after this program's envs were stored
    if ADVANCE:
        tl.debug_barrier()  # every warp has read its obs values (rollout may be obs) before any is rewritten
        for d0 in range(0, AD, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            m2 = m[:, None] & (d < AD)[None, :]
            adv = tl.load(advance_ptr + i64[:, None] * advance_stride + d[None, :], mask=m2, other=0)
            tl.store(rollout_ptr + i64[:, None] * rollout_stride + d[None, :], adv.to(rollout_ptr.dtype.element_ty),
                     mask=m2)

    # ---- the last program advances the counters (ordering: module docstring)
    tl.debug_barrier()  # every warp of this program has read ptr before the (one-thread) ticket increment
    ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu")
    if ticket == tl.num_programs(0) - 1:
        tl.store(ptr_ptr, (row + 1) % rows)
        tl.store(written_ptr, tl.load(written_ptr) + 1)
        tl.store(ticket_ptr, 0)


@device_op("foxdqn::replay_add", mutates_args={
    "rollout", "obs_buf", "next_buf", "action_buf", "reward_buf", "term_buf", "ended_buf", "episode_buf", "vol_buf",
    "episode_now", "ptr", "written", "ticket"})
def _replay_add_op(obs: Tensor, next_obs: Tensor, advance_obs: Tensor, rollout: Tensor, action: Tensor, reward: Tensor, scale: Tensor,
                   terminated: Tensor, truncated: Tensor, vol_ratio: Tensor, obs_buf: Tensor, next_buf: Tensor,
                   action_buf: Tensor, reward_buf: Tensor, term_buf: Tensor, ended_buf: Tensor, episode_buf: Tensor,
                   vol_buf: Tensor, episode_now: Tensor, ptr: Tensor, written: Tensor, ticket: Tensor,
                   has_vol: bool, advance: bool) -> None:
    rows, n, d = obs_buf.shape
    wrap_triton(_replay_add_kernel)[(triton.cdiv(n, BLOCK_N),)](
        obs, next_obs, advance_obs, rollout, action, reward, scale, terminated, truncated, vol_ratio,
        obs_buf, next_buf, action_buf, reward_buf, term_buf, ended_buf, episode_buf, vol_buf,
        episode_now, ptr, written, ticket,
        n, d, advance_obs.shape[1], rows, n // scale.shape[0], obs.stride(0), next_obs.stride(0),
        advance_obs.stride(0), rollout.stride(0),
        HAS_VOL=has_vol, ADVANCE=advance, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D, num_warps=4,
    )


# ---------------------------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------------------------
def replay_add_reference(obs: Tensor, next_obs: Tensor, action: Tensor, reward: Tensor, scale: Tensor,
                         terminated: Tensor, truncated: Tensor, buffers: dict, episode_now: Tensor, ptr: Tensor,
                         written: Tensor, vol_ratio: Tensor | None = None, advance_obs: Tensor | None = None,
                         rollout: Tensor | None = None) -> None:
    """Plain-torch reference of :func:`replay_add` (same arguments but ``ticket``; device ops only)."""
    b = buffers
    row = ptr.view(1)  # index tensors, never a 0-d tensor in [] (that would read it on the host)
    n = action.shape[0]
    if b.get("vol_ratio") is not None and vol_ratio is not None:
        b["vol_ratio"].index_copy_(0, row, vol_ratio.to(torch.float32)[None])
    ended = (terminated | truncated).to(torch.float32)
    scaled = (reward.view(scale.shape[0], -1) * scale.to(reward.dtype)[:, None]).view(n)
    b["obs"].index_copy_(0, row, obs.to(b["obs"].dtype)[None])
    b["next_obs"].index_copy_(0, row, next_obs.to(b["next_obs"].dtype)[None])
    b["action"].index_copy_(0, row, action[None])
    b["reward"].index_copy_(0, row, scaled.to(torch.float32)[None])
    b["terminal"].index_copy_(0, row, terminated.to(torch.float32)[None])
    b["ended"].index_copy_(0, row, ended[None])
    b["episode"].index_copy_(0, row, episode_now[None])
    episode_now.add_(ended.to(torch.int64))
    if advance_obs is not None:
        (obs if rollout is None else rollout).copy_(advance_obs)
    ptr.copy_((ptr + 1) % b["obs"].shape[0])
    written.add_(1)


# ---------------------------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------------------------
def _check_args(obs, next_obs, action, reward, scale, terminated, truncated, buffers, episode_now, ptr, written,
                ticket, vol_ratio, advance_obs, rollout) -> None:
    ob = buffers.get("obs")
    if not isinstance(ob, Tensor) or ob.dim() != 3 or ob.dtype not in OBS_DTYPES or not ob.is_contiguous():
        raise ValueError(f"replay_add: buffers['obs'] must be a contiguous [rows, N, D] tensor of "
                         f"{[str(t) for t in OBS_DTYPES]}, got {describe(ob)}")
    rows, n, d = ob.shape
    dev = ob.device
    expect = {"next_obs": (ob.shape, OBS_DTYPES), "action": ((rows, n), (torch.int64,)),
              "reward": ((rows, n), (torch.float32,)), "terminal": ((rows, n), (torch.float32,)),
              "ended": ((rows, n), (torch.float32,)), "episode": ((rows, n), (torch.int64,))}
    if buffers.get("vol_ratio") is not None:
        expect["vol_ratio"] = ((rows, n), (torch.float32,))
    for name, (shape, dtypes) in expect.items():
        t = buffers.get(name)
        if not isinstance(t, Tensor) or t.shape != shape or t.dtype not in dtypes or not t.is_contiguous() \
                or t.device != dev:
            raise ValueError(f"replay_add: buffers[{name!r}] must be a contiguous {[str(x) for x in dtypes]} tensor "
                             f"{list(shape)} on {dev}, got {describe(t)}")
    if (buffers.get("vol_ratio") is None) != (vol_ratio is None):
        raise ValueError("replay_add: vol_ratio [N] is given exactly when buffers['vol_ratio'] is (regime weights)")
    ad = d if rollout is None else (rollout.shape[1] if isinstance(rollout, Tensor) and rollout.dim() == 2 else -1)
    for name, t, width in (("obs", obs, d), ("next_obs", next_obs, d), ("advance_obs", advance_obs, ad),
                           ("rollout", rollout, ad)):
        if name in ("advance_obs", "rollout") and t is None:
            continue
        if (not isinstance(t, Tensor) or t.dim() != 2 or t.shape != (n, width) or t.stride(1) != 1
                or t.dtype not in OBS_DTYPES):
            raise ValueError(f"replay_add: {name} must be a [N, {'D' if width == d else 'rollout width'}] = "
                             f"[{n}, {width}] tensor of {[str(x) for x in OBS_DTYPES]} with unit stride along its "
                             f"last axis, got {describe(t)}")
    if rollout is not None and advance_obs is None:
        raise ValueError("replay_add: rollout is the buffer advance_obs is copied into; give both or neither")
    vec = [("action", action, (torch.int64,)), ("reward", reward, (torch.float32, torch.float64)),
           ("terminated", terminated, (torch.bool,)), ("truncated", truncated, (torch.bool,)),
           ("episode_now", episode_now, (torch.int64,))]
    if vol_ratio is not None:
        vec.append(("vol_ratio", vol_ratio, (torch.float32, torch.float64)))
    for name, t, dtypes in vec:
        if not isinstance(t, Tensor) or t.shape != (n,) or t.dtype not in dtypes or not t.is_contiguous():
            raise ValueError(f"replay_add: {name} must be a contiguous {[str(x) for x in dtypes]} tensor [N] = [{n}], "
                             f"got {describe(t)}")
    if (not isinstance(scale, Tensor) or scale.dim() != 1 or scale.dtype not in (torch.float32, torch.float64)
            or not scale.is_contiguous() or scale.shape[0] < 1 or n % scale.shape[0]):
        raise ValueError(f"replay_add: scale must be a contiguous float32 or float64 tensor [G] with N={n} a "
                         f"multiple of G, got {describe(scale)}")
    for name, t, dtype in (("ptr", ptr, torch.int64), ("written", written, torch.int64),
                           ("ticket", ticket, torch.int32)):
        if not isinstance(t, Tensor) or t.dim() != 0 or t.dtype != dtype:
            raise ValueError(f"replay_add: {name} must be a 0-d {dtype} tensor, got {describe(t)}")
    for name, t in (("obs", obs), ("next_obs", next_obs), ("advance_obs", advance_obs), ("rollout", rollout),
                    ("action", action),
                    ("reward", reward), ("scale", scale), ("terminated", terminated), ("truncated", truncated),
                    ("vol_ratio", vol_ratio), ("episode_now", episode_now), ("ptr", ptr), ("written", written),
                    ("ticket", ticket)):
        if t is not None and t.device != dev:
            raise ValueError(f"replay_add: {name} is on {t.device}, the buffers on {dev}")


def replay_add(obs: Tensor, next_obs: Tensor, action: Tensor, reward: Tensor, scale: Tensor, terminated: Tensor,
               truncated: Tensor, buffers: dict, episode_now: Tensor, ptr: Tensor, written: Tensor, ticket: Tensor,
               *, vol_ratio: Tensor | None = None, advance_obs: Tensor | None = None,
               rollout: Tensor | None = None, backend: str = "auto") -> None:
    """Write one time row of N transitions into the replay's columns and advance its counters
    (rules and the ordering argument in the module docstring).

    Device ops only (no host reads): capturable in a CUDA graph. One kernel launch on CUDA.

    Args:
        obs: ``[N, D]`` (float32, float64 or uint8; unit stride along D) the states acted on (the
            observations, or the env's state codes); overwritten by ``advance_obs`` when that is
            given without ``rollout`` (after being stored).
        next_obs: ``[N, D]`` likewise, the states after the step (before auto-reset).
        action: int64 ``[N]``; reward: float32 or float64 ``[N]``, unscaled;
        scale: float32 or float64 ``[G]`` (N a multiple of G), the reward scale of each group.
        terminated, truncated: bool ``[N]``.
        buffers: the ring's columns, contiguous: ``obs``, ``next_obs`` ``[rows, N, D]`` (float32,
            float64 or uint8), ``action``, ``episode`` int64 ``[rows, N]``, ``reward``,
            ``terminal``, ``ended`` float32 ``[rows, N]``, and ``vol_ratio`` float32 ``[rows, N]``
            or None (no regime weights).
        episode_now: int64 ``[N]``, each env's episode number; advanced in place where ended.
        ptr: int64 0-d, the row to write (``0 <= ptr < rows``, a device value: not checked);
            advanced in place modulo rows.  written: int64 0-d, rows ever written; +1 in place.
        ticket: int32 0-d, zero between calls (the kernel's scratch; unused by the reference).
        vol_ratio: float32/float64 ``[N]``, exactly when ``buffers['vol_ratio']`` is a tensor.
        advance_obs: ``[N, D']`` or None: the next observations to act on, copied (cast) into
            ``rollout`` when given, else into ``obs`` (D' = D), after this row is stored.
        rollout: ``[N, D']`` (float32, float64 or uint8; unit stride along D') or None: the
            rollout's own observation buffer that ``advance_obs`` is copied into, when it differs
            from ``obs`` (e.g. the ring stores state codes of width D while the rollout acts on
            observations of width D'). Needs ``advance_obs``.
        backend: "auto" (Triton for CUDA tensors, torch for CPU), "triton", "torch".

    Raises:
        ValueError: wrong dtype, shape or device of an argument, ``rollout`` without
            ``advance_obs``, or an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check_args(obs, next_obs, action, reward, scale, terminated, truncated, buffers, episode_now, ptr, written,
                ticket, vol_ratio, advance_obs, rollout)
    if resolve_backend("replay_add", backend, action) == "torch":
        replay_add_reference(obs, next_obs, action, reward, scale, terminated, truncated, buffers, episode_now, ptr,
                             written, vol_ratio, advance_obs, rollout)
        return
    b = buffers
    has_vol, advance = vol_ratio is not None, advance_obs is not None
    none = torch.empty(0, device=action.device)  # stands for an absent input (never read: constexpr flags)
    advance_src = advance_obs if advance else none.view(0, 1)
    _replay_add_op(obs, next_obs, advance_src, obs if rollout is None else rollout, action, reward, scale,
                   terminated.view(torch.uint8), truncated.view(torch.uint8), vol_ratio if has_vol else none,
                   b["obs"], b["next_obs"], b["action"], b["reward"], b["terminal"], b["ended"], b["episode"],
                   b["vol_ratio"] if has_vol else none, episode_now, ptr, written,
                   ticket, has_vol, advance)
