r"""Execution model of the trading environment: order pricing, fills, fees and accounting.

Conventions
-----------
* Prices are in the instrument's own price units; open/high/low/close are mid prices.
* ``spread[t]`` is the *relative* quoted spread of bar ``t`` (ask − bid over mid, e.g. ``1e-4``
  = 1 bp). The spread used for execution is floored:
  ``s_t = max(spread[t], spread_floor_bps * 1e-4)``.
* Equity is in cash units and starts at ``initial_equity``. Units may be fractional and negative
  (short). ``bps`` values are multiplied by ``1e-4``.
* All arithmetic runs in the environment's ``dtype`` (float64 in the tests).

Timeline
--------
The agent decides at the close of bar ``t`` (it sees bars up to and including ``t``); the order
is sent at the open of bar ``t+1`` and either executes at that instant (market, IoC) or rests
through bar ``t+1`` (limit maker); the reward is measured at the close of bar ``t+1``.

1. **Target.** The action's exposure index ``e`` selects ``x = EXPOSURES[e]``. If ``e`` equals the
   exposure index currently held, no order is sent (no rebalancing of drifted exposure); order
   type and urgency are ignored that step. Otherwise the target position is
   ``q* = x * equity_t / close_t`` units and the order is ``dq = q* - q``
   (``sgn = sign(dq)``, +1 buy, −1 sell). The exposure index held changes only on a fill.
2. **Price and fill**, by order type, with urgency ``u`` (0 patient, 1 normal, 2 aggressive).
   ``s_t`` is the floored spread of bar ``t``, the last spread known when the order is sent; it
   is also the spread assumed at the open of ``t+1`` (the spread estimate of bar ``t+1`` reads
   that bar's high and low, which are not known at its open). The touch at the open is
   ``touch = open_{t+1} * (1 + sgn * s_t/2)`` (the ask for a buy, the bid for a sell).

   * ``market``: always fills, at ``open_{t+1} * (1 + sgn * (s_t/2 + market_slippage_bps[u]*1e-4))``.
     Taker fee.
   * ``ioc`` (immediate or cancel): limit ``L = close_t * (1 + sgn * (s_t/2 + ioc_offset_bps[u]*1e-4))``
     (beyond the touch at decision time). Sent at the open of ``t+1``, it is decided at that
     instant: it fills iff it is marketable against the touch at the open — buy
     ``L >= touch``, sell ``L <= touch`` — at the touch plus the market slippage of its urgency,
     never beyond its limit: buy ``min(L, touch * (1 + slip_u))``, sell
     ``max(L, touch * (1 - slip_u))``. Taker fee. Otherwise it is cancelled. No high or low of bar
     ``t+1`` takes part: whether and where an IoC fills is known at the open.
   * ``limit_maker``: limit price set at decision time,
     ``L = close_t * (1 - sgn * limit_offset_half_spreads[u] * s_t/2)`` (on the passive side of
     the decision close). It rests through bar ``t+1`` and fills only if the bar trades *through*
     the limit — buy: ``low_{t+1} < L``, sell: ``high_{t+1} > L`` (strict; a bar that only
     touches ``L`` does not fill it) — at price ``L``. Maker fee (negative = rebate). Otherwise
     cancelled at the end of the bar, position unchanged. Reading bar ``t+1``'s low/high is the
     resting order's own life, not look-ahead: the fill happens when the price crosses ``L``,
     and the position is marked at ``close_{t+1}`` after it. Two conservative choices: a bar that
     gaps through ``L`` at the open fills at ``L``, not at the better open; and a fill is
     conditioned on the price moving against the order (adverse selection: on a random walk
     the expected mark after a fill is at or below ``L`` for a buy, never above).

3. **Fee.** ``fee = |dq| * fill_price * fee_bps * 1e-4`` (taker fee for market and IoC, maker
   fee for limit-maker; a negative fee is a rebate and adds cash).
4. **Accounting** on a fill: ``cash -= dq * fill_price + fee``; ``units += dq``. Entry price:
   volume-weighted average when adding in the same direction; unchanged when reducing; the
   fill price when opening from flat or flipping side; ``0`` when the fill leaves the position
   flat.
5. **Mark to market.** ``equity_{t+1} = cash + units * close_{t+1}``. The reward is
   ``log(equity_{t+1}) - log(equity_t)``, net of every cost. If
   ``equity_{t+1} <= 1e-6 * initial_equity`` (ruin, which includes ``equity <= 0``) the episode
   terminates and the reward is ``log(1e-6 * initial_equity) - log(equity_t)``, i.e. equity is
   floored at ``1e-6 * initial_equity`` inside the log (with the default ``initial_equity = 1``
   this is ``log(1e-6) - log(equity_t)``).

Information audit
-----------------
Every quantity the environment, the data pipeline and the evaluation use, the bar it is
computed from, when it is known and when it is used (``t`` = decision bar, ``t+1`` = the bar the
order executes in; "train end" = the last bar of the training split). Nothing is used before it
is known; the only quantities computed over a whole split are the training-split statistics,
which are known at the end of the training split and used in the validation and test splits
after it (inside the training split they are in-sample, like any fitted model).

=======================================  ==============================  ======================  ==============================
quantity                                 computed from                   known at                used at
=======================================  ==============================  ======================  ==============================
features of row ``t`` (log return,       bars ``<= t`` (vol window,      close of ``t``          observation at the decision
range, close location, volatility,       volume window back)                                     at ``t``
volume z)
feature normalisation mean/std, clip     training-split rows             train end               every observation (train,
                                                                                                 val, test)
``volume_z`` included or not             training-split volumes          train end               every observation
spread ``s_t`` (Corwin-Schultz, causal   high/low/close of bars          close of ``t``          limit and IoC prices at the
rolling mean)                            ``t-spread_window .. t``                                decision; the touch and market
                                                                                                 price at the open of ``t+1``
routing medians (spread, volatility)     training-split rows             train end               exposure_routed order type and
                                                                                                 urgency at each decision
routing / regime volatility of ``t``     closes ``<= t``                 close of ``t``          decision at ``t``; replay
                                                                                                 regime weight of that state
account obs (exposure, unrealised PnL)   units, entry, close ``t``,      close of ``t``          observation at the decision
                                         equity ``t``
target units ``q*``                      equity ``t``, close ``t``       close of ``t``          order size sent at the open
                                                                                                 of ``t+1``
market fill price                        open ``t+1``, ``s_t``           open of ``t+1``         fill at the open of ``t+1``
IoC fill decision and price              ``L`` (close ``t``, ``s_t``),   open of ``t+1``         fill or cancel at the open of
                                         open ``t+1``                                            ``t+1``
limit-maker fill                         ``L`` (close ``t``, ``s_t``),   while bar ``t+1``       the resting order fills when
                                         low/high of ``t+1``             trades                  the price crosses ``L``
mark to market, reward                   close ``t+1``                   close of ``t+1``        reward of step ``t -> t+1``
training episode start                   uniform draw in                 before the episode      first observation of the
                                         ``[first_valid, last - L]``                             episode (no price read)
                                         of the training split
evaluation walk                          the split's bars only, from     bar by bar              decision at ``t`` sees rows
                                         ``max(start, W-1)`` to its                              ``<= t``; its last order
                                         last bar                                                executes in the split's last
                                                                                                 bar, never past it
observation window at a split's first    rows ``t-W+1 .. t``: may reach  close of ``t``          allowed (the past); nothing of
bars                                     back into the previous split                            a later split is ever read
bars per year (annualisation)            timestamp spacing of all rows   known a priori          metrics only, not the agent
validation metric (early stopping,       the validation split            end of each             choosing weights and sweep
best checkpoint, sweeps)                                                 validation walk         settings
test metrics                             the test split, walked once     end of the run          the report only, never a choice
=======================================  ==============================  ======================  ==============================

Reported cost
-------------
``cost = dq * (fill_price - reference) + fee`` in equity (cash) units — spread plus slippage
plus fee, signed: negative when the fill beats its reference (captured half-spreads, rebates).
The reference mid is ``open_{t+1}`` for market and IoC orders (they execute against the book at
the open of bar ``t+1``) and ``close_t`` for limit-maker orders (the mid their price was quoted
from). For a market order it is exactly ``|dq| * open_{t+1} * (s_t/2 + slippage) + fee``.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields
from typing import Any, List, Mapping, NamedTuple

import torch
from torch import Tensor

from foxdqn.errors import ConfigError

from foxdqn.execution.orders import LIMIT_MAKER, MARKET, NORMAL, NUM_URGENCIES

BPS = 1e-4
RUIN_FRACTION = 1e-6  # equity at or below RUIN_FRACTION * initial_equity terminates the episode


@dataclass
class ExecutionConfig:
    """Costs and order-pricing parameters (see the module docstring for the exact model).

    Defaults describe a liquid instrument — an FX major on an ECN account or a large-cap
    equity — traded on intraday bars:

    * ``spread_floor_bps = 0.5``: floor on the per-bar relative spread. Raw EUR/USD ECN spreads
      are ~0.1–0.3 pip (~0.1–0.3 bp) and retail ~0.5–1 pip; a one-cent spread on a $100 stock
      is 1 bp. 0.5 bp keeps data with missing/zero spreads from trading for free.
    * ``taker_fee_bps = 0.3``: ~$3 per side per $100k on FX ECN accounts, ~$0.003/share on a
      $100 stock (commission + exchange take fee).
    * ``maker_fee_bps = 0.0``: no rebate assumed (conservative; most FX and retail equity
      accounts do not pass rebates on). Set it negative (e.g. ``-0.2``) for a rebate venue.
    * ``market_slippage_bps = (0.1, 0.3, 1.0)``: extra slippage beyond the half spread for
      patient/normal/aggressive market orders (an aggressive order is assumed to sweep deeper).
    * ``limit_offset_half_spreads = (1.0, 0.5, 0.0)``: the patient limit rests at the touch
      (one half-spread from the decision close, i.e. at the bid for a buy), normal halfway,
      aggressive at the mid.
    * ``ioc_offset_bps = (0.5, 1.0, 2.0)``: IoC protection band beyond the touch.
    * ``initial_equity = 1.0``: equity is tracked in units of starting capital.
    * The IoC fill rule is not a setting: an IoC is marketable at the open or cancelled (the
      module docstring). The earlier ``ioc_fill_rule`` ("range", which read the next bar's
      high/low, and "marketable") is gone; a config that still sets it is refused
      (``foxdqn.config.schema.REMOVED_KEYS``).

    Per-urgency fields are sequences of 3 floats (patient, normal, aggressive); a list, tuple or
    OmegaConf ``ListConfig`` is accepted.
    """

    spread_floor_bps: float = 0.5  # floor on each bar's relative spread (bp)
    taker_fee_bps: float = 0.3  # fee of market and IoC fills (bp of notional)
    maker_fee_bps: float = 0.0  # fee of limit-maker fills (bp; negative = rebate)
    # slippage of market orders beyond the half spread (bp), by urgency (patient, normal, aggressive)
    market_slippage_bps: List[float] = field(default_factory=lambda: [0.1, 0.3, 1.0])
    # limit below (buy) / above (sell) the decision close, in half spreads (1 = the touch), by urgency
    limit_offset_half_spreads: List[float] = field(default_factory=lambda: [1.0, 0.5, 0.0])
    # IoC limit beyond the touch (bp), by urgency
    ioc_offset_bps: List[float] = field(default_factory=lambda: [0.5, 1.0, 2.0])
    initial_equity: float = 1.0  # starting equity (units of capital)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], prefix: str = "env.execution") -> "ExecutionConfig":
        """Build from a mapping (e.g. a Hydra/OmegaConf node) and :meth:`validate` it.

        Raises:
            ConfigError: an unknown key (named as ``<prefix>.<key>``) or an invalid value.
        """
        known = {f.name for f in fields(cls)}
        for key in values:
            if key not in known:
                raise ConfigError(
                    f"{prefix}.{key}: unknown execution setting (allowed: {', '.join(sorted(known))})"
                )
        cfg = cls(**{k: values[k] for k in values})
        cfg.validate(prefix)
        return cfg

    def validate(self, prefix: str = "env.execution") -> None:
        """Check every field; the error names the field as ``<prefix>.<field>``.

        Rules: all values finite real numbers; ``spread_floor_bps >= 0``; ``taker_fee_bps >= 0``;
        ``maker_fee_bps`` any finite value (negative = rebate); per-urgency fields have exactly 3
        entries, each ``>= 0``;
        ``initial_equity > 0``.

        Raises:
            ConfigError: the first invalid field.
        """
        _number(self.spread_floor_bps, f"{prefix}.spread_floor_bps", minimum=0.0)
        _number(self.taker_fee_bps, f"{prefix}.taker_fee_bps", minimum=0.0)
        _number(self.maker_fee_bps, f"{prefix}.maker_fee_bps")
        for name in ("market_slippage_bps", "limit_offset_half_spreads", "ioc_offset_bps"):
            _triple(getattr(self, name), f"{prefix}.{name}")
        _number(self.initial_equity, f"{prefix}.initial_equity", minimum=0.0, strict=True)


def _number(value: Any, where: str, minimum: float | None = None, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{where}: must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ConfigError(f"{where}: must be finite, got {value!r}")
    if minimum is not None and (v <= minimum if strict else v < minimum):
        raise ConfigError(f"{where}: must be {'>' if strict else '>='} {minimum}, got {value!r}")
    return v


def _triple(value: Any, where: str) -> tuple[float, float, float]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise ConfigError(
            f"{where}: must be a list of {NUM_URGENCIES} numbers (patient, normal, aggressive), got {value!r}"
        )
    items = list(value)
    if len(items) != NUM_URGENCIES:
        raise ConfigError(
            f"{where}: must have exactly {NUM_URGENCIES} entries (patient, normal, aggressive), got {len(items)}"
        )
    return tuple(_number(v, f"{where}[{i}]", minimum=0.0) for i, v in enumerate(items))  # type: ignore[return-value]


def unit_switch_cost(spread: Tensor, cfg: ExecutionConfig) -> Tensor:
    """Cost of trading one unit of exposure (a change of 1 in the position as a fraction of equity)
    with a market order of normal urgency: ``c_t = s_t/2 + (market_slippage_bps[normal] +
    taker_fee_bps) * 1e-4``, a fraction of equity, hence the reward (log-equity) a switch of
    ``|dx|`` units loses, to first order: ``|dx| * c_t``.

    Args:
        spread: ``[N]`` floored relative spreads ``s_t`` (``TradingEnv.market_state()``), any float dtype.
        cfg: the env's costs (assumed valid).

    Returns:
        ``[N]`` in ``spread``'s dtype. The near-oracle (:func:`foxdqn.analysis.backtest.oracle_policy`) and
        the cost-aware greedy choice (:mod:`foxdqn.actions.switch`) price a switch with it.
    """
    return spread / 2 + (float(cfg.market_slippage_bps[NORMAL]) + float(cfg.taker_fee_bps)) * BPS


class CostTables(NamedTuple):
    """:class:`ExecutionConfig` as device tensors in the env dtype (relative units, not bps)."""

    slippage: Tensor  # [3] market slippage beyond the half spread, by urgency
    limit_k: Tensor  # [3] limit-maker offset in half-spreads, by urgency
    ioc_offset: Tensor  # [3] IoC offset beyond the half spread, by urgency
    fee_rate: Tensor  # [3] fee rate by order type (market, limit_maker, ioc)


def cost_tables(cfg: ExecutionConfig, device: torch.device, dtype: torch.dtype) -> CostTables:
    """Convert ``cfg`` (assumed valid) to :class:`CostTables` on ``device``."""

    def t(values):
        return torch.tensor([float(v) for v in values], dtype=dtype, device=device)

    taker, maker = float(cfg.taker_fee_bps) * BPS, float(cfg.maker_fee_bps) * BPS
    fee = [0.0, 0.0, 0.0]
    fee[MARKET], fee[LIMIT_MAKER], fee[2] = taker, maker, taker
    return CostTables(
        slippage=t(cfg.market_slippage_bps) * BPS,
        limit_k=t(cfg.limit_offset_half_spreads),
        ioc_offset=t(cfg.ioc_offset_bps) * BPS,
        fee_rate=t(fee),
    )


class Fills(NamedTuple):
    """Result of :func:`simulate_fills`; all ``[N]``."""

    fill: Tensor  # bool
    price: Tensor  # fill price (0 where no fill)
    traded: Tensor  # signed units traded (0 where no fill)
    fee: Tensor  # fee paid in cash units (negative = rebate; 0 where no fill)
    cost: Tensor  # spread + slippage + fee in cash units (see module docstring)


def simulate_fills(
    *,
    dq: Tensor,
    order_type: Tensor,
    urgency: Tensor,
    close_t: Tensor,
    spread_t: Tensor,
    open_n: Tensor,
    high_n: Tensor,
    low_n: Tensor,
    tables: CostTables,
) -> Fills:
    """Price and fill the orders ``dq`` sent at the open of the next bar (pure, sync-free, vectorised).

    The rules and the information each one reads are in the module docstring (Timeline and
    Information audit). Market and IoC orders read only ``open_n`` of the next bar; only the
    resting limit-maker order reads its ``low_n`` / ``high_n``.

    Args:
        dq: ``[N]`` desired signed order in units (0 = no order).
        order_type, urgency: ``[N]`` long, ``0..2``.
        close_t, spread_t: ``[N]`` decision-bar close (price units) and floored relative spread
            ``s_t`` (fraction of price), the last spread known when the order is sent.
        open_n, high_n, low_n: ``[N]`` next bar's open/high/low (price units).
        tables: from :func:`cost_tables`.

    Returns:
        :class:`Fills`, all ``[N]`` in the dtype of ``dq``.
    """
    sgn = torch.sign(dq)
    buy = sgn > 0
    sell = sgn < 0
    half = spread_t * 0.5
    slip = tables.slippage[urgency]

    p_market = open_n * (1 + sgn * (half + slip))

    p_limit = close_t * (1 - sgn * tables.limit_k[urgency] * half)
    fill_limit = (buy & (low_n < p_limit)) | (sell & (high_n > p_limit))

    l_ioc = close_t * (1 + sgn * (half + tables.ioc_offset[urgency]))
    touch = open_n * (1 + sgn * half)
    fill_ioc = (buy & (l_ioc >= touch)) | (sell & (l_ioc <= touch))
    swept = touch * (1 + sgn * slip)
    p_ioc = torch.where(buy, torch.minimum(l_ioc, swept), torch.maximum(l_ioc, swept))

    is_market = order_type == MARKET
    is_limit = order_type == LIMIT_MAKER
    price = torch.where(is_market, p_market, torch.where(is_limit, p_limit, p_ioc))
    fill = torch.where(is_market, buy | sell, torch.where(is_limit, fill_limit, fill_ioc))

    zero = torch.zeros((), dtype=dq.dtype, device=dq.device)
    traded = torch.where(fill, dq, zero)
    price = torch.where(fill, price, zero)
    fee = traded.abs() * price * tables.fee_rate[order_type]
    reference = torch.where(is_limit, close_t, open_n)
    cost = torch.where(fill, traded * (price - reference) + fee, zero)
    return Fills(fill=fill, price=price, traded=traded, fee=fee, cost=cost)


def apply_fills(cash: Tensor, units: Tensor, entry: Tensor, fills: Fills) -> tuple[Tensor, Tensor, Tensor]:
    """Book ``fills`` into the account (pure): returns new ``(cash, units, entry_price)``, ``[N]``.

    Entry price: fill price when opening from flat or flipping side; volume-weighted average when
    adding in the same direction; unchanged when reducing; 0 when the result is flat.
    """
    dq, price = fills.traded, fills.price
    new_cash = cash - dq * price - fills.fee
    new_units = units + dq
    s_old = torch.sign(units)
    s_new = torch.sign(new_units)
    zero = torch.zeros((), dtype=units.dtype, device=units.device)
    opening = (s_old == 0) | (s_new != s_old)
    adding = (s_old != 0) & (torch.sign(dq) == s_old)
    safe_units = torch.where(new_units == 0, torch.ones_like(new_units), new_units)
    average = (units * entry + dq * price) / safe_units
    booked = torch.where(s_new == 0, zero, torch.where(opening, price, torch.where(adding, average, entry)))
    new_entry = torch.where(fills.fill, booked, entry)
    return new_cash, new_units, new_entry
