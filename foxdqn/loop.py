"""The host training loop: replay iterations, poll the guard, log once per interval, evaluate.

Steady state, per iteration: one call of the iteration (one CUDA-graph replay on the GPU) and a
poll of the guard's pinned host ring (a plain memory read, never a wait). Once per log interval:
one device→host copy of all monitoring accumulators (:meth:`DeviceStats.snapshot`). At the end
(or on a halt): checkpoint, evaluation on the test split, report.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from foxdqn.checkpoint import save_checkpoint
from foxdqn.config import TrainConfig
from foxdqn.errors import ConfigError, HaltError
from foxdqn.evaluate import evaluate, evaluate_episodes, write_report
from foxdqn.io_atomic import write_json_atomic
from foxdqn.step import stats as S
from foxdqn.step.iteration import make_iteration
from foxdqn.step.state import TrainState, build_state, resolve_device


log = logging.getLogger(__name__)


def use_graph(cfg: TrainConfig, device: torch.device) -> bool:
    if cfg.graph == "on" and device.type != "cuda":
        raise ConfigError("graph=on needs a CUDA device; use graph=auto or graph=off on CPU")
    return cfg.graph == "on" or (cfg.graph == "auto" and device.type == "cuda")


def _entropy(counts: np.ndarray) -> float:
    total = counts.sum()
    if total <= 0:
        return 0.0
    p = counts[counts > 0] / total
    return float(-(p * np.log(p)).sum())


class Snapshotter:
    """Turns one host copy of the device accumulators into a log row, then resets them."""

    def __init__(self, s: TrainState):
        self.s = s

    def __call__(self) -> dict:
        s = self.s
        host = s.stats.snapshot(s.guard.acc, s.qmon.acc).numpy()
        nf, na = S.NUM_FIELDS, s.stats.actions.numel()
        acc, actions = host[:nf], host[nf:nf + na]
        g = host[nf + na: nf + na + s.guard.acc.numel()]
        q = host[nf + na + s.guard.acc.numel():]
        s.stats.reset()
        s.guard.reset_accumulators()
        s.qmon.reset()
        row = {
            "episodes": acc[S.EP_COUNT],
            "episode_return": acc[S.EP_RETURN_SUM] / acc[S.EP_COUNT] if acc[S.EP_COUNT] else float("nan"),
            "reward_per_step": acc[S.REWARD_SUM] / max(acc[S.TRANSITIONS], 1),
            "fill_rate": acc[S.TRADES] / max(acc[S.TRANSITIONS], 1),
            "action_entropy": _entropy(actions),
            "loss": g[0] / g[2] if g[2] else float("nan"),
            "grad_norm": g[1] / g[2] if g[2] else float("nan"),
            "skipped_updates": g[3],
            "mean_max_q": q[0] / q[1] if q[1] else float("nan"),
        }
        return row


def _evaluate_val(s: TrainState, market) -> dict:
    """Validation metrics of the greedy agent (trading: val split; others: 20 episodes)."""
    if s.cfg.env.name == "trading":
        return evaluate(s.cfg, market, s.online, s.device, split="val", action_mode=s.action_mode)["metrics"]["agent"]
    return evaluate_episodes(s.cfg, s.online, s.action_mode, s.device, episodes=min(20, s.cfg.eval.episodes))


def train(cfg: TrainConfig, market, run_dir: Path) -> dict:
    """Train, evaluate on ``cfg.eval.split`` and write the run's outputs into ``run_dir``.

    Raises:
        HaltError: a guard flag fired (the checkpoint of the last good weights is written first).
    """
    from foxdqn.monitor import MetricsLogger
    from foxdqn.monitor.progress import TrainProgress

    t0 = time.perf_counter()
    device = resolve_device(cfg.device)
    graph = use_graph(cfg, device)
    s = build_state(cfg, market, device)
    a = cfg.agent
    per_iter = cfg.env.num_envs * a.steps_per_iter
    total_iters = max(1, math.ceil(a.total_env_steps / per_iter))
    warm_iters = min(total_iters, math.ceil(a.learning_starts / per_iter))
    log.info("%s: %s on %s (graph=%s), %d env steps in %d iterations of %d envs x %d steps, %d updates each",
             cfg.experiment, cfg.env.name if market is None else market.source, device, graph,
             total_iters * per_iter, total_iters, cfg.env.num_envs, a.steps_per_iter, a.updates_per_iter)
    collect_only = make_iteration(s, graph, updates=0)
    full = make_iteration(s, graph)  # host envs (env=gym): eager collect, captured update-only graph
    log_every = max(1, cfg.log.interval_env_steps // per_iter)
    eval_every = cfg.eval.interval_env_steps // per_iter if cfg.eval.interval_env_steps else 0
    snapshot = Snapshotter(s)
    logger = MetricsLogger(run_dir, tensorboard=cfg.log.tensorboard)
    recent_return = float("nan")
    halt = None
    t_log, steps_log = time.perf_counter(), 0
    try:
        with TrainProgress(total=total_iters * per_iter, enabled=cfg.log.progress) as progress:
            for it in range(total_iters):
                (collect_only if it < warm_iters else full)()
                record = s.guard.reader.latest()  # pinned memory read: no wait
                reason = s.guard.reader.halt_reason(record) if record is not None else None
                if reason is not None:  # name the flag of the update that fired, not the latch after it
                    first = s.guard.reader.first_halt()
                    halt = s.guard.reader.halt_reason(first) if first is not None else reason
                    break
                env_steps = (it + 1) * per_iter
                if (it + 1) % log_every == 0 or it == total_iters - 1:
                    row = snapshot()
                    now = time.perf_counter()
                    row["env_steps_per_s"] = (env_steps - steps_log) / max(now - t_log, 1e-9)
                    t_log, steps_log = now, env_steps
                    row["epsilon"] = a.eps_end + (a.eps_start - a.eps_end) * max(
                        0.0, 1.0 - env_steps / max(a.eps_decay_fraction * a.total_env_steps, 1.0))
                    row["updates"] = max(0, it + 1 - warm_iters) * a.updates_per_iter
                    if not math.isnan(row["episode_return"]):
                        recent_return = row["episode_return"]
                    logger.log(env_steps, {f"train/{k}": v for k, v in row.items()})
                    progress.update(env_steps, {"eps": row["epsilon"], "loss": row["loss"],
                                                "ep_ret": recent_return})
                if eval_every and (it + 1) % eval_every == 0 and it < total_iters - 1:
                    logger.log(env_steps, {f"val/{k}": v for k, v in _evaluate_val(s, market).items()})
    finally:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        logger.close()
        if hasattr(s.env, "close"):  # host vector envs: end their workers
            s.env.close()
    ckpt = save_checkpoint(run_dir / "checkpoints" / "last.pt", s)
    if halt is not None:
        log.error("halted: %s", halt)
        (run_dir / "HALTED").write_text(halt + "\n")
        raise HaltError(f"{halt}; last good weights saved to {ckpt}")
    wall = time.perf_counter() - t0
    log.info("trained in %.1f s; evaluating", wall)
    extra = {
        "experiment": cfg.experiment,
        "data": market.source if market is not None else None,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "graph": graph,
        "torch": torch.__version__,
        "env_steps": int(s.env_steps.item()),
        "updates": int(s.updates.item()),
        "wall_time_s": round(wall, 2),
        "checkpoint": str(ckpt.relative_to(run_dir)),
    }
    if cfg.env.name != "trading":
        summary = {**extra, "env": cfg.env.name,
                   "metrics": {"agent": evaluate_episodes(cfg, s.online, s.action_mode, device,
                                                          episodes=cfg.eval.episodes)}}
        if cfg.env.name == "gym":
            summary["env_id"] = cfg.env.id
        write_json_atomic(run_dir / "eval" / "summary.json", summary)
        return summary
    result = evaluate(cfg, market, s.online, device, split=cfg.eval.split, action_mode=s.action_mode)
    data_name = cfg.data.name if cfg.data.path is None else Path(cfg.data.path).name
    title = f"{cfg.experiment}: {data_name}, {cfg.eval.split} split"
    return write_report(run_dir / "eval", result, market, cfg.eval.split, title, extra)
