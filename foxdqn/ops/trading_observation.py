r"""Trading observations rebuilt from state codes, fused into one kernel (the replay's decode).

The windowed trading replay (docs/design/replay.md#windowed-trading-replay) stores per transition
the state codes ``(t, units, entry_price, equity)`` of s and s' (:mod:`foxdqn.ops.trading_code`)
instead of their ``[W*F+2]`` observations; a sampled batch rebuilds both observations here, from
the env's device feature table and closes. The observation is the env's
(:func:`foxdqn.ops.trading_step.observation_reference`, layout in :mod:`foxdqn.envs.trading`):

* the feature rows ``t-W+1 .. t`` (``W*F`` contiguous values from ``(t-W+1)*F``);
* ``clip(units * close_t / max(equity, ruin), ±ACCOUNT_OBS_CLIP)``;
* ``clip(units * (close_t - entry_price) / max(equity, ruin), ±ACCOUNT_OBS_CLIP)``,

computed in the env dtype, then rounded to ``out_dtype`` (the replay's observation dtype, float32).
The kernel is the trading step kernel's observation gather (:mod:`foxdqn.ops.trading_step`), one
program per ``BLOCK`` rows of one code tensor; the codes of s and of s' are two tensors decoded
in the same launch (grid axis 1). It evaluates the reference's expressions in the same order,
without FMA contraction and with round-to-nearest division, so its observations equal the
reference's bit for bit, and both equal the observation the env returned for that state (the
code holds its four values exactly).

Bar indices outside ``[W-1, T-1]`` (never in a written replay row) are clamped into it, so no
code reads outside the feature table; the observation of such a code is undefined.

Population
----------
The one parameter the observation reads, the ruin equity (the floor of the denominator), is read
per row from ``fparams[g]`` with ``g = group[b]`` (``group=None``: row 0, ``G = 1``), as the
trading step reads its parameters per env group; P members' rows decode in the same launch. With
``members=P`` (the codes of a member-major batch, ``B/P`` rows per member) the kernel stores the two
observations of s and s' as the population's stacked pair ``[P, 2, B/P, D]`` (member p's s rows,
then its s' rows: what :func:`foxdqn.ops.replay_gather.replay_gather` returns with ``stacked``), so
the members' Double DQN forward reads them without a concatenation; only the addresses change.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import resolve_backend
from foxdqn.ops.library import compile_disabled, device_op, wrap_triton
from foxdqn.ops.trading_code import CODE_ENTRY, CODE_EQUITY, CODE_T, CODE_UNITS, CODE_WIDTH
from foxdqn.ops.trading_step import (_RUIN, ACCOUNT_OBS_CLIP, FP_WIDTH, TradingMarket, TradingParams,
                                     _store_account_obs, observation_reference)

BLOCK = 1  # code rows per program (the three from an H200 sweep at the update's 128 rows:
#           docs/bench.md#launch-constants)
NUM_WARPS = 1  # warps per program
CHUNK = 256  # window columns gathered per loop iteration (eurusd_dqn's 160 in one)


@triton.jit
def _decode_rows(code_ptr, out_ptr, group_ptr, close_ptr, feat_ptr, fparams_ptr, pid, B, num_bars, W, F, OBS_DIM,
                 MROWS, GAP, HAS_GROUP: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr, CODE_W: tl.constexpr,
                 C_T: tl.constexpr, C_UNITS: tl.constexpr, C_ENTRY: tl.constexpr, C_EQUITY: tl.constexpr,
                 FPW: tl.constexpr, RUIN: tl.constexpr, OBS_CLIP: tl.constexpr):
    b = pid * BLOCK + tl.arange(0, BLOCK)
    m = b < B
    b64 = b.to(tl.int64)
    crow = b64 * CODE_W
    dt = close_ptr.dtype.element_ty  # the env dtype: the account values are computed in it
    t = tl.load(code_ptr + crow + C_T, mask=m, other=0).to(tl.int64)
    t = tl.minimum(tl.maximum(t, W - 1), num_bars - 1)
    units = tl.load(code_ptr + crow + C_UNITS, mask=m, other=0).to(dt)
    entry = tl.load(code_ptr + crow + C_ENTRY, mask=m, other=0).to(dt)
    equity = tl.load(code_ptr + crow + C_EQUITY, mask=m, other=1).to(dt)
    if HAS_GROUP:
        grp = tl.load(group_ptr + b64, mask=m, other=0).to(tl.int64)
    else:
        grp = tl.zeros([BLOCK], dtype=tl.int64)
    ruin = tl.load(fparams_ptr + grp * FPW + RUIN, mask=m, other=1.0)
    odt = out_ptr.dtype.element_ty

    # account values (observation_reference's expressions and order); output row b of member
    # b // MROWS skips GAP rows per member before it (the other half of the members' pairs)
    row = (b64 + (b64 // MROWS) * GAP) * OBS_DIM
    WF = W * F
    _store_account_obs(out_ptr, row + WF, close_ptr, t, units, entry, equity, ruin, OBS_CLIP, m)

    # window: rows t-W+1 .. t of the [T, F] feature table are W*F contiguous values
    src = (t - W + 1) * F
    for c in range(0, WF, CHUNK):
        j = c + tl.arange(0, CHUNK)
        m2 = m[:, None] & (j < WF)[None, :]
        v = tl.load(feat_ptr + src[:, None] + j[None, :], mask=m2, other=0.0)
        tl.store(out_ptr + row[:, None] + j[None, :], v.to(odt), mask=m2)


@triton.jit
def _trading_observation_kernel(code_a_ptr, code_b_ptr, out_a_ptr, out_b_ptr, group_ptr, close_ptr, feat_ptr,
                                fparams_ptr, B, num_bars, W, F, OBS_DIM, MROWS, GAP,
                                HAS_GROUP: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr,
                                CODE_W: tl.constexpr, C_T: tl.constexpr, C_UNITS: tl.constexpr,
                                C_ENTRY: tl.constexpr, C_EQUITY: tl.constexpr, FPW: tl.constexpr,
                                RUIN: tl.constexpr, OBS_CLIP: tl.constexpr):
    pid = tl.program_id(0)
    if tl.program_id(1) == 0:  # axis 1: which code tensor (a -> out a, b -> out b)
        _decode_rows(code_a_ptr, out_a_ptr, group_ptr, close_ptr, feat_ptr, fparams_ptr, pid, B, num_bars, W, F,
                     OBS_DIM, MROWS, GAP, HAS_GROUP, BLOCK, CHUNK, CODE_W, C_T, C_UNITS, C_ENTRY, C_EQUITY, FPW, RUIN, OBS_CLIP)
    else:
        _decode_rows(code_b_ptr, out_b_ptr, group_ptr, close_ptr, feat_ptr, fparams_ptr, pid, B, num_bars, W, F,
                     OBS_DIM, MROWS, GAP, HAS_GROUP, BLOCK, CHUNK, CODE_W, C_T, C_UNITS, C_ENTRY, C_EQUITY, FPW, RUIN, OBS_CLIP)


@device_op("foxdqn::trading_observation", mutates_args={"out"})
def _trading_observation_op(code_a: Tensor, code_b: Tensor, out: Tensor, group: Tensor, close: Tensor,
                            features: Tensor, fparams: Tensor, window: int, num_features: int, has_group: bool) -> None:
    """``out``: the pair ``[P, k, B/P, D]`` (one run: P = 1); code row b goes to ``out[b // (B/P), half, b % (B/P)]``."""
    members, k, rows, obs_dim = out.shape
    b = members * rows
    wrap_triton(_trading_observation_kernel)[(triton.cdiv(b, BLOCK), k)](
        code_a, code_b, out[0, 0], out[0, -1], group, close, features, fparams, b, close.shape[0], window,
        num_features, obs_dim, rows, (k - 1) * rows,
        HAS_GROUP=has_group, BLOCK=BLOCK, CHUNK=CHUNK, CODE_W=CODE_WIDTH, C_T=CODE_T, C_UNITS=CODE_UNITS,
        C_ENTRY=CODE_ENTRY, C_EQUITY=CODE_EQUITY, FPW=FP_WIDTH, RUIN=_RUIN, OBS_CLIP=ACCOUNT_OBS_CLIP,
        num_warps=NUM_WARPS, enable_fp_fusion=False,  # no FMA contraction: the reference's roundings, bit for bit
    )


def _trading_observation_triton(codes: tuple[Tensor, ...], group: Tensor | None, market: TradingMarket,
                                params: TradingParams, out_dtype: torch.dtype, members: int | None) -> tuple[Tensor, ...]:
    b, dev = codes[0].shape[0], codes[0].device
    # [P, k, B/P, D]: two decoded halves form the replay's stacked pair (foxdqn.ops.replay_gather.stacked_pair),
    # so a Double DQN online forward reads s and s' without a concatenation
    p = members or 1
    pair = torch.empty(p, len(codes), b // p, params.window * params.num_features + 2, device=dev, dtype=out_dtype)
    if b > 0:
        _trading_observation_op(codes[0], codes[-1], pair, group if group is not None else codes[0], market.close,
                                market.features, params.fparams, params.window, params.num_features,
                                group is not None)
    return tuple(pair[0].unbind(0)) if members is None else _member_views(pair)


def _member_views(out: Tensor) -> tuple[Tensor, ...]:
    """The observations of each code tensor in ``out`` ``[P, k, B/P, D]``: ``[P, B/P, D]`` views, or
    ``[B, D]`` for P = 1 (the layout of :func:`foxdqn.ops.replay_gather.replay_gather`'s pair)."""
    return tuple(out[0, i] if out.shape[0] == 1 else out[:, i] for i in range(out.shape[1]))


def trading_observation_reference(codes: tuple[Tensor, ...], group: Tensor | None, market: TradingMarket,
                                  params: TradingParams, out_dtype: torch.dtype,
                                  members: int | None = None) -> tuple[Tensor, ...]:
    """Plain-torch reference of :func:`trading_observation` (same arguments): the env's
    :func:`~foxdqn.ops.trading_step.observation_reference` with a per-row ruin equity, of the
    decoded (and bar-clamped) codes, rounded to ``out_dtype``."""
    dt = market.close.dtype
    ruin = params.fparams[:, _RUIN] if group is None else params.fparams[group, _RUIN]  # [1] or [B]
    out = []
    for code in codes:
        t = code[:, CODE_T].to(torch.int64).clamp(params.window - 1, market.close.shape[0] - 1)
        units, entry, equity = (code[:, k].to(dt) for k in (CODE_UNITS, CODE_ENTRY, CODE_EQUITY))
        out.append(observation_reference(market, params, t, units, entry, equity, ruin=ruin).to(out_dtype))
    if members is not None:  # the kernel's shapes (contiguous here): [P, B/P, D], or [B, D] for P = 1
        d = out[0].shape[-1]
        return tuple(o if members == 1 else o.view(members, -1, d) for o in out)
    return tuple(out)


@compile_disabled
def trading_observation(codes: tuple[Tensor, ...], group: Tensor | None, market: TradingMarket,
                        params: TradingParams, out_dtype: torch.dtype = torch.float32,
                        backend: str = "auto", *, members: int | None = None) -> tuple[Tensor, ...]:
    """Rebuild trading observations from state codes: one kernel for one or two code tensors.

    Device ops only (no host reads): capturable in a CUDA graph. Shapes and dtypes are checked;
    values are not.

    Args:
        codes: one or two ``[B, 4]`` contiguous code tensors (``(t, units, entry_price, equity)``,
            :mod:`foxdqn.ops.trading_code`), float32 or float64, on the market's device: e.g. a
            batch's s and s' codes.
        group: int64 ``[B]`` parameter row of each code row (the env group its transition came
            from, ``env // (N // G)``), or None: row 0 for all (``G = 1``).
        market: the env's :class:`~foxdqn.ops.trading_step.TradingMarket` (env dtype).
        params: the env's :class:`~foxdqn.ops.trading_step.TradingParams` (``window``,
            ``num_features``, ``fparams``' ruin equity, ``window_offsets``).
        out_dtype: dtype of the observations (float32: what the network reads; float64 keeps the
            env's float64 values).
        backend: "auto" (Triton for CUDA tensors, torch for CPU), "triton", "torch".
        members: None, or P dividing B: the codes are P members' ``B/P`` rows each, member-major
            (a population's batch, module docstring).

    Returns:
        One ``[B, W*F+2]`` ``out_dtype`` observation per code tensor, in order: the env's
        observation of each coded state (:func:`foxdqn.ops.trading_step.observation_reference`)
        rounded to ``out_dtype``. On the Triton path two of them are the halves of one
        ``[1, 2, B, W*F+2]`` tensor, the replay's stacked pair
        (:func:`foxdqn.ops.replay_gather.stacked_pair`), which a Double DQN online forward reads
        without a concatenation. With ``members`` each is ``[P, B/P, W*F+2]`` (``[B, W*F+2]`` for
        P = 1), on the Triton path the halves of the pair ``[P, 2, B/P, W*F+2]``.

    Raises:
        ValueError: not one or two code tensors, a code tensor that is not ``[B, 4]`` contiguous
            float32/float64 on the market's device (the two of the same shape and dtype), a
            ``group`` that is not int64 ``[B]`` contiguous there, a non-floating ``out_dtype``,
            ``members`` not dividing B, or an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    codes = tuple(codes)
    _check_args(codes, group, market, params, out_dtype)
    if members is not None and (isinstance(members, bool) or not isinstance(members, int) or members < 1
                                or codes[0].shape[0] % members):
        raise ValueError(f"trading_observation: members must be None or an int >= 1 dividing B = "
                         f"{codes[0].shape[0]}, got {members!r}")
    if resolve_backend("trading_observation", backend, codes[0]) == "torch":
        return trading_observation_reference(codes, group, market, params, out_dtype, members)
    return _trading_observation_triton(codes, group, market, params, out_dtype, members)


def _check_args(codes, group, market, params, out_dtype) -> None:
    if len(codes) not in (1, 2):
        raise ValueError(f"trading_observation: codes must be one or two tensors, got {len(codes)}")
    dev = market.close.device
    first = codes[0]
    for k, code in enumerate(codes):
        if (code.dim() != 2 or code.shape[1] != CODE_WIDTH or code.dtype not in (torch.float32, torch.float64)
                or not code.is_contiguous() or code.device != dev or code.shape != first.shape
                or code.dtype != first.dtype):
            raise ValueError(f"trading_observation: codes[{k}] must be a contiguous float32/float64 [B, {CODE_WIDTH}] "
                             f"tensor on {dev} (all codes alike), got {code.dtype} {tuple(code.shape)} on "
                             f"{code.device}")
    if group is not None and (group.dtype != torch.int64 or tuple(group.shape) != (first.shape[0],)
                              or not group.is_contiguous() or group.device != dev):
        raise ValueError(f"trading_observation: group must be None or a contiguous int64 [{first.shape[0]}] tensor "
                         f"on {dev}, got {group.dtype} {tuple(group.shape)} on {group.device}")
    if not out_dtype.is_floating_point:
        raise ValueError(f"trading_observation: out_dtype must be a floating dtype, got {out_dtype}")
    if market.features.dim() != 2 or market.features.shape[1] != params.num_features \
            or not market.features.is_contiguous() or market.features.dtype != market.close.dtype:
        raise ValueError(f"trading_observation: market.features must be a contiguous [T, {params.num_features}] "
                         f"{market.close.dtype} tensor")
