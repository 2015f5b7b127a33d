"""HER makes the difference on bit flipping (Andrychowicz et al. 2017, §4.1), n = 10, CPU budget.

The same budget, network and schedule with and without hindsight relabelling: HER must reach a
greedy success rate ≥ 0.9 and plain DQN must not (so the test fails if HER makes no difference).
At the 30k env steps of the budget HER's greedy success rate was 0.985, 0.99, 0.985 and 0.955 for
seeds 0-3 (0.43-0.57 at 16k, 0.945-0.975 at 24k), plain DQN's 0.0 (seeds 0 and 1; 0.0 at 40k too).
"""
import pytest
import torch

from foxdqn.analysis.backtest import evaluate_episodes
from foxdqn.config.compose import load_config
from foxdqn.population.state import build_population

from support import member_network, train_eager

BUDGET = ["device=cpu", "env.n_bits=10", "env.num_envs=16", "agent.total_env_steps=30000",
          "agent.learning_starts=2000", "agent.batch_size=128", "model.hidden=[128]", "replay.capacity=100000",
          "log.progress=false"]


def success_rate(experiment: str) -> float:
    cfg = load_config([f"+experiment={experiment}", *BUDGET])
    s = build_population([cfg], None, torch.device("cpu"))
    train_eager(s, cfg)
    online, mode = member_network(s)
    return evaluate_episodes(cfg, online, mode, torch.device("cpu"), episodes=200)["success_rate"]


@pytest.mark.slow
def test_her_solves_10_bits_and_dqn_does_not():
    her, dqn = success_rate("bitflip_her"), success_rate("bitflip_dqn")
    assert her >= 0.9, her
    assert dqn < 0.5, dqn
