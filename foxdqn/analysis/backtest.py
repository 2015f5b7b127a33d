"""Out-of-sample evaluation: the greedy agent against buy-and-hold, flat and, on a generated market
with a known answer, the oracle (:func:`oracle_policy`) on one split.

Each policy walks one evaluation-mode env (foxdqn.envs.trading, ``eval_mode=True``) once through
the split, deterministically, under the same execution model and costs as training. Metrics
come from :func:`foxdqn.analysis.metrics.performance_summary` with the bar frequency inferred from the
timestamps (``MarketData.bars_per_year``), plus how far the Sharpe ratio can be trusted
(:mod:`foxdqn.analysis.significance`): ``psr_vs_zero`` and, for the agent, ``psr_vs_buy_and_hold``
(probabilistic Sharpe ratio, Bailey & López de Prado 2012; against buy-and-hold it is the PSR of
the agent's return minus buy-and-hold's), and ``sharpe_ci95_low`` /
``sharpe_ci95_high`` (circular block bootstrap, 2,000 resamples, blocks of ceil(S^(1/3)) bars).
A walk that ends in ruin (equity at or below ``RUIN_FRACTION`` of the initial equity, which may
have gone negative inside the bar) is floored there and carried to the split's end, flat, so every
policy is measured over the same bars.

The walks and the greedy episodes step in chunks (:class:`foxdqn.device.chunk_graph.ChunkGraph`):
on CUDA, unless ``graph: off``, one chunk of steps (policy forward, env step, the step's records
into device buffers) is captured in a CUDA graph and replayed, with one host read per chunk; on
CPU the same chunks run eagerly. The results do not depend on it.
"""
from __future__ import annotations

import functools
import logging
from pathlib import Path

import numpy as np
import torch

from foxdqn.actions.switch import SwitchPenalty
from foxdqn.execution.orders import EXPOSURES, MARKET, NORMAL, compose
from foxdqn.execution.fills import RUIN_FRACTION, unit_switch_cost
from foxdqn.analysis.equity_plot import plot_equity
from foxdqn.analysis.metrics import performance_summary
from foxdqn.analysis.significance import probabilistic_sharpe_ratio, sharpe_confidence_interval
from foxdqn.device.chunk_graph import CHUNK_STEPS, ChunkGraph
from foxdqn.io_atomic import write_json_atomic, write_text_atomic
from foxdqn.step import build  # called as build.build_env: tests replace it to watch the env a walk uses

# Baselines as fixed actions: exposure index 4 (+1) / 2 (flat), market order, normal urgency.
BUY_AND_HOLD_ACTION = int(compose(torch.tensor(4), torch.tensor(0), torch.tensor(1)))
FLAT_ACTION = int(compose(torch.tensor(2), torch.tensor(0), torch.tensor(1)))
#: The policies of a final evaluation; ``oracle`` only where the market has one (a generated market).
POLICIES = ("agent", "buy_and_hold", "flat", "oracle")
#: Units of the metrics in summary.json and the printed table.
UNITS = {
    "total_return": "fraction of initial equity over the split",
    "annualised_return": "fraction per year (compound)",
    "sharpe": "annualised, risk-free rate 0",
    "sortino": "annualised, target return 0",
    "max_drawdown": "fraction of the running peak",
    "profit_factor": "gross profit / gross loss",
    "hit_rate": "fraction of bars held with a positive PnL",
    "turnover": "multiples of equity traded per year (a flip from +1 to -1 counts 2)",
    "num_trades": "fills",
    "psr_vs_zero": "probability that the true Sharpe ratio is above 0",
    "psr_vs_buy_and_hold": "probability that the agent's per-bar return minus buy-and-hold's has a true Sharpe "
                           "ratio (information ratio) above 0",
    "sharpe_ci95_low": "annualised Sharpe, 2.5 % block-bootstrap quantile",
    "sharpe_ci95_high": "annualised Sharpe, 97.5 % block-bootstrap quantile",
}


def capture_default(cfg) -> bool:
    """Whether an evaluation captures its loop in a CUDA graph when it runs on CUDA: unless the
    run's ``graph`` is ``off`` (the escape hatch for a network that cannot be captured)."""
    return cfg.graph != "off"


def _walks(cfg, market, split, device, policy, num_envs: int = 1, capturable: bool = False) -> list[dict]:
    """``num_envs`` walks of ``split`` by ``policy`` (``TradingEnv.run_policies``) in one eval env,
    its generator seeded with ``cfg.seed``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(cfg.seed)
    env = build.build_env(cfg, market, split, device, gen, num_envs=num_envs, eval_mode=True)
    return env.run_policies(policy, capturable=capturable)


def _to_full_length(walk: dict, length: int, floor: float) -> dict:
    """Floor the walk's equity at ``floor`` (a ruined account, which may have gone negative inside
    its last bar, is worth the ruin floor) and carry a walk that ended early to ``length`` steps:
    equity stays at its last value, flat."""
    out = {**walk, "equity": np.maximum(walk["equity"], floor)}
    pad = length - int(walk["exposure"].size)
    if pad <= 0:
        return out
    out["index"] = np.arange(walk["index"][0], walk["index"][0] + length + 1, dtype=np.int64)
    out["equity"] = np.concatenate([out["equity"], np.full(pad, out["equity"][-1])])
    for name in ("exposure", "rewards", "fill_price", "fees", "costs", "traded_units"):
        out[name] = np.concatenate([walk[name], np.zeros(pad)])
    out["actions"] = np.concatenate([walk["actions"], np.full(pad, FLAT_ACTION, dtype=np.int64)])
    out["fills"] = np.concatenate([walk["fills"], np.zeros(pad, dtype=bool)])
    return out


def significance(equity: np.ndarray, bars_per_year: float, benchmark: np.ndarray | None = None) -> dict:
    """``psr_vs_zero``, ``sharpe_ci95_low/high`` and, given a ``benchmark`` equity curve of the same
    bars, ``psr_vs_buy_and_hold`` of one equity curve ``[S+1]`` (foxdqn.analysis.significance).

    ``psr_vs_buy_and_hold`` is the PSR against 0 of the per-bar *active* return (agent minus
    benchmark), so the benchmark's own sampling error and the correlation of the two curves count;
    comparing with the benchmark's sample Sharpe as if it were known would not.
    """
    r = equity[1:] / equity[:-1] - 1.0
    low, high = sharpe_confidence_interval(r, bars_per_year)
    out = {"psr_vs_zero": probabilistic_sharpe_ratio(r), "sharpe_ci95_low": low, "sharpe_ci95_high": high}
    if benchmark is not None:
        out["psr_vs_buy_and_hold"] = probabilistic_sharpe_ratio(r - (benchmark[1:] / benchmark[:-1] - 1.0))
    return out


def oracle_policy(expected_future_return: np.ndarray, device: torch.device):
    """The near-oracle of a generated market, as a policy ``(obs, env) -> [N] env actions``.

    At the close of bar ``t = env.t`` it reads ``G_t = expected_future_return[t]`` (what one unit
    of exposure held from there on is expected to earn over every later bar, given the market's
    latent state: :class:`foxdqn.data.synthetic.SyntheticMarket`) and the cost of trading one unit
    of exposure with a market order of normal urgency, ``c_t = s_t/2 + (market_slippage_bps[normal]
    + taker_fee_bps) * 1e-4`` (``s_t`` the floored spread the env prices that order with,
    ``env.market_state()``; the env's ``execution`` costs). It targets exposure +1 when
    ``G_t > c_t``, -1 when ``G_t < -c_t``, and keeps the exposure it holds otherwise (no order),
    always as a market order of normal urgency. A switch is made when it breaks even if the new
    position were held for ever (from flat: ``G_t`` against ``c_t``; a flip trades 2 units for
    ``2 G_t``). It is a near-oracle, not the optimal policy: it knows the latent state, but it
    neither weighs the chance of switching back later nor sizes below 1. With ``G = 0`` (the
    martingale) it never trades: it is flat.

    Args:
        expected_future_return: float64 ``[T]``, one value per bar of the market (fraction).
        device: the env's device; the policy launches only fixed-shape ops there (capturable).
    """
    future = torch.as_tensor(np.asarray(expected_future_return, dtype=np.float64), device=device)
    long, short = EXPOSURES.index(1.0), EXPOSURES.index(-1.0)

    def act(obs, env):
        spread, _ = env.market_state()
        cost = unit_switch_cost(spread.to(torch.float64), env.execution)
        g = future[env.t]
        exposure = torch.where(g > cost, long, torch.where(g < -cost, short, env.exposure_idx))
        return compose(exposure, MARKET, NORMAL)

    return act


def evaluate(cfg, market, online: torch.nn.Module, device: torch.device, split: str = "test",
             action_mode=None, policies: tuple[str, ...] = POLICIES, graph: bool | None = None) -> dict:
    """Run ``policies`` (of agent, buy-and-hold, flat and oracle) on ``split``; the oracle
    (:func:`oracle_policy`) only when ``market.expected_future_return`` is set (a generated market),
    else it is left out. ``action_mode`` maps the network's action to the env's factored action
    (None: the network acts over the 45 actions). The agent acts greedily: the argmax of its Q, or
    with ``action.switch_margin`` > 0 of its Q minus the switch penalty of each walk's account
    (:mod:`foxdqn.actions.switch`).
    ``graph``: on CUDA, capture the walks in a CUDA graph (``online`` and ``action_mode`` must be
    capturable, as they are in training); None: :func:`capture_default`. Ignored on CPU.

    Returns ``{"curves": {name: walk dict}, "metrics": {name: metrics dict}}`` where a walk dict
    holds numpy arrays (equity [S+1], exposure [S], ...) from ``TradingEnv.run_policy``, carried
    to the split's end at the floored equity when the walk ended in ruin.
    """
    return evaluate_agents(cfg, market, online, device, 1, split, action_mode, policies, graph)[0]


def evaluate_agents(cfg, market, online: torch.nn.Module, device: torch.device, agents: int, split: str = "test",
                    action_mode=None, policies: tuple[str, ...] = POLICIES, graph: bool | None = None,
                    reward_scales: list[float] | None = None, switch_margins: list[float] | None = None,
                    with_metrics: bool = True) -> list[dict]:
    """:func:`evaluate` of P = ``agents`` greedy agents at once (a population's members): ``online``
    maps observations ``[P, D]`` (agent p's walk in row p) to Q ``[P, A]`` (one whose ``needs_held`` is
    True also gets the exposure index each walk holds, int64 ``[P]``: the ensemble's ``consensus``
    and ``lcb`` rules, foxdqn.population.ensemble); the P walks and one walk of each other policy
    (buy-and-hold, flat, the oracle) run in one eval env, a row each (the rows never interact: a
    walk is the same in an env of any size). ``reward_scales``: agent p's
    ``loss.reward_scale`` for its switch penalty (``action.switch_margin`` > 0; a member key of a
    population); None: ``cfg``'s for every agent. ``switch_margins``: agent p's switch margin (>= 0; the
    deployment gate's candidates, foxdqn.analysis.gate), in place of ``action.switch_margin``; None:
    ``cfg``'s for every agent. Returns P results in :func:`evaluate`'s format; with ``with_metrics``
    False, their ``metrics`` are empty (the walks only: the significance's bootstrap costs about
    0.25 s a walk of 6,000 bars on a 2-core CPU).

    Raises:
        ValueError: ``reward_scales`` or ``switch_margins`` not of length ``agents``."""
    for name, values in (("reward_scales", reward_scales), ("switch_margins", switch_margins)):
        if values is not None and len(values) != agents:
            raise ValueError(f"evaluate_agents: {name} has {len(values)} values for {agents} agents")
    capturable = capture_default(cfg) if graph is None else bool(graph)
    online.eval()
    switch = scale = None
    mode_name = None if action_mode is None else action_mode.name
    if switch_margins is not None:  # one margin per walk: the penalty of margin 1, scaled per walk
        if any(m > 0 for m in switch_margins):
            switch = SwitchPenalty(1.0, 1.0, mode_name, device)
            ks = reward_scales if reward_scales else [cfg.loss.reward_scale] * agents
            scale = torch.tensor([m * k for m, k in zip(switch_margins, ks)], dtype=torch.float32,
                                 device=device).view(-1, 1)
    elif cfg.action.switch_margin > 0:  # the greedy choice pays for leaving the position (foxdqn.actions.switch)
        switch = SwitchPenalty(cfg.action.switch_margin, 1.0 if reward_scales else cfg.loss.reward_scale,
                               mode_name, device)
        if reward_scales:
            scale = torch.tensor(list(reward_scales), dtype=torch.float32, device=device).view(-1, 1)

    held_exposure = getattr(online, "needs_held", False)  # a policy that reads the exposure index each walk holds
    chosen = {"buy_and_hold": BUY_AND_HOLD_ACTION, "flat": FLAT_ACTION}
    if market.expected_future_return is not None:
        chosen["oracle"] = oracle_policy(market.expected_future_return, device)
    names = list(dict.fromkeys(name for name in policies if name == "agent" or name in chosen))
    first, total = {}, 0  # each policy's first env row: the agents' P rows, then one row per other policy
    for name in sorted(names, key=lambda n: n != "agent"):
        first[name] = total
        total += agents if name == "agent" else 1
    if switch is not None and scale is not None and total > agents:  # the other rows' penalty: never read
        scale = torch.cat([scale, scale.new_ones(total - agents, 1)])

    @torch.no_grad()
    def act(obs, env):
        """Every walk's env action, int64 [total]: the agents' greedy actions in rows 0..P-1, each other
        policy's in its row (all walks in one eval env: each env row walks on its own)."""
        action = torch.zeros(total, dtype=torch.int64, device=obs.device)
        if "agent" in first:
            x = obs[:agents].to(torch.float32)
            q = online(x, env.account().held[:agents]) if held_exposure else online(x)
            if total > agents:  # rows of the other policies: any action, replaced below
                q = torch.cat([q, q.new_zeros(total - agents, q.shape[1])])
            if switch is not None:
                q = q - (switch(env) if scale is None else switch(env) * scale)
            action = q.argmax(dim=1)
            action = action if action_mode is None else action_mode.to_env(action, env)
        for name, row in first.items():
            if name == "oracle":
                action[row:row + 1] = chosen[name](obs, env)[row:row + 1]
            elif name != "agent":
                action[row:row + 1] = chosen[name]
        return action

    rows = _walks(cfg, market, split, device, act, total, capturable)
    walks = {name: rows[first[name]:first[name] + (agents if name == "agent" else 1)] for name in names}
    online.train()
    from foxdqn.envs.trading import walk_bounds  # the trading env: with a trading walk only

    first_valid, last_bar = walk_bounds(market, split, cfg.env.window, cfg.debug.max_eval_bars)
    steps = last_bar - first_valid  # a whole walk: first valid bar to the split's last (or debug.max_eval_bars)
    floor = RUIN_FRACTION * float(cfg.env.execution.initial_equity)
    walks = {name: [_to_full_length(w, steps, floor) for w in ws] for name, ws in walks.items()}
    bench = walks["buy_and_hold"][0] if "buy_and_hold" in walks else None
    shared = {name: _metrics(ws[0], market, None) for name, ws in walks.items() if name != "agent" and with_metrics}
    results = []
    for p in range(agents):
        curves = {name: ws[p] if name == "agent" else ws[0] for name, ws in walks.items()}
        metrics = {name: _metrics(curves[name], market, bench) if name == "agent" else shared[name]
                   for name in curves} if with_metrics else {}
        results.append({"curves": curves, "metrics": metrics})
    return results


def _metrics(walk: dict, market, bench: dict | None) -> dict:
    """Performance and significance of one walk (against ``bench``'s equity when given)."""
    equity = np.asarray(walk["equity"], dtype=np.float64)
    return {
        **performance_summary(equity, np.asarray(walk["exposure"], dtype=np.float64), market.bars_per_year,
                              trades=int(walk["trades"])),
        **significance(equity, market.bars_per_year, None if bench is None else np.asarray(bench["equity"])),
    }


def write_report(out_dir: Path, result: dict, market, split: str, title: str, extra: dict,
                 plots: list | None = None) -> dict:
    """Write ``eval/summary.json``, ``eval/equity.csv`` and ``eval/equity.png`` atomically, in that
    order; returns the summary. A plot that cannot be drawn is a logged warning, not an error.
    ``plots``: the plot is appended to it as a callable instead (:func:`draw_plot`'s arguments
    bound), for the caller to draw once every report of a population is written.

    ``equity.csv`` has one row per equity point: ``timestamp``, then ``<policy>_equity`` (cash
    units) for every policy and ``agent_exposure`` (the exposure held during the bar that ends
    there, as a signed fraction of equity; empty on the first row).
    """
    import pandas as pd

    out_dir.mkdir(parents=True, exist_ok=True)
    agent = result["curves"]["agent"]
    index = np.asarray(agent["index"], dtype=np.int64)  # bar of each equity point, [S+1]
    ts = market.timestamps
    summary = {
        **extra,
        "split": split,
        "bars": int(len(index) - 1),
        "period": [str(ts[index[0]]), str(ts[index[-1]])],
        "bars_per_year": float(market.bars_per_year),
        "units": UNITS,
        "metrics": result["metrics"],
    }
    curves = {name: np.asarray(w["equity"], dtype=np.float64) for name, w in result["curves"].items()}
    table = pd.DataFrame({"timestamp": ts[index].astype(str), **{f"{k}_equity": v for k, v in curves.items()},
                          "agent_exposure": np.concatenate([[np.nan], agent["exposure"]])})
    write_json_atomic(out_dir / "summary.json", summary)  # first: a plot failure must not lose the run
    write_text_atomic(out_dir / "equity.csv", table.to_csv(index=False))
    plot = functools.partial(draw_plot, out_dir / "equity.png", ts[index], curves, title)
    if plots is None:
        plot()
    else:
        plots.append(plot)
    return summary


def draw_plot(path: Path, timestamps, curves: dict, title: str) -> None:
    """:func:`foxdqn.analysis.equity_plot.plot_equity`, a plot that cannot be drawn a logged warning."""
    try:
        plot_equity(path, timestamps, curves, title)
    except (ValueError, RuntimeError, OSError) as exc:
        logging.getLogger(__name__).warning("%s not written: %s", "/".join(path.parts[-2:]),
                                            str(exc).splitlines()[0][:200])


@torch.no_grad()
def evaluate_episodes(cfg, online: torch.nn.Module, action_mode, device: torch.device, episodes: int = 100,
                      num_envs: int = 32, seed_offset: int = 1, graph: bool | None = None) -> dict:
    """Greedy return over ``episodes`` finished episodes of a non-trading env (CartPole, bit flipping,
    a Gymnasium env through foxdqn.envs.gym_adapter).

    Runs E envs from the seed ``cfg.seed + seed_offset`` (1 for the final evaluation, 2 for the
    validation episodes during training, so that no choice is made on the evaluated episodes), E the
    largest divisor of ``episodes`` that is ≤ ``num_envs``, and
    keeps the first ``episodes / E`` episodes of every env (not the first ``episodes`` to end, which
    would favour short episodes); gives up after ``episodes / E × max_episode_steps`` steps
    (:func:`finished_episodes`; ``graph`` as in :func:`evaluate`; a host env is never captured).
    Returns mean/std/min/max return, mean length and, for goal-conditioned envs, the success rate.
    """
    gen = torch.Generator(device=device)
    gen.manual_seed(cfg.seed + seed_offset)
    num_envs = episode_env_count(episodes, num_envs)
    env = build.build_env(cfg, None, "test", device, gen, num_envs=num_envs)
    online.eval()
    try:
        done = finished_episodes(env, lambda obs: action_mode.to_env(online(obs).argmax(dim=1), env),
                                 episodes // num_envs, generators=(gen,),
                                 capturable=capture_default(cfg) if graph is None else bool(graph))
    finally:
        online.train()
        env.close()
    success = done["success"].tolist() if "success" in done else []
    return episode_metrics(done["returns"].tolist(), done["lengths"].tolist(), success, episodes)


def finished_episodes(env, act, quota: int, *, capturable: bool = False, generators=(),
                      chunk: int = CHUNK_STEPS) -> dict[str, np.ndarray]:
    """The first ``quota`` episodes to finish in each of ``env``'s N envs under the policy ``act``.

    Resets every env, then steps ``env.step(act(obs))`` (``obs`` float32 ``[N, D]``, the
    observation after the last step; ``act`` returns the ``[N]`` env action) in chunks of ``chunk``
    steps (:class:`foxdqn.device.chunk_graph.ChunkGraph`, under ``torch.no_grad``) until every env
    has finished ``quota`` episodes or ``quota × env.max_episode_steps + 1`` steps have run (at
    least 1); the host reads the step records once per chunk. With ``capturable`` on CUDA (and
    a device env, ``env.on_host`` False) one chunk is captured in a CUDA graph and replayed:
    ``act`` must then launch only fixed-shape device ops, and ``generators`` must list every
    ``torch.Generator`` the env and ``act`` draw from (the env's resets), to be registered with the
    graph. The result does not depend on ``chunk`` or ``capturable``.

    Returns:
        numpy arrays over the M ≤ N·quota kept episodes, in the order they finished (step, then
        env index): ``env`` int64 (which env), ``returns`` (the env's ``episode_return``),
        ``lengths`` int64 (``episode_length``) and, when the env reports ``is_success``,
        ``success``.

    Raises:
        ValueError: ``quota`` or ``chunk`` not an integer ``>= 1``.
    """
    if isinstance(quota, bool) or not isinstance(quota, int) or quota < 1:
        raise ValueError(f"quota: episodes per env must be an integer >= 1, got {quota!r}")
    device = torch.device(env.device)
    obs = env.reset_all().to(torch.float32).clone()  # acted on, updated in place (a graph reads it)

    def step() -> dict[str, torch.Tensor]:
        out = env.step(act(obs))
        obs.copy_(out.obs)
        info = out.info
        records = {"done": info["episode_done"], "returns": info["episode_return"],
                   "lengths": info["episode_length"].to(torch.int64)}
        if "is_success" in info:
            records["success"] = info["is_success"]
        return records

    finished = np.zeros(env.num_envs, dtype=np.int64)
    events: dict[str, list[np.ndarray]] = {}  # each chunk's finished episodes, by step, then env

    def take(records: dict[str, np.ndarray]) -> bool:
        done = records["done"]
        rows, envs = np.nonzero(done)
        for name, value in (("env", envs), *((n, records[n][rows, envs]) for n in records if n != "done")):
            events.setdefault(name, []).append(value)
        finished[:] += done.sum(axis=0)
        return bool((finished >= quota).all())

    use_graph = capturable and device.type == "cuda" and not env.on_host
    steps = ChunkGraph(step, device, chunk, use_graph=use_graph, generators=generators)
    steps.run(max(1, quota * int(env.max_episode_steps) + 1), take, keep=False)  # only the episodes' ends kept
    kept = {name: np.concatenate(parts) for name, parts in events.items()}
    first = _first_per_group(kept["env"], quota)  # each env's first `quota` episodes
    result = {"env": kept["env"][first].astype(np.int64), "returns": kept["returns"][first],
              "lengths": kept["lengths"][first].astype(np.int64)}
    if "success" in kept:
        result["success"] = kept["success"][first]
    return result


def _first_per_group(groups: np.ndarray, quota: int) -> np.ndarray:
    """bool mask of ``groups`` (int, ``[M]``): True at the first ``quota`` occurrences of each value,
    in array order."""
    order = np.argsort(groups, kind="stable")  # each group's occurrences, in array order
    ordered = groups[order]
    rank = np.empty(groups.size, dtype=np.int64)
    rank[order] = np.arange(groups.size) - np.searchsorted(ordered, ordered, side="left")
    return rank < quota


def episode_env_count(episodes: int, num_envs: int = 32) -> int:
    """E, the envs an episode evaluation runs: the largest divisor of ``episodes`` ≤ ``num_envs``."""
    return max(d for d in range(1, min(num_envs, episodes) + 1) if episodes % d == 0)


def episode_metrics(returns: list, lengths: list, success: list, episodes: int) -> dict:
    """Mean/std/min/max return and mean length of the first ``episodes`` finished episodes (and the
    success rate when ``success`` is not empty); NaN without episodes."""
    r = np.asarray(returns[:episodes], dtype=np.float64)
    result = {"episodes": int(r.size), "mean_return": float(r.mean()) if r.size else float("nan"),
              "std_return": float(r.std()) if r.size else float("nan"),
              "min_return": float(r.min()) if r.size else float("nan"),
              "max_return": float(r.max()) if r.size else float("nan"),
              "mean_length": float(np.mean(lengths[:episodes])) if lengths else float("nan")}
    if success:
        result["success_rate"] = float(np.mean(success[:episodes]))
    return result
