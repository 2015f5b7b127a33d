"""The deployment gate of a trading agent (``eval.gate``): of the agent's policies and flat, the
simplest one that validation cannot tell apart from the best is the one evaluated.

Candidates, simplest first (docs/backtest.md#the-deployment-gate):

1. flat: no order at all;
2. the agent's greedy policy under each switch margin of ``eval.gate.margins`` above its own
   ``action.switch_margin``, largest first (:mod:`foxdqn.actions.switch`: a larger margin leaves
   the position less often);
3. the agent as trained (its own ``action.switch_margin``).

Every candidate walks the validation split (one eval env, one walk per agent and candidate:
:func:`foxdqn.analysis.backtest.evaluate_agents`). With ``r_c`` candidate c's per-bar simple returns
there, a difference ``r_a − r_c`` is *significant* when :func:`paired_psr` of it is at least
``eval.gate.confidence``. The best candidate ``b`` has the highest total validation return. The gate
is flat unless ``r_b − r_flat`` is significant; else it takes the simplest candidate ``c`` that
beats flat significantly and whose difference from the best, ``r_b − r_c``, is not significant.
This is the one-standard-error rule of model selection (Hastie, Tibshirani & Friedman, "The
Elements of Statistical Learning", §7.10) with a paired test in place of the standard error: an
agent trades on the evaluation split only where validation shows that trading beats staying flat,
and with the fewest switches validation cannot tell from the best.

The choice reads the validation split only. Every candidate also walks the evaluation split, so
that the summary can show what each would have made there (``gate.candidates``); the evaluated
policy, ``agent`` in the summary's metrics and curves, is the chosen one's.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["candidate_margins", "choose", "gate_enabled", "gated_agents", "paired_psr"]


def gate_enabled(cfg) -> bool:
    """Whether ``cfg``'s evaluation is behind the gate: ``eval.gate.enabled`` true, or null (the
    default) on a trading env; never on another env (CartPole's greedy episodes have no validation
    walk to choose on)."""
    return cfg.env.name == "trading" and cfg.eval.gate.enabled is not False


def candidate_margins(trained: float, margins: Sequence[float]) -> list[float]:
    """The agent's candidate switch margins, simplest first: those of ``margins`` above ``trained``
    (``action.switch_margin``, >= 0), largest first, then ``trained``. Duplicates are dropped."""
    return sorted({float(m) for m in margins if float(m) > float(trained)}, reverse=True) + [float(trained)]


def paired_psr(diff: np.ndarray) -> float:
    """How sure validation is that ``diff`` (per-bar return differences ``[S]``) has a positive mean:
    the smaller of the probabilistic Sharpe ratio against 0 (Bailey & López de Prado 2012, eq. 3;
    :func:`foxdqn.analysis.significance.probabilistic_sharpe_ratio`) and ``Φ(SR·√(S−1))``, its normal
    approximation without the skewness and kurtosis terms. The PSR's skewness term overstates an
    edge made of a few bars (a policy exposed on one winning bar of 933 gets PSR 0.98): the
    smaller of the two keeps such a difference below any confidence that a fair coin would pass.
    NaN when ``diff`` has no variance or fewer than 3 bars (not significant)."""
    from foxdqn.analysis.significance import per_bar_sharpe, probabilistic_sharpe_ratio

    diff = np.asarray(diff, dtype=np.float64)
    psr = probabilistic_sharpe_ratio(diff)
    sr = per_bar_sharpe(diff) if diff.size >= 3 else math.nan
    if math.isnan(psr) or math.isnan(sr):
        return math.nan
    return min(psr, 0.5 * math.erfc(-sr * math.sqrt(diff.size - 1) / math.sqrt(2.0)))


def _returns(equity: np.ndarray) -> np.ndarray:
    equity = np.asarray(equity, dtype=np.float64)
    return equity[1:] / equity[:-1] - 1.0


def choose(equities: Sequence[np.ndarray], confidence: float) -> tuple[int, list[float], list[float]]:
    """The gate's choice among candidates (module docstring) from their validation equity curves.

    Args:
        equities: one float64 equity curve ``[S+1]`` per candidate, over the same bars, simplest
            candidate first (flat first, whose curve is constant).
        confidence: in (0, 1): a candidate is kept over a simpler one only when the best beats the
            simpler one with PSR ≥ ``confidence``.

    Returns:
        ``(index, psr_best_over, psr_over_flat)``: the chosen candidate's index and, for each
        candidate, :func:`paired_psr` of the best candidate's per-bar return minus its own, and of
        its own minus flat's (NaN: not significant; the best itself, flat itself).

    Raises:
        ValueError: no candidate, curves of different lengths, or ``confidence`` outside (0, 1).
    """
    if not equities:
        raise ValueError("choose: no candidate")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"choose: confidence must be in (0, 1), got {confidence!r}")
    returns = [_returns(e) for e in equities]
    if len({r.size for r in returns}) != 1:
        raise ValueError(f"choose: the candidates' curves differ in length: {[r.size + 1 for r in returns]}")
    totals = [float(np.asarray(e, dtype=np.float64)[-1] / np.asarray(e, dtype=np.float64)[0]) for e in equities]
    best = int(np.argmax(totals))  # the first of equal totals: the simplest
    best_over = [math.nan if not np.any(returns[best] - r) else paired_psr(returns[best] - r) for r in returns]
    over_flat = [math.nan if not np.any(r - returns[0]) else paired_psr(r - returns[0]) for r in returns]
    if not over_flat[best] >= confidence:  # trading does not beat flat on validation (NaN: not significant)
        return 0, best_over, over_flat
    chosen = next(i for i in range(1, len(returns))  # the best qualifies: it beats flat, and not itself
                  if over_flat[i] >= confidence and not best_over[i] >= confidence)
    return chosen, best_over, over_flat


def _summary_of(walk: dict, market) -> dict:
    """Total return, Sharpe and trades of one walk (no significance: a bootstrap per candidate would
    cost more than the walks)."""
    from foxdqn.analysis.metrics import performance_summary

    m = performance_summary(np.asarray(walk["equity"], dtype=np.float64), np.asarray(walk["exposure"], dtype=np.float64),
                            market.bars_per_year, trades=int(walk["trades"]))
    return {k: m[k] for k in ("total_return", "sharpe", "num_trades")}


def gated_agents(cfg, market, online, device, agents: int, split: str, action_mode=None,
                 policies: tuple[str, ...] = ("agent",), reward_scales: list[float] | None = None,
                 graph: bool | None = None) -> tuple[list[dict], list[dict]]:
    """:func:`foxdqn.analysis.backtest.evaluate_agents` of ``agents`` agents behind the gate: each agent's
    candidates walk the validation split and ``split`` (``online`` maps ``[agents·K, D]``
    observations, agent p's K walks in rows ``p·K .. p·K + K − 1``, as a population's
    :class:`~foxdqn.population.evaluate.MemberGreedy` with K walks per member), the gate chooses on
    validation, and agent p's result on ``split`` is its chosen candidate's walk (flat's walk when
    it chose flat; its metrics as an agent's: against buy-and-hold).

    Returns:
        ``(results, gates)``: P results in :func:`~foxdqn.analysis.backtest.evaluate`'s format, and
        per agent the summary entry ``gate``: ``confidence``, ``chosen`` (``"flat"`` or
        ``"switch_margin=M"``), ``switch_margin`` of the chosen (None for flat), and
        ``candidates``, simplest first, each with its ``policy``, ``switch_margin``, ``val`` and
        ``<split>`` total return, Sharpe and trades (one ``val`` entry when ``split`` is val), and
        ``psr_best_over`` and ``psr_over_flat`` (:func:`choose`).
    """
    from foxdqn.analysis.backtest import _metrics, evaluate_agents

    gate = cfg.eval.gate
    margins = candidate_margins(cfg.action.switch_margin, gate.margins)
    k = len(margins)
    per_walk = [m for _ in range(agents) for m in margins]
    scales = None if reward_scales is None else [s for s in reward_scales for _ in range(k)]

    def walk(on: str, pols: tuple[str, ...]) -> list[dict]:
        return evaluate_agents(cfg, market, online, device, agents * k, on, action_mode, pols, graph,
                               reward_scales=scales, switch_margins=per_walk, with_metrics=False)

    val = walk("val", ("agent", "flat"))
    wanted = tuple(dict.fromkeys(("agent", "flat", "buy_and_hold") + tuple(policies)))
    test = walk(split, wanted)
    bench = test[0]["curves"].get("buy_and_hold")
    shared = {name: _metrics(w, market, None) for name, w in test[0]["curves"].items()
              if name != "agent" and name in policies}
    results, gates = [], []
    for p in range(agents):
        rows_val = [val[0]["curves"]["flat"]] + [val[p * k + i]["curves"]["agent"] for i in range(k)]
        chosen, psr, over_flat = choose([w["equity"] for w in rows_val], float(gate.confidence))
        rows_test = [test[0]["curves"]["flat"]] + [test[p * k + i]["curves"]["agent"] for i in range(k)]
        cands = []
        for i, (wv, wt) in enumerate(zip(rows_val, rows_test)):
            margin = None if i == 0 else margins[i - 1]
            cands.append({"policy": "flat" if i == 0 else "agent", "switch_margin": margin,
                          "val": _summary_of(wv, market), split: _summary_of(wt, market),
                          "psr_best_over": psr[i], "psr_over_flat": over_flat[i]})
        margin = cands[chosen]["switch_margin"]
        gates.append({"confidence": float(gate.confidence), "chosen": "flat" if margin is None else f"switch_margin={margin:g}",
                      "switch_margin": margin, "candidates": cands})
        curves = {name: test[0]["curves"][name] for name in policies if name != "agent" and name in test[0]["curves"]}
        metrics = {name: shared[name] for name in curves}
        if "agent" in policies:
            curves = {"agent": rows_test[chosen], **curves}
            metrics = {"agent": _metrics(rows_test[chosen], market, bench), **metrics}
        results.append({"curves": curves, "metrics": metrics})
    return results, gates
