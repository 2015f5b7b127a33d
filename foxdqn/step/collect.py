"""One collect step: ε-greedy actions for all N envs, env step, replay insertion.

Device ops only (no host reads), so it runs eagerly or inside a captured CUDA graph. The env is
used through :class:`foxdqn.envs.base.BatchedEnv`; what an env adds to a transition comes from its
``collect_hook`` (:class:`foxdqn.envs.base.CollectHook`).
"""
from __future__ import annotations

import torch

from foxdqn.step.state import TrainState


def epsilon_greedy(q: torch.Tensor, eps: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """q float32 [N, A], eps float32 0-d → actions int64 [N]: uniform random with probability
    eps, else argmax (ties → lowest index)."""
    n, num_actions = q.shape
    explore = torch.rand(n, device=q.device, generator=generator) < eps
    random_a = torch.randint(0, num_actions, (n,), device=q.device, generator=generator)
    return torch.where(explore, random_a, q.argmax(dim=1))


def collect_step(s: TrainState) -> None:
    """T = 1 step of the N envs: act ε-greedily on ``s.rollout.obs``, step, insert the transitions
    (rewards times ``loss.reward_scale``), advance ``s.env_steps`` by N and the monitors' counts."""
    r = s.rollout
    with torch.no_grad():
        eps = s.schedules.epsilon(s.env_steps)
        action = epsilon_greedy(s.nets.online(r.obs), eps, s.generator)  # network action
    env_action = r.action_mode.to_env(action, r.env)  # e.g. exposure → routed factored action
    hook = r.env.collect_hook
    extras = hook.replay_extras(r.env, s.replay)  # of the state acted on, read before the step moves it
    out = r.env.step(env_action)
    s.replay.add(r.obs, action, out.reward * s.cfg.loss.reward_scale, out.next_obs, out.terminated, out.truncated,
                 **extras)
    r.obs.copy_(out.obs)
    s.env_steps.add_(action.shape[0])
    info = out.info
    s.monitors.stats.add_step(env_action, out.reward, info["episode_done"], info["episode_return"],
                              info["episode_length"], hook.trades(out))
