"""Typed configuration schema, registered with Hydra's ConfigStore.

``conf/train.yaml`` (shipped inside the package, so a wheel install has it) composes on top of
:class:`TrainConfig`: a key that is not in the schema, or a value of the wrong type, fails at
compose time. :func:`finalize` then checks ranges and cross-field rules (raising
:class:`~foxdqn.errors.ConfigError` naming the dotted field) and applies the ``debug`` caps.

Groups mirror the package: ``data`` (foxdqn.data), ``env`` (foxdqn.envs), ``model`` (foxdqn.nn
encoders), ``head`` (foxdqn.nn heads), ``replay`` (foxdqn.replay), ``agent`` (foxdqn.step),
``objective`` (foxdqn.objectives), ``action`` (foxdqn.actions), ``guard``
(foxdqn.ops.training_guard), ``optim``/``prune``/``regime`` (the training controls:
foxdqn.step.update, foxdqn.step.pruning, foxdqn.replay.regime), ``debug``.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from foxdqn.data.config import DataConfig
from foxdqn.envs.trading import ExecutionConfig
from foxdqn.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")
GRAPH_MODES = ("auto", "on", "off")
ENCODERS = ("mlp", "attention", "nature_cnn")
HEADS = ("q", "dueling", "c51", "iqn")
REPLAYS = ("uniform", "per")
ENVS = ("trading", "cartpole", "bitflip", "gym")
VECTORIZATIONS = ("auto", "sync", "async")
ACTION_MODES = ("factored", "exposure_routed", "branching")
TARGET_UPDATES = ("polyak", "hard")
ACTIVATIONS = ("relu", "gelu", "tanh", "silu")

#: Keys that existed once and were removed on purpose: a config that still sets one is refused with
#: this reason instead of the generic unknown-key message.
REMOVED_KEYS = {
    "env.execution.ioc_fill_rule": (
        "removed: its rules read the next bar's high/low to fill an IoC sent at that bar's open "
        "(look-ahead); an IoC now fills iff it is marketable against the touch at the open "
        "(foxdqn.envs.execution), with no rule to choose"),
}


def unknown_key_message(key: str) -> str:
    """One line for an unknown dotted ``key``: the removal reason, or the keys allowed there."""
    if key in REMOVED_KEYS:
        return f"{key}: {REMOVED_KEYS[key]}"
    return f"unknown key {key}; allowed keys there: {', '.join(allowed_keys(key))}"


@dataclass
class EnvConfig:
    """Batched trading environment (foxdqn.envs.trading)."""

    name: str = "trading"  # trading | cartpole | bitflip | gym (any Gymnasium env, stepped on the host)
    num_envs: int = 32  # N envs stepped together
    window: int = 32  # W bars of features in each observation (trading)
    episode_length: int = 256  # L steps per training episode (trading)
    dtype: str = "float32"  # accounting precision: float32 | float64 (trading)
    n_bits: int = 10  # bit-flipping: n bits, episode length n
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    # gym (foxdqn.envs.gym_adapter): a Gymnasium id with a Discrete action space, e.g. CartPole-v1, ALE/Pong-v5
    id: Optional[str] = None
    vectorization: str = "auto"  # auto (the env's own vector env if registered, e.g. ale_py's; else sync) | sync | async
    # Atari (ALE/* ids): Mnih et al. 2015 preprocessing
    frame_skip: int = 4  # agent steps repeat the action this many frames (max-pooled over the last two)
    screen_size: int = 84  # observation frames are screen_size x screen_size, greyscale
    frame_stack: int = 4  # observation = the last frame_stack frames, uint8 [frame_stack, 84, 84]
    terminal_on_life_loss: bool = False  # training episodes end at a life loss (evaluation plays full games)
    noop_max: int = 30  # up to this many no-op actions at reset
    repeat_action_probability: float = 0.25  # sticky actions (ALE v5 default 0.25; Nature DQN 0)


@dataclass
class ModelConfig:
    """Observation encoder (foxdqn.nn)."""

    encoder: str = "mlp"  # mlp | attention
    hidden: List[int] = field(default_factory=lambda: [256, 256])  # mlp widths
    activation: str = "relu"
    width: int = 64  # attention: model width
    heads: int = 4  # attention heads
    layers: int = 2  # attention blocks
    pooling: str = "mean"  # attention: mean | last


@dataclass
class HeadConfig:
    """Q head. ``dueling``: Wang et al. 2016 eq. 9 (mean-subtracted advantages)."""

    name: str = "dueling"  # q | dueling | c51 | iqn
    double: bool = True  # Double DQN target (van Hasselt et al. 2016, eq. 4)
    dueling: bool = False  # dueling streams inside the c51 / iqn heads
    atoms: int = 51  # c51: atoms K on the support [v_min, v_max]
    v_min: float = -10.0
    v_max: float = 10.0
    num_quantiles: int = 32  # iqn: N sampled τ for the online quantiles
    num_target_quantiles: int = 32  # iqn: N' sampled τ' for the target
    num_quantiles_policy: int = 32  # iqn: K fixed τ for acting
    embedding_dim: int = 64  # iqn: cosine embedding size n
    kappa: float = 1.0  # iqn: quantile Huber threshold κ


@dataclass
class ReplayConfig:
    """Replay memory on the training device (foxdqn.replay)."""

    name: str = "uniform"  # uniform | per
    capacity: int = 100_000
    n_step: int = 1  # n-step returns (n ≥ 1), truncated at episode ends
    alpha: float = 0.6  # per: priority exponent α
    beta_start: float = 0.4  # per: IS exponent β₀, annealed to 1 over the run's updates
    eps: float = 1.0e-6  # per: ε added to |TD|
    her: bool = False  # hindsight relabelling, "future" strategy (goal-conditioned envs)
    her_k: int = 4  # her: relabelled goals per original


@dataclass
class ObjectiveConfig:
    """Extra objective terms (foxdqn.objectives)."""

    cql_alpha: float = 0.0  # CQL α (Kumar et al. 2020); 0 = off
    iql: bool = False  # IQL (Kostrikov et al. 2021): V by expectile regression, Q toward r + γV(s')
    iql_expectile: float = 0.7  # IQL expectile τ


@dataclass
class ActionConfig:
    """How the network's output becomes an env action (trading: 45 factored actions)."""

    mode: str = "factored"  # factored | exposure_routed | branching


@dataclass
class AgentConfig:
    """DQN training schedule (Mnih et al. 2015) and optimiser."""

    total_env_steps: int = 400_000  # env transitions collected over the whole run (all envs)
    steps_per_iter: int = 4  # T env steps per env per iteration (collect phase)
    updates_per_iter: int = 1  # K gradient updates per iteration (train phase)
    learning_starts: int = 5_000  # env transitions collected before the first update
    batch_size: int = 128
    gamma: float = 0.99
    lr: float = 3e-4
    adam_eps: float = 1e-5
    grad_clip: float = 10.0  # max global gradient L2 norm
    huber_delta: float = 1.0
    tau: float = 0.005  # Polyak (EMA) target update: θ' ← (1 − τ) θ' + τ θ, every update
    target_update: str = "polyak"  # polyak | hard (copy every hard_update_period updates)
    hard_update_period: int = 1000
    eps_start: float = 1.0
    eps_end: float = 0.05
    eps_decay_fraction: float = 0.5  # epsilon decays linearly over this fraction of total_env_steps
    reward_scale: float = 100.0  # rewards (log-equity changes) are multiplied by this for the TD target
    matmul_precision: str = "high"  # CUDA float32 matmuls: highest (IEEE fp32) | high (TF32) | medium


@dataclass
class OptimConfig:
    """How one gradient update is computed (foxdqn.step.update)."""

    accumulate: int = 1  # M micro-batches per update (agent.batch_size / M rows each); 1 = off


@dataclass
class PruneConfig:
    """Magnitude pruning of the online network's weight matrices (foxdqn.step.pruning;
    Zhu & Gupta 2017, eq. 1). Update numbers count gradient updates from 0."""

    enabled: bool = False
    initial_sparsity: float = 0.0  # s_i, fraction of weights zeroed at start_update
    final_sparsity: float = 0.5  # s_f, fraction zeroed from end_update on
    start_update: int = 0  # t0, first mask update
    end_update: int = 10_000  # t0 + nΔt, last mask update (final sparsity reached here)
    frequency: int = 100  # Δt, updates between mask updates


@dataclass
class RegimeConfig:
    """Regime-weighted TD errors (foxdqn.replay.regime): loss weight by the sampled state's
    volatility regime, volatility / training-split median volatility (trading env only)."""

    enabled: bool = False
    low_threshold: float = 0.5  # ratio < low: low-volatility regime (routing rule's 0.5)
    high_threshold: float = 1.5  # ratio > high: high-volatility regime (routing rule's 1.5)
    weights: List[float] = field(default_factory=lambda: [0.5, 1.0, 2.0])  # [low, normal, high] loss weights


@dataclass
class GuardConfig:
    """On-device training guard (ops.training_guard; docs/design/guard.md)."""

    loss_clip: float = 1.0e6
    collapse_multiplier: float = 0.0  # gradient-collapse threshold = lr × multiplier (0 disables)
    collapse_patience: int = 100
    warmup_updates: int = 100
    q_divergence: float = 1.0e4  # |Q| above this is a divergence (Q-value monitor)
    ring_size: int = 64


@dataclass
class EvalConfig:
    """Out-of-sample evaluation (foxdqn.evaluate)."""

    split: str = "test"
    episodes: int = 100  # greedy episodes per evaluation of a non-trading env (20 at most during training)
    interval_env_steps: int = 0  # validation evaluations during training (0 = only at the end)


EARLY_STOP_METRICS = ("auto", "sharpe", "sortino", "total_return", "profit_factor", "max_drawdown",
                      "mean_return")


@dataclass
class EarlyStopConfig:
    """Early stopping (foxdqn.early_stop; docs/design/monitors.md#early-stopping).

    Checked on the host at eval / log boundaries only (never inside the captured iteration).
    """

    enabled: bool = False
    metric: str = "auto"  # validation metric: auto (sharpe on trading, mean_return elsewhere) | sharpe |
    #                       sortino | total_return | profit_factor | max_drawdown (lower is better) | mean_return
    patience: int = 5  # validation evaluations in a row without improvement before stopping
    min_delta: float = 0.0  # an improvement must beat the best by more than this (metric units)
    q_bound: Optional[float] = None  # stop when |mean max-Q| of a log interval exceeds this (null = off)
    q_patience: int = 3  # ... for this many log intervals in a row
    on_q_divergence: bool = False  # a Q-monitor divergence flag ends the run as early_stop_q (exit 0)
    #                                instead of a guard halt (exit 3); NaN/loss-clip/collapse still halt


@dataclass
class DiversityConfig:
    """Executed-action diversity logged at log boundaries (foxdqn.monitor.diversity; docs/design/monitors.md#action-diversity)."""

    enabled: bool = True  # log entropies and the most frequent actions (host side, from the device counts)
    top_k: int = 3  # most frequent actions named in the log line
    min_entropy: float = 0.0  # collapse warning below this normalised entropy H / log(K) in [0, 1] (0 = off)
    patience: int = 3  # ... for this many log intervals in a row (one warning per collapse episode)


@dataclass
class LogConfig:
    interval_env_steps: int = 20_000  # one device→host readback per interval
    tensorboard: bool = True
    progress: bool = True


@dataclass
class CheckpointConfig:
    """Checkpoints for resuming (foxdqn.checkpoint): ``checkpoints/last.pt``, rewritten atomically."""

    every_env_steps: int = 100_000  # also every this many env steps (0 = only at the end, on a halt or a signal)
    save_replay: bool = False  # include the replay memory (an exact continuation; large)


@dataclass
class DebugConfig:
    """Caps applied after composition (so they win over any experiment): ``debug=smoke``."""

    name: Optional[str] = None
    max_env_steps: Optional[int] = None
    max_num_envs: Optional[int] = None
    max_batch_size: Optional[int] = None
    max_learning_starts: Optional[int] = None
    max_replay_capacity: Optional[int] = None
    max_hidden: Optional[int] = None
    fit_prune_schedule: bool = False  # with max_env_steps: shrink prune.start/end_update and frequency by the same ratio
    inject_nan_at_step: Optional[int] = None  # poison the loss at this update (guard test)


@dataclass
class TrainConfig:
    experiment: str = "eurusd_dqn"
    seed: int = 0
    device: str = "auto"
    graph: str = "auto"
    cpu_threads: int = 1  # torch intra-op threads on CPU (0 = torch's default); 1 is as fast at these sizes

    data: DataConfig = field(default_factory=DataConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    action: ActionConfig = field(default_factory=ActionConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    prune: PruneConfig = field(default_factory=PruneConfig)
    regime: RegimeConfig = field(default_factory=RegimeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)
    diversity: DiversityConfig = field(default_factory=DiversityConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    resume: Optional[str] = None  # auto (the newest checkpoint of hydra.run.dir) | a checkpoint path


def run_name(experiment: str, data_path: Optional[str] = None, env_id: Optional[str] = None) -> str:
    """The name of a run's folders and titles: the experiment, plus the stem of ``data.path`` or
    the Gymnasium ``env.id`` when one is set (so ``data.path=bars.csv`` is not filed as
    ``eurusd_dqn``). Characters other than letters, digits, ``-``, ``_`` and ``.`` become ``_``."""
    import re
    from pathlib import Path

    extra = Path(str(data_path)).stem if data_path else (str(env_id) if env_id else "")
    name = f"{experiment}_{extra}" if extra else str(experiment)
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def register_configs() -> None:
    """Register the schema as ``train_schema`` (train.yaml lists it first in its defaults) and the
    ``run_name`` resolver its folder names use."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    if not OmegaConf.has_resolver("run_name"):
        OmegaConf.register_new_resolver("run_name", lambda e, d=None, i=None: run_name(e, d, i))


def _choice(value: Any, allowed: tuple, name: str) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not allowed; choose one of {', '.join(map(str, allowed))}")


def _positive(value: float, name: str, allow_zero: bool = False) -> None:
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name}={value} must be {'>= 0' if allow_zero else '> 0'}")


def _unit(value: float, name: str, lo_open: bool = False, hi_open: bool = False) -> None:
    if not math.isfinite(value):
        raise ConfigError(f"{name}={value} must be a finite number in [0, 1]")
    lo_ok = value > 0 if lo_open else value >= 0
    hi_ok = value < 1 if hi_open else value <= 1
    if not (lo_ok and hi_ok):
        raise ConfigError(f"{name}={value} must be in {'(' if lo_open else '['}0, 1{')' if hi_open else ']'}")


def to_object(cfg: DictConfig | TrainConfig) -> TrainConfig:
    """Turn a composed DictConfig into a :class:`TrainConfig` instance (a copy)."""
    if isinstance(cfg, TrainConfig):
        return dataclasses.replace(cfg)
    obj = OmegaConf.to_object(cfg)
    if not isinstance(obj, TrainConfig):  # composed without the schema (should not happen)
        obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), cfg))
    return obj


def apply_debug(cfg: TrainConfig) -> TrainConfig:
    """Apply the ``debug`` caps in place and return ``cfg``: the schedule caps, then the size caps."""
    return apply_size_caps(apply_schedule_caps(cfg))


def apply_schedule_caps(cfg: TrainConfig) -> TrainConfig:
    """``debug.max_env_steps`` and ``debug.max_learning_starts`` (a shorter run), in place."""
    d = cfg.debug
    if d.max_env_steps is not None:
        full = cfg.agent.total_env_steps
        cfg.agent.total_env_steps = min(full, d.max_env_steps)
        if d.fit_prune_schedule and cfg.prune.enabled and cfg.agent.total_env_steps < full:
            r, p = cfg.agent.total_env_steps / full, cfg.prune
            p.start_update = int(p.start_update * r)
            p.end_update = max(p.start_update + 1, int(p.end_update * r))
            p.frequency = max(1, int(p.frequency * r))
        cfg.log.interval_env_steps = min(cfg.log.interval_env_steps, max(1, d.max_env_steps // 4))
        if cfg.eval.interval_env_steps:
            cfg.eval.interval_env_steps = min(cfg.eval.interval_env_steps, max(1, d.max_env_steps // 2))
    if d.max_learning_starts is not None:
        cfg.agent.learning_starts = min(cfg.agent.learning_starts, d.max_learning_starts)
    return cfg


def apply_size_caps(cfg: TrainConfig) -> TrainConfig:
    """``debug.max_num_envs``, ``max_batch_size``, ``max_replay_capacity``, ``max_hidden``, in place."""
    d = cfg.debug
    if d.max_num_envs is not None:
        cfg.env.num_envs = min(cfg.env.num_envs, d.max_num_envs)
    if d.max_batch_size is not None:
        cfg.agent.batch_size = min(cfg.agent.batch_size, d.max_batch_size)
    if d.max_replay_capacity is not None:
        cfg.replay.capacity = min(cfg.replay.capacity, d.max_replay_capacity)
    if d.max_hidden is not None:
        cfg.model.hidden = [min(h, d.max_hidden) for h in cfg.model.hidden]
    return cfg


def _check_finite(node, prefix: str = "") -> None:
    """Every float anywhere in the config must be finite (NaN/±inf name their field)."""
    for f in dataclasses.fields(node):
        value, name = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            _check_finite(value, f"{name}.")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name}={value} must be a finite number")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                if isinstance(v, float) and not math.isfinite(v):
                    raise ConfigError(f"{name}[{i}]={v} must be a finite number")


def unknown_keys(composed: DictConfig, schema=None, prefix: str = "") -> list[str]:
    """Dotted keys of ``composed`` that the schema does not have (``+key=value`` overrides add
    them past the struct check; they would otherwise be dropped without a word)."""
    schema = OmegaConf.structured(TrainConfig) if schema is None else schema
    out = []
    for key in composed.keys():
        if prefix == "" and key == "hydra":
            continue
        if key not in schema:
            out.append(f"{prefix}{key}")
            continue
        sub, ref = composed._get_node(key), schema._get_node(key)
        if OmegaConf.is_dict(sub) and OmegaConf.is_dict(ref):
            out += unknown_keys(sub, ref, f"{prefix}{key}.")
    return out


def allowed_keys(dotted: str) -> list[str]:
    """Keys allowed next to ``dotted`` (its parent's schema keys)."""
    node = OmegaConf.structured(TrainConfig)
    for part in dotted.split(".")[:-1]:
        if part not in node or not OmegaConf.is_dict(node._get_node(part)):
            break
        node = node._get_node(part)
    return sorted(str(k) for k in node.keys())


def validate(cfg: TrainConfig) -> None:
    """Check ranges and cross-field rules. Raises ConfigError naming the dotted field."""
    _check_finite(cfg)
    if not 0 <= cfg.seed < 2 ** 63:
        raise ConfigError(f"seed={cfg.seed} must be an integer in [0, 2**63)")
    _positive(cfg.checkpoint.every_env_steps, "checkpoint.every_env_steps", allow_zero=True)
    if cfg.resume is not None and not str(cfg.resume).strip():
        raise ConfigError("resume must be auto or the path of a checkpoint (.pt)")
    _choice(cfg.device, DEVICES, "device")
    _choice(cfg.graph, GRAPH_MODES, "graph")
    _positive(cfg.cpu_threads, "cpu_threads", allow_zero=True)
    import torch

    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no CUDA device is available; use device=auto or device=cpu")
    if cfg.graph == "on" and (cfg.device == "cpu" or not torch.cuda.is_available()):
        raise ConfigError("graph=on needs a CUDA device; use graph=auto or graph=off on CPU")
    e = cfg.env
    _choice(e.name, ENVS, "env.name")
    if e.name == "trading":
        cfg.data.validate()
    _choice(e.dtype, ("float32", "float64"), "env.dtype")
    for name in ("num_envs", "window", "episode_length", "n_bits"):
        _positive(getattr(e, name), f"env.{name}")
    e.execution.validate("env.execution")
    _choice(e.vectorization, VECTORIZATIONS, "env.vectorization")
    for name in ("frame_skip", "screen_size", "frame_stack"):
        _positive(getattr(e, name), f"env.{name}")
    _positive(e.noop_max, "env.noop_max", allow_zero=True)
    _unit(e.repeat_action_probability, "env.repeat_action_probability")
    if e.name == "gym" and not e.id:
        raise ConfigError("env.id must name a Gymnasium environment when env.name=gym (e.g. env.id=CartPole-v1)")
    m = cfg.model
    _choice(m.encoder, ENCODERS, "model.encoder")
    _choice(m.activation, ACTIVATIONS, "model.activation")
    if not m.hidden or any(h <= 0 for h in m.hidden):
        raise ConfigError(f"model.hidden={list(m.hidden)} must be a non-empty list of positive widths")
    for name in ("width", "heads", "layers"):
        _positive(getattr(m, name), f"model.{name}")
    if m.encoder == "attention":
        _choice(m.pooling, ("mean", "last"), "model.pooling")
        if m.width % m.heads:
            raise ConfigError(f"model.width={m.width} must be a multiple of model.heads={m.heads}")
        if e.name != "trading":
            raise ConfigError(f"model.encoder=attention attends over the trading observation window; env.name={e.name!r}")
    if m.encoder == "nature_cnn" and e.name != "gym":
        raise ConfigError(f"model.encoder=nature_cnn reads image observations [C, H, W] (env.name=gym with an "
                          f"ALE/* env.id); env.name={e.name!r}")
    h = cfg.head
    _choice(h.name, HEADS, "head.name")
    if h.name == "c51":
        if h.atoms < 2:
            raise ConfigError(f"head.atoms={h.atoms} must be >= 2")
        if not h.v_min < h.v_max:
            raise ConfigError(f"head.v_min={h.v_min} must be < head.v_max={h.v_max}")
    if h.name == "iqn":
        for name in ("num_quantiles", "num_target_quantiles", "num_quantiles_policy", "embedding_dim"):
            _positive(getattr(h, name), f"head.{name}")
        _positive(h.kappa, "head.kappa", allow_zero=True)
    o = cfg.objective
    _positive(o.cql_alpha, "objective.cql_alpha", allow_zero=True)
    _unit(o.iql_expectile, "objective.iql_expectile", lo_open=True, hi_open=True)
    if o.iql and h.name in ("c51", "iqn"):
        raise ConfigError(f"objective.iql=true trains a scalar Q toward r + γV(s'); head.name={h.name!r} is "
                          "distributional (use head=q or head=dueling)")
    _choice(cfg.action.mode, ACTION_MODES, "action.mode")
    if cfg.action.mode != "factored" and e.name != "trading":
        raise ConfigError(f"action.mode={cfg.action.mode!r} needs env.name=trading (got {e.name!r})")
    if cfg.action.mode == "branching" and (h.name != "dueling" or o.iql):
        raise ConfigError(f"action.mode=branching uses its own branching dueling head; set head=dueling "
                          f"(got head.name={h.name!r}{', objective.iql=true' if o.iql else ''})")
    r = cfg.replay
    _choice(r.name, REPLAYS, "replay.name")
    _positive(r.n_step, "replay.n_step")
    _unit(r.alpha, "replay.alpha")
    _unit(r.beta_start, "replay.beta_start")
    _positive(r.eps, "replay.eps")
    _positive(r.her_k, "replay.her_k")
    if r.her and e.name != "bitflip":
        raise ConfigError(f"replay.her=true needs a goal-conditioned env (env.name=bitflip); got env.name={e.name!r}")
    if r.her and r.n_step != 1:
        raise ConfigError(f"replay.her=true needs replay.n_step=1 (got {r.n_step})")
    a = cfg.agent
    for name in ("total_env_steps", "steps_per_iter", "updates_per_iter", "batch_size", "lr", "adam_eps",
                 "grad_clip", "huber_delta", "reward_scale"):
        _positive(getattr(a, name), f"agent.{name}")
    _positive(a.learning_starts, "agent.learning_starts", allow_zero=True)
    _unit(a.gamma, "agent.gamma", hi_open=False)
    _unit(a.tau, "agent.tau", lo_open=True)
    _choice(a.target_update, TARGET_UPDATES, "agent.target_update")
    _choice(a.matmul_precision, ("highest", "high", "medium"), "agent.matmul_precision")
    _positive(a.hard_update_period, "agent.hard_update_period")
    _unit(a.eps_start, "agent.eps_start")
    _unit(a.eps_end, "agent.eps_end")
    _unit(a.eps_decay_fraction, "agent.eps_decay_fraction", lo_open=True)
    if a.eps_end > a.eps_start:
        raise ConfigError(f"agent.eps_end={a.eps_end} must be <= agent.eps_start={a.eps_start} (ε decays)")
    if a.learning_starts >= a.total_env_steps:
        raise ConfigError(f"agent.learning_starts={a.learning_starts} must be < agent.total_env_steps="
                          f"{a.total_env_steps} (else no update is made)")
    if cfg.replay.capacity < (cfg.replay.n_step + 1) * e.num_envs:
        raise ConfigError(f"replay.capacity={cfg.replay.capacity} must be >= (replay.n_step + 1) * env.num_envs = "
                          f"{(cfg.replay.n_step + 1) * e.num_envs}")
    if cfg.replay.capacity < a.batch_size:
        raise ConfigError(f"replay.capacity={cfg.replay.capacity} must be >= agent.batch_size={a.batch_size}")
    if cfg.replay.capacity < e.num_envs:
        raise ConfigError(f"replay.capacity={cfg.replay.capacity} must be >= env.num_envs={e.num_envs}")
    _validate_controls(cfg)
    g = cfg.guard
    _positive(g.loss_clip, "guard.loss_clip")
    _positive(g.collapse_multiplier, "guard.collapse_multiplier", allow_zero=True)
    _positive(g.collapse_patience, "guard.collapse_patience", allow_zero=True)
    _positive(g.warmup_updates, "guard.warmup_updates", allow_zero=True)
    _positive(g.q_divergence, "guard.q_divergence")
    _positive(g.ring_size, "guard.ring_size")
    _choice(cfg.eval.split, ("train", "val", "test"), "eval.split")
    _positive(cfg.eval.episodes, "eval.episodes")
    _positive(cfg.eval.interval_env_steps, "eval.interval_env_steps", allow_zero=True)
    _positive(cfg.log.interval_env_steps, "log.interval_env_steps")
    _validate_early_stop(cfg)
    d = cfg.diversity
    _positive(d.top_k, "diversity.top_k")
    _unit(d.min_entropy, "diversity.min_entropy")
    _positive(d.patience, "diversity.patience")
    if cfg.debug.inject_nan_at_step is not None and cfg.debug.inject_nan_at_step < 0:
        raise ConfigError(f"debug.inject_nan_at_step={cfg.debug.inject_nan_at_step} must be >= 0 (an update number)")


def _validate_early_stop(cfg: TrainConfig) -> None:
    es = cfg.early_stop
    _choice(es.metric, EARLY_STOP_METRICS, "early_stop.metric")
    _positive(es.patience, "early_stop.patience")
    _positive(es.min_delta, "early_stop.min_delta", allow_zero=True)
    _positive(es.q_patience, "early_stop.q_patience")
    if es.q_bound is not None:
        _positive(es.q_bound, "early_stop.q_bound")
    if not es.enabled:
        return
    trading = cfg.env.name == "trading"
    if es.metric == "mean_return" and trading:
        raise ConfigError("early_stop.metric=mean_return is for episodic envs; the trading env's validation "
                          "metrics are sharpe, sortino, total_return, profit_factor, max_drawdown (or auto)")
    if es.metric not in ("auto", "mean_return") and not trading:
        raise ConfigError(f"early_stop.metric={es.metric!r} is a trading metric; env.name={cfg.env.name!r} is "
                          "validated by mean_return (or auto)")
    if cfg.eval.interval_env_steps <= 0:
        raise ConfigError("early_stop.enabled=true needs eval.interval_env_steps > 0 (the validation "
                          f"evaluations it watches); got eval.interval_env_steps={cfg.eval.interval_env_steps}")


def _validate_controls(cfg: TrainConfig) -> None:
    """optim.*, prune.*, regime.* (the training controls of docs/design/update.md)."""
    m, b = cfg.optim.accumulate, cfg.agent.batch_size
    if m < 1 or b % m:
        raise ConfigError(f"optim.accumulate={m} must be >= 1 and divide agent.batch_size={b}")
    p = cfg.prune
    if p.enabled:
        _unit(p.initial_sparsity, "prune.initial_sparsity", hi_open=True)
        _unit(p.final_sparsity, "prune.final_sparsity", hi_open=True)
        if p.initial_sparsity > p.final_sparsity:
            raise ConfigError(f"prune.initial_sparsity={p.initial_sparsity} must be <= "
                              f"prune.final_sparsity={p.final_sparsity}")
        _positive(p.start_update, "prune.start_update", allow_zero=True)
        _positive(p.frequency, "prune.frequency")
        if p.end_update <= p.start_update:
            raise ConfigError(f"prune.end_update={p.end_update} must be > prune.start_update={p.start_update}")
    r = cfg.regime
    if r.enabled:
        if cfg.env.name != "trading":
            raise ConfigError(f"regime.enabled=true needs env.name=trading (it weights by the trading env's "
                              f"volatility regime); got env.name={cfg.env.name!r}")
        if not 0 < r.low_threshold < r.high_threshold:
            raise ConfigError(f"regime.low_threshold={r.low_threshold} must be > 0 and < "
                              f"regime.high_threshold={r.high_threshold}")
        if len(r.weights) != 3 or any(w < 0 for w in r.weights) or not any(w > 0 for w in r.weights):
            raise ConfigError(f"regime.weights={list(r.weights)} must be 3 numbers [low, normal, high], "
                              ">= 0 and not all 0")


def finalize(cfg: DictConfig | TrainConfig) -> TrainConfig:
    """Composed config → validated :class:`TrainConfig` with the debug caps applied."""
    if isinstance(cfg, DictConfig):
        extra = unknown_keys(cfg)
        if extra:
            raise ConfigError(unknown_key_message(extra[0]))
    obj = apply_schedule_caps(to_object(cfg))
    validate(obj)  # sizes as written: the size caps must not hide a bad combination (batch > replay, ...)
    obj = apply_size_caps(obj)
    validate(obj)
    warn_ignored(obj)
    return obj


def total_updates(cfg: TrainConfig) -> int:
    """Gradient updates the run will make (host arithmetic on the schedule, no device read)."""
    a = cfg.agent
    per_iter = cfg.env.num_envs * a.steps_per_iter
    iters = max(1, math.ceil(a.total_env_steps / per_iter))
    warm = min(iters, math.ceil(a.learning_starts / per_iter))
    return (iters - warm) * a.updates_per_iter


def warn_ignored(cfg: TrainConfig) -> list[str]:
    """Log (and return) one warning per setting that the chosen components ignore: keys of a head
    that is not selected, or ``debug.inject_nan_at_step`` past the run's last update."""
    import logging

    notes = []
    default = HeadConfig()
    groups = {"c51": ("atoms", "v_min", "v_max"),
              "iqn": ("num_quantiles", "num_target_quantiles", "num_quantiles_policy", "embedding_dim", "kappa")}
    for head, keys in groups.items():
        if cfg.head.name != head:
            changed = [k for k in keys if getattr(cfg.head, k) != getattr(default, k)]
            if changed:
                notes.append(f"head.{', head.'.join(changed)} set but head.name={cfg.head.name!r}: ignored "
                             f"(they belong to head={head})")
    nan_at = cfg.debug.inject_nan_at_step
    if nan_at is not None and nan_at >= total_updates(cfg):
        notes.append(f"debug.inject_nan_at_step={nan_at} is past the run's last update ({total_updates(cfg) - 1}): "
                     "no NaN will be injected")
    for note in notes:
        logging.getLogger("foxdqn.config").warning(note)
    return notes


register_configs()
