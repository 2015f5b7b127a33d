"""The near-oracle's signal traded through every order type and urgency: is the near-oracle an upper bound?

Usage::

    python -m bench.oracle_variants [PHI:MARKET_SEED ...] [-- extra overrides...]

For each ``ar1_1h`` market (default: φ = ±0.2, market seeds 0–3), one walk of the test split with
one env per variant (foxdqn.analysis.backtest's walks, the env's execution model and costs): the
near-oracle's signal (``G``, the expected sum of future returns, or ``next``, the next bar's
expected return φ·x_t) against a threshold of 0, ½, 1 or 2 times the cost of a market order of
normal urgency (:func:`foxdqn.execution.fills.unit_switch_cost`), sent as a market or limit-maker
order of each urgency; long above the threshold, short below its negative, else the exposure held.
``G/mkt/nor/k=1`` is the near-oracle itself (:func:`foxdqn.analysis.backtest.oracle_policy`). Prints
one line per market: the near-oracle's test return and trades, then the six best variants.
docs/bench.md#the-deployment-gate-2026-12-04-every-trading-experiment-one-h200.
"""
from __future__ import annotations

import itertools
import sys
import time

import torch

from foxdqn.analysis.backtest import _metrics, _walks
from foxdqn.config.compose import load_config
from foxdqn.data import load_market_data
from foxdqn.execution.fills import unit_switch_cost
from foxdqn.execution.orders import AGGRESSIVE, EXPOSURES, LIMIT_MAKER, MARKET, NORMAL, PATIENT, compose

CPU = torch.device("cpu")
#: (signal, (order type name, order type), (urgency name, urgency), threshold in market-order costs)
VARIANTS = list(itertools.product(("G", "next"), (("mkt", MARKET), ("lim", LIMIT_MAKER)),
                                  (("pat", PATIENT), ("nor", NORMAL), ("agg", AGGRESSIVE)), (0.0, 0.5, 1.0, 2.0)))
NEAR_ORACLE = "G/mkt/nor/k=1"


def name(v) -> str:
    return f"{v[0]}/{v[1][0]}/{v[2][0]}/k={v[3]:g}"


def policy(expected_future, expected_next):
    """The walk's policy: env i trades variant i (:data:`VARIANTS`)."""
    sig = torch.stack([torch.as_tensor(expected_future if v[0] == "G" else expected_next, dtype=torch.float64)
                       for v in VARIANTS])
    order = torch.tensor([v[1][1] for v in VARIANTS])
    urgency = torch.tensor([v[2][1] for v in VARIANTS])
    k = torch.tensor([v[3] for v in VARIANTS], dtype=torch.float64)
    long, short, rows = EXPOSURES.index(1.0), EXPOSURES.index(-1.0), torch.arange(len(VARIANTS))

    def act(obs, env):
        spread, _ = env.market_state()
        cost = k * unit_switch_cost(spread.to(torch.float64), env.execution)
        g = sig[rows, env.t]
        return compose(torch.where(g > cost, long, torch.where(g < -cost, short, env.exposure_idx)), order, urgency)

    return act


def variants_on(phi: float, seed: int, extra: list[str]) -> list[tuple[str, float, int]]:
    """``(name, test total return, trades)`` of every variant on ``ar1_1h`` at ``phi``, market ``seed``."""
    cfg = load_config(["data.name=ar1_1h", f"data.synthetic.phi={phi}", f"data.synthetic.seed={seed}", "device=cpu",
                       *extra])
    market = load_market_data(cfg.data, cfg.env.window, cfg.env.episode_length)
    walks = _walks(cfg, market, "test", CPU, policy(market.expected_future_return, market.expected_return), len(VARIANTS))
    out = []
    for v, w in zip(VARIANTS, walks):
        m = _metrics(w, market, None)
        out.append((name(v), float(m["total_return"]), int(m["num_trades"])))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    cells = argv[:argv.index("--")] if "--" in argv else argv
    try:
        cells = [(float(c.split(":")[0]), int(c.split(":")[1])) for c in cells] or [
            (phi, seed) for phi in (0.2, -0.2) for seed in range(4)]
    except (ValueError, IndexError):
        print(f"bench.oracle_variants: error: markets are PHI:MARKET_SEED (e.g. 0.2:3), got {cells}", file=sys.stderr)
        return 2
    for phi, seed in cells:
        t0 = time.perf_counter()
        rows = variants_on(phi, seed, extra)
        base = next(r for r in rows if r[0] == NEAR_ORACLE)
        best = sorted(rows, key=lambda r: r[1], reverse=True)[:6]
        print(f"phi={phi:+g} seed={seed} ({time.perf_counter() - t0:.0f} s): near-oracle {base[1] * 100:+.1f} % "
              f"({base[2]} trades); best: " + "; ".join(f"{n} {r * 100:+.1f} % ({t})" for n, r, t in best), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
