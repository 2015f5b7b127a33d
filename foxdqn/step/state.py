"""Everything one training run keeps on the device, built from the config.

:func:`build_state` is the single place that turns a validated :class:`~foxdqn.config.TrainConfig`
and a :class:`~foxdqn.data.MarketData` into live objects: environment, online/target networks,
fused Adam with a tensor learning rate, replay, schedules, guard, Q monitor, monitoring
accumulators and the dedicated random generator. The collect and update functions
(``collect.py``, ``update.py``) read and mutate these objects with device ops only.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from foxdqn.config import TrainConfig
from foxdqn.envs.actions import NUM_ACTIONS
from foxdqn.envs.trading import TradingEnv
from foxdqn.nn import build_qnet
from foxdqn.ops.qvalue_stats import QValueMonitor
from foxdqn.ops.training_guard import TrainingGuard
from foxdqn.replay import ReplayBuffer
from foxdqn.step.schedules import LinearSchedule
from foxdqn.step.stats import DeviceStats

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


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
    env: TradingEnv
    online: torch.nn.Module
    target: torch.nn.Module
    optimizer: torch.optim.Optimizer
    lr: torch.Tensor  # float32 0-d, the optimizer's learning rate (change in place)
    tau: torch.Tensor  # float32 0-d, Polyak τ
    gamma: float
    replay: ReplayBuffer
    epsilon: LinearSchedule  # of env_steps
    guard: TrainingGuard
    qmon: QValueMonitor
    stats: DeviceStats
    generator: torch.Generator
    obs: torch.Tensor  # float32 [N, D] observations for the next action
    env_steps: torch.Tensor  # int64 0-d, transitions collected (all envs)
    updates: torch.Tensor  # int64 0-d, gradient updates attempted
    tau_eff: torch.Tensor  # float32 0-d scratch: τ·(1 − skip)
    nan_at: torch.Tensor  # int64 0-d, update at which the loss is poisoned (−1 = never)
    online_params: list
    target_params: list

    @property
    def num_actions(self) -> int:
        return NUM_ACTIONS


def make_env(cfg: TrainConfig, market, split: str, device: torch.device, generator: torch.Generator,
             num_envs: int | None = None, eval_mode: bool = False) -> TradingEnv:
    """Trading env over one split of ``market`` (a foxdqn.data.MarketData)."""
    return TradingEnv(
        open=market.open, high=market.high, low=market.low, close=market.close,
        spread=market.spread, features=market.features, split=market.splits[split],
        num_envs=1 if eval_mode else (num_envs or cfg.env.num_envs), window=cfg.env.window,
        episode_length=cfg.env.episode_length, execution=cfg.env.execution, device=device,
        dtype=_DTYPES[cfg.env.dtype], generator=generator, eval_mode=eval_mode,
        volatility=market.volatility, median_spread=market.median_spread,
        median_volatility=market.median_volatility,
    )


def build_state(cfg: TrainConfig, market, device: torch.device) -> TrainState:
    torch.manual_seed(cfg.seed)
    gen = torch.Generator(device=device)
    gen.manual_seed(cfg.seed)
    env = make_env(cfg, market, "train", device, gen)
    online = build_qnet(cfg.model, cfg.head, env.obs_dim, NUM_ACTIONS).to(device)
    target = copy.deepcopy(online).requires_grad_(False)
    f32 = dict(device=device, dtype=torch.float32)
    a = cfg.agent
    lr = torch.tensor(a.lr, **f32)
    opt_kwargs = dict(lr=lr, eps=a.adam_eps, fused=True)
    if device.type == "cuda":
        opt_kwargs["capturable"] = True
    optimizer = torch.optim.Adam(online.parameters(), **opt_kwargs)
    replay = ReplayBuffer(cfg.replay.capacity, env.obs_dim, device)
    eps = LinearSchedule(a.eps_start, a.eps_end, a.eps_decay_fraction * a.total_env_steps, device)
    g = cfg.guard
    guard = TrainingGuard(device, loss_clip=g.loss_clip, collapse_threshold=a.lr * g.collapse_multiplier,
                          warmup_steps=g.warmup_updates, patience=g.collapse_patience, ring_size=g.ring_size)
    qmon = QValueMonitor(guard.ring, device, threshold=g.q_divergence)
    optimizer.found_inf = guard.skip  # fused Adam skips the update on the device when skip == 1
    nan_at = cfg.debug.inject_nan_at_step
    return TrainState(
        cfg=cfg, device=device, env=env, online=online, target=target, optimizer=optimizer, lr=lr,
        tau=torch.tensor(a.tau, **f32), gamma=a.gamma, replay=replay, epsilon=eps, guard=guard, qmon=qmon,
        stats=DeviceStats(NUM_ACTIONS, env.num_envs, device), generator=gen,
        obs=env.reset_all().to(torch.float32).clone(),
        env_steps=torch.zeros((), dtype=torch.int64, device=device),
        updates=torch.zeros((), dtype=torch.int64, device=device),
        tau_eff=torch.zeros((), **f32),
        nan_at=torch.tensor(-1 if nan_at is None else int(nan_at), dtype=torch.int64, device=device),
        online_params=list(online.parameters()), target_params=list(target.parameters()),
    )
