"""``cartpole_dqn``, ``cartpole_cleanrl`` and ``cartpole_zoo`` at ``debug=smoke`` learn: their greedy
return beats a uniformly random policy's.

cartpole_dqn runs as configured (smoke caps it to 16 envs x 16 steps, a 64x64 MLP and batch 64) for
8192 env steps (30 iterations of 32 updates after learning_starts): at smoke's 4096 (14 iterations)
whether seed 0 leaves the random-policy return is a matter of the draws (the single-run loop's did,
its population of one does not; seeds 1-3 fail in both). At smoke's 4096 env steps, cartpole_cleanrl's 1
update per 10 transitions (CleanRL) makes ~360 updates, too few to leave the "always push one way"
phase (greedy return ≈ 9); its test runs 4 updates per iteration (≈ 1400 updates, ~3 s on one core). cartpole_zoo (rl-zoo's SB3 settings:
128 updates per 256 env steps) runs as configured, through the trainer (a population of one, as foxdqn.train):
14 iterations after learning_starts, 1792 updates, ~4 s. The random policy is evaluated by the same
function on the same env seeds, so the checks can fail.
"""
import json

import pytest
import torch

from foxdqn.analysis.backtest import evaluate_episodes
from foxdqn.config.compose import load_config
from foxdqn.population.state import build_population

from support import member_network, train_eager, train_run as train


def _cfg(name, *extra):
    return load_config([f"+experiment={name}", "debug=smoke", "device=cpu", "log.progress=false", *extra])


def _random_return(cfg, s, episodes=50) -> float:
    gen = torch.Generator().manual_seed(0)

    class RandomPolicy(torch.nn.Module):
        def forward(self, obs):
            return torch.rand(obs.shape[0], 2, generator=gen)

    random = evaluate_episodes(cfg, RandomPolicy(), s.action_mode, s.device, episodes=episodes)["mean_return"]
    assert 15 <= random <= 30, random  # CartPole-v1 under a uniform random policy: ≈ 22
    return random


@pytest.mark.parametrize("name, extra, shape", [
    ("cartpole_dqn", ("debug.max_env_steps=8192",), (16, 16, 32)),
    ("cartpole_cleanrl", ("agent.updates_per_iter=4",), (10, 1, 4)),
])
@pytest.mark.slow
def test_smoke_beats_random_policy(name, extra, shape):
    cfg = _cfg(name, *extra)
    assert (cfg.env.num_envs, cfg.agent.steps_per_iter, cfg.agent.updates_per_iter) == shape
    s = build_population([cfg], None, torch.device("cpu"))
    train_eager(s, cfg)
    online, mode = member_network(s)
    trained = evaluate_episodes(cfg, online, mode, s.device, episodes=50)["mean_return"]
    random = _random_return(cfg, s)
    assert trained >= random + 15, (trained, random)


@pytest.mark.slow
def test_cartpole_zoo_smoke_trains_and_beats_random_policy(tmp_path):
    cfg = _cfg("cartpole_zoo", "logger=csv", "eval.episodes=50")
    assert (cfg.env.num_envs, cfg.agent.steps_per_iter, cfg.agent.updates_per_iter) == (1, 256, 128)
    summary = train(cfg, None, tmp_path)
    assert summary == json.loads((tmp_path / "eval" / "summary.json").read_text())
    trained = summary["metrics"]["agent"]["mean_return"]
    random = _random_return(cfg, build_population([cfg], None, torch.device("cpu")))
    assert trained >= random + 15, (trained, random)
