"""Out-of-sample evaluation: the greedy agent against buy-and-hold and flat on one split.

Each policy walks one evaluation-mode env (foxdqn.envs.trading, ``eval_mode=True``) once through
the split, deterministically, under the same execution model and costs as training. Metrics
come from :func:`foxdqn.metrics.performance_summary` with the bar frequency inferred from the
timestamps (``MarketData.bars_per_year``). This walk reads the device every bar; it is not the
training hot loop.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from foxdqn.envs.actions import compose
from foxdqn.metrics import performance_summary

# Baselines as fixed actions: exposure index 4 (+1) / 2 (flat), market order, normal urgency.
BUY_AND_HOLD_ACTION = int(compose(torch.tensor(4), torch.tensor(0), torch.tensor(1)))
FLAT_ACTION = int(compose(torch.tensor(2), torch.tensor(0), torch.tensor(1)))


def _walk(cfg, market, split, device, policy) -> dict:
    from foxdqn.step.build import build_env

    gen = torch.Generator(device=device)
    gen.manual_seed(cfg.seed)
    env = build_env(cfg, market, split, device, gen, eval_mode=True)
    return env.run_policy(policy)


def evaluate(cfg, market, online: torch.nn.Module, device: torch.device, split: str = "test",
             action_mode=None) -> dict:
    """Run agent, buy-and-hold and flat on ``split``. ``action_mode`` maps the network's action
    to the env's factored action (None: the network acts over the 45 factored actions).

    Returns ``{"curves": {name: walk dict}, "metrics": {name: metrics dict}}`` where a walk dict
    holds numpy arrays (equity [S+1], exposure [S], ...) from ``TradingEnv.run_policy``.
    """
    online.eval()

    @torch.no_grad()
    def greedy(obs, env):
        action = online(obs.to(torch.float32)).argmax(dim=1)
        return action if action_mode is None else action_mode.to_env(action, env)

    def const(a):
        return lambda obs, env: torch.full((obs.shape[0],), a, dtype=torch.int64, device=obs.device)

    walks = {
        "agent": _walk(cfg, market, split, device, greedy),
        "buy_and_hold": _walk(cfg, market, split, device, const(BUY_AND_HOLD_ACTION)),
        "flat": _walk(cfg, market, split, device, const(FLAT_ACTION)),
    }
    online.train()
    metrics = {
        name: performance_summary(np.asarray(w["equity"], dtype=np.float64),
                                  np.asarray(w["exposure"], dtype=np.float64),
                                  market.bars_per_year, trades=int(w["trades"]))
        for name, w in walks.items()
    }
    return {"curves": walks, "metrics": metrics}


def write_report(out_dir: Path, result: dict, market, split: str, title: str, extra: dict) -> dict:
    """Write ``eval/summary.json`` and ``eval/equity.png`` atomically; returns the summary."""
    from foxdqn.evaluate_plot import plot_equity
    from foxdqn.io_atomic import write_json_atomic

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
        "metrics": result["metrics"],
    }
    curves = {name: np.asarray(w["equity"], dtype=np.float64) for name, w in result["curves"].items()}
    plot_equity(out_dir / "equity.png", ts[index], curves, title)
    write_json_atomic(out_dir / "summary.json", summary)
    return summary


@torch.no_grad()
def evaluate_episodes(cfg, online: torch.nn.Module, action_mode, device: torch.device, episodes: int = 100,
                      num_envs: int = 32) -> dict:
    """Greedy return over ``episodes`` finished episodes of a non-trading env (CartPole, bit flipping,
    a Gymnasium env through foxdqn.envs.gym_adapter).

    Runs E envs from a fixed seed, E the largest divisor of ``episodes`` that is ≤ ``num_envs``, and
    keeps the first ``episodes / E`` episodes of every env (not the first ``episodes`` to end, which
    would favour short episodes); gives up after ``episodes / E × max_episode_steps`` steps. Reads
    the finished episodes' returns on the host every step.
    Returns mean/std/min/max return, mean length and, for goal-conditioned envs, the success rate.
    """
    from foxdqn.step.build import build_env

    gen = torch.Generator(device=device)
    gen.manual_seed(cfg.seed + 1)
    num_envs = max(d for d in range(1, min(num_envs, episodes) + 1) if episodes % d == 0)
    quota = episodes // num_envs
    env = build_env(cfg, None, "test", device, gen, num_envs=num_envs)
    obs = env.reset_all().to(torch.float32)
    returns, lengths, success = [], [], []
    taken = np.zeros(num_envs, dtype=np.int64)
    max_steps = int(getattr(env, "max_episode_steps", 1000))
    online.eval()
    try:
        for _ in range(max(1, quota * max_steps + 1)):
            out = env.step(action_mode.to_env(online(obs).argmax(dim=1), env))
            obs = out.obs.to(torch.float32)
            done = out.info["episode_done"].cpu().numpy() & (taken < quota)
            if done.any():
                taken += done
                returns += out.info["episode_return"].cpu().numpy()[done].tolist()
                lengths += out.info["episode_length"].cpu().numpy()[done].tolist()
                if "is_success" in out.info:
                    success += out.info["is_success"].cpu().numpy()[done].tolist()
            if len(returns) >= episodes:
                break
    finally:
        online.train()
        if hasattr(env, "close"):
            env.close()
    r = np.asarray(returns[:episodes], dtype=np.float64)
    result = {"episodes": int(r.size), "mean_return": float(r.mean()) if r.size else float("nan"),
              "std_return": float(r.std()) if r.size else float("nan"),
              "min_return": float(r.min()) if r.size else float("nan"),
              "max_return": float(r.max()) if r.size else float("nan"),
              "mean_length": float(np.mean(lengths[:episodes])) if lengths else float("nan")}
    if success:
        result["success_rate"] = float(np.mean(success[:episodes]))
    return result
