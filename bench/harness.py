"""Builds a training state for benchmarks (synthetic bars for trading; no dataset file needed)."""
from __future__ import annotations

import torch

from foxdqn.data import market_data_from_frame
from foxdqn.data.synthetic import make_synthetic_ohlcv
from foxdqn.step.iteration import Iteration
from foxdqn.step.state import build_state
from foxdqn.config.compose import load_config


def make_state(overrides: list[str], device: str, bars: int = 4000, fill: bool = True):
    """TrainState for ``overrides`` on ``device``; ``fill`` runs collect-only iterations until the
    replay holds a few batches."""
    cfg = load_config([f"device={device}", "log.progress=false", *overrides])
    market = None
    if cfg.env.name == "trading":
        frame = make_synthetic_ohlcv(bars, drift_per_bar=1e-4, vol=2e-3, seed=0)
        market = market_data_from_frame(frame, cfg.data, cfg.env.window, cfg.env.episode_length)
    s = build_state(cfg, market, torch.device(device))
    if fill:
        collect = Iteration(s, use_graph=False, updates=0)
        per_iter = cfg.env.num_envs * cfg.agent.steps_per_iter
        for _ in range(max(cfg.replay.n_step + 1, -(-cfg.agent.batch_size * 2 // per_iter))):
            collect()
    return s
