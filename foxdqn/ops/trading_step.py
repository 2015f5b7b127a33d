r"""One step of N trading accounts with auto-reset, fused into one kernel.

The environment is :class:`foxdqn.envs.trading.TradingEnv`, whose
:meth:`~foxdqn.envs.trading.TradingEnv.step` calls this op; the execution model (order pricing,
fills, fees, accounting, reward) is the one of :mod:`foxdqn.execution.fills` and the action space
that of :mod:`foxdqn.execution.orders`. The reference (:func:`trading_step_reference`) is the env's
torch step, moved here unchanged: 185 small tensor ops at N = 4,096 (counted with a dispatch
mode), each a kernel launch on CUDA. The Triton kernel does the whole step in one launch, one
program per ``BLOCK`` envs:

1. decode the action ``a = exposure*9 + order_type*3 + urgency``;
2. the order ``dq = EXPOSURES[e] * equity_t / close_t - units`` (none when ``e`` is the exposure
   index held, or the env is frozen);
3. price and fill it (:func:`foxdqn.execution.fills.simulate_fills`): market and IoC read only the
   open of bar ``t+1`` and the spread ``s_t`` known at the decision, limit-maker fills on a
   trade-through of bar ``t+1``'s low/high;
4. book it (:func:`foxdqn.execution.fills.apply_fills`), mark to market at ``close_{t+1}``, reward
   ``log(max(equity_{t+1}, ruin)) - log(max(equity_t, ruin))``;
5. ruin (``terminated``), episode length / split end (``truncated``), episode return and length;
6. auto-reset of the envs that ended (training) or freeze (eval mode);
7. both observations (before and after the reset): ``W*F`` feature values gathered from the
   feature table, then the clipped exposure and unrealised PnL; the one before the reset
   (``next_obs``) is skipped when the caller stores state codes instead (``next_obs=False``);
8. training mode: the state codes of the replay (:mod:`foxdqn.ops.trading_code`): ``code`` of the
   state before the step (the one acted on) and ``next_code`` of the state after it, before the
   reset (the one ``next_obs`` observes); the replay stores them instead of the observations and
   rebuilds those with :func:`foxdqn.ops.trading_observation.trading_observation`
   (docs/design/replay.md#windowed-trading-replay).

Kernels per env step: one (this kernel) in eval mode or when the start range of an episode is a
single bar; two in training mode otherwise, since the start bars of the resets are drawn with
``torch.randint`` and the env's generator before the kernel (drawn for every env every step, as
the reference does, so the generator advances identically on both backends).

Precision
---------
Everything is computed in the env dtype (``float32`` or ``float64``, ``TradingEnv.dtype``): the
bars, the cost tables, the account state (cash, units, entry price, equity, episode return) and
the observations live in it, and the kernel does every operation in the dtype of its inputs
(constants come from the parameter rows in that dtype, never from a Python float, which Triton
would round to float32). With ``dtype=float64`` the accounting (cash, units, entry price, equity,
the log-equity reward and the episode return) is float64 end to end; integer state (bar index,
step count, exposure index) is int64.

The kernel evaluates the reference's expressions in the same order and association, is launched
with ``enable_fp_fusion=False`` (no multiply-add contraction) and divides with
``tl.math.div_rn`` (IEEE round-to-nearest, as torch does; Triton's plain float32 ``/`` is an
approximate division). Every value but the logarithm is then the reference's bit for bit; ``log``
comes from a different library (libdevice on CUDA, numpy in the interpreter, SLEEF in torch on
CPU), each within 1 ulp, so ``reward`` and ``episode_return`` may differ by a few ulps of
``log(equity)``.

Population
----------
The kernel is indexed by env and reads its parameters per env from ``fparams[g]`` / ``iparams[g]``
with ``g = i // envs_per_group`` (the cost tables, exposures, initial and ruin equity; the episode
length, first valid bar and last bar), so P agents x N envs with ``[P]`` hyperparameters step in
the same single launch with ``G = P`` parameter rows. Today ``G = 1``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.execution.fills import apply_fills, simulate_fills
from foxdqn.execution.orders import FLAT, factor
from foxdqn.ops.backend import resolve_backend
from foxdqn.ops.library import compile_disabled, device_op, wrap_triton
from foxdqn.ops.trading_code import CODE_WIDTH, state_code_dtype

#: Bound of the observation's two account values (exposure, unrealised PnL): they are clipped to
#: ``±ACCOUNT_OBS_CLIP`` so that the observation after ruin stays finite (the layout:
#: :mod:`foxdqn.envs.trading`, which re-exports it). Defined here, where the kernels read it, so
#: that this module does not import :mod:`foxdqn.envs` (which imports this module).
ACCOUNT_OBS_CLIP = 100.0

BLOCK = 32  # envs per program (4,096 envs: 128 programs)
NUM_WARPS = 1  # warps per program: one thread per env (4 are slower on the H200: docs/bench.md#launch-constants)
CHUNK = 64  # observation-window columns gathered per loop iteration

# fparams row layout (env dtype)
_SLIP, _LIMK, _IOC, _FEE, _EXPO, _INIT, _RUIN = 0, 3, 6, 9, 12, 17, 18
FP_WIDTH = 19
# iparams row layout (int64)
_EPLEN, _FIRST, _LAST = 0, 1, 2
IP_WIDTH = 3
# rows of the float output block
_O_REWARD, _O_PRICE, _O_FEE, _O_COST, _O_EXPOSURE, _O_EQUITY, _O_RETURN, _O_TRADED = range(8)


class TradingMarket(NamedTuple):
    """The bars of one instrument on the env device, env dtype, shared by every env.

    open, high, low, close: ``[T]`` mid prices (price units).  spread: ``[T]`` relative spread
    floored at ``spread_floor_bps * 1e-4`` (fraction of price).  features: ``[T, F]``
    contiguous, the normalised per-bar features.
    """

    open: Tensor
    high: Tensor
    low: Tensor
    close: Tensor
    spread: Tensor
    features: Tensor


class TradingState(NamedTuple):
    """The ``[N]`` state tensors of :class:`~foxdqn.envs.trading.TradingEnv`, updated in place.

    t: int64 current bar.  steps: int64 steps taken in the episode.  cash (cash units), units
    (instrument units), entry_price (price units), equity (cash units), episode_return (sum of
    rewards): env dtype.  exposure_idx: int64 exposure index held (0..4).  frozen: bool, eval
    mode's "episode over, waiting for reset_all".
    """

    t: Tensor
    steps: Tensor
    cash: Tensor
    units: Tensor
    entry_price: Tensor
    equity: Tensor
    exposure_idx: Tensor
    episode_return: Tensor
    frozen: Tensor


class TradingParams(NamedTuple):
    """The env's constants, as the reference reads them and packed for the kernel.

    exposures: ``[5]`` dtype.  tables: :class:`foxdqn.execution.fills.CostTables` (dtype).
    initial_equity, ruin_equity: cash units (Python floats).  window (W), num_features (F),
    episode_length (L), first_valid, last_bar, num_bars: ints.  eval_mode: bool.
    fparams: ``[G, 19]`` dtype rows ``slippage[3], limit_k[3], ioc_offset[3], fee_rate[3],
    exposures[5], initial_equity, ruin_equity``.  iparams: ``[G, 3]`` int64 rows
    ``episode_length, first_valid, last_bar``.  ``G = 1`` for one env population; env ``i``
    reads row ``i // (N // G)``.  window_offsets: ``[W]`` int64 ``-W+1 .. 0`` (the reference's
    window rows relative to ``t``).  code_dtype: dtype of the state codes (training mode,
    :func:`foxdqn.ops.trading_code.state_code_dtype` of the dtype and ``num_bars``).
    """

    exposures: Tensor
    tables: tuple
    initial_equity: float
    ruin_equity: float
    window: int
    num_features: int
    episode_length: int
    first_valid: int
    last_bar: int
    num_bars: int
    eval_mode: bool
    fparams: Tensor
    iparams: Tensor
    window_offsets: Tensor
    code_dtype: torch.dtype


def trading_params(*, exposures: Tensor, tables, initial_equity: float, ruin_equity: float, window: int,
                   num_features: int, episode_length: int, first_valid: int, last_bar: int, num_bars: int,
                   eval_mode: bool) -> TradingParams:
    """Build :class:`TradingParams` with one parameter row (``G = 1``). The packed rows hold the very
    tensors the reference reads (same dtype rounding), and ``initial_equity`` / ``ruin_equity``
    rounded to the dtype as torch rounds a Python float scalar."""
    dev, dt = exposures.device, exposures.dtype
    scalars = torch.tensor([float(initial_equity), float(ruin_equity)], device=dev, dtype=dt)
    fparams = torch.cat([tables.slippage, tables.limit_k, tables.ioc_offset, tables.fee_rate, exposures,
                         scalars]).reshape(1, FP_WIDTH).contiguous()
    iparams = torch.tensor([[int(episode_length), int(first_valid), int(last_bar)]], device=dev, dtype=torch.int64)
    return TradingParams(exposures, tables, float(initial_equity), float(ruin_equity), int(window), int(num_features),
                         int(episode_length), int(first_valid), int(last_bar), int(num_bars), bool(eval_mode),
                         fparams, iparams, torch.arange(-int(window) + 1, 1, device=dev, dtype=torch.long),
                         state_code_dtype(dt, int(num_bars)))


class TradingStepOut(NamedTuple):
    """Outputs of one step (fresh tensors; the state is updated in place), ``N`` envs, dtype unless said.

    next_obs: ``[N, W*F+2]`` observation after the step, before the reset (None when the step was
    asked for none: :func:`trading_step`'s ``next_obs``).  obs: ``[N, W*F+2]``
    after the reset (the same tensor as ``next_obs`` in eval mode).  reward: log-equity change.
    terminated, truncated, done, fill: bool.  fill_price (price units, 0 without a fill), fee
    (cash, negative = rebate), cost (cash), traded (signed units, 0 without a fill), exposure
    (``EXPOSURES`` of the index held after the step), equity (after the step, before the reset),
    episode_return (of the episode that ended on this step, else 0).  episode_length: int64,
    likewise.  code, next_code: ``[N, 4]`` ``params.code_dtype`` state codes ``(t, units,
    entry_price, equity)`` (:mod:`foxdqn.ops.trading_code`) of the state before the step and of
    the one after it, before the reset (``next_obs``'s state); None in eval mode.
    """

    next_obs: Tensor | None
    obs: Tensor
    reward: Tensor
    terminated: Tensor
    truncated: Tensor
    done: Tensor
    fill: Tensor
    fill_price: Tensor
    fee: Tensor
    cost: Tensor
    traded: Tensor
    exposure: Tensor
    equity: Tensor
    episode_return: Tensor
    episode_length: Tensor
    code: Tensor | None = None
    next_code: Tensor | None = None


# ---------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def _div(a, b):
    # IEEE round-to-nearest division, as torch divides: Triton's float32 `/` is approximate
    # (div.full.f32); its float64 `/` is already div.rn.f64 (div_rn takes float32 only)
    if a.dtype.is_fp32():
        return tl.math.div_rn(a, b)
    else:
        return a / b


@triton.jit
def _sign(x, zero, one):
    return tl.where(x > zero, one, tl.where(x < zero, -one, zero))


@triton.jit
def _store_account_obs(out_ptr, at, close_ptr, t, units, entry, equity, ruin, OBS_CLIP, m):
    """Store the account part of an observation at ``out_ptr + at`` (clipped exposure, then clipped
    unrealised PnL, :func:`observation_reference`'s expressions and order) for the state
    (``t``, ``units``, ``entry``, ``equity``), cast to the output's dtype."""
    odt = out_ptr.dtype.element_ty
    close = tl.load(close_ptr + t, mask=m, other=1.0)
    denom = tl.maximum(equity, ruin)
    x = _div(units * close, denom)
    u = _div(units * (close - entry), denom)
    tl.store(out_ptr + at, tl.minimum(tl.maximum(x, -OBS_CLIP), OBS_CLIP).to(odt), mask=m)
    tl.store(out_ptr + at + 1, tl.minimum(tl.maximum(u, -OBS_CLIP), OBS_CLIP).to(odt), mask=m)


@triton.jit
def _trading_step_kernel(
    t_ptr, steps_ptr, cash_ptr, units_ptr, entry_ptr, equity_ptr, expo_ptr, ret_ptr, frozen_ptr,
    action_ptr, starts_ptr,
    open_ptr, high_ptr, low_ptr, close_ptr, spread_ptr, feat_ptr,
    fparams_ptr, iparams_ptr,
    next_obs_ptr, obs_ptr, fout_ptr, flags_ptr, len_ptr, code_ptr, next_code_ptr,
    N, num_bars, envs_per_group, W, F, OBS_DIM,
    EVAL: tl.constexpr, NEXT_OBS: tl.constexpr, CODE_W: tl.constexpr, HAS_STARTS: tl.constexpr, BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
    FPW: tl.constexpr, IPW: tl.constexpr, SLIP: tl.constexpr, LIMK: tl.constexpr, IOC: tl.constexpr,
    FEE: tl.constexpr, EXPO: tl.constexpr, INIT: tl.constexpr, RUIN: tl.constexpr, EPLEN: tl.constexpr,
    FIRST: tl.constexpr, LAST: tl.constexpr, FLAT_IDX: tl.constexpr, OBS_CLIP: tl.constexpr,
):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    i64 = i.to(tl.int64)
    grp = (i // envs_per_group).to(tl.int64)
    fp = fparams_ptr + grp * FPW
    ip = iparams_ptr + grp * IPW

    # ---- state and action
    t = tl.load(t_ptr + i64, mask=m, other=0)
    steps = tl.load(steps_ptr + i64, mask=m, other=0)
    cash = tl.load(cash_ptr + i64, mask=m, other=0.0)
    units = tl.load(units_ptr + i64, mask=m, other=0.0)
    entry = tl.load(entry_ptr + i64, mask=m, other=0.0)
    equity = tl.load(equity_ptr + i64, mask=m, other=1.0)
    expo_idx = tl.load(expo_ptr + i64, mask=m, other=FLAT_IDX)
    ep_ret = tl.load(ret_ptr + i64, mask=m, other=0.0)
    frozen = tl.load(frozen_ptr + i64, mask=m, other=0) != 0
    action = tl.load(action_ptr + i64, mask=m, other=0).to(tl.int64)
    # factor(): exposure, order type, urgency (clamped so an out-of-range action never reads
    # outside the tables; its result is undefined, as in the reference)
    e_new = tl.minimum(tl.maximum(action // 9, 0), 4)
    rest = action - (action // 9) * 9
    otype = tl.minimum(tl.maximum(rest // 3, 0), 2)
    urg = tl.minimum(tl.maximum(rest - (rest // 3) * 3, 0), 2)

    dt = cash.dtype
    zero = tl.zeros([BLOCK], dtype=dt)
    one = zero + 1

    # ---- bars: decision bar t, next bar t+1 (clamped: only a frozen env sits on the last bar)
    t_n = tl.minimum(t + 1, num_bars - 1)
    close_t = tl.load(close_ptr + t, mask=m, other=1.0)
    spread_t = tl.load(spread_ptr + t, mask=m, other=0.0)
    close_n = tl.load(close_ptr + t_n, mask=m, other=1.0)
    open_n = tl.load(open_ptr + t_n, mask=m, other=1.0)
    high_n = tl.load(high_ptr + t_n, mask=m, other=1.0)
    low_n = tl.load(low_ptr + t_n, mask=m, other=1.0)

    # ---- per-env parameters
    x_new = tl.load(fp + EXPO + e_new, mask=m, other=0.0)
    slip = tl.load(fp + SLIP + urg, mask=m, other=0.0)
    limit_k = tl.load(fp + LIMK + urg, mask=m, other=0.0)
    ioc_off = tl.load(fp + IOC + urg, mask=m, other=0.0)
    fee_rate = tl.load(fp + FEE + otype, mask=m, other=0.0)
    init_eq = tl.load(fp + INIT, mask=m, other=1.0)
    ruin = tl.load(fp + RUIN, mask=m, other=1.0)
    ep_len = tl.load(ip + EPLEN, mask=m, other=1)
    first_valid = tl.load(ip + FIRST, mask=m, other=0)
    last_bar = tl.load(ip + LAST, mask=m, other=0)

    # ---- the order
    alive = frozen == 0
    order = alive & (e_new != expo_idx)
    target_units = _div(x_new * equity, close_t)
    dq = tl.where(order, target_units - units, zero)

    # ---- simulate_fills
    sgn = _sign(dq, zero, one)
    buy = sgn > zero
    sell = sgn < zero
    half = spread_t * 0.5
    p_market = open_n * (1 + sgn * (half + slip))
    p_limit = close_t * (1 - sgn * limit_k * half)
    fill_limit = (buy & (low_n < p_limit)) | (sell & (high_n > p_limit))
    l_ioc = close_t * (1 + sgn * (half + ioc_off))
    touch = open_n * (1 + sgn * half)
    fill_ioc = (buy & (l_ioc >= touch)) | (sell & (l_ioc <= touch))
    swept = touch * (1 + sgn * slip)
    p_ioc = tl.where(buy, tl.minimum(l_ioc, swept), tl.maximum(l_ioc, swept))
    is_market = otype == 0
    is_limit = otype == 1
    price = tl.where(is_market, p_market, tl.where(is_limit, p_limit, p_ioc))
    fill = tl.where(is_market, buy | sell, tl.where(is_limit, fill_limit, fill_ioc))
    traded = tl.where(fill, dq, zero)
    price = tl.where(fill, price, zero)
    fee = tl.abs(traded) * price * fee_rate
    ref_mid = tl.where(is_limit, close_t, open_n)
    cost = tl.where(fill, traded * (price - ref_mid) + fee, zero)

    # ---- apply_fills
    cash1 = cash - traded * price - fee
    units1 = units + traded
    s_old = _sign(units, zero, one)
    s_new = _sign(units1, zero, one)
    opening = (s_old == zero) | (s_new != s_old)
    adding = (s_old != zero) & (_sign(traded, zero, one) == s_old)
    safe_units = tl.where(units1 == zero, one, units1)
    average = _div(units * entry + traded * price, safe_units)
    booked = tl.where(s_new == zero, zero, tl.where(opening, price, tl.where(adding, average, entry)))
    entry1 = tl.where(fill, booked, entry)
    expo1 = tl.where(fill, e_new, expo_idx)
    equity1 = tl.where(alive, cash1 + units1 * close_n, equity)
    t1 = tl.where(alive, t + 1, t)
    steps1 = tl.where(alive, steps + 1, steps)

    # ---- reward, episode ends
    log_eq0 = tl.log(tl.maximum(equity, ruin))
    log_eq1 = tl.log(tl.maximum(equity1, ruin))
    reward = tl.where(alive, log_eq1 - log_eq0, zero)
    terminated = alive & (equity1 <= ruin)
    if EVAL:
        limit = t1 >= last_bar
    else:
        limit = (t1 >= last_bar) | (steps1 >= ep_len)
    truncated = (alive & limit & (terminated == 0)) | frozen
    done = terminated | truncated
    ep_ret1 = ep_ret + reward

    # ---- outputs of the step
    tl.store(fout_ptr + 0 * N + i64, reward, mask=m)
    tl.store(fout_ptr + 1 * N + i64, price, mask=m)
    tl.store(fout_ptr + 2 * N + i64, fee, mask=m)
    tl.store(fout_ptr + 3 * N + i64, cost, mask=m)
    tl.store(fout_ptr + 4 * N + i64, tl.load(fp + EXPO + expo1, mask=m, other=0.0), mask=m)
    tl.store(fout_ptr + 5 * N + i64, equity1, mask=m)
    tl.store(fout_ptr + 6 * N + i64, tl.where(done, ep_ret1, zero), mask=m)
    tl.store(fout_ptr + 7 * N + i64, traded, mask=m)
    tl.store(flags_ptr + 0 * N + i64, terminated.to(tl.uint8), mask=m)
    tl.store(flags_ptr + 1 * N + i64, truncated.to(tl.uint8), mask=m)
    tl.store(flags_ptr + 2 * N + i64, done.to(tl.uint8), mask=m)
    tl.store(flags_ptr + 3 * N + i64, fill.to(tl.uint8), mask=m)
    tl.store(len_ptr + i64, tl.where(done, steps1, 0), mask=m)

    # ---- account part of next_obs (the observation of (t1, units1, entry1, equity1))
    row = i64 * OBS_DIM
    WF = W * F
    if NEXT_OBS:
        _store_account_obs(next_obs_ptr, row + WF, close_ptr, t1, units1, entry1, equity1, ruin, OBS_CLIP, m)

    # ---- state codes (training): (t, units, entry, equity) before the step and after it, before the
    # reset; int64 bar and env-dtype values converted exactly (trading_code.state_code_dtype)
    if not EVAL:
        cdt = code_ptr.dtype.element_ty
        crow = i64 * CODE_W
        tl.store(code_ptr + crow + 0, t.to(cdt), mask=m)
        tl.store(code_ptr + crow + 1, units.to(cdt), mask=m)
        tl.store(code_ptr + crow + 2, entry.to(cdt), mask=m)
        tl.store(code_ptr + crow + 3, equity.to(cdt), mask=m)
        tl.store(next_code_ptr + crow + 0, t1.to(cdt), mask=m)
        tl.store(next_code_ptr + crow + 1, units1.to(cdt), mask=m)
        tl.store(next_code_ptr + crow + 2, entry1.to(cdt), mask=m)
        tl.store(next_code_ptr + crow + 3, equity1.to(cdt), mask=m)

    # ---- new state: auto-reset (training) or freeze (eval)
    if EVAL:
        tl.store(frozen_ptr + i64, (frozen | done).to(tl.uint8), mask=m)
        t_o = t1
    else:
        if HAS_STARTS:
            start = tl.load(starts_ptr + i64, mask=m, other=0)
        else:
            start = first_valid
        t_o = tl.where(done, start, t1)
        steps1 = tl.where(done, 0, steps1)
        cash1 = tl.where(done, init_eq, cash1)
        units1 = tl.where(done, zero, units1)
        entry1 = tl.where(done, zero, entry1)
        equity1 = tl.where(done, init_eq, equity1)
        expo1 = tl.where(done, FLAT_IDX, expo1)
        ep_ret1 = tl.where(done, zero, ep_ret1)
        tl.store(frozen_ptr + i64, tl.zeros([BLOCK], dtype=tl.uint8), mask=m)
        # account part of obs (the observation of the state after the reset)
        _store_account_obs(obs_ptr, row + WF, close_ptr, t_o, units1, entry1, equity1, ruin, OBS_CLIP, m)
    tl.store(t_ptr + i64, t_o, mask=m)
    tl.store(steps_ptr + i64, steps1, mask=m)
    tl.store(cash_ptr + i64, cash1, mask=m)
    tl.store(units_ptr + i64, units1, mask=m)
    tl.store(entry_ptr + i64, entry1, mask=m)
    tl.store(equity_ptr + i64, equity1, mask=m)
    tl.store(expo_ptr + i64, expo1, mask=m)
    tl.store(ret_ptr + i64, ep_ret1, mask=m)

    # ---- window part of the observations: rows t-W+1 .. t of the [T, F] feature table are the
    # W*F contiguous values from (t-W+1)*F (first_valid >= W-1, so never before row 0)
    src_n = (t1 - W + 1) * F
    src_o = (t_o - W + 1) * F
    for c in range(0, WF, CHUNK):
        j = c + tl.arange(0, CHUNK)
        m2 = m[:, None] & (j < WF)[None, :]
        dst = row[:, None] + j[None, :]
        if NEXT_OBS:
            v = tl.load(feat_ptr + src_n[:, None] + j[None, :], mask=m2, other=0.0)
            tl.store(next_obs_ptr + dst, v, mask=m2)
        if not EVAL:
            vo = tl.load(feat_ptr + src_o[:, None] + j[None, :], mask=m2, other=0.0)
            tl.store(obs_ptr + dst, vo, mask=m2)


# ---------------------------------------------------------------------------------------------
# Launcher (a device_op: registered with torch.library by register_ops(), foxdqn/ops/library.py)
# ---------------------------------------------------------------------------------------------
@device_op("foxdqn::trading_step", mutates_args={
    "t", "steps", "cash", "units", "entry_price", "equity", "exposure_idx", "episode_return", "frozen",
    "next_obs", "obs", "fout", "flags", "episode_length", "code", "next_code"})
def _trading_step_op(t: Tensor, steps: Tensor, cash: Tensor, units: Tensor, entry_price: Tensor, equity: Tensor,
                     exposure_idx: Tensor, episode_return: Tensor, frozen: Tensor, action: Tensor, starts: Tensor,
                     open_: Tensor, high: Tensor, low: Tensor, close: Tensor, spread: Tensor, features: Tensor,
                     fparams: Tensor, iparams: Tensor, next_obs: Tensor, obs: Tensor, fout: Tensor, flags: Tensor,
                     episode_length: Tensor, code: Tensor, next_code: Tensor, num_bars: int, envs_per_group: int,
                     window: int, num_features: int,
                     eval_mode: bool, has_starts: bool, with_next_obs: bool) -> None:
    n = t.shape[0]
    wrap_triton(_trading_step_kernel)[(triton.cdiv(n, BLOCK),)](
        t, steps, cash, units, entry_price, equity, exposure_idx, episode_return, frozen,
        action, starts, open_, high, low, close, spread, features, fparams, iparams,
        next_obs, obs, fout, flags, episode_length, code, next_code,
        n, num_bars, envs_per_group, window, num_features, window * num_features + 2,
        EVAL=eval_mode, NEXT_OBS=with_next_obs, CODE_W=CODE_WIDTH, HAS_STARTS=has_starts, BLOCK=BLOCK, CHUNK=CHUNK, FPW=FP_WIDTH, IPW=IP_WIDTH,
        SLIP=_SLIP, LIMK=_LIMK, IOC=_IOC, FEE=_FEE, EXPO=_EXPO, INIT=_INIT, RUIN=_RUIN, EPLEN=_EPLEN, FIRST=_FIRST,
        LAST=_LAST, FLAT_IDX=FLAT, OBS_CLIP=ACCOUNT_OBS_CLIP, num_warps=NUM_WARPS,
        enable_fp_fusion=False,  # no FMA contraction: the reference's roundings, bit for bit
    )


def _trading_step_triton(state: TradingState, action: Tensor, starts: Tensor | None, market: TradingMarket,
                         params: TradingParams, next_obs: bool) -> TradingStepOut:
    n, dev, dt = state.t.shape[0], state.t.device, state.cash.dtype
    obs_dim = params.window * params.num_features + 2
    with_next_obs = next_obs
    next_obs = torch.empty(n if with_next_obs else 0, obs_dim, device=dev, dtype=dt)
    obs = torch.empty(0 if params.eval_mode else n, obs_dim, device=dev, dtype=dt)  # eval: obs is next_obs
    fout = torch.empty(8, n, device=dev, dtype=dt)
    flags = torch.empty(4, n, device=dev, dtype=torch.uint8)
    episode_length = torch.empty(n, device=dev, dtype=torch.int64)
    codes = torch.empty(2, 0 if params.eval_mode else n, CODE_WIDTH, device=dev, dtype=params.code_dtype)
    groups = params.fparams.shape[0]
    has_starts = starts is not None
    _trading_step_op(
        state.t, state.steps, state.cash, state.units, state.entry_price, state.equity, state.exposure_idx,
        state.episode_return, state.frozen.view(torch.uint8), action,
        starts if has_starts else torch.empty(0, device=dev, dtype=torch.int64),
        market.open, market.high, market.low, market.close, market.spread, market.features,
        params.fparams, params.iparams, next_obs, obs, fout, flags, episode_length, codes[0], codes[1],
        params.num_bars, n // groups, params.window, params.num_features, params.eval_mode, has_starts,
        with_next_obs,
    )
    term, trunc, done, fill = flags.view(torch.bool).unbind(0)
    return TradingStepOut(
        next_obs=next_obs if with_next_obs else None, obs=next_obs if params.eval_mode else obs,
        reward=fout[_O_REWARD], terminated=term,
        truncated=trunc, done=done,
        fill=fill, fill_price=fout[_O_PRICE], fee=fout[_O_FEE], cost=fout[_O_COST], traded=fout[_O_TRADED],
        exposure=fout[_O_EXPOSURE], equity=fout[_O_EQUITY], episode_return=fout[_O_RETURN],
        episode_length=episode_length,
        code=None if params.eval_mode else codes[0], next_code=None if params.eval_mode else codes[1],
    )


# ---------------------------------------------------------------------------------------------
# Reference (the torch step of TradingEnv, unchanged)
# ---------------------------------------------------------------------------------------------
def observation_reference(market: TradingMarket, params: TradingParams, t: Tensor, units: Tensor, entry: Tensor,
                          equity: Tensor, ruin: Tensor | None = None) -> Tensor:
    """Observation ``[N, W*F+2]`` (env dtype) of the accounts ``(units, entry, equity)`` at bars ``t``
    (the layout: :mod:`foxdqn.envs.trading`).

    Args:
        market, params: the env's bars and parameters.
        t: int64 ``[N]`` bars in ``[W-1, T-1]``; units, entry, equity: ``[N]`` env dtype.
        ruin: the floor of the account values' denominator, ``max(equity, ruin)``: env dtype
            ``[N]`` or ``[1]``, one per row (the replay's decode,
            :func:`foxdqn.ops.trading_observation.trading_observation_reference`); None:
            ``params.ruin_equity`` for all rows (the env's step).
    """
    rows = t.unsqueeze(1) + params.window_offsets  # [N, W]
    window = market.features[rows].reshape(t.shape[0], -1)  # [N, W*F]
    close = market.close[t]
    denom = equity.clamp(min=params.ruin_equity) if ruin is None else torch.maximum(equity, ruin)
    exposure = (units * close / denom).clamp(-ACCOUNT_OBS_CLIP, ACCOUNT_OBS_CLIP)
    upnl = (units * (close - entry) / denom).clamp(-ACCOUNT_OBS_CLIP, ACCOUNT_OBS_CLIP)
    return torch.cat([window, exposure.unsqueeze(1), upnl.unsqueeze(1)], dim=1)


def state_code_reference(t: Tensor, units: Tensor, entry: Tensor, equity: Tensor, code_dtype: torch.dtype) -> Tensor:
    """State codes ``[N, 4]`` (``code_dtype``) of the accounts ``(units, entry, equity)`` at bars ``t``
    (:mod:`foxdqn.ops.trading_code`): the four values converted exactly."""
    return torch.stack([t.to(code_dtype), units.to(code_dtype), entry.to(code_dtype), equity.to(code_dtype)], dim=1)


def reset_where_reference(state: TradingState, mask: Tensor, starts: Tensor, params: TradingParams) -> None:
    """Reset the envs where ``mask`` (``[N]`` bool) to a fresh flat episode at bars ``starts``
    (``[N]`` int64), in place."""
    dev, dt = state.cash.device, state.cash.dtype
    zero = torch.zeros((), device=dev, dtype=dt)
    init = torch.full((), params.initial_equity, device=dev, dtype=dt)
    state.t.copy_(torch.where(mask, starts, state.t))
    state.steps.masked_fill_(mask, 0)
    state.cash.copy_(torch.where(mask, init, state.cash))
    state.units.copy_(torch.where(mask, zero, state.units))
    state.entry_price.copy_(torch.where(mask, zero, state.entry_price))
    state.equity.copy_(torch.where(mask, init, state.equity))
    state.exposure_idx.masked_fill_(mask, FLAT)
    state.episode_return.copy_(torch.where(mask, zero, state.episode_return))
    state.frozen.masked_fill_(mask, False)


def trading_step_reference(state: TradingState, action: Tensor, starts: Tensor | None, market: TradingMarket,
                           params: TradingParams, next_obs: bool = True) -> TradingStepOut:
    """Plain-torch reference of :func:`trading_step` (same arguments, same in-place writes): the
    step of :class:`~foxdqn.envs.trading.TradingEnv` in torch ops."""
    with_next_obs = next_obs
    exposure_new, order_type, urgency = factor(action)
    dev, dt = state.cash.device, state.cash.dtype
    zero = torch.zeros((), device=dev, dtype=dt)

    t = state.t
    code = None if params.eval_mode else state_code_reference(t, state.units, state.entry_price, state.equity,
                                                                params.code_dtype)
    t_next_bar = (t + 1).clamp_(max=params.num_bars - 1)  # clamp only matters for a frozen env
    close_t = market.close[t]
    close_n = market.close[t_next_bar]
    equity = state.equity
    units = state.units

    alive = ~state.frozen
    order = alive & (exposure_new != state.exposure_idx)
    target_units = params.exposures[exposure_new] * equity / close_t
    dq = torch.where(order, target_units - units, zero)

    fills = simulate_fills(
        dq=dq,
        order_type=order_type,
        urgency=urgency,
        close_t=close_t,
        spread_t=market.spread[t],
        open_n=market.open[t_next_bar],
        high_n=market.high[t_next_bar],
        low_n=market.low[t_next_bar],
        tables=params.tables,
    )
    cash1, units1, entry1 = apply_fills(state.cash, units, state.entry_price, fills)
    exposure_idx1 = torch.where(fills.fill, exposure_new, state.exposure_idx)
    equity1 = torch.where(alive, cash1 + units1 * close_n, equity)
    t1 = torch.where(alive, t + 1, t)
    steps1 = torch.where(alive, state.steps + 1, state.steps)

    log_eq0 = torch.log(equity.clamp(min=params.ruin_equity))
    log_eq1 = torch.log(equity1.clamp(min=params.ruin_equity))
    reward = torch.where(alive, log_eq1 - log_eq0, zero)
    terminated = alive & (equity1 <= params.ruin_equity)
    if params.eval_mode:
        limit = t1 >= params.last_bar
    else:
        limit = (t1 >= params.last_bar) | (steps1 >= params.episode_length)
    truncated = (alive & limit & ~terminated) | state.frozen
    done = terminated | truncated
    episode_return1 = state.episode_return + reward

    next_obs = observation_reference(market, params, t1, units1, entry1, equity1) if with_next_obs else None
    next_code = None if params.eval_mode else state_code_reference(t1, units1, entry1, equity1, params.code_dtype)
    out = dict(
        fill=fills.fill,
        fill_price=fills.price,
        fee=fills.fee,
        cost=fills.cost,
        exposure=params.exposures[exposure_idx1],
        equity=equity1,
        episode_return=torch.where(done, episode_return1, zero),
        done=done,
        episode_length=torch.where(done, steps1, torch.zeros_like(steps1)),
        traded=fills.traded,
        code=code,
        next_code=next_code,
    )

    state.t.copy_(t1)
    state.steps.copy_(steps1)
    state.cash.copy_(cash1)
    state.units.copy_(units1)
    state.entry_price.copy_(entry1)
    state.equity.copy_(equity1)
    state.exposure_idx.copy_(exposure_idx1)
    state.episode_return.copy_(episode_return1)
    if params.eval_mode:
        state.frozen.logical_or_(done)
        obs = next_obs
    else:
        if starts is None:
            starts = torch.full_like(state.t, params.first_valid)
        reset_where_reference(state, done, starts, params)
        obs = observation_reference(market, params, state.t, state.units, state.entry_price, state.equity)
    return TradingStepOut(next_obs=next_obs, obs=obs, reward=reward, terminated=terminated, truncated=truncated,
                          **out)


# ---------------------------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------------------------
@compile_disabled
def trading_step(state: TradingState, action: Tensor, starts: Tensor | None, market: TradingMarket,
                 params: TradingParams, backend: str = "auto", next_obs: bool = True) -> TradingStepOut:
    """Step N trading accounts once: fill, book, mark, reward, end and auto-reset (module docstring).

    Device ops only (no host reads): capturable in a CUDA graph. Shapes are checked; values are
    not (that would need a sync).

    Args:
        state: :class:`TradingState`, ``[N]`` contiguous tensors on one device; updated in place
            (after the step, with the envs that ended reset in training mode, or frozen in eval
            mode).
        action: ``[N]`` integer, ``0..44`` (``exposure*9 + order_type*3 + urgency``); results for
            other values are undefined.
        starts: ``[N]`` int64 start bars of the episodes that reset on this step (training mode;
            one draw per env whether or not it resets), or None: every reset starts at
            ``params.first_valid`` (and always None in eval mode, which never resets).
        market: :class:`TradingMarket` on the state's device, in the accounting dtype.
        params: :class:`TradingParams` (from :func:`trading_params`).
        backend: "auto" (Triton for CUDA tensors, torch for CPU), "triton", "torch".
        next_obs: False (training mode only): ``next_obs`` is neither computed nor returned (None),
            for a caller that stores the state codes instead (the windowed replay): the kernel
            then gathers one observation window per env instead of two.

    Returns:
        :class:`TradingStepOut`.

    Raises:
        ValueError: a wrong dtype, shape or device of an argument, an unknown backend, or
            ``next_obs=False`` in eval mode (where ``obs`` is ``next_obs``).
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check_args(state, action, starts, market, params)
    if not next_obs and params.eval_mode:
        raise ValueError("next_obs=False is for training mode only: in eval mode obs is next_obs")
    if resolve_backend("trading_step", backend, state.t) == "torch":
        return trading_step_reference(state, action, starts, market, params, next_obs)
    return _trading_step_triton(state, action, starts, market, params, next_obs)


def _check_args(state, action, starts, market, params) -> None:
    t = state.t
    n, dev, dt = t.shape[0], t.device, market.close.dtype  # the accounting dtype
    expect = dict(t=torch.int64, steps=torch.int64, cash=dt, units=dt, entry_price=dt, equity=dt,
                  exposure_idx=torch.int64, episode_return=dt, frozen=torch.bool)
    for name, dtype in expect.items():
        x = getattr(state, name)
        if x.dtype != dtype or tuple(x.shape) != (n,) or not x.is_contiguous() or x.device != dev:
            raise ValueError(f"state.{name} must be a contiguous {dtype} tensor [{n}] on {dev}, got "
                             f"{x.dtype} {tuple(x.shape)} on {x.device}")
    if action.dtype.is_floating_point or tuple(action.shape) != (n,) or not action.is_contiguous() \
            or action.device != dev:
        raise ValueError(f"action must be a contiguous integer tensor [{n}] on {dev}, got {action.dtype} "
                         f"{tuple(action.shape)} on {action.device}")
    if starts is not None and (starts.dtype != torch.int64 or tuple(starts.shape) != (n,)
                               or not starts.is_contiguous() or starts.device != dev):
        raise ValueError(f"starts must be None or a contiguous int64 tensor [{n}] on {dev}")
    if starts is not None and params.eval_mode:
        raise ValueError("starts must be None in eval mode (it never resets)")
    for name in TradingMarket._fields:
        x = getattr(market, name)
        if x.dtype != dt or not x.is_contiguous() or x.device != dev:
            raise ValueError(f"market.{name} must be a contiguous {dt} tensor on {dev}")
    if market.features.dim() != 2 or market.features.shape[1] != params.num_features:
        raise ValueError(f"market.features must be [T, {params.num_features}]")
    groups = params.fparams.shape[0]
    if (params.fparams.dtype != dt or tuple(params.fparams.shape) != (groups, FP_WIDTH)
            or params.iparams.dtype != torch.int64 or tuple(params.iparams.shape) != (groups, IP_WIDTH)
            or n % groups != 0 or params.fparams.device != dev or params.iparams.device != dev):
        raise ValueError(f"params.fparams / iparams must be [G, {FP_WIDTH}] {dt} / [G, {IP_WIDTH}] int64 on {dev} "
                         f"with G dividing N = {n}")
