"""Learning check on a market with no edge: eurusd_dqn trained on ``martingale_1h`` earns nothing.

Three seeds of ``+experiment=eurusd_dqn data.name=martingale_1h`` on the CPU with a 50k env-step
budget, trained as one population of three (each member draws what the single run of its seed
draws: tests/population/test_population.py). On the test split no seed may earn beyond noise: the probabilistic Sharpe ratio against 0
stays below 0.95 and the block-bootstrap 95 % Sharpe interval reaches 0 or below.

The same predicate is applied to a policy that reads the next bar's close (a look-ahead bug in
its purest form), which must be flagged, so the check can fail. The budget is one at which training
still exploits a leak: with the features shifted one bar ahead (each bar's observation holding the
next bar's return) on all bars, or on a random 60 % of them, every seed trained on 50k env steps is
flagged (60 %: Sharpe intervals from 4.7, 6.4, 9.2 up), as at 100k (9.6, 14.1, 14.1); at 30k the
60 % leak went unflagged for all three.
"""
import numpy as np
import pytest
import torch

from foxdqn.data import load_market_data
from foxdqn.execution.orders import compose
from foxdqn.analysis.backtest import evaluate
from foxdqn.config.compose import load_config
from foxdqn.population.state import build_population

from support import member_network, train_eager

pytestmark = pytest.mark.slow


def _config(seed: int):
    return load_config(["+experiment=eurusd_dqn", "data.name=martingale_1h", "device=cpu", "log.progress=false",
                        "agent.total_env_steps=50000", f"seed={seed}"])


def earns_beyond_noise(agent_metrics: dict) -> bool:
    return agent_metrics["psr_vs_zero"] > 0.95 or agent_metrics["sharpe_ci95_low"] > 0


@pytest.fixture(scope="module")
def market():
    cfg = _config(0)
    return load_market_data(cfg.data, cfg.env.window, cfg.env.episode_length)


SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def trained(market):
    cfgs = [_config(seed) for seed in SEEDS]
    s = build_population(cfgs, market, torch.device("cpu"))
    train_eager(s, cfgs[0])
    return s


@pytest.mark.parametrize("member", range(len(SEEDS)))
def test_trained_agent_earns_nothing_on_a_martingale(market, trained, member):
    # the agent's walk alone: its psr_vs_zero and Sharpe interval do not depend on the other policies
    cfg = trained.cfgs[member]
    agent = evaluate(cfg, market, member_network(trained, member)[0], torch.device("cpu"), split="test",
                     policies=("agent",))
    agent = agent["metrics"]["agent"]
    assert cfg.seed == SEEDS[member]
    assert not earns_beyond_noise(agent), agent


def test_a_look_ahead_policy_is_flagged(market):
    cfg = _config(0)
    close = torch.as_tensor(market.close)

    class PeeksAtTheNextClose(torch.nn.Module):
        """Not a network: ``evaluate`` calls it on the observation; it reads the env's bar index."""

        env = None

        def forward(self, obs):
            t = int(self.env.t[0])
            up = close[min(t + 1, close.numel() - 1)] > close[t]
            return torch.nn.functional.one_hot(torch.tensor([compose(4 if up else 0, 0, 0)]), 45).float()

    peek = PeeksAtTheNextClose()
    from foxdqn.step import build

    real_build_env = build.build_env

    def build_env(*args, **kwargs):
        env = real_build_env(*args, **kwargs)
        peek.env = env
        return env

    build.build_env = build_env
    try:
        agent = evaluate(cfg, market, peek, torch.device("cpu"), split="test", policies=("agent",))["metrics"]["agent"]
    finally:
        build.build_env = real_build_env
    assert earns_beyond_noise(agent), agent
    assert np.isfinite(agent["sharpe"])
