r"""Batched, GPU-resident, CUDA-graph-capturable trading environment.

:class:`TradingEnv` steps ``N`` independent single-instrument trading accounts over one split of
validated market data (:class:`foxdqn.data.MarketData`). The execution model (order pricing,
fills, fees, accounting, reward) is documented in :mod:`foxdqn.execution.fills`; the action space
in :mod:`foxdqn.execution.orders`.

Observation
-----------
``obs[i]`` (``[obs_dim] = [W*F + 2]``, env ``dtype``) for env ``i`` at current bar ``t``:

* the feature rows ``t-W+1 .. t`` flattened row-major (``W*F`` values; row ``t-W+1`` first);
* current exposure ``units * close_t / equity_t``;
* unrealised PnL ``units * (close_t - entry_price) / equity_t``.

The two account values divide by ``max(equity, 1e-6 * initial_equity)`` and are clipped to
``±ACCOUNT_OBS_CLIP`` (100; defined in :mod:`foxdqn.ops.trading_step`, re-exported here) so that
the observation after ruin stays finite.

Episodes
--------
The split ``(start, end) = market.splits[split]`` is half-open: bars ``start .. end-1``. The first
valid bar is ``first_valid = max(start, W-1)`` (the window may reach rows before ``start``: that
is causal); the last bar is ``last_bar = end - 1``. A training episode starts flat with
``equity = initial_equity`` at a bar drawn uniformly from ``[first_valid, last_bar - L]``
(``first_valid`` when that range is empty) and ends after ``L`` steps or when the current bar
reaches ``last_bar`` (``truncated``), or on ruin (``terminated``, which takes precedence: the two
flags are never both true). Envs that end are reset inside the same :meth:`TradingEnv.step`
(auto-reset, branch-free with ``torch.where``): ``StepOut.next_obs`` is the observation before
the reset (store it in replay), ``StepOut.obs`` the one after (act on it).

Training paths
--------------
Given the resampled training paths of ``data.augment`` (:class:`foxdqn.data.augment.TrainingPaths`:
``P`` series of ``L`` bars laid end to end as one ``"train"`` split of ``P·L`` bars) a training env
starts each episode on a path drawn uniformly, at a bar drawn uniformly from that path's
``[k·L + W-1, k·L + L-1-L_ep]`` (one ``randint`` over the ``P`` paths' starts): its window never
reaches into the previous path and its ``L_ep`` steps end at or before the path's last bar. An
eval-mode env refuses such paths (validation and test walk the market itself).

Replay codes
------------
The observation is a pure function of ``(t, units, entry_price, equity)``, so the training replay
stores those four values per state (the state code, :mod:`foxdqn.ops.trading_code`) instead of
the ``W*F+2`` observation: in training mode :meth:`TradingEnv.step` returns the code of the state
it stepped from (``info["state_code"]``) and of the state it reached before the reset
(``info["next_state_code"]``), and :meth:`TradingEnv.decode_observations` rebuilds the
observations of sampled codes, bit for bit the ones the env returned
(:func:`foxdqn.ops.trading_observation.trading_observation`; docs/design/replay.md#windowed-trading-replay).

Eval mode (``eval_mode=True``; N envs walk the same split, e.g. one per agent of a population):
:meth:`TradingEnv.reset_all` starts every env at
``first_valid``; ``episode_length`` is ignored and the episode runs to ``last_bar`` (or ruin); no
randomness is used. There is no auto-reset: once the episode has ended the env is frozen — every
further :meth:`TradingEnv.step` sends no order, leaves the state unchanged and returns reward 0,
``terminated=False``, ``truncated=True``, ``episode_done=True`` and ``episode_return`` = the
finished episode's return again — until the next :meth:`TradingEnv.reset_all`.
:meth:`TradingEnv.run_policy` walks the split once and returns the equity curve on the host
(:meth:`TradingEnv.run_policies`: N walks at once).

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
``IndexError`` on CPU; the CUDA kernel clamps its table indices, so it reads no memory outside them).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, NamedTuple

import numpy as np
import torch
from torch import Tensor

from foxdqn.errors import ConfigError

from foxdqn.ops.trading_code import CODE_EQUITY, CODE_T, CODE_UNITS, CODE_WIDTH
from foxdqn.ops.trading_observation import trading_observation
from foxdqn.ops.trading_step import (ACCOUNT_OBS_CLIP, TradingMarket, TradingState, observation_reference,
                                     reset_where_reference, trading_params, trading_step)
from foxdqn.device.chunk_graph import CHUNK_STEPS, ChunkGraph

from foxdqn.execution.orders import EXPOSURES, FLAT, NUM_ACTIONS
from foxdqn.envs.base import DRAW, StepOut
from foxdqn.envs.checks import check_generator, float_dtype, positive_int
from foxdqn.execution.fills import RUIN_FRACTION, ExecutionConfig, cost_tables
from foxdqn.envs.trading_hook import TRADING_HOOK

if TYPE_CHECKING:
    from foxdqn.data import MarketData

__all__ = ["Account", "ExecutionConfig", "StepOut", "TradingEnv", "ACCOUNT_OBS_CLIP"]


class Account(NamedTuple):
    """What :meth:`TradingEnv.account` returns: per account, ``exposure`` (fraction of equity,
    env dtype), ``held`` (int64 exposure index) and ``spread`` (floored relative spread, env dtype)."""

    exposure: Tensor
    held: Tensor
    spread: Tensor


class TradingEnv:
    """``N`` vectorised trading accounts on one instrument (see the module docstring).

    Args:
        market: validated bars (:class:`foxdqn.data.MarketData`: ``[T]`` finite prices > 0
            with ``low <= open, close <= high``, ``[T]`` finite relative spreads and per-bar
            volatilities ``>= 0``, ``[T, F]`` finite features, their training-split medians);
            the env copies them to ``device`` without checking them again. Or, for a training env,
            :class:`foxdqn.data.augment.TrainingPaths` (the same as device tensors, with
            ``path_bars`` and ``paths``; see "Training paths").
        split: name of the split to walk (a key of ``market.splits``: ``"train"``, ``"val"``,
            ``"test"``); its ``(start, end)`` is a half-open bar range.
        num_envs: ``N >= 1`` (in eval mode: N walks of the split, :meth:`run_policies`).
        window: ``W >= 1`` feature rows per observation.
        episode_length: ``L >= 1`` steps per training episode.
        execution: costs and order pricing; validated here.
        device: where the state and data tensors live.
        dtype: floating dtype of prices, accounting, observations and rewards.
        generator: ``torch.Generator`` on ``device``; the only source of randomness.
        eval_mode: deterministic walks through the split, one per env (see module docstring).
        max_eval_bars: in eval mode, the walks end after this many steps at most (``last_bar =
            min(end - 1, first_valid + max_eval_bars)``: ``debug.max_eval_bars``, a smoke run's
            shorter evaluation); None (the default): the whole split. Ignored in training mode.

    Raises:
        ValueError: naming the parameter: ``num_envs``/``window``/``episode_length`` not an
            integer ``>= 1``, a ``split`` the market does not
            have or too short to take one step after the window warm-up (``max(start, W-1) >=
            end - 1``), training paths in eval mode or too short for one episode after the
            window warm-up (named ``market``), a non-floating ``dtype``, a ``generator`` that is not a
            ``torch.Generator`` on the env's device type, or an invalid ``execution``
            (:class:`~foxdqn.errors.ConfigError`, a ValueError, naming ``execution.<field>``).

    Attributes:
        obs_dim: ``W * F + 2``.  obs_shape: ``(obs_dim,)``.  obs_dtype: float32 (what the agent
        stores; the env computes in ``dtype``).  num_envs: ``N``.  num_actions: 45.
        max_episode_steps: the longest episode, ``last_bar - first_valid`` in eval mode, else
        ``min(L, last_bar - first_valid)``.
        on_host: False.  collect_hook: :data:`foxdqn.envs.trading_hook.TRADING_HOOK`.
        step_backend: backend of :func:`foxdqn.ops.trading_step.trading_step` that :meth:`step`
        runs: ``"auto"`` (the Triton kernel on CUDA, the torch reference on CPU; the default),
        ``"triton"`` or ``"torch"``.
        decode_backend: backend of :func:`foxdqn.ops.trading_observation.trading_observation` that
        :meth:`decode_observations` runs (same choices).
        step_next_obs: True (the default): :meth:`step` returns ``next_obs``; False (training mode,
        set by :meth:`foxdqn.envs.trading_hook.TradingCollectHook.replay_stores_codes` when the
        replay stores the state codes): it returns ``next_obs=None`` and the kernel skips that
        observation's window.
        code_dim: 4, values per state code.  code_dtype: their dtype
        (:func:`foxdqn.ops.trading_code.state_code_dtype`: float32 for a float32 env, else float64).
        split: ``(start, end)`` of the split walked.
        path_bars: ``L`` bars per resampled training path, None for a market walked as it is
        (see "Training paths").  num_paths: ``P`` (1 without paths).
        first_valid, last_bar, start_high: bar bounds of episode starts and ends (ints).
        median_spread: ``market.median_spread`` floored at ``spread_floor_bps * 1e-4`` (relative),
            like the spreads :meth:`market_state` returns.
        median_volatility: ``market.median_volatility`` (per bar).
        t: ``[N]`` long, current bar index.  steps: ``[N]`` long, steps taken in the episode.
        cash, units, entry_price, equity: ``[N]`` dtype account state (cash units / instrument
            units / price units / cash units).  exposure_idx: ``[N]`` long, exposure index held.
        episode_return: ``[N]`` dtype, sum of rewards so far in the episode.
    """

    obs_dtype = torch.float32
    num_actions = NUM_ACTIONS
    on_host = False
    collect_hook = TRADING_HOOK
    code_dim = CODE_WIDTH

    def __init__(
        self,
        market: MarketData,
        split: str,
        *,
        num_envs: int,
        window: int,
        episode_length: int,
        execution: ExecutionConfig,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
        generator: torch.Generator,
        eval_mode: bool = False,
        max_eval_bars: int | None = None,
    ) -> None:
        num_envs = positive_int(num_envs, "num_envs")
        window = positive_int(window, "window")
        episode_length = positive_int(episode_length, "episode_length")
        if not isinstance(execution, ExecutionConfig):
            raise ValueError(f"execution: must be an ExecutionConfig, got {type(execution).__name__}")
        execution.validate("execution")
        dtype = float_dtype(dtype)
        device = torch.device(device)
        check_generator(generator, device)
        eval_mode = bool(eval_mode)
        start, end = _split_range(market, split, window)
        self.path_bars = getattr(market, "path_bars", None)  # resampled training paths (foxdqn.data.augment)
        self.num_paths = getattr(market, "paths", 1)
        if self.path_bars is not None:
            _check_paths(self.path_bars, window, episode_length, eval_mode)

        self.device = device
        self.dtype = dtype
        self.generator = generator
        self.eval_mode = eval_mode
        self.step_backend = "auto"
        self.decode_backend = "auto"
        self.step_next_obs = True
        self.execution = execution
        self.num_envs = num_envs
        self.window = window
        self.episode_length = episode_length
        self.split = (start, end)
        self.first_valid, self.last_bar = walk_bounds(market, split, window, max_eval_bars if eval_mode else None)
        self.start_high = self.first_valid if eval_mode else max(self.first_valid, self.last_bar - episode_length)
        longest = self.last_bar - self.first_valid
        if self.path_bars is not None:  # path k's starts: k·L + W-1 .. k·L + L-1-episode_length
            self._path_starts = self.path_bars - episode_length - self.first_valid
            self.start_high = (self.num_paths - 1) * self.path_bars + self.path_bars - 1 - episode_length
            longest = self.path_bars - 1 - self.first_valid
        self.max_episode_steps = longest if eval_mode else min(episode_length, longest)
        self.initial_equity = float(execution.initial_equity)
        self.ruin_equity = RUIN_FRACTION * self.initial_equity
        self._load_market(market)
        self._allocate_state()

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
        return observation_reference(self._market, self._params, self.t, self.units, self.entry_price, self.equity)

    def market_state(self) -> tuple[Tensor, Tensor]:
        """``(spread, volatility)``, each ``[N]`` dtype, at each env's current bar ``t``.

        ``spread`` is the floored relative spread ``s_t`` that limit and IoC prices are quoted
        from (compare with :attr:`median_spread`); ``volatility`` is the market's per-bar
        volatility (``MarketData.volatility``; compare with :attr:`median_volatility`).
        """
        return self._spread[self.t], self._vol[self.t]

    def account(self, code: Tensor | None = None) -> Account:
        """The position each account holds, and the spread a switch away from it pays
        (:class:`Account`; sync-free, fixed shapes).

        Args:
            code: None: the ``N`` envs' current states. Else ``[B, 4]`` state codes
                (``info["state_code"]`` / ``info["next_state_code"]`` of :meth:`step`, what the replay
                stores: :mod:`foxdqn.ops.trading_code`) of states of this env's bars.

        Returns:
            :class:`Account` of ``[N]`` (or ``[B]``) tensors: ``exposure`` (env dtype) =
            ``units * close_t / max(equity, ruin equity)`` clipped to ``±ACCOUNT_OBS_CLIP``, the
            observation's exposure value, in fractions of equity; ``held`` (int64) the exposure
            index held, :attr:`exposure_idx` for the current states; a code does not hold it, so
            for codes it is the index of the :data:`~foxdqn.execution.orders.EXPOSURES` value nearest
            ``exposure`` (the lower one on a tie), which is the index held unless the position has
            drifted more than 0.25 from its nominal exposure since its fill (a short of -1 after the
            price fell 14 %, of -0.5 after it rose 29 % or fell 40 %, a long of 0.5 after it
            tripled or fell 67 %); ``spread`` (env dtype) the floored relative spread ``s_t`` of
            the state's bar, as in :meth:`market_state`.
        """
        if code is None:
            t, units, equity, held = self.t, self.units, self.equity, self.exposure_idx
        else:
            t = code[:, CODE_T].long()
            units, equity, held = code[:, CODE_UNITS].to(self.dtype), code[:, CODE_EQUITY].to(self.dtype), None
        denom = equity.clamp(min=self.ruin_equity)
        exposure = (units * self._close[t] / denom).clamp(-ACCOUNT_OBS_CLIP, ACCOUNT_OBS_CLIP)
        if held is None:
            held = (exposure.unsqueeze(1) - self._exposures).abs().argmin(dim=1)
        return Account(exposure, held, self._spread[t])

    def draw_step(self) -> Tensor | None:
        """The random draws of the next :meth:`step`, made now: in training mode the ``[N]`` int64
        reset start bars (one ``randint`` from the env's generator), or None where there is
        nothing to draw (eval mode, or a start range of one bar: every reset starts at
        ``first_valid``). Pass them to ``step(action, draws)``; the collect step draws them on a
        second stream beside the action selection (:func:`foxdqn.device.side_stream.beside`)."""
        return self._draw_starts()

    def step(self, action: Tensor, draws: Tensor | None | object = DRAW) -> StepOut:
        """Execute one decision per env and advance one bar (sync-free, graph-capturable).

        Args:
            action: ``[N]`` long tensor on the env device, values in ``0..44``
                (``exposure*9 + order_type*3 + urgency``).
            draws: what :meth:`draw_step` returned for this step; left out
                (:data:`~foxdqn.envs.base.DRAW`), the step draws them.

        Returns:
            :class:`~foxdqn.envs.StepOut`, every tensor ``[N]`` (observations ``[N, obs_dim]``) in
            ``dtype`` unless said: ``reward`` ``log(equity_{t+1}) - log(equity_t)`` (ruin: equity
            floored); ``terminated`` (bool): ruin (``equity <= 1e-6 * initial_equity``);
            ``truncated`` (bool): episode length or split end reached (and not terminated);
            ``info``: ``fill`` (bool), ``fill_price`` (price units, 0 if no fill), ``fee`` (cash,
            negative = rebate), ``cost`` (spread + slippage + fee, cash), ``exposure`` (nominal
            exposure held after the step, ``EXPOSURES[index]``), ``equity`` (after the step,
            before reset), ``episode_return`` (log(final equity / initial equity) of the episode
            that ended on this step, else 0), ``episode_done`` (bool, ``terminated |
            truncated``), ``episode_length`` (int64, steps of the episode that ended on this
            step, else 0), ``traded_units`` (signed units filled, 0 if none); in training mode
            also ``state_code`` and ``next_state_code`` (``[N, 4]`` :attr:`code_dtype`, the codes of
            the state stepped from and of the one ``next_obs`` observes: see "Replay codes" in the
            module docstring). The state tensors are updated in place (with auto-reset in training
            mode).

        The whole step is one op, :func:`foxdqn.ops.trading_step.trading_step` (backend
        :attr:`step_backend`): on CUDA one Triton kernel, after the ``randint`` of the reset start
        bars in training mode when ``draws`` is left out (2 kernels); on CPU its torch reference,
        this env's original step.
        """
        starts = self._draw_starts() if draws is DRAW else draws
        out = trading_step(self._state, action.contiguous(), starts, self._market, self._params,
                           backend=self.step_backend, next_obs=self.step_next_obs)
        info = {
            "fill": out.fill,
            "fill_price": out.fill_price,
            "fee": out.fee,
            "cost": out.cost,
            "exposure": out.exposure,
            "equity": out.equity,
            "episode_return": out.episode_return,
            "episode_done": out.done,
            "episode_length": out.episode_length,
            "traded_units": out.traded,
        }
        if out.code is not None:
            info["state_code"], info["next_state_code"] = out.code, out.next_code
        return StepOut(next_obs=out.next_obs, reward=out.reward, terminated=out.terminated, truncated=out.truncated,
                       obs=out.obs, info=info)

    def decode_observations(self, code: Tensor, next_code: Tensor, index: Tensor,
                            members: int | None = None) -> tuple[Tensor, Tensor]:
        """Observations of sampled state codes (the replay's decoder; sync-free, one kernel on CUDA).

        Args:
            code, next_code: ``[B, 4]`` :attr:`code_dtype` codes of s and s' (``info["state_code"]``,
                ``info["next_state_code"]`` of :meth:`step`).
            index: int64 ``[B]`` flat replay rows ``t·N + e`` (``e`` the env of each transition:
                it selects the env's parameter row; unused while there is one, ``G = 1``).
            members: None, or P: the rows are a population's member-major batch
                (:meth:`foxdqn.population.replay.MemberReplay.sample_members`).

        Returns:
            ``(obs, next_obs)``, each ``[B, obs_dim]`` :attr:`obs_dtype` (with ``members``
            ``[P, B/P, obs_dim]``, halves of the members' stacked pair: :func:`~foxdqn.ops.trading_observation.trading_observation`):
            the observations :meth:`step` returned for those states, cast as the replay stored them, bit for bit.
        """
        groups = self._params.fparams.shape[0]
        group = None if groups == 1 else (index % self.num_envs) // (self.num_envs // groups)
        obs, next_obs = trading_observation((code.contiguous(), next_code.contiguous()), group, self._market,
                                            self._params, self.obs_dtype, backend=self.decode_backend,
                                            members=members)
        return obs, next_obs

    @property
    def code_dtype(self) -> torch.dtype:
        return self._params.code_dtype

    # ------------------------------------------------------------------ host-side evaluation

    def run_policy(self, policy_fn: Callable[[Tensor, "TradingEnv"], Tensor], *, capturable: bool = False,
                   chunk: int = CHUNK_STEPS) -> dict[str, np.ndarray]:
        """Walk the split once with ``policy_fn`` (eval mode only; reads results back to the host).

        Calls :meth:`reset_all`, then ``action = policy_fn(obs, env)`` (``obs`` ``[N, obs_dim]``;
        ``action`` an ``[N]`` integer tensor, or anything ``torch.as_tensor`` turns into N
        values) and :meth:`step` until the episode ends at the last bar of the split or on ruin.
        With N > 1 envs use :meth:`run_policies` (N walks of the same split at once; ``capturable``
        and ``chunk`` as there).

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
            ConfigError: the env is not in eval mode, or has more than one env.
        """
        if self.eval_mode and self.num_envs != 1:
            raise ConfigError(f"env.num_envs: run_policy walks one env, this env has {self.num_envs}; "
                              "use run_policies")
        return self.run_policies(policy_fn, capturable=capturable, chunk=chunk)[0]

    def run_policies(self, policy_fn: Callable[[Tensor, "TradingEnv"], Tensor], *, capturable: bool = False,
                     chunk: int = CHUNK_STEPS) -> list[dict[str, np.ndarray]]:
        """N walks of the split at once, one per env (e.g. P agents, one env each): env i's walk,
        in :meth:`run_policy`'s format, ends at the split's last bar or at its own ruin. The loop
        stops when every walk has ended. Eval mode only (every env starts at ``first_valid``).

        The steps run in chunks of ``chunk`` (:class:`foxdqn.device.chunk_graph.ChunkGraph`): each
        step's records go into device buffers, read back once per chunk, when the loop also
        checks whether every walk has ended. Steps after a walk's end leave it unchanged (the env
        is frozen) and are cut off, so the walks do not depend on ``chunk`` or ``capturable``.

        Args:
            policy_fn: ``policy_fn(obs, env) -> action`` (see :meth:`run_policy`).
            capturable: ``policy_fn`` only launches fixed-shape ops on the env device and reads
                nothing back (no ``.item()``, no host tensors, no randomness): on CUDA one chunk
                is then captured in a CUDA graph and replayed. Ignored on CPU (eager).
            chunk: ``K >= 1`` steps per chunk (default :data:`~foxdqn.device.chunk_graph.CHUNK_STEPS`).

        Raises:
            ConfigError: the env is not in eval mode.
            ValueError: ``chunk`` is not an integer ``>= 1``.
        """
        if not self.eval_mode:
            raise ConfigError("env.eval_mode: run_policy needs an env built with eval_mode=True")
        max_steps, n = self.last_bar - self.first_valid, self.num_envs
        dev, dt = self.device, self.dtype
        obs = self.reset_all().clone()  # the observation acted on, updated in place (a graph reads it)

        def step() -> dict[str, Tensor]:
            action = torch.as_tensor(policy_fn(obs, self), device=dev).reshape(n).long()
            out = self.step(action)
            obs.copy_(out.obs)
            info = out.info
            return {name: value.to(kind) for name, value, kind in (
                ("equity", info["equity"], dt), ("exposure", info["exposure"], dt), ("rewards", out.reward, dt),
                ("fill_price", info["fill_price"], dt), ("fees", info["fee"], dt), ("costs", info["cost"], dt),
                ("traded_units", info["traded_units"], dt), ("actions", action, torch.long),
                ("fills", info["fill"], torch.bool), ("done", info["episode_done"], torch.bool),
                ("terminated", out.terminated, torch.bool),
            )}

        ended = np.zeros(n, dtype=bool)

        def all_ended(records: dict[str, np.ndarray]) -> bool:
            ended[:] |= records["done"].any(axis=0)
            return bool(ended.all())

        walker = ChunkGraph(step, dev, chunk, use_graph=bool(capturable) and dev.type == "cuda")
        host = walker.run(max_steps, all_ended)
        steps_run = int(host["done"].shape[0])
        return [self._walk(host, e, steps_run) for e in range(n)]

    def _walk(self, host: dict[str, np.ndarray], e: int, max_steps: int) -> dict[str, np.ndarray]:
        """Env ``e``'s walk (:meth:`run_policy`'s dict) from the host copy of the step buffers."""
        done_at = np.flatnonzero(host["done"][:, e])
        steps_taken = int(done_at[0]) + 1 if done_at.size else max_steps
        cut = {name: value[:steps_taken, e] for name, value in host.items()}
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

    def close(self) -> None:
        """Nothing to release (the env holds only tensors)."""

    @property
    def rebuilt_tensors(self) -> tuple[Tensor, ...]:
        """The bar tensors of resampled training paths (rebuilt from the config by every run that
        builds this env, so a checkpoint leaves them out: :func:`foxdqn.run.checkpoint.state_tensors`);
        ``()`` for a market read or generated as it is."""
        if self.path_bars is None:
            return ()
        return (self._open, self._high, self._low, self._close, self._spread, self._vol, self._features)

    # ------------------------------------------------------------------ internals

    def _load_market(self, market: MarketData) -> None:
        """Copy the bars to the device (dtype), spreads floored at ``spread_floor_bps``."""
        device, dtype, window = self.device, self.dtype, self.window
        floor = float(self.execution.spread_floor_bps) * 1e-4

        def dev(a: np.ndarray | Tensor) -> Tensor:
            if isinstance(a, Tensor):  # resampled training paths, already on the device
                return a.to(device=device, dtype=dtype).contiguous()
            return torch.as_tensor(np.ascontiguousarray(a), device=device).to(dtype)

        self.num_bars = int(len(market.close))
        self.num_features = int(market.features.shape[1])
        self.obs_dim = window * self.num_features + 2
        self.obs_shape = (self.obs_dim,)
        self.median_spread = max(float(market.median_spread), floor)
        self.median_volatility = float(market.median_volatility)
        self._open = dev(market.open)
        self._high = dev(market.high)
        self._low = dev(market.low)
        self._close = dev(market.close)
        spread = market.spread
        self._spread = dev(spread.clamp(min=floor) if isinstance(spread, Tensor) else np.maximum(spread, floor))
        self._vol = dev(market.volatility)
        self._features = dev(market.features)
        self._exposures = torch.tensor(EXPOSURES, device=device, dtype=dtype)
        self._tables = cost_tables(self.execution, device, dtype)
        self._market = TradingMarket(self._open, self._high, self._low, self._close, self._spread, self._features)
        self._params = trading_params(
            exposures=self._exposures, tables=self._tables, initial_equity=self.initial_equity,
            ruin_equity=self.ruin_equity, window=window, num_features=self.num_features,
            episode_length=self.episode_length, first_valid=self.first_valid, last_bar=self.last_bar,
            num_bars=self.num_bars, eval_mode=self.eval_mode,
        )

    def _allocate_state(self) -> None:
        """The ``[N]`` state tensors, set to a valid flat state at ``first_valid`` (no randomness
        drawn); :meth:`reset_all` starts the episodes."""
        def zeros(dt):
            return torch.zeros(self.num_envs, device=self.device, dtype=dt)

        self.t = zeros(torch.long)
        self.steps = zeros(torch.long)
        self.cash = zeros(self.dtype)
        self.units = zeros(self.dtype)
        self.entry_price = zeros(self.dtype)
        self.equity = zeros(self.dtype)
        self.exposure_idx = zeros(torch.long)
        self.episode_return = zeros(self.dtype)
        self._frozen = zeros(torch.bool)  # eval mode: episode over, waiting for reset_all
        self._state = TradingState(self.t, self.steps, self.cash, self.units, self.entry_price, self.equity,
                                   self.exposure_idx, self.episode_return, self._frozen)
        self._reset_state(None, torch.full((self.num_envs,), self.first_valid, device=self.device, dtype=torch.long))

    def _draw_starts(self) -> Tensor | None:
        """Training mode: ``[N]`` start bars drawn for every env (:meth:`_starts`), or None when the
        start range is the single bar ``first_valid`` (no draw, as :meth:`_starts`)."""
        if self.eval_mode or self.start_high == self.first_valid:
            return None
        return self._starts()

    def _starts(self) -> Tensor:
        if self.eval_mode or self.start_high == self.first_valid:
            return torch.full((self.num_envs,), self.first_valid, device=self.device, dtype=torch.long)
        if self.path_bars is not None:  # a path drawn uniformly, then a start inside it
            k = torch.randint(0, self.num_paths * self._path_starts, (self.num_envs,), generator=self.generator,
                              device=self.device, dtype=torch.long)
            return self._path_start(k // self._path_starts, k % self._path_starts)
        return torch.randint(
            self.first_valid,
            self.start_high + 1,
            (self.num_envs,),
            generator=self.generator,
            device=self.device,
            dtype=torch.long,
        )

    def _path_start(self, path: Tensor, offset: Tensor) -> Tensor:
        """Start bars (int64, ``path``'s shape) of episodes on resampled paths: the ``offset``-th
        start of path ``path`` (``offset`` in ``0 .. path_bars - episode_length - first_valid - 1``),
        bar ``path·L + first_valid + offset`` ("Training paths" in the module docstring)."""
        return path * self.path_bars + self.first_valid + offset

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
        reset_where_reference(self._state, mask, starts, self._params)

# ---------------------------------------------------------------------- host-side helpers


def _check_paths(path_bars: int, window: int, episode_length: int, eval_mode: bool) -> None:
    """ValueError unless resampled training paths of ``path_bars`` bars fit a training episode."""
    if eval_mode:
        raise ValueError("market: resampled training paths (foxdqn.data.augment) are for training; an eval-mode "
                         "walk reads the market itself")
    if path_bars - 1 - episode_length < window - 1:
        raise ValueError(f"market: training paths of {path_bars} bars leave no start for an episode of "
                         f"episode_length={episode_length} steps after the window warm-up of {window} bars")


def walk_bounds(market: MarketData, split: str, window: int, max_eval_bars: int | None = None) -> tuple[int, int]:
    """``(first_valid, last_bar)`` of a walk of ``split``: ``max(start, window − 1)`` and ``end − 1``,
    or with ``max_eval_bars`` (an eval walk of ``debug.max_eval_bars``) ``first_valid +
    max_eval_bars`` where that is sooner. Raises ValueError as :class:`TradingEnv` (the split, or a
    ``max_eval_bars`` that is not an integer >= 1)."""
    start, end = _split_range(market, split, window)
    first_valid, last_bar = max(start, window - 1), end - 1
    if max_eval_bars is not None:
        last_bar = min(last_bar, first_valid + positive_int(max_eval_bars, "max_eval_bars"))
    return first_valid, last_bar


def _split_range(market: MarketData, split: str, window: int) -> tuple[int, int]:
    """``market.splits[split]`` as ints; ValueError naming ``split`` when it is missing or leaves no
    step after the ``window`` warm-up."""
    if split not in market.splits:
        raise ValueError(f"split: {split!r} is not a split of the market data (it has {', '.join(market.splits)})")
    start, end = (int(v) for v in market.splits[split])
    first_valid, last_bar = max(start, window - 1), end - 1
    if first_valid >= last_bar:
        raise ValueError(
            f"split: {split!r} = ({start}, {end}) leaves no step: the first valid bar max(start, window-1) = "
            f"{first_valid} must be before the last bar {last_bar}; use a longer split or a smaller window"
        )
    return start, end
