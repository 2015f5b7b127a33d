"""Everything one training run keeps on the device, built from the config.

:func:`build_state` turns a validated :class:`~foxdqn.config.TrainConfig` (and, for trading, a
:class:`~foxdqn.data.MarketData`) into live objects: environment, action mode, online/target
networks, objective, fused Adam with a tensor learning rate, replay, schedules, guard, Q monitor,
monitoring accumulators and the dedicated random generator. The collect and update functions
(``collect.py``, ``update.py``) read and mutate these objects with device ops only.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from foxdqn.config import TrainConfig, total_updates
from foxdqn.ops.qvalue_stats import QValueMonitor
from foxdqn.ops.training_guard import TrainingGuard
from foxdqn.step.build import build_action_mode, build_env, build_network, build_objective, build_replay
from foxdqn.step.schedules import LinearSchedule
from foxdqn.step.stats import DeviceStats


def resolve_device(name: str) -> torch.device:
    """``auto`` → cuda when available, else cpu. ``cuda`` without a GPU raises ConfigError."""
    from foxdqn.errors import ConfigError

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no CUDA device is available; use device=auto or device=cpu")
    return torch.device(name)


@dataclass
class TrainState:
    cfg: TrainConfig
    device: torch.device
    env: object  # TradingEnv | CartPoleEnv | BitFlipEnv | GymVectorEnv
    action_mode: object  # foxdqn.actions.modes.*
    online: torch.nn.Module
    target: torch.nn.Module
    objective: torch.nn.Module
    optimizer: torch.optim.Optimizer
    lr: torch.Tensor  # float32 0-d, the optimizer's learning rate (change in place)
    tau: torch.Tensor  # float32 0-d, Polyak τ
    hard_period: torch.Tensor  # int64 0-d, hard target update period (target.update=hard)
    replay: object  # foxdqn.replay.ReplayBuffer
    epsilon: LinearSchedule  # of env_steps
    guard: TrainingGuard
    qmon: QValueMonitor
    stats: DeviceStats
    generator: torch.Generator
    obs: torch.Tensor  # [N, D] observations for the next action (float32; env.obs_dtype, e.g. uint8 images)
    env_steps: torch.Tensor  # int64 0-d, transitions collected (all envs)
    updates: torch.Tensor  # int64 0-d, gradient updates attempted
    tau_eff: torch.Tensor  # float32 0-d scratch: this update's target-update weight
    nan_at: torch.Tensor  # int64 0-d, update at which the loss is poisoned (−1 = never)
    trainable: list  # parameters trained by Adam (online + objective extras)
    target_params: list  # Polyak/hard targets ...
    source_params: list  # ... and what they follow
    pruner: object = None  # foxdqn.step.pruning.MagnitudePruner (prune.enabled) or None


def build_state(cfg: TrainConfig, market, device: torch.device) -> TrainState:
    if device.type == "cuda":
        torch.set_float32_matmul_precision(str(cfg.matmul_precision))
    elif cfg.cpu_threads > 0:
        torch.set_num_threads(cfg.cpu_threads)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator(device=device)
    gen.manual_seed(cfg.seed)
    env = build_env(cfg, market, "train", device, gen)
    mode = build_action_mode(cfg, env)
    online = build_network(cfg, env, mode.num_actions).to(device)
    target = copy.deepcopy(online).requires_grad_(False)
    objective = build_objective(cfg, online, target, env, gen)
    f32 = dict(device=device, dtype=torch.float32)
    a = cfg.agent
    lr = torch.tensor(cfg.optim.lr, **f32)
    trainable = list(online.parameters()) + list(objective.extra_parameters())
    opt_kwargs = dict(lr=lr, eps=cfg.optim.adam_eps, fused=True)
    if device.type == "cuda":
        opt_kwargs["capturable"] = True
    optimizer = torch.optim.Adam(trainable, **opt_kwargs)
    updates = torch.zeros((), dtype=torch.int64, device=device)
    replay = build_replay(cfg, env, device, updates, total_updates(cfg))
    x = cfg.explore
    eps = LinearSchedule(x.eps_start, x.eps_end, x.eps_decay_fraction * a.total_env_steps, device)
    g = cfg.guard
    guard = TrainingGuard(device, loss_clip=g.loss_clip, collapse_threshold=cfg.optim.lr * g.collapse_multiplier,
                          warmup_steps=g.warmup_updates, patience=g.collapse_patience, ring_size=g.ring_size)
    qmon = QValueMonitor(guard.ring, device, threshold=g.q_divergence)
    optimizer.found_inf = guard.skip  # fused Adam skips the update on the device when skip == 1
    targets, sources = list(target.parameters()), list(online.parameters())
    for tgt, src in objective.polyak_pairs():
        targets, sources = targets + list(tgt), sources + list(src)
    nan_at = cfg.debug.inject_nan_at_step
    pruner = None
    if cfg.prune.enabled:
        from foxdqn.step.pruning import MagnitudePruner

        p = cfg.prune
        pruner = MagnitudePruner(online, target, p.initial_sparsity, p.final_sparsity, p.start_update,
                                 p.end_update, p.frequency, device)
    env_actions = getattr(env, "num_actions", 45)
    return TrainState(
        cfg=cfg, device=device, env=env, action_mode=mode, online=online, target=target, objective=objective,
        optimizer=optimizer, lr=lr, tau=torch.tensor(cfg.target.tau, **f32),
        hard_period=torch.tensor(cfg.target.period, dtype=torch.int64, device=device),
        replay=replay, epsilon=eps, guard=guard, qmon=qmon,
        stats=DeviceStats(env_actions, env.num_envs, device), generator=gen,
        obs=env.reset_all().to(getattr(env, "obs_dtype", torch.float32)).clone(),
        env_steps=torch.zeros((), dtype=torch.int64, device=device), updates=updates,
        tau_eff=torch.zeros((), **f32),
        nan_at=torch.tensor(-1 if nan_at is None else int(nan_at), dtype=torch.int64, device=device),
        trainable=trainable, target_params=targets, source_params=sources, pruner=pruner,
    )
