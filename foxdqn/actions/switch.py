r"""Cost-aware greedy choice (``action.switch_margin``): change exposure only when the Q gain pays
a margin times the switch's cost.

With margin ``m > 0`` every greedy choice of a trading agent (the test and validation walks of
:mod:`foxdqn.analysis.backtest`, the greedy part of the collect step's ε-greedy, and the argmax of the
bootstrap target: Double DQN's online argmax, plain DQN's max, C51's and IQN's expected-Q argmax,
the branching target's exposure branch) is, per state::

    a* = argmax_a [ Q(s, a) − m · k · c_t · |x(a) − x_t| · 1{e(a) ≠ e_t} ]

* ``e(a)`` is the exposure index the network action ``a`` targets (:func:`action_exposures`:
  ``a // 9`` for the 45 factored actions and the branching mode's joint actions, ``a`` itself for
  ``exposure_routed``, whose order type and urgency are routed afterwards) and ``x(a) =
  EXPOSURES[e(a)]`` its target exposure; every order type and urgency of one exposure gets the same
  penalty. ``e_t`` is the exposure index held and ``x_t = units · close_t / equity`` the exposure
  held (:meth:`foxdqn.envs.trading.TradingEnv.account`): an action of the held index sends no
  order (:mod:`foxdqn.execution.fills`), so it costs nothing, and any other trades ``|x(a) − x_t|``
  units of exposure.
* ``c_t`` is the cost of one unit of exposure traded with a market order of normal urgency,
  ``s_t/2 + (market_slippage_bps[normal] + taker_fee_bps)·1e-4``
  (:func:`foxdqn.execution.fills.unit_switch_cost`, the near-oracle's cost), a fraction of equity:
  the reward (log-equity change) the switch loses, to first order. ``k = loss.reward_scale``
  brings it to the units of Q (the replay stores rewards times ``k``).

So the greedy agent leaves its position only when ``Q(s, a) − Q(s, keep) > m · k · c_t ·
|x(a) − x_t|`` for the best such ``a``. ``m = 0`` is the plain argmax; the option is off and
nothing of this module runs (``action.switch_margin: 0``, the default). The bootstrap target takes
the penalty only to choose ``a*``; the value it bootstraps is the unpenalised ``Q_target(s', a*)``
(the costs paid are in the rewards already). The next states' accounts come from the replay's
state codes (:class:`foxdqn.replay.buffer.Batch` ``next_code``), whose held index is the nearest
exposure (:meth:`~foxdqn.envs.trading.TradingEnv.account`).

IQL's target bootstraps ``V(s')``, with no argmax: there the margin changes the acting only.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from foxdqn.execution.orders import EXPOSURES, NUM_ACTIONS, NUM_EXPOSURES, factor
from foxdqn.execution.fills import unit_switch_cost

__all__ = ["NextStatePenalty", "SwitchPenalty", "action_exposures", "switch_penalty"]


def action_exposures(mode_name: str | None, device: torch.device | str = "cpu") -> Tensor:
    """int64 ``[A]``: the exposure index (0..4) each network action targets.

    Args:
        mode_name: ``action.mode``: ``"factored"`` or ``"branching"`` (the 45 joint actions
            ``exposure·9 + order_type·3 + urgency``: ``a // 9``), ``"exposure_routed"`` (the 5
            exposures), None: the 45 factored actions.
        device: where the tensor is made.

    Raises:
        ValueError: an unknown ``mode_name``.
    """
    if mode_name in (None, "factored", "branching"):
        return factor(torch.arange(NUM_ACTIONS, device=device))[0]
    if mode_name == "exposure_routed":
        return torch.arange(NUM_EXPOSURES, device=device)
    raise ValueError(f"action_exposures: mode_name must be factored, branching or exposure_routed, got {mode_name!r}")


def switch_penalty(exposure: Tensor, held: Tensor, unit_cost: Tensor, exposures: Tensor, scale: float) -> Tensor:
    """Per exposure index, what a greedy choice subtracts from Q: ``scale · c · |x_e − x| · 1{e ≠ held}``.

    Args:
        exposure: ``[N]`` exposure held ``x`` (fraction of equity), float.
        held: int64 ``[N]`` exposure index held.
        unit_cost: ``[N]`` cost ``c`` of trading one unit of exposure (fraction of equity), float.
        exposures: ``[E]`` the target exposure of each index (:data:`foxdqn.execution.orders.EXPOSURES`).
        scale: ``m · k``, the margin times ``loss.reward_scale`` (>= 0).

    Returns:
        float32 ``[N, E]``, 0 in the held column (computed in float64, then rounded once).
    """
    f64 = torch.float64
    distance = (exposures.to(f64).unsqueeze(0) - exposure.to(f64).unsqueeze(1)).abs()
    cost = distance * unit_cost.to(f64).unsqueeze(1) * float(scale)
    columns = torch.arange(exposures.shape[0], device=held.device)
    return torch.where(columns.unsqueeze(0) == held.unsqueeze(1), torch.zeros_like(cost), cost).to(torch.float32)


class SwitchPenalty:
    """The switch penalty of ``action.switch_margin`` for one run (module docstring).

    Args:
        margin: ``m > 0`` (``action.switch_margin``).
        reward_scale: ``k > 0`` (``loss.reward_scale``).
        mode_name: ``action.mode`` (:func:`action_exposures`).
        device: where the action → exposure map lives.

    Attributes:
        scale: ``m · k``.  action_exposure: int64 ``[A]`` (:func:`action_exposures`).
        exposures: float64 ``[5]``, :data:`~foxdqn.execution.orders.EXPOSURES`.

    Raises:
        ValueError: ``margin`` or ``reward_scale`` not a finite number > 0, or an unknown mode.
    """

    checkpointed = False  # constants of the config, rebuilt with the run

    def __init__(self, margin: float, reward_scale: float, mode_name: str | None, device: torch.device | str):
        for name, value in (("margin", margin), ("reward_scale", reward_scale)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and value > 0):
                raise ValueError(f"SwitchPenalty: {name} must be a finite number > 0, got {value!r}")
        self.scale = float(margin) * float(reward_scale)
        self.action_exposure = action_exposures(mode_name, device)
        self.exposures = torch.tensor(EXPOSURES, device=device, dtype=torch.float64)

    def per_exposure(self, env, code: Tensor | None = None) -> Tensor:
        """float32 ``[N, 5]`` (or ``[B, 5]``): the penalty of each exposure index for ``env``'s
        current states (``code`` None) or for the states of ``code`` (``[B, 4]`` state codes of
        ``env``'s bars), from :meth:`foxdqn.envs.trading.TradingEnv.account`. Sync-free."""
        account = env.account(code)
        cost = unit_switch_cost(account.spread.to(torch.float64), env.execution)
        return switch_penalty(account.exposure, account.held, cost, self.exposures, self.scale)

    def __call__(self, env, code: Tensor | None = None) -> Tensor:
        """float32 ``[N, A]``: the penalty of every network action (its exposure's, :meth:`per_exposure`)."""
        return self.per_exposure(env, code)[:, self.action_exposure]


class NextStatePenalty:
    """The switch penalty of a replay batch's next states s', for the bootstrap target's argmax.

    Args:
        switch: the run's :class:`SwitchPenalty`.
        env: the training env whose state codes the replay stores (its bars and costs).

    ``penalty(batch)`` → float32 ``[B, A]`` and ``penalty.per_exposure(batch)`` → float32
    ``[B, 5]`` for the states of ``batch.next_code`` (``[B, 4]`` state codes of s',
    :class:`foxdqn.replay.buffer.Batch`). Sync-free.

    Raises:
        ValueError: (at the call) a batch without ``next_code``: its replay stores observations,
            which do not say the bar's spread.
    """

    checkpointed = False

    def __init__(self, switch: SwitchPenalty, env):
        self.switch, self.env = switch, env

    def per_exposure(self, batch) -> Tensor:
        if batch.next_code is None:
            raise ValueError("action.switch_margin: the bootstrap target needs the state codes of s' "
                             "(Batch.next_code), and this replay stores observations")
        return self.switch.per_exposure(self.env, batch.next_code)

    def __call__(self, batch) -> Tensor:
        return self.per_exposure(batch)[:, self.switch.action_exposure]
