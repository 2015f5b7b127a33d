"""``cartpole_dqn debug=smoke`` learns: its greedy return beats a uniformly random policy's.

At smoke's 4096 env steps, cartpole_dqn's 1 update per 10 transitions (CleanRL) makes ~360
updates, too few to leave the "always push one way" phase (greedy return ≈ 9); the test runs 4
updates per iteration (≈ 1400 updates, ~3 s on one core). The random policy is evaluated by the
same function on the same env seeds, so the check can fail.
"""
import torch

from foxdqn.evaluate import evaluate_episodes
from foxdqn.step.state import build_state
from foxdqn.train import load_config

from support import train_eager


def _cfg():
    return load_config(["+experiment=cartpole_dqn", "debug=smoke", "device=cpu", "log.progress=false",
                        "agent.updates_per_iter=4"])


def test_cartpole_dqn_smoke_beats_random_policy():
    cfg = _cfg()
    s = build_state(cfg, None, torch.device("cpu"))
    train_eager(s, cfg)
    trained = evaluate_episodes(cfg, s.online, s.action_mode, s.device, episodes=50)["mean_return"]

    gen = torch.Generator().manual_seed(0)

    class RandomPolicy(torch.nn.Module):
        def forward(self, obs):
            return torch.rand(obs.shape[0], 2, generator=gen)

    random = evaluate_episodes(cfg, RandomPolicy(), s.action_mode, s.device, episodes=50)["mean_return"]
    assert 15 <= random <= 30, random  # CartPole-v1 under a uniform random policy: ≈ 22
    assert trained >= random + 15, (trained, random)
