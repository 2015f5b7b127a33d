"""Executed-action diversity from the per-interval action counts (host side, at log boundaries).

Design: docs/design/monitors.md#action-diversity. The counts are the ones
:class:`foxdqn.population.stats.MemberStats` accumulates on the device (``actions``, one float64 count
per env action) and brings back with the log snapshot, so nothing here adds device work or a
host synchronisation. For the trading env's 45 factored actions
(``a = exposure * 9 + order_type * 3 + urgency``, :mod:`foxdqn.execution.orders`) the per-component
distributions are the marginals of the 45-way counts.

Entropies are Shannon entropies in nats, ``H = -Σ p log p`` over the actions with ``p > 0``;
the normalised entropy is ``H / log K`` in ``[0, 1]`` (1 = uniform over all K actions, 0 = one
action only; defined as 1 for K = 1).
"""
from __future__ import annotations

import logging
import math

import numpy as np

from foxdqn.execution.orders import NUM_ACTIONS, NUM_EXPOSURES, NUM_ORDER_TYPES, NUM_URGENCIES, action_name

__all__ = ["entropy", "normalised_entropy", "action_diversity", "top_actions", "CollapseMonitor"]

log = logging.getLogger(__name__)

COMPONENTS = (("exposure", 0), ("order_type", 1), ("urgency", 2))  # axes of counts.reshape(5, 3, 3)


def entropy(counts: np.ndarray) -> float:
    """Shannon entropy (nats) of the distribution ``counts / counts.sum()``; 0.0 for no counts.

    Args:
        counts: non-negative counts, any shape (flattened).
    """
    c = np.asarray(counts, dtype=np.float64).reshape(-1)
    total = c.sum()
    if total <= 0:
        return 0.0
    p = c[c > 0] / total
    return max(0.0, float(-(p * np.log(p)).sum()))  # one action: 0.0, not -0.0


def normalised_entropy(counts: np.ndarray) -> float:
    """``entropy(counts) / log K`` with K = number of entries (1.0 when K = 1; NaN for no counts)."""
    c = np.asarray(counts, dtype=np.float64).reshape(-1)
    if c.sum() <= 0:
        return float("nan")
    return entropy(c) / math.log(c.size) if c.size > 1 else 1.0


def top_actions(counts: np.ndarray, k: int, factored: bool) -> list[tuple[str, float]]:
    """The ``k`` most frequent actions as ``(label, share)``, most frequent first (ties: lower
    index first); labels are :func:`foxdqn.execution.orders.action_name` for the factored trading
    actions, else the action index. Actions never taken are left out."""
    c = np.asarray(counts, dtype=np.float64).reshape(-1)
    total = c.sum()
    if total <= 0:
        return []
    order = np.argsort(-c, kind="stable")[:k]
    return [(action_name(int(a)) if factored else str(int(a)), float(c[a] / total)) for a in order if c[a] > 0]


def action_diversity(counts: np.ndarray, factored: bool) -> dict[str, float]:
    """Numeric diversity columns of one log interval.

    Args:
        counts: float64 ``[A]`` executed-action counts.
        factored: the counts are the trading env's 45 factored actions (then the exposure /
            order-type / urgency marginals are reported too).

    Returns:
        ``action_entropy`` (nats), ``action_entropy_norm`` (÷ log A) and, when ``factored``,
        ``exposure_entropy``, ``order_type_entropy``, ``urgency_entropy`` (nats) and their
        ``*_entropy_norm`` (÷ log 5, log 3, log 3). NaN norms when the interval has no actions.

    Raises:
        ValueError: ``factored`` but ``counts`` does not have 45 entries.
    """
    c = np.asarray(counts, dtype=np.float64).reshape(-1)
    out = {"action_entropy": entropy(c), "action_entropy_norm": normalised_entropy(c)}
    if factored:
        if c.size != NUM_ACTIONS:
            raise ValueError(f"factored counts must have {NUM_ACTIONS} entries, got {c.size}")
        cube = c.reshape(NUM_EXPOSURES, NUM_ORDER_TYPES, NUM_URGENCIES)
        for name, axis in COMPONENTS:
            marginal = cube.sum(axis=tuple(i for i in range(3) if i != axis))
            out[f"{name}_entropy"] = entropy(marginal)
            out[f"{name}_entropy_norm"] = normalised_entropy(marginal)
    return out


class CollapseMonitor:
    """Warns once per collapse episode when the normalised action entropy stays low.

    A log interval is *low* when its ``action_entropy_norm < min_entropy``; after ``patience``
    low intervals in a row :meth:`update` logs one warning and returns True. The episode ends at
    the first interval that is not low (an interval without actions, NaN, neither counts nor
    ends it); the next run of ``patience`` low intervals warns again.

    Args:
        min_entropy: threshold on the normalised entropy in [0, 1]; 0 disables the monitor.
        patience: low intervals in a row before the warning (>= 1).

    Attributes: ``warnings`` (collapse episodes warned about), ``low_streak`` (current run of
    low intervals), ``collapsed`` (inside a warned episode now).
    """

    def __init__(self, min_entropy: float, patience: int) -> None:
        self.min_entropy = float(min_entropy)
        self.patience = int(patience)
        self.warnings = 0
        self.low_streak = 0
        self.collapsed = False

    def state_dict(self) -> dict:
        """The monitor's progress as plain data, for a checkpoint."""
        return {"warnings": self.warnings, "low_streak": self.low_streak, "collapsed": self.collapsed}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict` ``state``."""
        self.warnings, self.low_streak = int(state["warnings"]), int(state["low_streak"])
        self.collapsed = bool(state["collapsed"])

    def update(self, norm_entropy: float, env_steps: int, top: list[tuple[str, float]] = ()) -> bool:
        """Feed one interval's normalised entropy; True exactly when a warning is issued."""
        if self.min_entropy <= 0 or math.isnan(norm_entropy):
            return False
        if norm_entropy >= self.min_entropy:
            self.low_streak, self.collapsed = 0, False
            return False
        self.low_streak += 1
        if self.collapsed or self.low_streak < self.patience:
            return False
        self.collapsed = True
        self.warnings += 1
        log.warning("action collapse at %d env steps: normalised action entropy %.3f < %.3f for %d log "
                    "intervals in a row (top: %s)", env_steps, norm_entropy, self.min_entropy, self.low_streak,
                    format_top(top))
        return True


def format_top(top) -> str:
    """``"+1.0 market normal 62%, ..."`` for a :func:`top_actions` list."""
    return ", ".join(f"{label} {share:.0%}" for label, share in top) or "none"
