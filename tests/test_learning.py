"""Learning check: on a steadily rising series a short run ends long and beats flat.

The same predicate is applied to a uniformly random agent, which must fail it, so the check
can fail. At 8,192 env steps (480 updates, 992 at 16,384) training still separates: seeds 0-2 pass with mean
exposures 0.96, 0.91, 0.95 and returns +24.8 %, +22.9 %, +24.2 % (16,384 steps: 0.95-0.96, +24.0 to
+25.5 %); with the rewards stored with the wrong sign (each member's reward scale negated) seeds 0
and 1 end short (mean exposure -0.90, -0.94; returns -20.5 %) and fail it, as at 16,384 steps.
"""
import numpy as np
import torch

from foxdqn.data import market_data_from_frame
from foxdqn.data.synthetic import make_synthetic_ohlcv
from foxdqn.analysis.backtest import evaluate
from foxdqn.config.compose import load_config
from foxdqn.population.state import build_population

from support import member_network, train_eager

OVERRIDES = [
    "device=cpu", "log.progress=false", "env.num_envs=16", "env.window=8", "env.episode_length=64",
    "model.hidden=[64,64]", "agent.batch_size=64", "agent.learning_starts=512", "optim.lr=1e-3",
    "agent.total_env_steps=8192", "agent.steps_per_iter=2", "agent.updates_per_iter=2",
    "explore.eps_decay_fraction=0.5", "replay.capacity=16384",
]


def _setup():
    cfg = load_config(OVERRIDES)
    frame = make_synthetic_ohlcv(1500, drift_per_bar=1e-3, vol=1e-3, seed=3)
    market = market_data_from_frame(frame, cfg.data, cfg.env.window, cfg.env.episode_length)
    return cfg, market


def ends_long_and_beats_flat(result) -> bool:
    walk = result["curves"]["agent"]
    exposure = np.asarray(walk["exposure"], dtype=np.float64)
    m = result["metrics"]
    return bool(exposure[-1] > 0 and exposure.mean() >= 0.5
                and m["agent"]["total_return"] > m["flat"]["total_return"] + 0.01)


def test_short_run_ends_long_and_beats_flat():
    cfg, market = _setup()
    s = build_population([cfg], market, torch.device("cpu"))
    train_eager(s, cfg)
    result = evaluate(cfg, market, member_network(s)[0], torch.device("cpu"), split="test")
    assert ends_long_and_beats_flat(result), result["metrics"]


def test_random_agent_fails_the_check():
    cfg, market = _setup()
    gen = torch.Generator().manual_seed(0)

    class RandomPolicy(torch.nn.Module):
        def forward(self, obs):
            return torch.rand(obs.shape[0], 45, generator=gen)

    result = evaluate(cfg, market, RandomPolicy(), torch.device("cpu"), split="test")
    assert not ends_long_and_beats_flat(result)
