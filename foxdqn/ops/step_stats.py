r"""One collect step's monitoring sums (:meth:`foxdqn.step.stats.DeviceStats.add_step`), fused into one kernel.

For the N envs of one step (``done`` the envs whose episode ended on it), in float64::

    acc[0] += Σ_i episode_return[i] · done[i]        (returns of the finished episodes)
    acc[1] += Σ_i done[i]                            (finished episodes)
    acc[2] += Σ_i episode_length[i] · done[i]        (their lengths, in env steps)
    acc[3] += Σ_i reward[i]                          (reward, log-equity units for trading)
    acc[4] += N                                      (transitions)
    acc[5] += Σ_i traded[i]                          (steps with a fill; 0 without ``traded``)
    actions[action[i]] += 1                          (histogram of the executed actions)
    env_steps += N                                   (optional: the run's env-step counter)

(docs/design/hot_loop.md#log-snapshot). The kernel is one program looping over the N envs in
blocks of ``BLOCK``, summing each field in a fixed order, so the result does not change from run
to run. That order is not torch's ``sum``: the two non-integer sums (returns, rewards) may differ
from the reference (:func:`step_stats_reference`) in the last bits of float64; the counts are
exact in both. The histogram uses atomic adds of 1.0 to float64 counts: integer values below
2**53, exact in any order. An action outside ``[0, A)`` is not counted by the kernel (the reference's
``index_add_`` raises on CPU).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import resolve_backend

BLOCK = 1024  # envs per loop iteration of the single program
NUM_FIELDS = 6  # acc's fields, in the order of the module docstring


# ---------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def _step_stats_kernel(action_ptr, reward_ptr, done_ptr, ret_ptr, len_ptr, traded_ptr, acc_ptr, hist_ptr,
                       env_steps_ptr, N, A, HAS_TRADED: tl.constexpr, STEPS: tl.constexpr, BLOCK: tl.constexpr):
    s_ret = tl.zeros([BLOCK], tl.float64)
    s_done = tl.zeros([BLOCK], tl.float64)
    s_len = tl.zeros([BLOCK], tl.float64)
    s_rew = tl.zeros([BLOCK], tl.float64)
    s_trd = tl.zeros([BLOCK], tl.float64)
    s_n = tl.zeros([BLOCK], tl.float64)
    for start in range(0, N, BLOCK):
        i = start + tl.arange(0, BLOCK)
        m = i < N
        s_n += m.to(tl.float64)
        done = (tl.load(done_ptr + i, mask=m, other=0) != 0).to(tl.float64)
        s_ret += tl.load(ret_ptr + i, mask=m, other=0.0).to(tl.float64) * done
        s_done += done
        s_len += tl.load(len_ptr + i, mask=m, other=0).to(tl.float64) * done
        s_rew += tl.load(reward_ptr + i, mask=m, other=0.0).to(tl.float64)
        if HAS_TRADED:
            s_trd += (tl.load(traded_ptr + i, mask=m, other=0) != 0).to(tl.float64)
        a = tl.load(action_ptr + i, mask=m, other=0)
        ok = m & (a >= 0) & (a < A)
        tl.atomic_add(hist_ptr + tl.where(ok, a, 0), tl.zeros([BLOCK], tl.float64) + 1.0, mask=ok)
    tl.store(acc_ptr + 0, tl.load(acc_ptr + 0) + tl.sum(s_ret, axis=0))
    tl.store(acc_ptr + 1, tl.load(acc_ptr + 1) + tl.sum(s_done, axis=0))
    tl.store(acc_ptr + 2, tl.load(acc_ptr + 2) + tl.sum(s_len, axis=0))
    tl.store(acc_ptr + 3, tl.load(acc_ptr + 3) + tl.sum(s_rew, axis=0))
    tl.store(acc_ptr + 4, tl.load(acc_ptr + 4) + tl.sum(s_n, axis=0))
    tl.store(acc_ptr + 5, tl.load(acc_ptr + 5) + tl.sum(s_trd, axis=0))
    if STEPS:
        tl.store(env_steps_ptr, tl.load(env_steps_ptr) + N)


@torch.library.triton_op("foxdqn::step_stats", mutates_args={"acc", "actions", "env_steps"})
def _step_stats_op(action: Tensor, reward: Tensor, done: Tensor, episode_return: Tensor, episode_length: Tensor,
                   traded: Tensor, acc: Tensor, actions: Tensor, env_steps: Tensor, has_traded: bool,
                   advance_steps: bool) -> None:
    torch.library.wrap_triton(_step_stats_kernel)[(1,)](
        action, reward, done, episode_return, episode_length, traded, acc, actions, env_steps,
        action.shape[0], actions.shape[0], HAS_TRADED=has_traded, STEPS=advance_steps, BLOCK=BLOCK, num_warps=8)


# ---------------------------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------------------------
def step_stats_reference(action: Tensor, reward: Tensor, done: Tensor, episode_return: Tensor,
                         episode_length: Tensor, traded: Tensor | None, acc: Tensor, actions: Tensor,
                         env_steps: Tensor | None = None) -> None:
    """Plain-torch reference of :func:`step_stats` (same arguments; device ops only): the former
    ``DeviceStats.add_step`` plus the counter's ``add_``."""
    n = action.shape[0]
    d = done.to(torch.float64)
    zero = torch.zeros((), dtype=torch.float64, device=acc.device)
    upd = torch.stack([
        (episode_return.to(torch.float64) * d).sum(),
        d.sum(),
        (episode_length.to(torch.float64) * d).sum(),
        reward.to(torch.float64).sum(),
        torch.full((), float(n), dtype=torch.float64, device=acc.device),
        zero if traded is None else traded.to(torch.float64).sum(),
    ])
    acc.add_(upd)
    actions.index_add_(0, action, torch.ones(n, dtype=torch.float64, device=acc.device))
    if env_steps is not None:
        env_steps.add_(n)


# ---------------------------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------------------------
def _desc(t) -> str:
    return f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}"


def _check_args(action, reward, done, episode_return, episode_length, traded, acc, actions, env_steps) -> None:
    if not isinstance(action, Tensor) or action.dim() != 1 or action.dtype != torch.int64:
        raise ValueError(f"step_stats: action must be an int64 tensor [N], got {_desc(action)}")
    n, dev = action.shape[0], action.device
    floats = (torch.float32, torch.float64)
    for name, t, dtypes in (("action", action, (torch.int64,)), ("reward", reward, floats),
                            ("done", done, (torch.bool,)), ("episode_return", episode_return, floats),
                            ("episode_length", episode_length, (torch.int64,)),
                            ("traded", traded, (torch.bool,))):
        if name == "traded" and t is None:
            continue
        if not isinstance(t, Tensor) or t.shape != (n,) or t.dtype not in dtypes or not t.is_contiguous() \
                or t.device != dev:
            raise ValueError(f"step_stats: {name} must be a contiguous {[str(x) for x in dtypes]} tensor [N] = [{n}] "
                             f"on {dev}, got {_desc(t)}")
    for name, t, shape, dtype in (("acc", acc, (NUM_FIELDS,), torch.float64),
                                  ("actions", actions, None, torch.float64),
                                  ("env_steps", env_steps, (), torch.int64)):
        if name == "env_steps" and t is None:
            continue
        if (not isinstance(t, Tensor) or t.dtype != dtype or not t.is_contiguous() or t.device != dev
                or (shape is not None and t.shape != shape) or (shape is None and (t.dim() != 1 or t.numel() < 1))):
            want = "[A], A >= 1" if shape is None else list(shape)
            raise ValueError(f"step_stats: {name} must be a contiguous {dtype} tensor {want} on {dev}, got {_desc(t)}")


def step_stats(action: Tensor, reward: Tensor, done: Tensor, episode_return: Tensor, episode_length: Tensor,
               traded: Tensor | None, acc: Tensor, actions: Tensor, env_steps: Tensor | None = None, *,
               backend: str = "auto") -> None:
    """Add one env step of N envs to the monitoring accumulators (fields in the module docstring).

    Device ops only (no host reads): capturable in a CUDA graph. One kernel launch on CUDA.

    Args:
        action: int64 ``[N]``, the executed (env) actions, in ``[0, A)``.
        reward: float32 or float64 ``[N]``, unscaled.
        done: bool ``[N]``, the episode ended on this step.
        episode_return: float32 or float64 ``[N]``, the finished episode's return where done.
        episode_length: int64 ``[N]``, its length in env steps where done.
        traded: bool ``[N]``, the step filled an order; None for an env that does not trade (0 trades).
        acc: float64 ``[6]``, accumulated in place.  actions: float64 ``[A]``, counts, in place.
        env_steps: int64 0-d or None: advanced by N in place.
        backend: "auto" (Triton for CUDA tensors, torch for CPU), "triton", "torch".

    Raises:
        ValueError: wrong dtype, shape or device of an argument, or an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check_args(action, reward, done, episode_return, episode_length, traded, acc, actions, env_steps)
    if resolve_backend("step_stats", backend, action) == "torch":
        step_stats_reference(action, reward, done, episode_return, episode_length, traded, acc, actions, env_steps)
        return
    dev = action.device
    _step_stats_op(action, reward, done.view(torch.uint8), episode_return, episode_length,
                   torch.empty(0, dtype=torch.uint8, device=dev) if traded is None else traded.view(torch.uint8),
                   acc, actions,
                   torch.empty(0, dtype=torch.int64, device=dev) if env_steps is None else env_steps,
                   traded is not None, env_steps is not None)
