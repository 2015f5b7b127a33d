"""One collect step: ε-greedy actions for all N envs, env step, replay insertion.

Device ops only (no host reads), so it runs eagerly or inside a captured CUDA graph. The env is
used through :class:`foxdqn.envs.base.BatchedEnv`; what an env adds to a transition comes from its
``collect_hook`` (:class:`foxdqn.envs.base.CollectHook`).
"""
from __future__ import annotations

import torch

from foxdqn.step.act import act
from foxdqn.device.side_stream import beside
from foxdqn.step.state import TrainState


def store(replay, hook, env, obs: torch.Tensor, action: torch.Tensor, out, reward_scale, backend: str = "auto",
          **extras) -> None:
    """Insert the step ``out`` of ``env``, taken from the observations ``obs`` with ``action``, into
    ``replay`` (rewards times ``reward_scale``: a float, or a ``[G]`` tensor of one scale per group of
    envs), then advance ``obs`` to ``out.obs`` in place.

    The stored rows are the hook's (:meth:`foxdqn.envs.base.CollectHook.replay_rows`): the
    observations, or the env's state codes (a trading env with a decoding replay); either way the
    replay-add kernel also advances ``obs`` in its launch (:func:`foxdqn.ops.replay_add.replay_add`).
    ``extras``: :meth:`~foxdqn.envs.base.CollectHook.replay_extras`.
    """
    rows, next_rows = hook.replay_rows(env, replay, obs, out)
    replay.add(rows, action, out.reward, next_rows, out.terminated, out.truncated, reward_scale=reward_scale,
               advance_obs=out.obs, rollout=obs, backend=backend, **extras)


def collect_step(s: TrainState, backend: str = "auto") -> None:
    """T = 1 step of the N envs: act ε-greedily on ``s.rollout.obs``, step, insert the transitions
    (rewards times ``loss.reward_scale``), advance ``s.rollout.obs``, ``s.env_steps`` by N and the
    monitors' counts.

    An env with ``draw_step`` (the trading env's reset start bars, CartPole's start states: its
    random draws) makes them after the ε-greedy uniforms (the same generator order as when the
    step drew them itself), on the monitors' second stream beside the action selection
    (:func:`foxdqn.device.side_stream.beside`: two branches of the captured graph), and its step takes
    them. The draws must share no device state with the action selection: a ``torch.Generator``
    reserves its offsets on the host at each launch, so both may draw from it; the population's
    member envs, whose draws advance a device counter, have their own collect step
    (:mod:`foxdqn.population.step`).
    Launches on CUDA besides the action mode's and the env's own: one ``torch.rand`` of the
    ε-greedy uniforms (the run's generator, so a captured graph advances it like an eager step),
    the network's forward and :func:`~foxdqn.ops.epsilon_greedy.epsilon_greedy` (schedule, explore
    test, random action, argmax), or both in one kernel where the network allows it
    (:func:`foxdqn.step.act.act`; with ``action.switch_margin`` > 0 the switch penalty of the
    env's current accounts, ``s.rollout.switch``, is subtracted from Q first, unfused),
    :func:`~foxdqn.ops.replay_add.replay_add` (the replay row, the reward
    scale, the rollout's next obs; PER adds its priority insert) and
    :func:`~foxdqn.ops.step_stats.step_stats` (monitor sums, ``env_steps``: on a second stream
    beside the replay insert, :func:`~foxdqn.device.side_stream.beside`). ``backend``
    is passed to these ops ("auto", "triton" or "torch").
    """
    r = s.rollout
    eps = s.schedules.epsilon

    u = torch.rand(1, 2, r.obs.shape[0], device=r.obs.device, generator=s.generator)  # explore tests, random actions

    def acting() -> torch.Tensor:
        with torch.no_grad():
            penalty = None if r.switch is None else r.switch(r.env)  # action.switch_margin > 0: [N, A]
            return act(s.nets.online, r.obs, s.env_steps, eps.start.view(1), eps.end.view(1), eps.duration.view(1), u,
                       backend=backend, penalty=penalty)  # network action

    draw = getattr(r.env, "draw_step", None)  # the env's own random draws, made ahead (envs/base.py)
    if draw is None:
        action, step_args = acting(), ()
    else:  # drawn after u (the generator's order of an env that draws in its step), beside the action selection
        draws, action = beside(s.monitors.stats.branch, draw, acting)
        step_args = (draws,)
    env_action = r.action_mode.to_env(action, r.env)  # e.g. exposure → routed factored action
    hook = r.env.collect_hook
    extras = hook.replay_extras(r.env, s.replay)  # of the state acted on, read before the step moves it
    out = r.env.step(env_action, *step_args)
    info = out.info
    # the monitors' sums (which read only the step's outputs) beside the replay insert (which
    # advances the rollout's obs): two branches of the captured graph on CUDA
    stats, traded = s.monitors.stats, hook.trades(out)
    beside(stats.branch,
           lambda: stats.add_step(env_action, out.reward, info["episode_done"], info["episode_return"],
                                  info["episode_length"], traded, env_steps=s.env_steps, backend=backend),
           lambda: store(s.replay, hook, r.env, r.obs, action, out, s.cfg.loss.reward_scale, backend=backend, **extras))
