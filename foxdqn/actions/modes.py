"""How the network's action index becomes an environment action (``action.mode``).

The network acts in its own action space (``num_actions`` outputs); replay stores that network
index, and :meth:`to_env` maps it to what ``env.step`` takes — for the trading env a factored
action ``exposure·9 + order_type·3 + urgency`` in ``0..44`` (:mod:`foxdqn.execution.orders`).

* ``factored`` (:class:`FactoredMode`): one head over all env actions (45 for trading,
  ``env.num_actions`` for any other env); identity.
* ``exposure_routed`` (:class:`ExposureRoutedMode`): one head over the 5 exposures; order type
  and urgency come from the routing rule of docs/environments.md#routing-rule
  (``OrderRouter::route``, :mod:`foxdqn.ops.route_exposure_to_factored`) applied to the bar's
  spread and volatility at decision time against the training-split medians.
* ``branching`` (:class:`BranchingMode`): BDQ branches (exposure 5, order type 3, urgency 3)
  whose network (:class:`foxdqn.nn.branching.BranchingNetwork`) outputs the joint Q over the 45
  factored actions; the network index already is the factored action, so ``to_env`` is the
  identity. The objective is :class:`foxdqn.objectives.branching.BranchingObjective`.

Every ``to_env`` launches device ops only (no host sync, fixed shapes): safe in a CUDA graph.
"""
from __future__ import annotations

import numbers

import torch
from torch import Tensor

from foxdqn.execution.orders import NUM_ACTIONS, NUM_EXPOSURES, NUM_ORDER_TYPES, NUM_URGENCIES
from foxdqn.ops.route_exposure_to_factored import route_exposure_to_factored

__all__ = ["ACTION_MODES", "BranchingMode", "ExposureRoutedMode", "FactoredMode", "build_action_mode"]

ACTION_MODES = ("factored", "exposure_routed", "branching")


class FactoredMode:
    """One Q head over every env action; ``to_env`` is the identity.

    Args:
        num_actions: the env's action count (45 for the trading env).

    Attributes:
        name: ``"factored"``.  num_actions: network outputs = env actions.

    Raises:
        ValueError: ``num_actions`` not an int >= 1.
    """

    name = "factored"

    def __init__(self, num_actions: int = NUM_ACTIONS):
        if isinstance(num_actions, bool) or not isinstance(num_actions, numbers.Integral) or num_actions < 1:
            raise ValueError(f"FactoredMode: num_actions must be an int >= 1, got {num_actions!r}")
        self.num_actions = int(num_actions)

    def to_env(self, action: Tensor, env=None) -> Tensor:
        """int64 ``[N]`` network action → the same tensor (env action)."""
        return action


class ExposureRoutedMode:
    """A head over the 5 exposures; order type and urgency routed from market state.

    Rule (docs/environments.md#routing-rule; exact float32 comparisons in
    :mod:`foxdqn.ops.route_exposure_to_factored`), per env with its bar's spread ``s`` and
    volatility ``v`` at decision time (``env.market_state()``)::

        order_type = market if m_s <= 0, limit-maker if s < m_s, market if s > 2 m_s, else IoC
        urgency    = normal if m_v <= 0, aggressive if v > 1.5 m_v, patient if v < 0.5 m_v, else normal

    Args:
        median_spread: ``m_s``, 0-d float32 device tensor (relative spread, the training split's
            median, floored like the env's spreads), or a Python number (converted to a 0-d
            float32 tensor on ``device``).
        median_volatility: ``m_v``, the same for the per-bar volatility.
        device: where number arguments are placed (ignored for tensors).

    Attributes:
        name: ``"exposure_routed"``.  num_actions: 5.  median_spread, median_volatility: the
        0-d tensors (device tensors: they may be updated in place between graph replays).

    Raises:
        ValueError: ``median_spread`` or ``median_volatility`` not a finite number >= 0 or a 0-d tensor.
    """

    name = "exposure_routed"
    num_actions = NUM_EXPOSURES

    def __init__(self, median_spread, median_volatility, device: torch.device | str = "cpu"):
        self.median_spread = _scalar_tensor(median_spread, "median_spread", device)
        self.median_volatility = _scalar_tensor(median_volatility, "median_volatility", device)

    def to(self, device: torch.device | str) -> "ExposureRoutedMode":
        """Move the medians to ``device`` (setup time, not inside a captured step); returns self."""
        self.median_spread = self.median_spread.to(device)
        self.median_volatility = self.median_volatility.to(device)
        return self

    def to_env(self, action: Tensor, env) -> Tensor:
        """Exposure ``[N]`` int64 (0..4) → factored action ``[N]`` int64 (0..44).

        ``env.market_state()`` gives ``(spread [N], volatility [N])`` in the env dtype; they are
        cast to float32 (the routing op's dtype) on the device. Sync-free.

        Raises:
            ValueError: the medians are not on the action's device (see :meth:`to`).
        """
        spread, volatility = env.market_state()
        return route_exposure_to_factored(
            action.contiguous(), spread.to(torch.float32), self.median_spread,
            volatility.to(torch.float32), self.median_volatility)


class BranchingMode:
    """BDQ branches (exposure 5, order type 3, urgency 3); the network index is the factored action.

    The network (:class:`foxdqn.nn.branching.BranchingNetwork` with these ``branch_sizes``)
    outputs ``Q(s, a) = (1/3) Σ_d Q_d(s, a_d)`` over the 45 joint actions at index
    ``exposure·9 + order_type·3 + urgency``; its argmax is the per-branch argmaxes combined
    (proof in :mod:`foxdqn.nn.branching`). ``to_env`` is the identity.

    Attributes:
        name: ``"branching"``.  num_actions: 45.  branch_sizes: ``(5, 3, 3)``.
    """

    name = "branching"
    num_actions = NUM_ACTIONS
    branch_sizes = (NUM_EXPOSURES, NUM_ORDER_TYPES, NUM_URGENCIES)

    def to_env(self, action: Tensor, env=None) -> Tensor:
        """int64 ``[N]`` joint action (0..44) → the same tensor (factored env action)."""
        return action


def build_action_mode(name: str, env):
    """The action mode ``name`` (``action.mode``) for ``env``.

    Args:
        name: ``"factored"`` | ``"exposure_routed"`` | ``"branching"``.
        env: the environment. ``factored`` works with any env (``num_actions = env.num_actions``);
            the other two need a trading env (one with ``market_state()``; ``exposure_routed``
            also reads ``env.median_spread``, ``env.median_volatility`` and ``env.device``).

    Returns:
        :class:`FactoredMode`, :class:`ExposureRoutedMode` (medians as 0-d float32 tensors on
        ``env.device``) or :class:`BranchingMode`.

    Raises:
        ValueError: unknown ``name``, or a mode other than ``factored`` for an ``env`` without
            ``market_state`` (the message names ``name`` and ``env``).
    """
    if name not in ACTION_MODES:
        raise ValueError(f"build_action_mode: name must be one of {', '.join(ACTION_MODES)}, got {name!r}")
    if name == "factored":
        return FactoredMode(env.num_actions)
    if not callable(getattr(env, "market_state", None)):
        raise ValueError(
            f"build_action_mode: name={name!r} needs an env with market_state() (the trading env, 45 factored "
            f"actions); env={type(env).__name__} supports only name='factored'")
    if name == "exposure_routed":
        return ExposureRoutedMode(env.median_spread, env.median_volatility, device=env.device)
    return BranchingMode()


def _scalar_tensor(value, field: str, device) -> Tensor:
    if isinstance(value, Tensor):
        if value.dim() != 0:
            raise ValueError(f"ExposureRoutedMode: {field} must be a 0-d tensor, got shape {tuple(value.shape)}")
        return value.to(torch.float32)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0 or value == float("inf"):
        raise ValueError(f"ExposureRoutedMode: {field} must be a finite number >= 0, got {value!r}")
    return torch.tensor(float(value), dtype=torch.float32, device=device)
