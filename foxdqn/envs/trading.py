r"""Batched, GPU-resident, CUDA-graph-capturable trading environment.

:class:`TradingEnv` steps ``N`` independent single-instrument trading accounts over one split of a
bar series. The execution model (order pricing, fills, fees, accounting, reward) is documented
in :mod:`foxdqn.envs.execution`; the action space in :mod:`foxdqn.envs.actions`.

Observation
-----------
``obs[i]`` (``[obs_dim] = [W*F + 2]``, env ``dtype``) for env ``i`` at current bar ``t``:

* the feature rows ``t-W+1 .. t`` flattened row-major (``W*F`` values; row ``t-W+1`` first);
* current exposure ``units * close_t / equity_t``;
* unrealised PnL ``units * (close_t - entry_price) / equity_t``.

The two account values divide by ``max(equity, 1e-6 * initial_equity)`` and are clipped to
``±ACCOUNT_OBS_CLIP`` so that the observation after ruin stays finite.

Episodes
--------
The split ``(start, end)`` is half-open: bars ``start .. end-1``. The first valid bar is
``first_valid = max(start, W-1)`` (the window may reach rows before ``start``: that is causal);
the last bar is ``last_bar = end - 1``. A training episode starts flat with
``equity = initial_equity`` at a bar drawn uniformly from ``[first_valid, last_bar - L]``
(``first_valid`` when that range is empty) and ends after ``L`` steps or when the current bar
reaches ``last_bar`` (``truncated``), or on ruin (``terminated``, which takes precedence: the two
flags are never both true). Envs that end are reset inside the same :meth:`TradingEnv.step`
(auto-reset, branch-free with ``torch.where``): ``StepOut.next_obs`` is the observation before
the reset (store it in replay), ``StepOut.obs`` the one after (act on it).

Eval mode (``eval_mode=True``, ``num_envs`` must be 1): :meth:`TradingEnv.reset_all` starts at
``first_valid``; ``episode_length`` is ignored and the episode runs to ``last_bar`` (or ruin); no
randomness is used. There is no auto-reset: once the episode has ended the env is frozen — every
further :meth:`TradingEnv.step` sends no order, leaves the state unchanged and returns reward 0,
``terminated=False``, ``truncated=True``, ``episode_done=True`` and ``episode_return`` = the
finished episode's return again — until the next :meth:`TradingEnv.reset_all`.
:meth:`TradingEnv.run_policy` walks the split once and returns the equity curve on the host.

Graph capture
-------------
:meth:`TradingEnv.reset_all`, :meth:`TradingEnv.observe`, :meth:`TradingEnv.step` and
:meth:`TradingEnv.market_state` only launch fixed-shape tensor ops on the env device, never read a
device value on the host, and update the state tensors in place; their randomness comes only
from the ``generator`` given to the constructor (in training mode one ``randint`` of ``[N]``
per ``step`` and per ``reset_all``, drawn for every env whether or not it resets, so the
generator advances by the same amount every step; none when the start range is a single bar).
To capture them in a ``torch.cuda.CUDAGraph`` with a non-default generator, register it first:
``graph.register_generator_state(generator)``. Actions are not range-checked (that would need a
sync): results for actions outside ``0..44`` are undefined (an exposure index >= 5 raises
``IndexError`` on CPU and a device-side assert on CUDA; negative actions wrap around).
"""
from __future__ import annotations

import numbers
from typing import Callable, NamedTuple

import numpy as np
import torch
from torch import Tensor

from foxdqn.errors import ConfigError, DataError

from .actions import EXPOSURES, FLAT, NUM_ACTIONS, factor
from .execution import RUIN_FRACTION, ExecutionConfig, apply_fills, cost_tables, simulate_fills

__all__ = ["ExecutionConfig", "StepOut", "TradingEnv", "ACCOUNT_OBS_CLIP"]

ACCOUNT_OBS_CLIP = 100.0

_RUN_POLICY_CHECK_EVERY = 256  # run_policy reads the done flag back every this many steps


class StepOut(NamedTuple):
    """Result of :meth:`TradingEnv.step`; every tensor is on the env device with leading dim ``N``.

    Attributes:
        next_obs: ``[N, obs_dim]`` dtype: observation after the step, before auto-reset (replay).
        reward: ``[N]`` dtype: ``log(equity_{t+1}) - log(equity_t)`` (ruin: equity floored).
        terminated: ``[N]`` bool: ruin (``equity <= 1e-6 * initial_equity``), a true terminal.
        truncated: ``[N]`` bool: episode length or split end reached (and not terminated).
        obs: ``[N, obs_dim]`` dtype: observation to act on next (after auto-reset).
        info: dict of ``[N]`` tensors — ``fill`` (bool), ``fill_price`` (price units, 0 if no
            fill), ``fee`` (cash, negative = rebate), ``cost`` (spread + slippage + fee, cash),
            ``exposure`` (nominal exposure held after the step, ``EXPOSURES[index]``, dtype),
            ``equity`` (after the step, before reset), ``episode_return`` (log(final equity /
            initial equity) of the episode that ended on this step, else 0), ``episode_done``
            (bool, ``terminated | truncated``), ``episode_length`` (int64, steps of the episode that
            ended on this step, else 0), ``traded_units`` (signed units filled, 0 if none).
    """

    next_obs: Tensor
    reward: Tensor
    terminated: Tensor
    truncated: Tensor
    obs: Tensor
    info: dict


class TradingEnv:
    """``N`` vectorised trading accounts on one instrument (see the module docstring).

    Args:
        open, high, low, close: ``[T]`` float arrays of mid prices (finite, > 0, ``low <= high``).
        spread: ``[T]`` relative spread (fraction of price, finite, ``>= 0``).
        features: ``[T, F]`` float array; the observation window (finite on the rows used).
        split: ``(start, end)``, half-open bar range of this split, ``0 <= start < end <= T``.
        num_envs: ``N >= 1`` (must be 1 in eval mode).
        window: ``W >= 1`` feature rows per observation.
        episode_length: ``L >= 1`` steps per training episode.
        execution: costs and order pricing; validated here.
        device: where the state and data tensors live.
        dtype: floating dtype of prices, accounting, observations and rewards.
        generator: ``torch.Generator`` on ``device``; the only source of randomness.
        eval_mode: deterministic single walk through the split (see module docstring).
        volatility: optional ``[T]`` per-bar volatility (finite, ``>= 0``) reported by
            :meth:`market_state`. Default: causal rolling standard deviation of 1-bar log
            returns of ``close`` over ``max(W, 2)`` bars (fewer at the start of the series).
        median_spread: reference spread for routing rules (relative); stored floored at
            ``spread_floor_bps * 1e-4``, like the spreads :meth:`market_state` returns.
        median_volatility: reference volatility for routing rules; stored as given.

    Raises:
        ConfigError: invalid ``num_envs``/``window``/``episode_length``/``split``/``dtype``/
            ``generator``/``execution`` values, ``num_envs != 1`` in eval mode, or a split too
            short to take one step after the window warm-up.
        DataError: arrays of the wrong shape, or a non-finite / non-positive price, a negative
            spread, ``low > high`` or a non-finite feature on a row the split uses (the message
            names the array and the row).

    Attributes:
        obs_dim: ``W * F + 2``.  num_envs: ``N``.  num_actions: 45.
        first_valid, last_bar, start_high: bar bounds of episode starts and ends (ints).
        t: ``[N]`` long, current bar index.  steps: ``[N]`` long, steps taken in the episode.
        cash, units, entry_price, equity: ``[N]`` dtype account state (cash units / instrument
            units / price units / cash units).  exposure_idx: ``[N]`` long, exposure index held.
        episode_return: ``[N]`` dtype, sum of rewards so far in the episode.
    """

    def __init__(
        self,
        *,
        open: np.ndarray,  # noqa: A002 - matches the data column name
        high: np.ndarray,
        low: np.ndarray,
        close: np.ndarray,
        spread: np.ndarray,
        features: np.ndarray,
        split: tuple[int, int],
        num_envs: int,
        window: int,
        episode_length: int,
        execution: ExecutionConfig,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
        generator: torch.Generator,
        eval_mode: bool = False,
        volatility: np.ndarray | None = None,
        median_spread: float = 0.0,
        median_volatility: float = 0.0,
    ) -> None:
        num_envs = _positive_int(num_envs, "env.num_envs")
        window = _positive_int(window, "env.window")
        episode_length = _positive_int(episode_length, "env.episode_length")
        if not isinstance(execution, ExecutionConfig):
            raise ConfigError(f"env.execution: must be an ExecutionConfig, got {type(execution).__name__}")
        execution.validate("env.execution")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ConfigError(f"env.dtype: must be a floating torch dtype, got {dtype!r}")
        device = torch.device(device)
        if not isinstance(generator, torch.Generator):
            raise ConfigError(f"env.generator: must be a torch.Generator, got {type(generator).__name__}")
        if generator.device.type != device.type:
            raise ConfigError(
                f"env.generator: generator is on {generator.device} but the env is on {device}; "
                "create it with torch.Generator(device=<env device>)"
            )
        eval_mode = bool(eval_mode)
        if eval_mode and num_envs != 1:
            raise ConfigError(f"env.num_envs: eval mode runs exactly 1 env, got {num_envs}")

        prices = {}
        for name, arr in (("open", open), ("high", high), ("low", low), ("close", close), ("spread", spread)):
            a = np.asarray(arr, dtype=np.float64)
            if a.ndim != 1:
                raise DataError(f"{name}: must be a 1-D array of bars, got shape {a.shape}")
            prices[name] = a
        T = prices["close"].shape[0]
        for name, a in prices.items():
            if a.shape[0] != T:
                raise DataError(f"{name}: has {a.shape[0]} bars but close has {T}")
        feats = np.asarray(features)
        if feats.ndim != 2 or feats.shape[0] != T or feats.shape[1] < 1:
            raise DataError(f"features: must have shape [T={T}, F>=1], got {feats.shape}")

        if (
            not isinstance(split, (tuple, list))
            or len(split) != 2
            or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in split)
        ):
            raise ConfigError(f"split: must be a pair of ints (start, end), got {split!r}")
        start, end = int(split[0]), int(split[1])
        if not 0 <= start < end <= T:
            raise ConfigError(f"split: ({start}, {end}) must satisfy 0 <= start < end <= {T} (bars in the data)")
        first_valid = max(start, window - 1)
        last_bar = end - 1
        if first_valid >= last_bar:
            raise ConfigError(
                f"split: ({start}, {end}) leaves no step: the first valid bar max(start, window-1) = "
                f"{first_valid} must be before the last bar {last_bar}; use a longer split or a smaller env.window"
            )
        _check_rows(prices, feats, volatility, first_valid, last_bar, window)

        floor = float(execution.spread_floor_bps) * 1e-4
        if volatility is None:
            vol = _rolling_volatility(prices["close"], max(window, 2))
        else:
            vol = np.asarray(volatility, dtype=np.float64)
        for name, value in (("median_spread", median_spread), ("median_volatility", median_volatility)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value) or value < 0:
                raise ConfigError(f"env.{name}: must be a finite number >= 0, got {value!r}")

        self.device = device
        self.dtype = dtype
        self.generator = generator
        self.eval_mode = eval_mode
        self.execution = execution
        self.num_envs = num_envs
        self.window = window
        self.episode_length = episode_length
        self.num_features = int(feats.shape[1])
        self.obs_dim = window * self.num_features + 2
        self.num_actions = NUM_ACTIONS
        self.num_bars = T
        self.split = (start, end)
        self.first_valid = first_valid
        self.last_bar = last_bar
        self.start_high = first_valid if eval_mode else max(first_valid, last_bar - episode_length)
        self.initial_equity = float(execution.initial_equity)
        self.ruin_equity = RUIN_FRACTION * self.initial_equity
        self.median_spread = max(float(median_spread), floor)
        self.median_volatility = float(median_volatility)

        def dev(a: np.ndarray) -> Tensor:
            return torch.as_tensor(np.ascontiguousarray(a), device=device).to(dtype)

        self._open = dev(prices["open"])
        self._high = dev(prices["high"])
        self._low = dev(prices["low"])
        self._close = dev(prices["close"])
        self._spread = dev(np.maximum(prices["spread"], floor))
        self._vol = dev(vol)
        self._features = dev(feats)
        self._window_offsets = torch.arange(-window + 1, 1, device=device, dtype=torch.long)
        self._exposures = torch.tensor(EXPOSURES, device=device, dtype=dtype)
        self._tables = cost_tables(execution, device, dtype)
        self._log_ruin = float(np.log(self.ruin_equity))

        def zeros(dt):
            return torch.zeros(num_envs, device=device, dtype=dt)

        self.t = zeros(torch.long)
        self.steps = zeros(torch.long)
        self.cash = zeros(dtype)
        self.units = zeros(dtype)
        self.entry_price = zeros(dtype)
        self.equity = zeros(dtype)
        self.exposure_idx = zeros(torch.long)
        self.episode_return = zeros(dtype)
        self._frozen = zeros(torch.bool)  # eval mode: episode over, waiting for reset_all
        # A valid, flat state at first_valid (no randomness drawn); reset_all() starts episodes.
        self._reset_state(None, torch.full((num_envs,), first_valid, device=device, dtype=torch.long))

    # ------------------------------------------------------------------ device-side API

    def reset_all(self) -> Tensor:
        """Start a fresh episode in every env: flat, ``equity = initial_equity``.

        Training mode draws start bars uniformly from ``[first_valid, start_high]`` with the
        env's generator; eval mode starts at ``first_valid``. Sync-free.

        Returns:
            ``[N, obs_dim]`` observation (dtype).
        """
        self._reset_state(None, self._starts())
        return self.observe()

    def observe(self) -> Tensor:
        """Observation of the current state, ``[N, obs_dim]`` dtype (no side effects, sync-free)."""
        return self._observation(self.t, self.units, self.entry_price, self.equity)

    def market_state(self) -> tuple[Tensor, Tensor]:
        """``(spread, volatility)``, each ``[N]`` dtype, at each env's current bar ``t``.

        ``spread`` is the floored relative spread ``s_t`` that limit and IoC prices are quoted
        from (compare with :attr:`median_spread`); ``volatility`` is the per-bar volatility
        (given or the default rolling estimate; compare with :attr:`median_volatility`).
        """
        return self._spread[self.t], self._vol[self.t]

    def step(self, action: Tensor) -> StepOut:
        """Execute one decision per env and advance one bar (sync-free, graph-capturable).

        Args:
            action: ``[N]`` long tensor on the env device, values in ``0..44``
                (``exposure*9 + order_type*3 + urgency``).

        Returns:
            :class:`StepOut`. The state tensors are updated in place (with auto-reset in
            training mode).
        """
        exposure_new, order_type, urgency = factor(action)
        zero = torch.zeros((), device=self.device, dtype=self.dtype)

        t = self.t
        t_next_bar = (t + 1).clamp_(max=self.num_bars - 1)  # clamp only matters for a frozen env
        close_t = self._close[t]
        close_n = self._close[t_next_bar]
        equity = self.equity
        units = self.units

        alive = ~self._frozen
        order = alive & (exposure_new != self.exposure_idx)
        target_units = self._exposures[exposure_new] * equity / close_t
        dq = torch.where(order, target_units - units, zero)

        fills = simulate_fills(
            dq=dq,
            order_type=order_type,
            urgency=urgency,
            close_t=close_t,
            spread_t=self._spread[t],
            open_n=self._open[t_next_bar],
            high_n=self._high[t_next_bar],
            low_n=self._low[t_next_bar],
            tables=self._tables,
        )
        cash1, units1, entry1 = apply_fills(self.cash, units, self.entry_price, fills)
        exposure_idx1 = torch.where(fills.fill, exposure_new, self.exposure_idx)
        equity1 = torch.where(alive, cash1 + units1 * close_n, equity)
        t1 = torch.where(alive, t + 1, t)
        steps1 = torch.where(alive, self.steps + 1, self.steps)

        log_eq0 = torch.log(equity.clamp(min=self.ruin_equity))
        log_eq1 = torch.log(equity1.clamp(min=self.ruin_equity))
        reward = torch.where(alive, log_eq1 - log_eq0, zero)
        terminated = alive & (equity1 <= self.ruin_equity)
        if self.eval_mode:
            limit = t1 >= self.last_bar
        else:
            limit = (t1 >= self.last_bar) | (steps1 >= self.episode_length)
        truncated = (alive & limit & ~terminated) | self._frozen
        done = terminated | truncated
        episode_return1 = self.episode_return + reward

        next_obs = self._observation(t1, units1, entry1, equity1)
        info = {
            "fill": fills.fill,
            "fill_price": fills.price,
            "fee": fills.fee,
            "cost": fills.cost,
            "exposure": self._exposures[exposure_idx1],
            "equity": equity1,
            "episode_return": torch.where(done, episode_return1, zero),
            "episode_done": done,
            "episode_length": torch.where(done, steps1, torch.zeros_like(steps1)),
            "traded_units": fills.traded,
        }

        self.t.copy_(t1)
        self.steps.copy_(steps1)
        self.cash.copy_(cash1)
        self.units.copy_(units1)
        self.entry_price.copy_(entry1)
        self.equity.copy_(equity1)
        self.exposure_idx.copy_(exposure_idx1)
        self.episode_return.copy_(episode_return1)
        if self.eval_mode:
            self._frozen.logical_or_(done)
            obs = next_obs
        else:
            self._reset_state(done, self._starts())
            obs = self.observe()
        return StepOut(next_obs=next_obs, reward=reward, terminated=terminated, truncated=truncated, obs=obs, info=info)

    # ------------------------------------------------------------------ host-side evaluation

    def run_policy(self, policy_fn: Callable[[Tensor, "TradingEnv"], Tensor]) -> dict[str, np.ndarray]:
        """Walk the split once with ``policy_fn`` (eval mode only; reads results back to the host).

        Calls :meth:`reset_all`, then ``action = policy_fn(obs, env)`` (``obs`` ``[1, obs_dim]``;
        ``action`` a ``[1]`` integer tensor, or anything ``torch.as_tensor`` turns into one
        value) and :meth:`step` until the episode ends at the last bar of the split or on ruin.

        Returns:
            dict of numpy arrays, ``S`` = steps taken (``last_bar - first_valid`` unless ruined):

            * ``index`` int64 ``[S+1]``: bar index of each equity point (``first_valid`` first);
            * ``equity`` float64 ``[S+1]``: equity at the close of those bars, ``initial_equity``
              first;
            * ``exposure`` float64 ``[S]``: nominal exposure held after each step;
            * ``actions`` int64 ``[S]``; ``rewards`` float64 ``[S]``;
            * ``fills`` bool ``[S]``; ``fill_price``, ``fees``, ``costs``, ``traded_units``
              float64 ``[S]`` (cash / price / instrument units, 0 without a fill);
            * ``trades`` int64 scalar: fills that changed the exposure held (every fill does,
              since an order is only sent when the target exposure differs);
            * ``terminated`` bool scalar: the walk ended in ruin.

        Raises:
            ConfigError: the env is not in eval mode.
        """
        if not self.eval_mode:
            raise ConfigError("env.eval_mode: run_policy needs an env built with eval_mode=True")
        max_steps = self.last_bar - self.first_valid
        dev, dt = self.device, self.dtype
        buf = {
            name: torch.zeros(max_steps, device=dev, dtype=kind)
            for name, kind in (
                ("equity", dt), ("exposure", dt), ("rewards", dt), ("fill_price", dt), ("fees", dt),
                ("costs", dt), ("traded_units", dt), ("actions", torch.long), ("fills", torch.bool),
                ("done", torch.bool), ("terminated", torch.bool),
            )
        }
        obs = self.reset_all()
        with torch.no_grad():
            for i in range(max_steps):
                action = torch.as_tensor(policy_fn(obs, self), device=dev).reshape(1).long()
                out = self.step(action)
                info = out.info
                for name, value in (
                    ("equity", info["equity"]), ("exposure", info["exposure"]), ("rewards", out.reward),
                    ("fill_price", info["fill_price"]), ("fees", info["fee"]), ("costs", info["cost"]),
                    ("traded_units", info["traded_units"]), ("actions", action), ("fills", info["fill"]),
                    ("done", info["episode_done"]), ("terminated", out.terminated),
                ):
                    buf[name][i] = value[0]
                obs = out.obs
                if (i + 1) % _RUN_POLICY_CHECK_EVERY == 0 and bool(buf["done"][i]):
                    break
        host = {name: value.cpu().numpy() for name, value in buf.items()}
        done_at = np.flatnonzero(host["done"])
        steps_taken = int(done_at[0]) + 1 if done_at.size else max_steps
        cut = {name: value[:steps_taken] for name, value in host.items()}
        return {
            "index": np.arange(self.first_valid, self.first_valid + steps_taken + 1, dtype=np.int64),
            "equity": np.concatenate([[self.initial_equity], cut["equity"].astype(np.float64)]),
            "exposure": cut["exposure"].astype(np.float64),
            "actions": cut["actions"].astype(np.int64),
            "rewards": cut["rewards"].astype(np.float64),
            "fills": cut["fills"].astype(bool),
            "fill_price": cut["fill_price"].astype(np.float64),
            "fees": cut["fees"].astype(np.float64),
            "costs": cut["costs"].astype(np.float64),
            "traded_units": cut["traded_units"].astype(np.float64),
            "trades": np.array(int(cut["fills"].sum()), dtype=np.int64),
            "terminated": np.array(bool(cut["terminated"].any())),
        }

    # ------------------------------------------------------------------ internals

    def _starts(self) -> Tensor:
        if self.eval_mode or self.start_high == self.first_valid:
            return torch.full((self.num_envs,), self.first_valid, device=self.device, dtype=torch.long)
        return torch.randint(
            self.first_valid,
            self.start_high + 1,
            (self.num_envs,),
            generator=self.generator,
            device=self.device,
            dtype=torch.long,
        )

    def _reset_state(self, mask: Tensor | None, starts: Tensor) -> None:
        """Reset the envs where ``mask`` (all when ``None``) to a fresh episode starting at ``starts``."""
        if mask is None:
            self.t.copy_(starts)
            self.steps.zero_()
            self.cash.fill_(self.initial_equity)
            self.units.zero_()
            self.entry_price.zero_()
            self.equity.fill_(self.initial_equity)
            self.exposure_idx.fill_(FLAT)
            self.episode_return.zero_()
            self._frozen.zero_()
            return
        zero = torch.zeros((), device=self.device, dtype=self.dtype)
        init = torch.full((), self.initial_equity, device=self.device, dtype=self.dtype)
        self.t.copy_(torch.where(mask, starts, self.t))
        self.steps.masked_fill_(mask, 0)
        self.cash.copy_(torch.where(mask, init, self.cash))
        self.units.copy_(torch.where(mask, zero, self.units))
        self.entry_price.copy_(torch.where(mask, zero, self.entry_price))
        self.equity.copy_(torch.where(mask, init, self.equity))
        self.exposure_idx.masked_fill_(mask, FLAT)
        self.episode_return.copy_(torch.where(mask, zero, self.episode_return))
        self._frozen.masked_fill_(mask, False)

    def _observation(self, t: Tensor, units: Tensor, entry: Tensor, equity: Tensor) -> Tensor:
        rows = t.unsqueeze(1) + self._window_offsets  # [N, W]
        window = self._features[rows].reshape(t.shape[0], -1)  # [N, W*F]
        close = self._close[t]
        denom = equity.clamp(min=self.ruin_equity)
        exposure = (units * close / denom).clamp(-ACCOUNT_OBS_CLIP, ACCOUNT_OBS_CLIP)
        upnl = (units * (close - entry) / denom).clamp(-ACCOUNT_OBS_CLIP, ACCOUNT_OBS_CLIP)
        return torch.cat([window, exposure.unsqueeze(1), upnl.unsqueeze(1)], dim=1)


# ---------------------------------------------------------------------- host-side helpers


def _positive_int(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{where}: must be an integer >= 1, got {value!r}")
    return int(value)


def _first_bad(bad: np.ndarray, offset: int) -> int:
    return int(np.flatnonzero(bad)[0]) + offset


def _check_rows(prices, feats, volatility, first_valid: int, last_bar: int, window: int) -> None:
    """Validate the rows an env on this split can read; DataError names the array and row."""
    lo, hi = first_valid, last_bar + 1  # price rows: close at t >= first_valid, OHLC of t+1 <= last_bar
    for name in ("open", "high", "low", "close"):
        a = prices[name][lo:hi]
        bad = ~(np.isfinite(a) & (a > 0))
        if bad.any():
            row = _first_bad(bad, lo)
            raise DataError(f"{name}: row {row} must be a finite price > 0, got {prices[name][row]!r}")
    inverted = prices["low"][lo:hi] > prices["high"][lo:hi]
    if inverted.any():
        row = _first_bad(inverted, lo)
        raise DataError(f"low: row {row} is above high ({prices['low'][row]!r} > {prices['high'][row]!r})")
    s = prices["spread"][lo:hi]
    bad = ~(np.isfinite(s) & (s >= 0))
    if bad.any():
        row = _first_bad(bad, lo)
        raise DataError(f"spread: row {row} must be a finite relative spread >= 0, got {prices['spread'][row]!r}")
    flo = first_valid - window + 1
    f = np.asarray(feats[flo:hi], dtype=np.float64)
    bad_rows = ~np.isfinite(f).all(axis=1)
    if bad_rows.any():
        row = _first_bad(bad_rows, flo)
        raise DataError(f"features: row {row} has a non-finite value (rows {flo}..{last_bar} feed the observations)")
    if volatility is not None:
        v = np.asarray(volatility, dtype=np.float64)
        if v.shape != prices["close"].shape:
            raise DataError(f"volatility: must have shape {prices['close'].shape}, got {v.shape}")
        bad = ~(np.isfinite(v[lo:hi]) & (v[lo:hi] >= 0))
        if bad.any():
            row = _first_bad(bad, lo)
            raise DataError(f"volatility: row {row} must be finite and >= 0, got {v[row]!r}")


def _rolling_volatility(close: np.ndarray, n: int) -> np.ndarray:
    """Causal rolling population std of 1-bar log returns over the last ``n`` bars ([T] float64).

    The return of bar 0 is taken as 0; bars with fewer than ``n`` returns use those available.
    Non-finite or non-positive closes (outside the checked split) give 0 returns.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        logc = np.log(close)
    r = np.zeros_like(close)
    r[1:] = np.diff(logc)
    r[~np.isfinite(r)] = 0.0
    c1 = np.concatenate([[0.0], np.cumsum(r)])
    c2 = np.concatenate([[0.0], np.cumsum(r * r)])
    idx = np.arange(close.shape[0])
    lo = np.maximum(idx - n + 1, 0)
    count = (idx - lo + 1).astype(np.float64)
    mean = (c1[idx + 1] - c1[lo]) / count
    var = (c2[idx + 1] - c2[lo]) / count - mean * mean
    return np.sqrt(np.maximum(var, 0.0))
