"""Replay sampling and n-step batch assembly in one kernel: uniform (time row, env) draw, then the
gather of obs, action, n-step reward, next_obs, discount and flat index.

Source: the n-step return of Sutton & Barto (2018, §7.1) as Rainbow uses it (Hessel et al. 2018),
cut at the first episode end in the window; the storage and the rules are those of
:class:`foxdqn.replay.buffer.ReplayBuffer` (its module docstring). For sampled row b with time row
t and env column e of a ring of T time rows and N envs:

    alive_k = Π_{j<k} (1 − ended[t+j, e])                        (k < n; indices mod T)
    R       = Σ_{k<n} reward[t+k, e] · alive_k · γ_g^k
    m       = Σ_{k<n} alive_k                                    (1 ≤ m ≤ n)
    discount = γ_g^m · (1 − terminal[t+m−1, e]),  next_obs = next_obs[t+m−1, e]

where γ_g is the discount of env e's group g = e // (N / G) (one group for a single run; a
population member's own γ, foxdqn/population/replay.py).

Where the rows come from (exactly one of):

* ``uniforms`` float32 ``[P, 2, B]`` (``[2, B]`` is P = 1), from the caller's generator: member p
  (envs p·N/P .. (p+1)·N/P − 1) draws its B rows (:func:`rows_from_uniforms`, the rule of
  ``ReplayBuffer.sample_index`` / ``MemberReplay.sample_members``), over the time rows whose
  n-step window is complete:
  filled = min(written, T), valid = max(filled − (n − 1), 1), oldest = (ptr − filled) mod T,
  t = (oldest + min(⌊u₀ · valid⌋, valid − 1)) mod T, column = min(⌊u₁ · N/P⌋, N/P − 1)
  (products in float32, as torch computes them). Output rows are member-major (p·B + b).
* ``index`` int64 ``[B]``: flat rows t·N + e given (PER's sampled rows, foxdqn/ops/per_sample.py);
  ``[P, B]``: P members' rows (a population's PER, foxdqn/population/replay.py), gathered as they
  are, member-major, with member p's γ where its envs are group p.

``stacked=True`` writes obs and next_obs into one tensor ``pair`` ``[P, 2, B, D]`` (member p's B
observations, then its B next observations), so that a network can evaluate Q(s) and Q(s') of
the batch as one forward of ``pair.view(P, 2B, D)`` (foxdqn/objectives/dqn.py).

Device ops only: ``ptr`` and ``written`` are read by the kernel, shapes are fixed, so the op runs
inside a CUDA graph (docs/design/hot_loop.md#the-contract). One kernel launch per call.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.replay_add import OBS_DTYPES

__all__ = ["ReplayGather", "replay_gather", "replay_gather_reference", "rows_from_uniforms", "stacked_pair"]

BLOCK_B = 2  # sampled rows per program on the GPU (an H200 sweep: docs/bench.md#launch-constants)
MAX_BLOCK_D = 256  # observation columns per tile on the GPU
NUM_WARPS = 4  # warps per program
#: a large batch (a population's P·B rows) doubles BLOCK_B while the grid has more programs than
#: this (8 per H200 multiprocessor: 512 members × 128 rows are 32,768 programs of 2 rows at BLOCK_B,
#: 16 waves of latency-bound programs, 67 µs) ...
MAX_PROGRAMS = 1056
#: ... up to this many rows per program, and a [rows, BLOCK_D] observation tile of at most MAX_TILE
MAX_BLOCK_B = 64
MAX_TILE = 4096


class ReplayGather(NamedTuple):
    """What :func:`replay_gather` returns (all on the replay's device).

    obs, next_obs: ``[R, D]`` of the storage dtype, R = P·B rows member-major (with ``stacked``
    and P > 1: ``[P, B, D]`` views of ``pair``); action: int64 ``[R]``; reward: float32 ``[R]``,
    the n-step discounted reward sum; discount: float32 ``[R]``, γ^m or 0 where the episode
    terminated in the window; index: int64 ``[R]`` flat rows t·N + e; pair: ``[P, 2, B, D]``
    (``stacked``) or None.
    """

    obs: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    next_obs: torch.Tensor
    discount: torch.Tensor
    index: torch.Tensor
    pair: torch.Tensor | None


# ----------------------------------------------------------------------------- kernel
@triton.jit
def _replay_gather_kernel(
    u_ptr,  # f32 [P, 2, Bg] (FROM_U)
    index_ptr,  # i64 [R] (not FROM_U)
    obs_ptr, next_obs_ptr,  # [T, N, D] contiguous
    action_ptr, reward_ptr, terminal_ptr, ended_ptr,  # [T, N] contiguous
    gamma_ptr,  # f32 [G, N_STEP + 1] contiguous
    ptr_ptr, written_ptr,  # i64 0-d
    out_obs_ptr, out_next_ptr,  # row (p, b) at (p * out_group_rows + b) * D
    out_action_ptr, out_reward_ptr, out_discount_ptr, out_index_ptr,  # [R]
    R, Bg, T, N, envs_per_member, envs_per_gamma_group, D, out_group_rows,
    N_STEP: tl.constexpr, FROM_U: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr,
):
    zero = tl.zeros([], dtype=tl.int64)  # int arguments to int64 (an argument equal to 1 arrives as a constexpr)
    Bg, T, N, D = Bg + zero, T + zero, N + zero, D + zero
    envs_per_member, envs_per_gamma_group, out_group_rows = (envs_per_member + zero, envs_per_gamma_group + zero,
                                                             out_group_rows + zero)
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    ok = rows < R
    rows64 = rows.to(tl.int64)
    p = rows64 // Bg
    b = rows64 % Bg
    if FROM_U:
        written = tl.load(written_ptr)
        ptr = tl.load(ptr_ptr)
        filled = tl.minimum(written, T)
        valid = tl.maximum(filled - (N_STEP - 1), 1)
        oldest = (ptr - filled + T) % T  # ptr - filled in [-T, T): a non-negative remainder
        u0 = tl.load(u_ptr + p * (2 * Bg) + b, mask=ok, other=0.0)
        u1 = tl.load(u_ptr + p * (2 * Bg) + Bg + b, mask=ok, other=0.0)
        offs = tl.minimum((u0 * valid.to(tl.float32)).to(tl.int64), valid - 1)
        t = (oldest + offs) % T
        col = tl.minimum((u1 * envs_per_member.to(tl.float32)).to(tl.int64), envs_per_member - 1)
        e = col + p * envs_per_member
    else:
        idx = tl.load(index_ptr + rows64, mask=ok, other=0)
        t = idx // N
        e = idx % N
    g = e // envs_per_gamma_group
    # n-step window: reward sum, steps m and the last step
    alive = tl.full([BLOCK_B], 1.0, tl.float32)
    reward = tl.zeros([BLOCK_B], dtype=tl.float32)
    steps = tl.zeros([BLOCK_B], dtype=tl.float32)
    for k in tl.static_range(N_STEP):
        slot = ((t + k) % T) * N + e
        r_k = tl.load(reward_ptr + slot, mask=ok, other=0.0)
        gamma_k = tl.load(gamma_ptr + g * (N_STEP + 1) + k, mask=ok, other=0.0)
        reward = reward + r_k * alive * gamma_k
        steps = steps + alive
        if k < N_STEP - 1:
            alive = alive * (1.0 - tl.load(ended_ptr + slot, mask=ok, other=0.0))
    m = steps.to(tl.int64)
    last = ((t + m - 1) % T) * N + e
    gamma_m = tl.load(gamma_ptr + g * (N_STEP + 1) + m, mask=ok, other=0.0)
    discount = gamma_m * (1.0 - tl.load(terminal_ptr + last, mask=ok, other=0.0))
    first = t * N + e
    tl.store(out_action_ptr + rows64, tl.load(action_ptr + first, mask=ok, other=0), mask=ok)
    tl.store(out_reward_ptr + rows64, reward, mask=ok)
    tl.store(out_discount_ptr + rows64, discount, mask=ok)
    tl.store(out_index_ptr + rows64, first, mask=ok)
    # observations: BLOCK_B rows x BLOCK_D columns per tile
    out_row = (p * out_group_rows + b) * D
    for d0 in range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        mask = ok[:, None] & (cols < D)[None, :]
        o = tl.load(obs_ptr + (first * D)[:, None] + cols[None, :], mask=mask)
        tl.store(out_obs_ptr + out_row[:, None] + cols[None, :], o, mask=mask)
        nx = tl.load(next_obs_ptr + (last * D)[:, None] + cols[None, :], mask=mask)
        tl.store(out_next_ptr + out_row[:, None] + cols[None, :], nx, mask=mask)


def _blocks(rows: int, d: int, interpret: bool) -> tuple[int, int]:
    """(BLOCK_B, BLOCK_D): small row blocks on the GPU (a batch of 256 spreads over 128 programs of
    BLOCK_B rows), doubled for a large batch while the grid exceeds MAX_PROGRAMS (up to MAX_BLOCK_B
    rows and a MAX_TILE tile: a population's P·B rows in one wave); big tiles in the interpreter
    (one numpy op per tile). Every row is gathered alone, so the tiling changes no bit."""
    if interpret:
        return min(triton.next_power_of_2(max(rows, 1)), 256), min(triton.next_power_of_2(d), 4096)
    block_b, block_d = BLOCK_B, min(triton.next_power_of_2(d), MAX_BLOCK_D)
    while triton.cdiv(rows, block_b) > MAX_PROGRAMS and 2 * block_b <= MAX_BLOCK_B and 2 * block_b * block_d <= MAX_TILE:
        block_b *= 2
    return block_b, block_d


def _launch(store, ptr, written, gamma, n_step, uniforms, index, members, stacked, out) -> None:
    obs, next_obs, action, reward, terminal, ended = store
    rows_total = out.action.shape[0]
    if rows_total == 0:
        return
    t_rows, n_envs, d = obs.shape
    bg = rows_total // members
    block_b, block_d = _blocks(rows_total, d, interpret=not obs.is_cuda)
    from_u = uniforms is not None
    if stacked:
        out_obs, out_next, group_rows = out.pair, out.pair[:, 1], 2 * bg
    else:
        out_obs, out_next, group_rows = out.obs, out.next_obs, bg
    dummy = uniforms if from_u else index  # the pointer the kernel does not read
    _replay_gather_kernel[(triton.cdiv(rows_total, block_b),)](
        uniforms if from_u else dummy, index if not from_u else dummy,
        obs, next_obs, action, reward, terminal, ended, gamma, ptr, written,
        out_obs, out_next, out.action, out.reward, out.discount, out.index,
        rows_total, bg, t_rows, n_envs, n_envs // members, n_envs // gamma.shape[0], d, group_rows,
        N_STEP=n_step, FROM_U=from_u, BLOCK_B=block_b, BLOCK_D=block_d, num_warps=NUM_WARPS)


# ----------------------------------------------------------------------------- reference
def rows_from_uniforms(uniforms: torch.Tensor, ptr: torch.Tensor, written: torch.Tensor, t_rows: int, n_envs: int,
                       n_step: int) -> torch.Tensor:
    """The uniform replay draw: flat rows ``t·N + e`` of ``uniforms``, over the time rows whose
    n-step window is complete (module docstring, "Where the rows come from"). Device ops only.

    The one definition of the rule: :meth:`foxdqn.replay.buffer.ReplayBuffer.sample_index` calls it
    with P = 1, and :func:`replay_gather_reference` (and the torch backend) with the members'
    draws; the kernel computes the same in its own code.

    Args:
        uniforms: float32 ``[2, B]`` (P = 1) or ``[P, 2, B]`` in [0, 1), P dividing ``n_envs``:
            row 0 picks the time row, row 1 the env column within the member's N/P envs.
        ptr: int64 0-d, the next time row to write; written: int64 0-d, time rows ever written.
        t_rows: T, time rows of the ring; n_envs: N, envs per time row; n_step: n ≥ 1.

    Returns:
        int64 ``[P·B]`` flat rows in [0, T·N), member-major (row p·B + b is member p's draw b;
        member p's envs are p·N/P .. (p+1)·N/P − 1).
    """
    if uniforms.dim() == 2:
        uniforms = uniforms[None]
    p = uniforms.shape[0]
    per_member = n_envs // p
    filled = torch.clamp(written, max=t_rows)
    valid = torch.clamp(filled - (n_step - 1), min=1)
    oldest = (ptr - filled) % t_rows
    t = (oldest + (uniforms[:, 0] * valid.to(torch.float32)).to(torch.int64).clamp(max=valid - 1)) % t_rows
    column = (uniforms[:, 1] * per_member).to(torch.int64).clamp(max=per_member - 1)
    env = column + per_member * torch.arange(p, device=uniforms.device)[:, None]
    return (t * n_envs + env).reshape(-1)


def _gather_torch(store, ptr, written, gamma, n_step, uniforms, index, members, stacked) -> ReplayGather:
    """The torch path of :func:`replay_gather` on checked arguments (its reference and its CPU backend)."""
    if uniforms is not None:
        index = rows_from_uniforms(uniforms, ptr, written, store[0].shape[0], store[0].shape[1], n_step)
    return _assemble(store, gamma, n_step, index.reshape(-1), members, stacked)


def _assemble(store, gamma, n_step, index, members, stacked) -> ReplayGather:
    """The n-step gather of ``ReplayBuffer.gather`` for flat rows ``index``, with γ per env group."""
    obs, next_obs, action, reward, terminal, ended = store
    t_rows, n_envs, d = obs.shape
    t, e = index // n_envs, index % n_envs
    table = gamma[e // (n_envs // gamma.shape[0])]  # [R, n + 1]
    gamma_k = table[:, :n_step]
    if n_step == 1:
        last = t
        ret = reward[t, e]
        disc = table[:, 1] * (1.0 - terminal[t, e])
    else:
        tk = (t[:, None] + torch.arange(n_step, device=index.device)[None, :]) % t_rows  # (R, n)
        ek = e[:, None].expand_as(tk)
        end = ended[tk, ek]
        alive = torch.cumprod(torch.cat([torch.ones_like(end[:, :1]), 1.0 - end[:, :-1]], dim=1), dim=1)
        ret = (reward[tk, ek] * alive * gamma_k).sum(dim=1)
        m = alive.sum(dim=1).to(torch.int64)
        last = tk.gather(1, (m - 1)[:, None]).squeeze(1)
        disc = table.gather(1, m[:, None]).squeeze(1) * (1.0 - terminal[last, e])
    o, nx, pair = obs[t, e], next_obs[last, e], None
    if stacked:
        pair = torch.stack([o.view(members, -1, d), nx.view(members, -1, d)], dim=1)  # [P, 2, B, D]
        o, nx = _pair_views(pair)
    return ReplayGather(o, action[t, e], ret, nx, disc, index, pair)


def _pair_views(pair: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """obs and next_obs views of ``pair`` [P, 2, B, D]: ``[B, D]`` for P = 1, else ``[P, B, D]``."""
    if pair.shape[0] == 1:
        return pair[0, 0], pair[0, 1]
    return pair[:, 0], pair[:, 1]


def replay_gather_reference(obs, next_obs, action, reward, terminal, ended, ptr, written, gamma, n_step, *,
                            uniforms=None, index=None, stacked=False) -> ReplayGather:
    """Plain-torch :func:`replay_gather` (same arguments and results; today's ReplayBuffer code)."""
    uniforms, members = _check(obs, next_obs, action, reward, terminal, ended, ptr, written, gamma, n_step,
                               uniforms, index)
    return _gather_torch((obs, next_obs, action, reward, terminal, ended), ptr, written, gamma, n_step, uniforms,
                         index, members, stacked)


# ----------------------------------------------------------------------------- checks
def _check(obs, next_obs, action, reward, terminal, ended, ptr, written, gamma, n_step, uniforms, index):
    """Validate the arguments; returns (uniforms as [P, 2, B] or None, P: of uniforms or of a [P, B]
    index)."""
    op = "replay_gather"
    if isinstance(n_step, bool) or not isinstance(n_step, int) or n_step < 1:
        raise ValueError(f"{op}: n_step must be an int >= 1, got {n_step!r}")
    if obs.dim() != 3 or obs.dtype not in OBS_DTYPES:
        raise ValueError(f"{op}: obs must be [T, N, D] of float32, float64 or uint8, got {describe(obs)}")
    t_rows, n_envs, _ = obs.shape
    if t_rows < n_step + 1:
        raise ValueError(f"{op}: the ring needs at least n_step + 1 = {n_step + 1} time rows, got T={t_rows}")
    if next_obs.shape != obs.shape or next_obs.dtype != obs.dtype:
        raise ValueError(f"{op}: next_obs must match obs {describe(obs)}, got {describe(next_obs)}")
    for name, x, dtype in (("action", action, torch.int64), ("reward", reward, torch.float32),
                           ("terminal", terminal, torch.float32), ("ended", ended, torch.float32)):
        if tuple(x.shape) != (t_rows, n_envs) or x.dtype != dtype:
            raise ValueError(f"{op}: {name} must be {dtype} [{t_rows}, {n_envs}], got {describe(x)}")
    for name, x in (("ptr", ptr), ("written", written)):
        if x.dim() != 0 or x.dtype != torch.int64:
            raise ValueError(f"{op}: {name} must be a 0-d int64 tensor, got {describe(x)}")
    if gamma.dim() != 2 or gamma.shape[1] != n_step + 1 or gamma.dtype != torch.float32 or gamma.shape[0] < 1 \
            or n_envs % gamma.shape[0]:
        raise ValueError(f"{op}: gamma must be float32 [G, n_step + 1 = {n_step + 1}] with G dividing "
                         f"N={n_envs}, got {describe(gamma)}")
    if (uniforms is None) == (index is None):
        raise ValueError(f"{op}: give exactly one of uniforms [P, 2, B] and index [B]")
    members = 1
    if uniforms is not None:
        if uniforms.dim() == 2:
            uniforms = uniforms[None]
        if uniforms.dim() != 3 or uniforms.shape[1] != 2 or uniforms.dtype != torch.float32 \
                or uniforms.shape[0] < 1 or n_envs % uniforms.shape[0]:
            raise ValueError(f"{op}: uniforms must be float32 [2, B] or [P, 2, B] with P dividing N={n_envs}, "
                             f"got {describe(uniforms)}")
        members = uniforms.shape[0]
    elif index.dim() not in (1, 2) or index.dtype != torch.int64 or index.dim() == 2 and (
            index.shape[0] < 1 or n_envs % index.shape[0]):
        raise ValueError(f"{op}: index must be int64 [B] or [P, B] with P dividing N={n_envs}, got {describe(index)}")
    elif index.dim() == 2:
        members = index.shape[0]
    for name, x in (("next_obs", next_obs), ("action", action), ("reward", reward), ("terminal", terminal),
                    ("ended", ended), ("ptr", ptr), ("written", written), ("gamma", gamma),
                    ("uniforms" if index is None else "index", uniforms if index is None else index)):
        if x.device != obs.device:
            raise ValueError(f"{op}: {name} is on {x.device}, obs on {obs.device}")
    return uniforms, members


# ----------------------------------------------------------------------------- public
def replay_gather(obs: torch.Tensor, next_obs: torch.Tensor, action: torch.Tensor, reward: torch.Tensor,
                  terminal: torch.Tensor, ended: torch.Tensor, ptr: torch.Tensor, written: torch.Tensor,
                  gamma: torch.Tensor, n_step: int, *, uniforms: torch.Tensor | None = None,
                  index: torch.Tensor | None = None, stacked: bool = False, backend: str = "auto") -> ReplayGather:
    """Sample (from ``uniforms``) or take (``index``) replay rows and assemble their n-step batch.

    Formulas and sampling rules: module docstring (those of ``ReplayBuffer.sample_index`` and
    ``ReplayBuffer.gather``). One kernel; device ops only (capturable in a CUDA graph).

    Args:
        obs, next_obs: the ring's observations ``[T, N, D]``, float32, float64 or uint8.
        action: int64 ``[T, N]``; reward, terminal, ended: float32 ``[T, N]`` (terminal: s' is
            terminal; ended: the episode ended there, terminated or truncated).
        ptr: int64 0-d, the next time row to write; written: int64 0-d, time rows ever written.
        gamma: float32 ``[G, n_step + 1]``, row g = γ_g^0 .. γ_g^n of env group g = e // (N / G)
            (G = 1: one γ).
        n_step: n ≥ 1; the ring holds at least n + 1 time rows.
        uniforms: float32 ``[2, B]`` or ``[P, 2, B]`` in [0, 1), P dividing N: draw B rows per
            member (module docstring).
        index: int64 ``[B]`` flat rows t·N + e in [0, T·N) (not checked: a device value), or
            ``[P, B]``, P dividing N: B rows per member (``stacked``: ``pair`` ``[P, 2, B, D]``).
            Exactly one of ``uniforms`` and ``index``.
        stacked: also lay obs and next_obs out as one ``pair`` ``[P, 2, B, D]``
            (``ReplayGather.obs``/``next_obs`` are then views of it).
        backend: ``"auto"`` (Triton for CUDA tensors, else torch), ``"triton"``, ``"torch"``.

    Returns:
        :class:`ReplayGather` (P·B rows, member-major).

    Raises:
        ValueError: wrong shape, dtype or device of an argument, neither or both of
            ``uniforms``/``index``, a ring shorter than n + 1 rows, an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    uniforms, members = _check(obs, next_obs, action, reward, terminal, ended, ptr, written, gamma, n_step,
                               uniforms, index)
    store = (obs, next_obs, action, reward, terminal, ended)
    if resolve_backend("replay_gather", backend, obs) == "torch":
        return _gather_torch(store, ptr, written, gamma, n_step, uniforms, index, members, stacked)
    for name, x in zip(("obs", "next_obs", "action", "reward", "terminal", "ended", "gamma"), (*store, gamma)):
        if not x.is_contiguous():
            raise ValueError(f"replay_gather: {name} must be contiguous for the Triton backend")
    rows = uniforms.shape[0] * uniforms.shape[2] if uniforms is not None else index.numel()
    d, dev = obs.shape[2], obs.device
    f32 = dict(device=dev, dtype=torch.float32)
    pair = None
    if stacked:
        pair = torch.empty(members, 2, rows // members, d, device=dev, dtype=obs.dtype)
        o, nx = _pair_views(pair)
    else:
        o = torch.empty(rows, d, device=dev, dtype=obs.dtype)
        nx = torch.empty(rows, d, device=dev, dtype=obs.dtype)
    out = ReplayGather(o, torch.empty(rows, device=dev, dtype=torch.int64), torch.empty(rows, **f32), nx,
                       torch.empty(rows, **f32), torch.empty(rows, device=dev, dtype=torch.int64), pair)
    _launch(store, ptr, written, gamma, n_step, None if uniforms is None else uniforms.contiguous(),
            None if index is None else index.contiguous(), members, stacked, out)
    return out


def stacked_pair(obs: torch.Tensor, next_obs: torch.Tensor) -> torch.Tensor | None:
    """The ``pair`` ``[P, 2, B, D]`` that ``obs`` and ``next_obs`` are the two halves of, as
    :func:`replay_gather` with ``stacked=True`` returns them; None when they are anything else
    (e.g. micro-batch chunks, relabelled copies). A host check of shapes and addresses only."""
    base = obs._base
    if base is None or next_obs._base is not base or base.dim() != 4 or base.shape[1] != 2:
        return None
    if not base.is_contiguous():
        return None
    o, nx = _pair_views(base)
    same = all(a.shape == b.shape and a.stride() == b.stride() and a.data_ptr() == b.data_ptr()
               for a, b in ((obs, o), (next_obs, nx)))
    return base if same else None

