"""Everything one training run keeps on the device, built from the config, in typed parts.

:func:`build_state` turns a validated :class:`~foxdqn.config.schema.TrainConfig` (and, for trading, a
:class:`~foxdqn.data.MarketData`) into a :class:`TrainState` of a few parts, one job each:
:class:`Networks` (online, target, objective, trainable parameters), :class:`Optimization`
(Adam's state and its tensor learning rate), :class:`~foxdqn.step.target_update.TargetUpdate`,
the replay, :class:`Rollout` (environment, action mode, observation to act on),
:class:`Schedules` (ε), :class:`Monitors` (guard, Q monitor, monitoring accumulators), plus the
run's counters and random generator. The collect and update functions (``collect.py``,
``update.py``) read and mutate these objects with device ops only.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

import torch

from foxdqn.actions.switch import SwitchPenalty
from foxdqn.config.schema import TrainConfig, total_updates
from foxdqn.errors import ConfigError
from foxdqn.guard.host import TrainingGuard
from foxdqn.guard.q_monitor import QValueMonitor
from foxdqn.replay.buffer import ReplayBuffer
from foxdqn.step.adam import Adam
from foxdqn.step.build import build_action_mode, build_env, build_network, build_objective, build_replay
from foxdqn.device.schedules import LinearSchedule
from foxdqn.step.last_good import LastGood
from foxdqn.step.pruning import MagnitudePruner
from foxdqn.step.stats import DeviceStats
from foxdqn.step.target_update import TargetUpdate
from foxdqn.step.weight_check import WeightCheck

if TYPE_CHECKING:  # typing only: importing them here would load every env and mode at start-up
    from foxdqn.actions.modes import BranchingMode, ExposureRoutedMode, FactoredMode
    from foxdqn.actions.switch import SwitchPenalty
    from foxdqn.envs.base import BatchedEnv
    from foxdqn.objectives.base import Objective
    from foxdqn.step.last_good import LastGood
    from foxdqn.step.pruning import MagnitudePruner
    from foxdqn.step.weight_check import WeightCheck

    Env = BatchedEnv  # any env of foxdqn.envs: the loop uses only the protocol's members
    ActionMode = Union[FactoredMode, ExposureRoutedMode, BranchingMode]


def resolve_device(name: str) -> torch.device:
    """``auto`` → cuda when available, else cpu. ``cuda`` without a GPU raises ConfigError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no CUDA device is available; use device=auto or device=cpu")
    return torch.device(name)


@dataclass
class Networks:
    """online: obs [B, D] → Q [B, A]; target: its frozen copy (no grad); objective: the loss
    module (reads both); trainable: the parameters Adam trains (online + objective extras)."""

    online: torch.nn.Module
    target: torch.nn.Module
    objective: Objective
    trainable: list[torch.nn.Parameter]


@dataclass
class Optimization:
    """optimizer: :class:`foxdqn.step.adam.Adam` over ``Networks.trainable``, the state that
    :func:`foxdqn.step.adam.adam_update_` steps in one kernel (the guard's skip flag skips it);
    lr: float32 0-d device tensor, its learning rate (change in place, never rebind);
    weight_check: the post-step weight check's trial step (``guard.max_weight``), else None;
    last_good: the weights from before the last applied update (``guard.keep_last_good``), else None."""

    optimizer: Adam
    lr: torch.Tensor
    weight_check: WeightCheck | None = None
    last_good: LastGood | None = None


@dataclass
class Rollout:
    """env: the training environment (N envs); action_mode: network action ↔ env action;
    obs: [N, D] (or [N, C, H, W]) observations to act on next, ``env.obs_dtype`` (float32 or uint8);
    switch: the greedy choice's switch penalty (``action.switch_margin`` > 0,
    :class:`foxdqn.actions.switch.SwitchPenalty`), else None."""

    env: Env
    action_mode: ActionMode
    obs: torch.Tensor
    switch: SwitchPenalty | None = None


@dataclass
class Schedules:
    """epsilon: ε of ε-greedy as a function of the env-step counter (float32 0-d on the device)."""

    epsilon: LinearSchedule


@dataclass
class Monitors:
    """guard: the training guard (skip flag, halt latch, host ring); qmon: the Q-value monitor
    (writes into the guard's ring); stats: episode/reward/action accumulators. All read by the host
    once per log interval (:meth:`DeviceStats.snapshot`) or by polling the ring."""

    guard: TrainingGuard
    qmon: QValueMonitor
    stats: DeviceStats


@dataclass
class TrainState:
    """The run's state. Counters are int64 0-d device tensors: ``env_steps`` (transitions
    collected, all envs), ``updates`` (gradient updates attempted); ``nan_at`` (int64 0-d) is the
    update whose loss ``debug.inject_nan_at_step`` poisons (−1: never). ``pruner`` is the
    :class:`~foxdqn.step.pruning.MagnitudePruner` with ``prune.enabled``, else None.
    ``lr_spike_at`` (int64 0-d) is the update whose learning rate ``debug.inject_lr_spike_at_step``
    multiplies by 2**100, else None.
    """

    cfg: TrainConfig
    device: torch.device
    generator: torch.Generator
    env_steps: torch.Tensor
    updates: torch.Tensor
    nets: Networks
    optim: Optimization
    target_update: TargetUpdate
    rollout: Rollout
    replay: ReplayBuffer  # after rollout: the checkpoint walk names shared env tensors rollout.env.*
    schedules: Schedules
    monitors: Monitors
    nan_at: torch.Tensor
    pruner: MagnitudePruner | None = None
    lr_spike_at: torch.Tensor | None = None


def build_networks(cfg: TrainConfig, env: Env, mode: ActionMode, device: torch.device,
                   gen: torch.Generator, switch: SwitchPenalty | None = None) -> Networks:
    online = build_network(cfg, env, mode.num_actions).to(device)
    target = copy.deepcopy(online).requires_grad_(False)
    objective = build_objective(cfg, online, target, env, gen, switch)
    return Networks(online, target, objective, list(online.parameters()) + list(objective.extra_parameters()))


def build_optimization(cfg: TrainConfig, nets: Networks, device: torch.device) -> Optimization:
    lr = torch.tensor(cfg.optim.lr, device=device, dtype=torch.float32)
    return Optimization(Adam(nets.trainable, lr, eps=cfg.optim.adam_eps), lr)


def build_monitors(cfg: TrainConfig, env: Env, device: torch.device) -> Monitors:
    g = cfg.guard
    guard = TrainingGuard(device, loss_clip=g.loss_clip, collapse_threshold=cfg.optim.lr * g.collapse_multiplier,
                          warmup_steps=g.warmup_updates, patience=g.collapse_patience, ring_size=g.ring_size,
                          max_weight=g.max_weight)
    qmon = QValueMonitor(guard.ring, device, threshold=g.q_divergence)
    return Monitors(guard, qmon, DeviceStats(env.num_actions, env.num_envs, device))


def build_state(cfg: TrainConfig, market, device: torch.device) -> TrainState:
    """The run's state for ``cfg`` on ``device`` (``market``: foxdqn.data.MarketData for trading,
    else None). Seeds torch and the run's generator with ``cfg.seed``."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision(str(cfg.matmul_precision))
    elif cfg.cpu_threads > 0:
        torch.set_num_threads(cfg.cpu_threads)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator(device=device)
    gen.manual_seed(cfg.seed)
    env = build_env(cfg, market, "train", device, gen)
    mode = build_action_mode(cfg, env)
    switch = None
    if cfg.action.switch_margin > 0:  # the greedy choice's switch penalty (foxdqn.actions.switch)
        switch = SwitchPenalty(cfg.action.switch_margin, cfg.loss.reward_scale, mode.name, device)
    nets = build_networks(cfg, env, mode, device, gen, switch)
    a = cfg.agent
    optim = build_optimization(cfg, nets, device)
    updates = torch.zeros((), dtype=torch.int64, device=device)
    replay = build_replay(cfg, env, device, updates, total_updates(cfg))
    x = cfg.explore
    eps = LinearSchedule(x.eps_start, x.eps_end, x.eps_decay_fraction * a.total_env_steps, device)
    monitors = build_monitors(cfg, env, device)
    if monitors.guard.checks_weights:  # guard.max_weight: Adam's step is tried on a copy and checked first
        optim.weight_check = WeightCheck(optim.optimizer, monitors.guard.weight_bits)
    if cfg.guard.keep_last_good:  # a halt keeps the weights from before the last applied update
        optim.last_good = LastGood(nets.trainable)
    targets, sources = list(nets.target.parameters()), list(nets.online.parameters())
    for tgt, src in nets.objective.polyak_pairs():
        targets, sources = targets + list(tgt), sources + list(src)
    target_update = TargetUpdate(cfg.target.update, cfg.target.tau, cfg.target.period, targets, sources, device)
    nan_at, spike_at = cfg.debug.inject_nan_at_step, cfg.debug.inject_lr_spike_at_step
    pruner = None
    if cfg.prune.enabled:
        p = cfg.prune
        pruner = MagnitudePruner(nets.online, nets.target, p.initial_sparsity, p.final_sparsity, p.start_update,
                                 p.end_update, p.frequency, device)
    obs = env.reset_all().to(env.obs_dtype).clone()
    return TrainState(
        cfg=cfg, device=device, generator=gen,
        env_steps=torch.zeros((), dtype=torch.int64, device=device), updates=updates,
        nets=nets, optim=optim, target_update=target_update, replay=replay, rollout=Rollout(env, mode, obs, switch),
        schedules=Schedules(eps), monitors=monitors,
        nan_at=torch.tensor(-1 if nan_at is None else int(nan_at), dtype=torch.int64, device=device),
        pruner=pruner,
        lr_spike_at=None if spike_at is None else torch.tensor(int(spike_at), dtype=torch.int64, device=device),
    )
