"""Small training states on synthetic bars for step tests."""
import torch

from foxdqn.data import market_data_from_frame
from foxdqn.data.synthetic import make_synthetic_ohlcv
from foxdqn.step.state import build_state
from foxdqn.train import load_config


def small_state(overrides=(), bars=1200, drift=1e-4, vol=2e-3, seed=0, device="cpu"):
    cfg = load_config(["debug=smoke", f"device={device}", "log.progress=false", *overrides])
    frame = make_synthetic_ohlcv(bars, drift_per_bar=drift, vol=vol, seed=seed)
    market = market_data_from_frame(frame, cfg.data, cfg.env.window, cfg.env.episode_length)
    return build_state(cfg, market, torch.device(device)), market
