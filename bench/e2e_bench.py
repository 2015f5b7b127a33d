"""End-to-end section: env steps/s and updates/s of the default experiment, graph on and off."""
from __future__ import annotations

import time

import torch

from bench.harness import iteration, make_state


def _rate(it, s, iters: int) -> tuple[float, float]:
    for _ in range(5):
        it()
    sync = torch.cuda.synchronize if s.device.type == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    for _ in range(iters):
        it()
    sync()
    dt = time.perf_counter() - t
    a = s.cfg.agent
    return iters * s.cfg.env.num_envs * it.collect_steps / dt, iters * it.updates / dt


def rows(device: str = "cuda", num_envs: tuple[int, ...] = (32, 4096)) -> list[dict]:
    out = []
    for n in num_envs:
        for graph in ([False, True] if device == "cuda" else [False]):
            s = make_state([f"env.num_envs={n}", "replay.capacity=262144"], device)
            it = iteration(s, use_graph=graph)
            iters = 200 if device == "cuda" else 20
            env_rate, upd_rate = _rate(it, s, iters)
            out.append({"section": "e2e", "features": "eurusd_dqn", "size": f"envs{n}",
                        "provider": "graph" if graph else "eager",
                        "env_steps_per_s": env_rate, "updates_per_s": upd_rate})
            # collect only (no updates): the environment + action selection + insertion rate
            it = iteration(s, use_graph=graph, updates=0)
            env_rate, _ = _rate(it, s, iters)
            out.append({"section": "e2e", "features": "eurusd_dqn_collect_only", "size": f"envs{n}",
                        "provider": "graph" if graph else "eager", "env_steps_per_s": env_rate})
    return out
