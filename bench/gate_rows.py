"""The seeds as trained, read from summaries written behind the deployment gate (``eval.gate.enabled``,
foxdqn.analysis.gate): each summary's ``gate`` entry lists its candidates' test results, the last
being the agent as trained. Used by bench.learnability and bench.trading_seeds to show a gated run's
seeds with and without the gate from the same runs."""
from __future__ import annotations

import math
import statistics
from typing import Any


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number, else None (a summary's "nan", a missing value)."""
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def as_trained(summaries: list[dict]) -> dict[str, Any]:
    """``gate_flat`` (seeds the gate kept flat), ``ungated_return`` (their mean test total return as
    trained, a fraction; None when none is finite) and ``ungated_trades`` (median trades as trained);
    where the seeds' ensemble policy was gated too, ``ungated_policy_return``, ``ungated_policy_trades``
    and ``gate_policy_flat``. Empty when a summary has no ``gate`` entry (a run without the gate)."""
    gates = [s.get("gate") for s in summaries]
    if not gates or any(g is None for g in gates):
        return {}
    trained = [g["candidates"][-1]["test"] for g in gates]
    returns = [r for r in (finite(t.get("total_return")) for t in trained) if r is not None]
    trades = [t["num_trades"] for t in trained if t.get("num_trades") is not None]
    out: dict[str, Any] = {"gate_flat": sum(g["chosen"] == "flat" for g in gates),
                           "ungated_return": statistics.fmean(returns) if returns else None,
                           "ungated_trades": statistics.median(trades) if trades else None}
    ens = (summaries[0].get("ensemble_policy") or {}).get("gate")
    if ens is not None:
        t = ens["candidates"][-1]["test"]
        out.update(ungated_policy_return=finite(t.get("total_return")), ungated_policy_trades=finite(t.get("num_trades")),
                   gate_policy_flat=ens["chosen"] == "flat")
    return out
