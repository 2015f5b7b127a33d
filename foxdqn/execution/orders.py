"""The 45 discrete trading actions: target exposure x order type x urgency.

An action is one integer ``a`` in ``0..44``::

    a = exposure * 9 + order_type * 3 + urgency

* ``exposure`` (0..4) indexes :data:`EXPOSURES`, the target position as a fraction of equity
  (negative = short). Index :data:`FLAT` (2) is flat.
* ``order_type`` (0..2) indexes :data:`ORDER_TYPES`: ``market``, ``limit_maker``, ``ioc``.
* ``urgency`` (0..2) indexes :data:`URGENCIES`: ``patient``, ``normal``, ``aggressive``.

How each order type and urgency executes is described in :mod:`foxdqn.execution.fills`.
"""
from __future__ import annotations

import torch
from torch import Tensor

EXPOSURES: tuple[float, ...] = (-1.0, -0.5, 0.0, 0.5, 1.0)
ORDER_TYPES: tuple[str, ...] = ("market", "limit_maker", "ioc")
URGENCIES: tuple[str, ...] = ("patient", "normal", "aggressive")

NUM_EXPOSURES = len(EXPOSURES)
NUM_ORDER_TYPES = len(ORDER_TYPES)
NUM_URGENCIES = len(URGENCIES)
NUM_ACTIONS = NUM_EXPOSURES * NUM_ORDER_TYPES * NUM_URGENCIES  # 45

FLAT = EXPOSURES.index(0.0)  # 2
MARKET, LIMIT_MAKER, IOC = 0, 1, 2
PATIENT, NORMAL, AGGRESSIVE = 0, 1, 2

_STRIDE_EXPOSURE = NUM_ORDER_TYPES * NUM_URGENCIES  # 9
_STRIDE_ORDER = NUM_URGENCIES  # 3


def factor(action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Split actions into their components.

    Args:
        action: integer tensor of any shape, values in ``0..44``.

    Returns:
        ``(exposure, order_type, urgency)``: integer tensors of ``action``'s shape and dtype,
        values in ``0..4``, ``0..2``, ``0..2``. Pure tensor arithmetic (no host sync); values
        outside ``0..44`` are not checked and give components out of range.
    """
    exposure = torch.div(action, _STRIDE_EXPOSURE, rounding_mode="floor")
    rest = action - exposure * _STRIDE_EXPOSURE
    order_type = torch.div(rest, _STRIDE_ORDER, rounding_mode="floor")
    urgency = rest - order_type * _STRIDE_ORDER
    return exposure, order_type, urgency


def compose(exposure, order_type, urgency):
    """Inverse of :func:`factor`: ``exposure * 9 + order_type * 3 + urgency``.

    Args:
        exposure, order_type, urgency: Python ints or integer tensors (broadcastable).

    Returns:
        The action(s): a tensor when any argument is a tensor, else an ``int``.
    """
    return exposure * _STRIDE_EXPOSURE + order_type * _STRIDE_ORDER + urgency


def action_name(action: int) -> str:
    """Human-readable name of one action, e.g. ``"+0.5 ioc aggressive"`` (for logs and plots).

    Raises:
        ValueError: ``action`` is not an int in ``0..44``.
    """
    if isinstance(action, bool) or not isinstance(action, int) or not 0 <= action < NUM_ACTIONS:
        raise ValueError(f"action must be an int in 0..{NUM_ACTIONS - 1}, got {action!r}")
    e, rest = divmod(action, _STRIDE_EXPOSURE)
    o, u = divmod(rest, _STRIDE_ORDER)
    return f"{EXPOSURES[e]:+.1f} {ORDER_TYPES[o]} {URGENCIES[u]}"
