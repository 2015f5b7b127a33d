"""Early stopping on the validation metric and on the Q-value monitor (host side).

Design: docs/design/monitors.md#early-stopping (Q-value early stopping: stop when the average max-Q
stays above a bound) and the usual patience / min-delta rule on a validation metric (as in
Keras' ``EarlyStopping``). Every decision is made on the host from numbers the loop already has:
the validation metrics of a greedy evaluation (eval boundaries, outside the captured iteration)
and the mean max-Q of the log snapshot (log boundaries). Nothing here touches a device tensor.

Rules (``early_stop.*`` keys, :class:`foxdqn.config.schema.EarlyStopConfig`):

* validation: an evaluation *improves* when ``sign · (value − best) > min_delta`` (strict;
  ``sign = −1`` for ``max_drawdown``, a positive fraction where lower is better, else +1); the
  first finite value is always an improvement, a NaN value never is. After ``patience``
  evaluations in a row without improvement the run stops with reason ``early_stop_val``.
* Q bound: a log interval is *high* when ``|mean max-Q| > q_bound``; ``q_patience`` high
  intervals in a row stop the run with reason ``early_stop_q`` (an interval without updates,
  NaN, neither counts nor resets). ``q_bound = None`` disables it.
* Q divergence flag (``on_q_divergence``): the loop calls :meth:`EarlyStopper.stop` with
  ``early_stop_q`` instead of halting when the only flag raised is the Q monitor's.
"""
from __future__ import annotations

import logging
import math

from foxdqn.analysis.metrics import LOWER_IS_BETTER

log = logging.getLogger(__name__)

REASONS = ("completed", "early_stop_val", "early_stop_q")  # and "pruned" (foxdqn.run.search), set by foxdqn.run.finish


def resolve_metric(metric: str, env_name: str) -> str:
    """``auto`` → ``sharpe`` for the trading env, ``mean_return`` (greedy episode return) otherwise."""
    if metric == "auto":
        return "sharpe" if env_name == "trading" else "mean_return"
    return metric


class EarlyStopper:
    """State of the early-stopping rules for one run (see the module docstring).

    Args:
        cfg: :class:`foxdqn.config.schema.EarlyStopConfig`.
        env_name: ``cfg.env.name`` (chooses the metric of ``metric=auto``).

    Attributes: ``metric`` (resolved name), ``best`` / ``best_env_steps`` (None until a finite
    value was seen), ``bad_evals`` (evaluations in a row without improvement), ``q_streak``,
    ``reason`` (None while running, else one of :data:`REASONS` but ``completed``),
    ``at_env_steps``, ``detail``.
    """

    def __init__(self, cfg, env_name: str) -> None:
        self.cfg = cfg
        self.metric = str(resolve_metric(cfg.metric, env_name))  # a plain str (checkpoints, summary.json)
        self.sign = -1.0 if self.metric in LOWER_IS_BETTER else 1.0
        self.best: float | None = None
        self.best_env_steps: int | None = None
        self.best_trades: int | None = None
        self.bad_evals = 0
        self.q_streak = 0
        self.reason: str | None = None
        self.at_env_steps: int | None = None
        self.detail = ""

    #: the attributes a checkpoint keeps (plain data; ``cfg`` comes from the run's config)
    STATE = ("best", "best_env_steps", "best_trades", "bad_evals", "q_streak", "reason", "at_env_steps", "detail")

    def state_dict(self) -> dict:
        """The stopper's progress as plain data (numbers, strings, None), for a checkpoint."""
        return {name: getattr(self, name) for name in self.STATE}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict` ``state`` (keys it lacks keep their values)."""
        for name in self.STATE:
            if name in state:
                setattr(self, name, state[name])

    # -- validation metric --------------------------------------------------------------------
    def update_val(self, env_steps: int, metrics: dict) -> bool:
        """Feed one validation evaluation (the dict of :func:`foxdqn.run.finish.evaluate_val`).

        Returns True when it improved on the best (the caller saves the best checkpoint).

        Raises:
            KeyError: ``metrics`` has no value for the configured metric.
        """
        value = float(metrics[self.metric])
        improved = not math.isnan(value) and (
            self.best is None or self.sign * (value - self.best) > self.cfg.min_delta)
        if improved:
            self.best, self.best_env_steps, self.bad_evals = value, int(env_steps), 0
            trades = metrics.get("num_trades")  # the kept weights' trades on val (foxdqn.run.search)
            self.best_trades = None if trades is None else int(trades)
        else:
            self.bad_evals += 1
        return improved

    @property
    def val_exhausted(self) -> bool:
        """``patience`` evaluations in a row without improvement."""
        return self.bad_evals >= self.cfg.patience

    # -- Q monitor ----------------------------------------------------------------------------
    def update_q(self, mean_max_q: float) -> bool:
        """Feed one log interval's mean max-Q; True when ``q_patience`` high intervals in a row."""
        if self.cfg.q_bound is None or math.isnan(mean_max_q):
            return False
        self.q_streak = self.q_streak + 1 if abs(mean_max_q) > self.cfg.q_bound else 0
        return self.q_streak >= self.cfg.q_patience

    # -- outcome ------------------------------------------------------------------------------
    def stop(self, reason: str, env_steps: int, detail: str = "") -> None:
        """Record the stop (reason one of ``early_stop_val`` / ``early_stop_q``) and log it."""
        if reason not in REASONS[1:]:
            raise ValueError(f"reason must be one of {REASONS[1:]}, got {reason!r}")
        self.reason, self.at_env_steps, self.detail = reason, int(env_steps), detail
        log.warning("early stop (%s) at %d env steps: %s", reason, env_steps, detail)

    def val_detail(self) -> str:
        return (f"val {self.metric} did not improve by more than {self.cfg.min_delta} for {self.bad_evals} "
                f"evaluations (best {self.best} at {self.best_env_steps} env steps)")

    def q_detail(self, mean_max_q: float) -> str:
        return (f"|mean max-Q| = {abs(mean_max_q):.6g} > q_bound = {self.cfg.q_bound} for {self.q_streak} "
                "log intervals in a row")


def stop_summary(stopper: EarlyStopper | None, env_steps: int) -> dict:
    """``summary.json``'s ``stop`` entry: reason, at_env_steps, best_env_steps, best_metric, metric."""
    if stopper is None:
        return {"reason": "completed", "at_env_steps": int(env_steps), "metric": None,
                "best_env_steps": None, "best_metric": None}
    return {"reason": stopper.reason or "completed",
            "at_env_steps": int(stopper.at_env_steps if stopper.reason else env_steps),
            "metric": stopper.metric, "best_env_steps": stopper.best_env_steps, "best_metric": stopper.best,
            **({"detail": stopper.detail} if stopper.detail else {})}
