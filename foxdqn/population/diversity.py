"""Each member's executed-action diversity at a log boundary
(docs/design/monitors.md#action-diversity).

From a member's action counts of the interval (float64 ``[A]``, :meth:`MemberStats.read
<foxdqn.population.stats.MemberStats.read>`): its row's ``action_entropy`` always and, with
``diversity.enabled``, the diversity columns (:func:`foxdqn.logger.diversity.action_diversity`), the
log-file line naming the top actions, and its own collapse monitor (``diversity.min_entropy``,
``diversity.patience``). Host side only: the counts come with the interval's one device→host copy.
"""
from __future__ import annotations

import logging

import numpy as np

from foxdqn.logger.detail import DETAIL
from foxdqn.logger.diversity import CollapseMonitor, action_diversity, entropy, format_top, top_actions

log = logging.getLogger(__name__)


class MemberDiversity:
    """Action diversity of P members whose configs are ``cfgs`` (``diversity.*`` is a group key);
    ``factored``: the 45 factored trading actions (their components get entropies too); ``jobs``:
    each member's job number for its log lines' prefix (None: a single run, no prefix)."""

    def __init__(self, cfgs, factored: bool, jobs: list[int] | None) -> None:
        d = cfgs[0].diversity
        self.enabled, self.top_k, self.factored, self.jobs = bool(d.enabled), int(d.top_k), factored, jobs
        self.collapse = [CollapseMonitor(d.min_entropy, d.patience) for _ in cfgs]

    def columns(self, counts: np.ndarray) -> dict[str, float]:
        """The row's diversity columns of one member's ``counts``: ``action_entropy`` (nats) and, when
        enabled, :func:`action_diversity`'s."""
        out = {"action_entropy": entropy(counts)}
        if self.enabled:
            out.update(action_diversity(counts, self.factored))
        return out

    def observe(self, p: int, row: dict, counts: np.ndarray, env_steps: int) -> None:
        """When enabled: member ``p``'s log-file line of its interval (``row`` holds :meth:`columns`)
        and its collapse monitor's update."""
        if not self.enabled:
            return
        top = top_actions(counts, self.top_k, self.factored)
        parts = [f"H={row['action_entropy']:.3f} nats ({row['action_entropy_norm']:.2f} of max)"]
        if self.factored:
            parts += [f"{name} {row[f'{name}_entropy_norm']:.2f}" for name in ("exposure", "order_type", "urgency")]
        prefix, extra = "", dict(DETAIL)
        if self.jobs is not None:
            prefix, extra["foxdqn_job"] = f"job {self.jobs[p]}: ", self.jobs[p]
        log.info("%sactions at %d env steps: %s; top: %s", prefix, env_steps, ", ".join(parts), format_top(top),
                 extra=extra)
        self.collapse[p].update(row["action_entropy_norm"], env_steps, top)
