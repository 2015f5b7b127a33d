"""Small training states for step tests: any experiment, debug=smoke caps, synthetic bars for trading."""
from pathlib import Path

import torch

from foxdqn.data import market_data_from_frame
from foxdqn.data.synthetic import make_synthetic_ohlcv
from foxdqn.step.state import build_state
from foxdqn.train import load_config

EXPERIMENTS = sorted(p.stem for p in (Path(__file__).parents[2] / "foxdqn" / "conf" / "experiment").glob("*.yaml"))


def small_state(overrides=(), bars=1200, drift=1e-4, vol=2e-3, seed=0, device="cpu"):
    cfg = load_config(["debug=smoke", f"device={device}", "log.progress=false", *overrides])
    market = None
    if cfg.env.name == "trading":
        frame = make_synthetic_ohlcv(bars, drift_per_bar=drift, vol=vol, seed=seed)
        market = market_data_from_frame(frame, cfg.data, cfg.env.window, cfg.env.episode_length)
    return build_state(cfg, market, torch.device(device)), market


def experiment_state(name, device="cpu", extra=()):
    """State for experiment ``name`` shrunk for tests (smoke caps; small replay; 2 updates/iter)."""
    over = [f"+experiment={name}", "agent.updates_per_iter=2", "agent.steps_per_iter=2", "env.num_envs=8",
            "replay.capacity=4096", "agent.batch_size=32"]
    if name.startswith("bitflip"):
        over.append("env.n_bits=6")
    return small_state([*over, *extra], device=device)
