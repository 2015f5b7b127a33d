"""One collect step: ε-greedy actions for all N envs, env step, replay insertion.

Device ops only (no host reads), so it runs eagerly or inside a captured CUDA graph.
"""
from __future__ import annotations

import torch

from foxdqn.replay.regime import volatility_ratio
from foxdqn.step.state import TrainState


def epsilon_greedy(q: torch.Tensor, eps: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """q float32 [N, A], eps float32 0-d → actions int64 [N]: uniform random with probability
    eps, else argmax (ties → lowest index)."""
    n, num_actions = q.shape
    explore = torch.rand(n, device=q.device, generator=generator) < eps
    random_a = torch.randint(0, num_actions, (n,), device=q.device, generator=generator)
    return torch.where(explore, random_a, q.argmax(dim=1))


def collect_step(s: TrainState) -> None:
    with torch.no_grad():
        eps = s.epsilon(s.env_steps)
        action = epsilon_greedy(s.online(s.obs), eps, s.generator)  # network action
    env_action = s.action_mode.to_env(action, s.env)  # e.g. exposure → routed factored action
    vol_ratio = None
    if s.replay.regime is not None:  # regime.enabled: the state's bar, read before the step moves it
        vol_ratio = volatility_ratio(s.env.market_state()[1], s.env.median_volatility)
    out = s.env.step(env_action)
    s.replay.add(s.obs, action, out.reward * s.cfg.loss.reward_scale, out.next_obs, out.terminated, out.truncated,
                 vol_ratio=vol_ratio)
    s.obs.copy_(out.obs)
    s.env_steps.add_(action.shape[0])
    info = out.info
    s.stats.add_step(env_action, out.reward, info["episode_done"], info["episode_return"],
                     info["episode_length"], info["fill"])
