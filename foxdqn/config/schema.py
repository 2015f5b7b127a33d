"""Typed configuration schema, registered with Hydra's ConfigStore, and the config layer's checks.

``conf/train.yaml`` (shipped in the wheel as ``foxdqn.conf``) composes on top of
:class:`TrainConfig`: a key that is not in the schema, a value of the wrong type or a choice
that is not one of its :class:`Choice` members fails at compose time. :func:`finalize` then
checks ranges (each group's ``validate``) and the rules that join groups
(:func:`_cross_checks`), raising :class:`~foxdqn.errors.ConfigError` naming the dotted key, and
applies the ``debug`` caps. Only this layer names config keys; components raise ``ValueError``
naming their own parameters. Every key is described in docs/configuration.md. Composing with Hydra
(where ``conf/`` is, :func:`foxdqn.config.compose.load_config`, the messages of composition errors) is
:mod:`foxdqn.config.compose`.

Groups mirror the package: ``data`` (foxdqn.data), ``env`` (foxdqn.envs), ``model``/``head``
(foxdqn.nn), ``objective`` (foxdqn.objectives), ``action`` (foxdqn.actions), ``replay``
(foxdqn.replay), ``agent`` (the budget and batch of foxdqn.step), ``optim`` (Adam and gradient
clipping), ``explore`` (the ε schedule), ``target`` (target-network updates), ``loss`` (TD loss
scale), ``guard`` (the on-device training guard), ``prune``/``regime`` (training controls),
``eval``, ``log``, ``logger``, ``early_stop``, ``diversity``, ``checkpoint``, ``search`` (hyperparameter
searches, foxdqn.run.search), ``debug``.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from foxdqn.actions.modes import ACTION_MODES
from foxdqn.data.builtin import BUILTIN_DATASETS
from foxdqn.data.config import DataConfig
from foxdqn.execution.fills import ExecutionConfig
from foxdqn.errors import ConfigError
from foxdqn.nn.mlp import ACTIVATIONS


class Choice(str, Enum):
    """A config choice: OmegaConf accepts only its members' names; it compares equal to, prints
    and serialises as its value string (``Head.c51 == "c51"``)."""

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


def _choice(name: str, values) -> type[Choice]:
    return Choice(name, [(v, v) for v in values])


Device = _choice("Device", ("auto", "cpu", "cuda"))
GraphMode = _choice("GraphMode", ("auto", "on", "off"))
MatmulPrecision = _choice("MatmulPrecision", ("highest", "high", "medium"))
EnvName = _choice("EnvName", ("trading", "cartpole", "bitflip", "gym"))
Dtype = _choice("Dtype", ("float32", "float64"))
Vectorization = _choice("Vectorization", ("auto", "sync", "async"))
Encoder = _choice("Encoder", ("mlp", "attention", "nature_cnn"))
Activation = _choice("Activation", tuple(ACTIVATIONS))
Pooling = _choice("Pooling", ("mean", "last"))
Head = _choice("Head", ("q", "dueling", "c51", "iqn"))
Replay = _choice("Replay", ("uniform", "per"))
ActionMode = _choice("ActionMode", ACTION_MODES)
TargetUpdate = _choice("TargetUpdate", ("polyak", "hard"))
Split = _choice("Split", ("train", "val", "test"))
EnsembleRule = _choice("EnsembleRule", ("none", "mean", "vote", "consensus", "lcb"))
Pruner = _choice("Pruner", ("none", "median"))
WandbMode = _choice("WandbMode", ("offline", "online", "disabled"))
EarlyStopMetric = _choice("EarlyStopMetric", ("auto", "sharpe", "sortino", "total_return", "profit_factor",
                                              "max_drawdown", "mean_return"))

#: Keys that existed once and were removed on purpose: a config that still sets one is refused with
#: this reason instead of the generic unknown-key message.
REMOVED_KEYS = {
    "env.execution.ioc_fill_rule": (
        "removed: its rules read the next bar's high/low to fill an IoC sent at that bar's open "
        "(look-ahead); an IoC now fills iff it is marketable against the touch at the open "
        "(foxdqn.execution.fills), with no rule to choose"),
}

#: Keys that moved to another group (old → new): a config that sets the old one is refused with a hint.
MOVED_KEYS = {
    "agent.lr": "optim.lr", "agent.adam_eps": "optim.adam_eps", "agent.grad_clip": "optim.grad_clip",
    "agent.eps_start": "explore.eps_start", "agent.eps_end": "explore.eps_end",
    "agent.eps_decay_fraction": "explore.eps_decay_fraction",
    "agent.tau": "target.tau", "agent.target_update": "target.update", "agent.hard_update_period": "target.period",
    "agent.huber_delta": "loss.huber_delta", "agent.reward_scale": "loss.reward_scale",
    "agent.matmul_precision": "matmul_precision", "log.tensorboard": "logger.tensorboard",
}

#: Keys added after runs were recorded (dotted key → the value that reproduces a record without it):
#: a resumed run keeps the behaviour it started with (:func:`upgrade`).
ADDED_KEYS = {
    "optim.accumulate_one_pass": False,  # before it, accumulation ran the M micro-batches as M passes
    "agent.collect_beside_update": False,  # before it, an iteration's update sampled after its collect steps
}


def unknown_key_message(key: str) -> str:
    """One line for an unknown dotted ``key``: the removal reason, the key it moved to, or the
    keys allowed there."""
    if key in REMOVED_KEYS:
        return f"{key}: {REMOVED_KEYS[key]}"
    if key in MOVED_KEYS:
        new = MOVED_KEYS[key]
        how = "logger=csv" if new == "logger.tensorboard" else f"{new}=..."
        return f"{key} moved to {new}; set {how} (docs/configuration.md)"
    return f"unknown key {key}; allowed keys there: {', '.join(allowed_keys(key))}"


# ----------------------------------------------------------------------------------------- checks


def _positive(value: float, name: str, allow_zero: bool = False) -> None:
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name}={value} must be {'>= 0' if allow_zero else '> 0'}")


def _all_positive(node, prefix: str, names: tuple[str, ...], allow_zero: bool = False) -> None:
    for name in names:
        _positive(getattr(node, name), f"{prefix}.{name}", allow_zero)


def _unit(value: float, name: str, lo_open: bool = False, hi_open: bool = False) -> None:
    if not math.isfinite(value):
        raise ConfigError(f"{name}={value} must be a finite number in [0, 1]")
    lo_ok = value > 0 if lo_open else value >= 0
    hi_ok = value < 1 if hi_open else value <= 1
    if not (lo_ok and hi_ok):
        raise ConfigError(f"{name}={value} must be in {'(' if lo_open else '['}0, 1{')' if hi_open else ']'}")


# ----------------------------------------------------------------------------------------- groups


@dataclass
class EnvConfig:
    """Batched environment (foxdqn.envs; docs/environments.md)."""

    name: EnvName = EnvName.trading  # trading | cartpole | bitflip | gym (any Gymnasium env, stepped on the host)
    num_envs: int = 32  # N envs stepped together
    window: int = 32  # W bars of features in each observation (trading)
    episode_length: int = 256  # L steps per training episode (trading)
    dtype: Dtype = Dtype.float32  # accounting precision (trading)
    n_bits: int = 10  # bit-flipping: n bits, episode length n
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    # gym (foxdqn.envs.gym_adapter): a Gymnasium id with a Discrete action space, e.g. CartPole-v1, ALE/Pong-v5
    id: Optional[str] = None
    vectorization: Vectorization = Vectorization.auto  # auto (the env's own vector env if registered) | sync | async
    # Atari (ALE/* ids): Mnih et al. 2015 preprocessing
    frame_skip: int = 4  # agent steps repeat the action this many frames (max-pooled over the last two)
    screen_size: int = 84  # observation frames are screen_size x screen_size, greyscale
    frame_stack: int = 4  # observation = the last frame_stack frames, uint8 [frame_stack, 84, 84]
    terminal_on_life_loss: bool = False  # training episodes end at a life loss (evaluation plays full games)
    noop_max: int = 30  # up to this many no-op actions at reset
    repeat_action_probability: float = 0.25  # sticky actions (ALE v5 default 0.25; Nature DQN 0)

    def validate(self) -> None:
        _all_positive(self, "env", ("num_envs", "window", "episode_length", "n_bits", "frame_skip", "screen_size",
                                    "frame_stack"))
        self.execution.validate("env.execution")
        _positive(self.noop_max, "env.noop_max", allow_zero=True)
        _unit(self.repeat_action_probability, "env.repeat_action_probability")
        if self.name == "gym" and not self.id:
            raise ConfigError("env.id must name a Gymnasium environment when env.name=gym (e.g. env.id=CartPole-v1)")


@dataclass
class ModelConfig:
    """Observation encoder (foxdqn.nn)."""

    encoder: Encoder = Encoder.mlp  # mlp | attention (over the trading window) | nature_cnn (images)
    hidden: List[int] = field(default_factory=lambda: [256, 256])  # mlp widths
    activation: Activation = Activation.relu  # hidden-layer nonlinearity
    width: int = 64  # attention: model width (a power of two of 16 to 128 with width / heads a power of two >= 16: fused no-gradient forward)
    heads: int = 4  # attention heads
    layers: int = 2  # attention blocks
    pooling: Pooling = Pooling.mean  # attention: mean | last

    def validate(self) -> None:
        if not self.hidden or any(h <= 0 for h in self.hidden):
            raise ConfigError(f"model.hidden={list(self.hidden)} must be a non-empty list of positive widths")
        _all_positive(self, "model", ("width", "heads", "layers"))
        if self.encoder == "attention" and self.width % self.heads:
            raise ConfigError(f"model.width={self.width} must be a multiple of model.heads={self.heads}")


@dataclass
class HeadConfig:
    """Q head. ``dueling``: Wang et al. 2016 eq. 9 (mean-subtracted advantages)."""

    name: Head = Head.dueling  # q | dueling | c51 | iqn
    double: bool = True  # Double DQN target (van Hasselt et al. 2016, eq. 4)
    dueling: bool = False  # dueling streams inside the c51 / iqn heads
    atoms: int = 51  # c51: atoms K on the support [v_min, v_max]
    v_min: float = -10.0  # c51: lowest atom of the support (return units after loss.reward_scale)
    v_max: float = 10.0  # c51: highest atom
    num_quantiles: int = 32  # iqn: N sampled τ for the online quantiles
    num_target_quantiles: int = 32  # iqn: N' sampled τ' for the target
    num_quantiles_policy: int = 32  # iqn: K fixed τ for acting
    embedding_dim: int = 64  # iqn: cosine embedding size n
    kappa: float = 1.0  # iqn: quantile Huber threshold κ

    def validate(self) -> None:
        if self.name == "c51":
            if self.atoms < 2:
                raise ConfigError(f"head.atoms={self.atoms} must be >= 2")
            if not self.v_min < self.v_max:
                raise ConfigError(f"head.v_min={self.v_min} must be < head.v_max={self.v_max}")
        if self.name == "iqn":
            _all_positive(self, "head", ("num_quantiles", "num_target_quantiles", "num_quantiles_policy",
                                         "embedding_dim"))
            _positive(self.kappa, "head.kappa", allow_zero=True)


@dataclass
class ReplayConfig:
    """Replay memory on the training device (foxdqn.replay)."""

    name: Replay = Replay.uniform  # uniform | per
    capacity: int = 100_000  # transitions held (all envs), oldest overwritten
    n_step: int = 1  # n-step returns (n ≥ 1), truncated at episode ends
    alpha: float = 0.6  # per: priority exponent α
    beta_start: float = 0.4  # per: IS exponent β₀, annealed to 1 over the run's updates
    eps: float = 1.0e-6  # per: ε added to |TD|
    her: bool = False  # hindsight relabelling, "future" strategy (goal-conditioned envs)
    her_k: int = 4  # her: relabelled goals per original

    def validate(self) -> None:
        _all_positive(self, "replay", ("capacity", "n_step", "eps", "her_k"))
        _unit(self.alpha, "replay.alpha")
        _unit(self.beta_start, "replay.beta_start")
        if self.her and self.n_step != 1:
            raise ConfigError(f"replay.her=true needs replay.n_step=1 (got {self.n_step})")


@dataclass
class ObjectiveConfig:
    """Extra objective terms (foxdqn.objectives)."""

    cql_alpha: float = 0.0  # CQL α (Kumar et al. 2020); 0 = off
    iql: bool = False  # IQL (Kostrikov et al. 2021): V by expectile regression, Q toward r + γV(s')
    iql_expectile: float = 0.7  # IQL expectile τ

    def validate(self) -> None:
        _positive(self.cql_alpha, "objective.cql_alpha", allow_zero=True)
        _unit(self.iql_expectile, "objective.iql_expectile", lo_open=True, hi_open=True)


@dataclass
class ActionConfig:
    """How the network's output becomes an env action (trading: 45 factored actions)."""

    mode: ActionMode = ActionMode.factored  # factored | exposure_routed | branching
    # greedy choice (walks, collect, target argmax) leaves the exposure held only when the Q gain beats
    #   this × the switch's cost (trading; foxdqn.actions.switch; docs/backtest.md#cost-aware-action-choice); 0 = off
    switch_margin: float = 0.0

    def validate(self) -> None:
        _positive(self.switch_margin, "action.switch_margin", allow_zero=True)  # the mode's rules: _cross_checks


@dataclass
class AgentConfig:
    """The run's budget and DQN training schedule (Mnih et al. 2015; foxdqn.step)."""

    total_env_steps: int = 400_000  # env transitions collected over the whole run (all envs), rounded up to whole iterations of env.num_envs × agent.steps_per_iter (10 envs: 2048 trains 2050)
    steps_per_iter: int = 4  # T env steps per env per iteration (collect phase)
    updates_per_iter: int = 1  # K gradient updates per iteration (train phase)
    learning_starts: int = 5_000  # env transitions collected before the first update
    batch_size: int = 128  # transitions sampled per gradient update
    gamma: float = 0.99  # discount γ
    # true: with updates_per_iter 1 and uniform replay the update samples the replay as it stood before
    # the iteration's collect steps, which run beside it on a second CUDA stream; false: collect, then update
    collect_beside_update: bool = True

    def validate(self) -> None:
        _all_positive(self, "agent", ("total_env_steps", "steps_per_iter", "updates_per_iter", "batch_size"))
        _positive(self.learning_starts, "agent.learning_starts", allow_zero=True)
        _unit(self.gamma, "agent.gamma")
        if self.learning_starts >= self.total_env_steps:
            raise ConfigError(f"agent.learning_starts={self.learning_starts} must be < agent.total_env_steps="
                              f"{self.total_env_steps} (else no update is made)")


@dataclass
class OptimConfig:
    """Adam (fused, capturable) and how one gradient update is computed (foxdqn.population.step)."""

    lr: float = 3e-4  # Adam learning rate
    adam_eps: float = 1e-5  # Adam ε
    grad_clip: float = 10.0  # max global gradient L2 norm
    accumulate: int = 1  # M micro-batches per update (agent.batch_size / M rows each); 1 = off
    # true: the M micro-batches in one forward and backward (the gradient of M passes to float rounding,
    # fewer kernels); false: M passes, each holding B/M rows' activations (less memory)
    accumulate_one_pass: bool = True

    def validate(self) -> None:
        _all_positive(self, "optim", ("lr", "adam_eps", "grad_clip"))
        if self.accumulate < 1:
            raise ConfigError(f"optim.accumulate={self.accumulate} must be >= 1 and divide agent.batch_size")


@dataclass
class ExploreConfig:
    """ε-greedy exploration: ε decays linearly from ``eps_start`` to ``eps_end``."""

    eps_start: float = 1.0  # ε at the first env step
    eps_end: float = 0.05  # ε after the decay, to the end
    eps_decay_fraction: float = 0.5  # ... over this fraction of agent.total_env_steps

    def validate(self) -> None:
        _unit(self.eps_start, "explore.eps_start")
        _unit(self.eps_end, "explore.eps_end")
        _unit(self.eps_decay_fraction, "explore.eps_decay_fraction", lo_open=True)
        if self.eps_end > self.eps_start:
            raise ConfigError(f"explore.eps_end={self.eps_end} must be <= explore.eps_start={self.eps_start} "
                              "(ε decays)")


@dataclass
class TargetConfig:
    """Target-network update after each gradient update."""

    update: TargetUpdate = TargetUpdate.polyak  # polyak: θ' ← (1 − τ) θ' + τ θ | hard: θ' ← θ every `period` updates
    tau: float = 0.005  # Polyak τ
    period: int = 1000  # hard: updates between copies

    def validate(self) -> None:
        _unit(self.tau, "target.tau", lo_open=True)
        _positive(self.period, "target.period")


@dataclass
class LossConfig:
    """Scale of the TD loss."""

    huber_delta: float = 1.0  # Huber threshold δ (reward units after reward_scale)
    reward_scale: float = 100.0  # rewards (trading: log-equity changes) are multiplied by this for the TD target

    def validate(self) -> None:
        _all_positive(self, "loss", ("huber_delta", "reward_scale"))


@dataclass
class PruneConfig:
    """Magnitude pruning of the online network's weight matrices (foxdqn.step.pruning;
    Zhu & Gupta 2017, eq. 1). Update numbers count gradient updates from 0."""

    enabled: bool = False  # prune the online network's weight matrices on the schedule below
    initial_sparsity: float = 0.0  # s_i, fraction of weights zeroed at start_update
    final_sparsity: float = 0.5  # s_f, fraction zeroed from end_update on
    start_update: int = 0  # t0, first mask update
    end_update: int = 10_000  # t0 + nΔt, last mask update (final sparsity reached here)
    frequency: int = 100  # Δt, updates between mask updates

    def validate(self) -> None:
        if not self.enabled:
            return
        _unit(self.initial_sparsity, "prune.initial_sparsity", hi_open=True)
        _unit(self.final_sparsity, "prune.final_sparsity", hi_open=True)
        if self.initial_sparsity > self.final_sparsity:
            raise ConfigError(f"prune.initial_sparsity={self.initial_sparsity} must be <= "
                              f"prune.final_sparsity={self.final_sparsity}")
        _positive(self.start_update, "prune.start_update", allow_zero=True)
        _positive(self.frequency, "prune.frequency")
        if self.end_update <= self.start_update:
            raise ConfigError(f"prune.end_update={self.end_update} must be > prune.start_update={self.start_update}")


@dataclass
class RegimeConfig:
    """Regime-weighted TD errors (foxdqn.replay.regime): loss weight by the sampled state's
    volatility regime, volatility / training-split median volatility (trading env only)."""

    enabled: bool = False  # weight each sampled transition's loss by its volatility regime
    low_threshold: float = 0.5  # ratio < low: low-volatility regime (routing rule's 0.5)
    high_threshold: float = 1.5  # ratio > high: high-volatility regime (routing rule's 1.5)
    weights: List[float] = field(default_factory=lambda: [0.5, 1.0, 2.0])  # [low, normal, high] loss weights

    def validate(self) -> None:
        if not self.enabled:
            return
        if not 0 < self.low_threshold < self.high_threshold:
            raise ConfigError(f"regime.low_threshold={self.low_threshold} must be > 0 and < "
                              f"regime.high_threshold={self.high_threshold}")
        w = self.weights
        if len(w) != 3 or any(x < 0 for x in w) or not any(x > 0 for x in w):
            raise ConfigError(f"regime.weights={list(w)} must be 3 numbers [low, normal, high], >= 0 and not all 0")


@dataclass
class GuardConfig:
    """On-device training guard (foxdqn.population.member_guard; docs/design/guard.md)."""

    loss_clip: float = 1.0e6  # a loss above this (or NaN/Inf) skips the update and halts
    collapse_multiplier: float = 0.0  # gradient-collapse threshold = optim.lr × multiplier (0 disables)
    collapse_patience: int = 100  # updates in a row below the collapse threshold before a halt
    warmup_updates: int = 100  # updates before the collapse check starts
    q_divergence: float = 1.0e4  # |Q| above this is a divergence (Q-value monitor)
    ring_size: int = 64  # no effect: the single-run loop's host ring is gone (kept so that older configs load)
    max_weight: Optional[float] = None  # post-step check: a step whose weights would have some |w| above this
    #                                     (or non-finite) is skipped and halts the run (null or 0 = off)
    keep_last_good: bool = True  # a halt saves the weights from before the last applied update (one copy of them)

    def validate(self) -> None:
        _all_positive(self, "guard", ("loss_clip", "q_divergence", "ring_size"))
        _all_positive(self, "guard", ("collapse_multiplier", "collapse_patience", "warmup_updates"), allow_zero=True)
        if self.max_weight is not None:
            _positive(self.max_weight, "guard.max_weight", allow_zero=True)


@dataclass
class GateConfig:
    """The deployment gate of a trading agent (foxdqn.analysis.gate; docs/backtest.md#the-deployment-gate): of flat,
    the agent under larger switch margins (none by default) and the agent as trained, the simplest that validation
    cannot tell from the best is evaluated."""

    enabled: Optional[bool] = None  # evaluate flat unless the agent beats it on validation with PSR >= confidence;
    #                                 null: on for trading, off for other envs
    margins: List[float] = field(default_factory=list)  # also try the agent under these switch margins (> action.switch_margin)
    confidence: float = 0.95  # keep a candidate over a simpler one only when the best beats the simpler with PSR >= this

    def validate(self) -> None:
        for i, m in enumerate(self.margins):
            if isinstance(m, bool) or not isinstance(m, (int, float)) or not (math.isfinite(m) and m > 0):
                raise ConfigError(f"eval.gate.margins[{i}]={m!r} must be a finite number > 0 (a switch margin, "
                                  "action.switch_margin's units)")
        if not (isinstance(self.confidence, (int, float)) and 0.0 < self.confidence < 1.0):
            raise ConfigError(f"eval.gate.confidence={self.confidence!r} must be in (0, 1): the PSR the best candidate "
                              "needs over a simpler one for the simpler one to be passed over")


@dataclass
class EvalConfig:
    """Out-of-sample evaluation (foxdqn.analysis.backtest)."""

    split: Split = Split.test  # the split evaluated once at the end (selection always uses val)
    episodes: int = 100  # greedy episodes per evaluation of a non-trading env (20 at most during training)
    interval_env_steps: int = 0  # validation evaluations during training (0 = only at the end)
    ensemble: EnsembleRule = EnsembleRule.mean  # a population's members of one setting (seeds) also walk as one
    #                                             agent: mean Q, vote, consensus or lcb (trading; foxdqn.population.ensemble)
    ensemble_agreement: float = 0.8  # consensus: share of members, in (0.5, 1], that must agree to leave a position
    ensemble_kappa: float = 1.0  # lcb: switch when the members' mean advantage − κ·std of it is > 0 (κ >= 0)
    gate: GateConfig = field(default_factory=GateConfig)  # trading: flat unless validation shows trading pays

    def validate(self) -> None:
        self.gate.validate()
        _positive(self.episodes, "eval.episodes")
        _positive(self.interval_env_steps, "eval.interval_env_steps", allow_zero=True)
        if not (math.isfinite(self.ensemble_agreement) and 0.5 < self.ensemble_agreement <= 1.0):
            raise ConfigError(f"eval.ensemble_agreement={self.ensemble_agreement} must be in (0.5, 1]: the fraction "
                              "of a setting's members that must target one new exposure (eval.ensemble=consensus)")
        _positive(self.ensemble_kappa, "eval.ensemble_kappa", allow_zero=True)


@dataclass
class EarlyStopConfig:
    """Early stopping (foxdqn.run.early_stop; docs/design/monitors.md#early-stopping). Checked on the host at eval /
    log boundaries only (never inside the captured iteration)."""

    enabled: bool = False  # stop on a validation plateau (patience) and evaluate the best validated weights
    metric: EarlyStopMetric = EarlyStopMetric.auto  # validation metric: auto (sharpe on trading, mean_return
    #                                                 elsewhere); max_drawdown: lower is better
    patience: int = 5  # validation evaluations in a row without improvement before stopping
    min_delta: float = 0.0  # an improvement must beat the best by more than this (metric units)
    q_bound: Optional[float] = None  # stop when |mean max-Q| of a log interval exceeds this (null = off)
    q_patience: int = 3  # ... for this many log intervals in a row
    on_q_divergence: bool = False  # a Q-monitor divergence flag ends the run as early_stop_q (exit 0)
    #                                instead of a guard halt (exit 3); NaN/loss-clip/collapse still halt

    def validate(self) -> None:
        _all_positive(self, "early_stop", ("patience", "q_patience"))
        _positive(self.min_delta, "early_stop.min_delta", allow_zero=True)
        if self.q_bound is not None:
            _positive(self.q_bound, "early_stop.q_bound")


@dataclass
class DiversityConfig:
    """Executed-action diversity logged at log boundaries (foxdqn.logger.diversity; docs/design/monitors.md#action-diversity)."""

    enabled: bool = True  # log entropies and the most frequent actions (host side, from the device counts)
    top_k: int = 3  # most frequent actions named in the log line
    min_entropy: float = 0.0  # collapse warning below this normalised entropy H / log(K) in [0, 1] (0 = off)
    patience: int = 3  # ... for this many log intervals in a row (one warning per collapse episode)

    def validate(self) -> None:
        _all_positive(self, "diversity", ("top_k", "patience"))
        _unit(self.min_entropy, "diversity.min_entropy")


@dataclass
class LogConfig:
    """Log boundaries and the console."""

    interval_env_steps: int = 20_000  # one device→host readback per interval
    progress: bool = True  # rich progress bar in a terminal, plain lines otherwise

    def validate(self) -> None:
        _positive(self.interval_env_steps, "log.interval_env_steps")


@dataclass
class PrometheusConfig:
    """The Prometheus endpoint of a run (foxdqn.logger.prometheus_log; docs/usage.md#prometheus)."""

    port: Optional[int] = None  # serve /metrics on this TCP port during training (null = off; logger=prometheus: 9464)
    addr: str = "127.0.0.1"  # address to bind (127.0.0.1: this machine only; 0.0.0.0: every interface)

    def validate(self, prefix: str = "logger.prometheus") -> None:
        if self.port is not None and not 1 <= self.port <= 65535:
            raise ConfigError(f"{prefix}.port={self.port} must be a TCP port in [1, 65535] (or null: off)")
        if not str(self.addr).strip():
            raise ConfigError(f"{prefix}.addr must be an address to bind, e.g. 127.0.0.1")

    def bind_error(self, exc: OSError, prefix: str = "logger.prometheus") -> ConfigError:
        """The one-line error for an endpoint that cannot be served: ``exc`` from binding
        ``addr:port`` (``socket.gaierror`` or ``EADDRNOTAVAIL``: the address does not resolve or is
        not this machine's, named as ``addr``; any other ``OSError``, e.g. the port in use, named
        as ``port``)."""
        import errno
        import socket

        if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
            return ConfigError(f"{prefix}.addr={self.addr}: not an address to bind ({exc.strerror or exc})")
        why = {errno.EADDRINUSE: "already in use", errno.EACCES: "not allowed (a privileged port)"}.get(
            exc.errno, exc.strerror or str(exc))
        return ConfigError(f"{prefix}.port={self.port}: cannot serve Prometheus on {self.addr}:{self.port}, "
                           f"{why}; choose another port or stop what holds it")


@dataclass
class LoggerConfig:
    """Where the logged metrics go (``logger=`` group, combinable: ``logger=[csv,tensorboard,prometheus,mlflow,wandb]``).
    ``metrics.csv`` is always written."""

    tensorboard: bool = False  # TensorBoard events in tb/ (set by logger=tensorboard, the default)
    mlflow: bool = False  # an MLflow run per foxdqn run (set by logger=mlflow; pip install 'foxdqn[mlflow]')
    mlflow_uri: Optional[str] = None  # the MLflow tracking store; null: mlflow.db (mode 0600) of the run (or sweep) folder
    wandb: bool = False  # a Weights & Biases run per foxdqn run (set by logger=wandb; pip install 'foxdqn[wandb]')
    wandb_mode: WandbMode = WandbMode.offline  # offline: written to <run>/wandb/, wandb sync uploads it; online: a login
    wandb_project: str = "foxdqn"  # the W&B project
    wandb_entity: Optional[str] = None  # the W&B entity (team or user); null: the login's default
    prometheus: PrometheusConfig = field(default_factory=PrometheusConfig)

    def validate(self) -> None:
        self.prometheus.validate()


@dataclass
class SearchConfig:
    """Hyperparameter searches (``hparams_search=<family>_optuna``; foxdqn.run.search): what a run returns
    to the sweeper and the pruning of the jobs of a ``--multirun``."""

    exclude_no_trades: bool = True  # a trading run whose kept weights never trade on val returns NaN (not counted)
    pruner: Pruner = Pruner.none  # median: stop a --multirun job below the finished jobs' median validation
    n_startup_trials: int = 5  # median pruner: no job is pruned until this many jobs of the sweep have finished
    n_warmup_steps: int = 0  # median pruner: no job is pruned before this many env steps

    def validate(self) -> None:
        _positive(self.n_startup_trials, "search.n_startup_trials", allow_zero=True)
        _positive(self.n_warmup_steps, "search.n_warmup_steps", allow_zero=True)


@dataclass
class CheckpointConfig:
    """Checkpoints for resuming (foxdqn.run.checkpoint): ``checkpoints/last.pt``, rewritten atomically."""

    every_env_steps: int = 100_000  # also every this many env steps (0 = only at the end, on a halt or a signal)
    save_replay: bool = False  # include the replay memory (an exact continuation; large)

    def validate(self) -> None:
        _positive(self.every_env_steps, "checkpoint.every_env_steps", allow_zero=True)


@dataclass
class DebugConfig:
    """Caps applied after composition (so they win over any experiment): ``debug=smoke``."""

    name: Optional[str] = None  # the debug option's name (smoke), for the record
    max_env_steps: Optional[int] = None  # cap on agent.total_env_steps (and the log/eval intervals), then rounded up as that key is
    max_num_envs: Optional[int] = None  # cap on env.num_envs
    max_batch_size: Optional[int] = None  # cap on agent.batch_size
    max_learning_starts: Optional[int] = None  # cap on agent.learning_starts
    max_replay_capacity: Optional[int] = None  # cap on replay.capacity
    max_hidden: Optional[int] = None  # cap on every width of model.hidden
    max_eval_bars: Optional[int] = None  # trading: each evaluation walk (validation, test, gate) ends after this many bars
    fit_prune_schedule: bool = False  # with max_env_steps: shrink prune.start/end_update and frequency by the same ratio
    inject_nan_at_step: Optional[int] = None  # poison the loss at this update (guard test)
    inject_lr_spike_at_step: Optional[int] = None  # learning rate x 2**100 for this one update (guard.max_weight test)

    def validate(self) -> None:
        if self.max_eval_bars is not None and (isinstance(self.max_eval_bars, bool) or self.max_eval_bars < 1):
            raise ConfigError(f"debug.max_eval_bars={self.max_eval_bars} must be >= 1 (bars of an evaluation walk) "
                              f"or null (the whole split)")
        for key in ("inject_nan_at_step", "inject_lr_spike_at_step"):
            value = getattr(self, key)
            if value is not None and value < 0:
                raise ConfigError(f"debug.{key}={value} must be >= 0 (an update number)")


@dataclass
class TrainConfig:
    experiment: str = "eurusd_dqn"  # the run's name in folders and reports (set by each experiment file)
    seed: int = 0  # seeds torch, the run's generator and the env resets
    device: Device = Device.auto  # auto: cuda when available, else cpu
    graph: GraphMode = GraphMode.auto  # auto: a CUDA graph on CUDA, eager on CPU
    cpu_threads: int = 1  # torch intra-op threads on CPU (0 = torch's default); 1 is as fast at these sizes
    matmul_precision: MatmulPrecision = MatmulPrecision.high  # CUDA float32 matmuls: highest | high (TF32) | medium

    data: DataConfig = field(default_factory=DataConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    action: ActionConfig = field(default_factory=ActionConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    explore: ExploreConfig = field(default_factory=ExploreConfig)
    target: TargetConfig = field(default_factory=TargetConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    prune: PruneConfig = field(default_factory=PruneConfig)
    regime: RegimeConfig = field(default_factory=RegimeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)
    diversity: DiversityConfig = field(default_factory=DiversityConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    resume: Optional[str] = None  # auto (the newest checkpoint of hydra.run.dir) | a checkpoint path


#: The groups of :class:`TrainConfig` that validate themselves, in the order they are checked.
GROUPS = ("env", "model", "head", "objective", "action", "replay", "agent", "optim", "explore", "target", "loss",
          "prune", "regime", "guard", "eval", "log", "logger", "early_stop", "diversity", "checkpoint", "search", "debug")


# ---------------------------------------------------------------------------------- validation


def validate(cfg: TrainConfig) -> None:
    """Check every value (finite, a member of its choices, in range: each group's ``validate``)
    and the rules that join groups. Raises ConfigError naming the dotted key."""
    _check_values(cfg)
    if not 0 <= cfg.seed < 2 ** 63:
        raise ConfigError(f"seed={cfg.seed} must be an integer in [0, 2**63)")
    _positive(cfg.cpu_threads, "cpu_threads", allow_zero=True)
    if cfg.resume is not None and not str(cfg.resume).strip():
        raise ConfigError("resume must be auto or the path of a checkpoint (.pt)")
    if cfg.env.name == "trading":
        cfg.data.validate()
    for name in GROUPS:
        getattr(cfg, name).validate()
    _cross_checks(cfg)


@functools.lru_cache(maxsize=None)
def field_types(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints(cls)`` of a config dataclass, resolved once per class (resolving the
    string annotations took 8 ms of a sweep's every job: docs/bench.md#other-costs). Treat as read-only."""
    return typing.get_type_hints(cls)


@functools.lru_cache(maxsize=None)
def _value_fields(cls: type) -> tuple[tuple[str, type | None], ...]:
    """Each field of the config dataclass ``cls`` as (name, its :class:`Choice` type or None), in
    order: :func:`_check_values`'s plan, made once per class (a sweep checks every job's config)."""
    hints = field_types(cls)
    return tuple((f.name, kind if isinstance(kind, type) and issubclass(kind, Choice) else None)
                 for f in dataclasses.fields(cls) for kind in [hints.get(f.name)])


def _check_values(node, prefix: str = "") -> None:
    """Every float anywhere in the config is finite and every :class:`Choice` field holds one of
    its values (a TrainConfig built in Python skips OmegaConf's compose-time check)."""
    for field_name, choice in _value_fields(type(node)):
        value = getattr(node, field_name)
        if dataclasses.is_dataclass(value):
            _check_values(value, f"{prefix}{field_name}.")
        elif choice is not None:
            if value not in choice._value2member_map_:
                raise ConfigError(f"{prefix}{field_name}={value!r} is not allowed; choose one of "
                                  f"{', '.join(choice._member_names_)}")
            setattr(node, field_name, choice(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{prefix}{field_name}={value} must be a finite number")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                if isinstance(v, float) and not math.isfinite(v):
                    raise ConfigError(f"{prefix}{field_name}[{i}]={v} must be a finite number")


def _cross_checks(cfg: TrainConfig) -> None:
    """The rules that join groups: the device, what each component needs of the env, sizes."""
    import torch

    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no CUDA device is available; use device=auto or device=cpu")
    if cfg.graph == "on" and (cfg.device == "cpu" or not torch.cuda.is_available()):
        raise ConfigError("graph=on needs a CUDA device; use graph=auto or graph=off on CPU")
    env, h, iql = cfg.env.name, cfg.head.name, cfg.objective.iql
    needs = [(cfg.model.encoder == "attention", "model.encoder=attention attends over the trading observation "
              "window", "trading"),
             (cfg.model.encoder == "nature_cnn", "model.encoder=nature_cnn reads image observations [C, H, W] "
              "(env.name=gym with an ALE/* env.id)", "gym"),
             (cfg.action.mode != "factored", f"action.mode={cfg.action.mode!r} needs env.name=trading", "trading"),
             (cfg.action.switch_margin > 0, f"action.switch_margin={cfg.action.switch_margin} prices a change of the "
              "trading env's exposure (set it to 0 for other envs)", "trading"),
             (str(cfg.data.augment.method) != "none", f"data.augment.method={cfg.data.augment.method} resamples the "
              "trading env's bars (set it to none for other envs)", "trading"),
             (cfg.eval.gate.enabled is True, "eval.gate.enabled=true chooses among a trading agent's policies on the validation "
              "split (set it to false for other envs)", "trading"),
             (cfg.replay.her, "replay.her=true needs a goal-conditioned env (env.name=bitflip)", "bitflip"),
             (cfg.regime.enabled, "regime.enabled=true needs env.name=trading (it weights by the trading env's "
              "volatility regime)", "trading")]
    for used, what, env_needed in needs:
        if used and env != env_needed:
            raise ConfigError(f"{what}; env.name={env!r}")
    if cfg.eval.gate.margins and cfg.eval.gate.enabled is not False and env == "trading" and str(
            cfg.eval.ensemble) == "vote":
        raise ConfigError(f"eval.ensemble=vote counts the members' greedy actions, which the switch margins of "
                          f"eval.gate.margins={list(cfg.eval.gate.margins)} do not price: use eval.ensemble=mean, or "
                          "eval.gate.margins=[]")
    if cfg.action.switch_margin > 0 and str(cfg.eval.ensemble) == "vote":
        raise ConfigError(f"eval.ensemble=vote counts the members' greedy actions, which action.switch_margin="
                          f"{cfg.action.switch_margin} does not price: use eval.ensemble=mean (Q minus the switch "
                          "penalty) or none")
    if iql and h in ("c51", "iqn"):
        raise ConfigError(f"objective.iql=true trains a scalar Q toward r + γV(s'); head.name={h!r} is "
                          "distributional (use head=q or head=dueling)")
    if cfg.action.mode == "branching" and (h != "dueling" or iql):
        raise ConfigError(f"action.mode=branching uses its own branching dueling head; set head=dueling "
                          f"(got head.name={h!r}{', objective.iql=true' if iql else ''})")
    capacity, n, b = cfg.replay.capacity, cfg.env.num_envs, cfg.agent.batch_size
    for need, what in (((cfg.replay.n_step + 1) * n, f"(replay.n_step + 1) * env.num_envs = "
                        f"{(cfg.replay.n_step + 1) * n}"), (b, f"agent.batch_size={b}"), (n, f"env.num_envs={n}")):
        if capacity < need:
            raise ConfigError(f"replay.capacity={capacity} must be >= {what}")
    if b % cfg.optim.accumulate:
        raise ConfigError(f"optim.accumulate={cfg.optim.accumulate} must be >= 1 and divide agent.batch_size={b}")
    _early_stop_checks(cfg)


def _early_stop_checks(cfg: TrainConfig) -> None:
    es, trading = cfg.early_stop, cfg.env.name == "trading"
    if not es.enabled:
        return
    if es.metric == "mean_return" and trading:
        raise ConfigError("early_stop.metric=mean_return is for episodic envs; the trading env's validation "
                          "metrics are sharpe, sortino, total_return, profit_factor, max_drawdown (or auto)")
    if es.metric not in ("auto", "mean_return") and not trading:
        raise ConfigError(f"early_stop.metric={es.metric!r} is a trading metric; env.name={cfg.env.name!r} is "
                          "validated by mean_return (or auto)")
    if cfg.eval.interval_env_steps <= 0:
        raise ConfigError("early_stop.enabled=true needs eval.interval_env_steps > 0 (the validation "
                          f"evaluations it watches); got eval.interval_env_steps={cfg.eval.interval_env_steps}")


# ------------------------------------------------------------------------- from composed to typed


@functools.lru_cache(maxsize=1)
def _schema_keys() -> DictConfig:
    """``OmegaConf.structured(TrainConfig)``, built once (40 ms on 2 idle cores, at every composition
    otherwise): read for its keys only (:func:`unknown_keys`, :func:`allowed_keys`), never changed."""
    return OmegaConf.structured(TrainConfig)


def unknown_keys(composed: DictConfig, schema=None, prefix: str = "") -> list[str]:
    """Dotted keys of ``composed`` that the schema does not have (``+key=value`` overrides add
    them past the struct check; they would otherwise be dropped without a word)."""
    schema = _schema_keys() if schema is None else schema
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
    node = _schema_keys()
    for part in dotted.split(".")[:-1]:
        if part not in node or not OmegaConf.is_dict(node._get_node(part)):
            break
        node = node._get_node(part)
    return sorted(str(k) for k in node.keys())


def to_object(cfg: DictConfig | TrainConfig) -> TrainConfig:
    """Turn a composed DictConfig into a :class:`TrainConfig` instance (a copy)."""
    if isinstance(cfg, TrainConfig):
        return dataclasses.replace(cfg)
    obj = OmegaConf.to_object(cfg)
    if not isinstance(obj, TrainConfig):  # composed without the schema (should not happen)
        obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), cfg))
    return obj


def to_plain(cfg: Any) -> Any:
    """``cfg`` as nested dicts of plain Python values (choices as their strings): what checkpoints
    store and resume compares; equal to ``OmegaConf.to_container(OmegaConf.structured(cfg),
    enum_to_str=True)``, without building an OmegaConf node (a population writes one per member).
    Nested values (groups, lists, choices) go through the same function."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, Enum):
        return cfg.name
    if isinstance(cfg, (list, tuple)):
        return [to_plain(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: to_plain(v) for k, v in cfg.items()}
    return cfg


def clone_config(cfg: Any) -> Any:
    """A deep copy of ``cfg``, a config or part of one (dataclasses, lists, tuples, dicts; numbers,
    strings, booleans, None and choices are shared, as they are immutable), equal to
    ``copy.deepcopy(cfg)`` for a config, whose fields never share a mutable object, at a fraction
    of its cost (a multirun's composer copies a config three times a job:
    :class:`foxdqn.config.compose.JobComposer`). Any other object is ``copy.deepcopy``'d."""
    kind = type(cfg)
    if kind in _IMMUTABLE or isinstance(cfg, Enum):
        return cfg
    if kind is list:
        return [clone_config(v) for v in cfg]
    if kind is dict:
        return {k: clone_config(v) for k, v in cfg.items()}
    if kind is tuple:
        return tuple(clone_config(v) for v in cfg)
    names = _FIELD_NAMES.get(kind)
    if names is None:
        if not dataclasses.is_dataclass(kind) or hasattr(kind, "__slots__"):
            import copy

            return copy.deepcopy(cfg)
        names = _FIELD_NAMES[kind] = tuple(f.name for f in dataclasses.fields(kind))
    new = object.__new__(kind)
    new.__dict__.update(cfg.__dict__)
    for name in names:
        value = new.__dict__[name]
        if type(value) not in _IMMUTABLE:
            new.__dict__[name] = clone_config(value)
    return new


_IMMUTABLE = frozenset({int, float, str, bool, type(None), bytes})
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def upgrade(values: dict) -> dict:
    """A copy of a plain config dict written before keys moved or were added (an older checkpoint's
    or start record's), with :data:`MOVED_KEYS` applied and each missing key of :data:`ADDED_KEYS`
    set to its value from before it; a current one comes back unchanged."""
    import copy

    out = copy.deepcopy(values)
    for key, before in ADDED_KEYS.items():
        group, leaf = key.split(".")
        if isinstance(out.get(group), dict) and leaf not in out[group]:
            out[group][leaf] = before
    for old, new in MOVED_KEYS.items():
        group, key = old.split(".")
        if isinstance(out.get(group), dict) and key in out[group]:
            value, node = out[group].pop(key), out
            *parents, leaf = new.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
    return out


def finalize(cfg: DictConfig | TrainConfig, warn: bool = True, check: bool = True) -> TrainConfig:
    """Composed config → validated :class:`TrainConfig` with the debug caps applied; ``warn``: log
    the settings it ignores (:func:`warn_ignored`; off for a resume's call, whose composed config is
    replaced by the run's own). ``check=False``: no value or rule checks (:func:`validate`), only
    the conversion, an unknown key and the caps: a resume's composed config, which joins keys given
    on its command line with the default experiment's (``optim.accumulate=3`` against the default
    batch), is checked as the run's config after :func:`foxdqn.run.resume.resolve_resume`.

    Raises:
        ConfigError: an unknown key, an interpolation that does not resolve (``${oops}``), a value
            out of range or two settings that do not go together (one line, naming the key).
    """
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(cfg, DictConfig):
        extra = unknown_keys(cfg)
        if extra:
            raise ConfigError(unknown_key_message(extra[0]))
    try:
        obj = to_object(cfg)
    except OmegaConfBaseException as exc:  # resolving ${...}: a missing key or env variable, a bad value
        raise ConfigError(composition_error(exc)) from None
    return finalize_object(obj, warn, check)


def finalize_object(obj: TrainConfig, warn: bool = True, check: bool = True) -> TrainConfig:
    """The part of :func:`finalize` after the conversion: the debug caps, the checks before and
    after them (``check``), and (``warn``) the warnings of ignored settings, on ``obj`` (changed in
    place, returned).

    Raises:
        ConfigError: as :func:`finalize`.
    """
    obj = apply_schedule_caps(obj)
    if check:
        validate(obj)  # sizes as written: the size caps must not hide a bad combination (batch > replay, ...)
    sizes = _capped_sizes(obj)
    obj = apply_size_caps(obj)
    if check and _capped_sizes(obj) != sizes:  # again only where a cap changed a size (a sweep's every job)
        validate(obj)
    if warn:
        warn_ignored(obj)
    return obj


# -------------------------------------------------------------------------------- debug caps


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


def _capped_sizes(cfg: TrainConfig) -> tuple:
    """The values :func:`apply_size_caps` may change (a copy of the hidden widths)."""
    return cfg.env.num_envs, cfg.agent.batch_size, cfg.replay.capacity, list(cfg.model.hidden)


def apply_size_caps(cfg: TrainConfig) -> TrainConfig:
    """``debug.max_num_envs``, ``max_batch_size``, ``max_replay_capacity``, ``max_hidden``, in place.
    A capped batch stays a multiple of ``optim.accumulate`` (rounded down to one, at least one
    micro-batch of a row each), so a valid config stays valid under ``debug=smoke``."""
    d = cfg.debug
    if d.max_num_envs is not None:
        cfg.env.num_envs = min(cfg.env.num_envs, d.max_num_envs)
    if d.max_batch_size is not None and cfg.agent.batch_size > d.max_batch_size:
        m = max(1, cfg.optim.accumulate)
        cfg.agent.batch_size = max(m, d.max_batch_size // m * m)
    if d.max_replay_capacity is not None:
        cfg.replay.capacity = min(cfg.replay.capacity, d.max_replay_capacity)
    if d.max_hidden is not None:
        cfg.model.hidden = [min(h, d.max_hidden) for h in cfg.model.hidden]
    return cfg


def total_updates(cfg: TrainConfig) -> int:
    """Gradient updates the run will make (host arithmetic on the schedule, no device read)."""
    a = cfg.agent
    per_iter = cfg.env.num_envs * a.steps_per_iter
    iters = max(1, math.ceil(a.total_env_steps / per_iter))
    warm = min(iters, math.ceil(a.learning_starts / per_iter))
    return (iters - warm) * a.updates_per_iter


def warn_ignored(cfg: TrainConfig) -> list[str]:
    """Log (and return) one warning per setting that the chosen components ignore: keys of a head
    that is not selected, ``data.augment`` sizes without its method, ``action.switch_margin``'s
    target part under IQL (no argmax), or ``debug.inject_nan_at_step`` /
    ``debug.inject_lr_spike_at_step`` past the run's last update."""
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
    aug, default_aug = cfg.data.augment, type(cfg.data.augment)()
    changed = [k for k in ("block_length", "paths") if getattr(aug, k) != getattr(default_aug, k)]
    if aug.method == "none" and changed and cfg.env.name == "trading":
        notes.append(f"data.augment.{', data.augment.'.join(changed)} set but data.augment.method='none': ignored "
                     "(they belong to data.augment.method=block_bootstrap)")
    gate = cfg.eval.gate
    if gate.margins and (gate.enabled is False or cfg.env.name != "trading"):
        notes.append(f"eval.gate.margins set but the deployment gate is off (eval.gate.enabled={gate.enabled}, "
                     f"env.name={cfg.env.name!r}): ignored")
    elif gate.margins and any(m <= cfg.action.switch_margin for m in gate.margins):
        notes.append(f"eval.gate.margins at or below action.switch_margin={cfg.action.switch_margin:g} are not "
                     f"candidates (the agent as trained already uses that margin): "
                     f"{[m for m in gate.margins if m <= cfg.action.switch_margin]} ignored")
    if cfg.env.name == "trading" and gate.enabled is not False and str(cfg.eval.split) == "val":
        notes.append("eval.split=val behind the deployment gate: the gate chooses and evaluates on the same split "
                     "(the result is not out of sample)")
    if cfg.action.switch_margin > 0 and cfg.objective.iql:
        notes.append("action.switch_margin with objective.iql=true: IQL's target bootstraps V(s') and has no argmax; "
                     "the margin changes the acting only")
    for key, what in (("inject_nan_at_step", "no NaN will be injected"),
                      ("inject_lr_spike_at_step", "no learning-rate spike will be injected")):
        at = getattr(cfg.debug, key)
        if at is not None and at >= total_updates(cfg):
            notes.append(f"debug.{key}={at} is past the run's last update ({total_updates(cfg) - 1}): {what}")
    for note in notes:
        logging.getLogger("foxdqn.config.schema").warning(note)
    return notes


# ------------------------------------------------------------------------------ registration


def run_name(experiment: str, data_path: Optional[str] = None, env_id: Optional[str] = None) -> str:
    """The name of a run's folders, titles, logger runs and reports.

    The experiment's name, except:

    * with ``data.path`` (the user's own bars), the name is after the file: the experiment without
      its market prefix (the word before the first ``_`` when it is a built-in dataset's market, as
      ``eurusd`` in ``eurusd_dqn``), then the file's stem: ``eurusd_dqn`` on ``bars.csv`` is
      ``dqn_bars``, ``eurusd_c51`` is ``c51_bars``, an experiment of the user's own ``mine`` is
      ``mine_bars``;
    * with a Gymnasium ``env.id``, the experiment and the id (``cartpole_gym_Acrobot-v1``).

    Characters other than letters, digits, ``-``, ``_`` and ``.`` become ``_``."""
    import re

    if data_path:
        market, _, algo = str(experiment).partition("_")
        markets = {name.split("_")[0] for name in BUILTIN_DATASETS}
        name = f"{algo if algo and market in markets else experiment}_{Path(str(data_path)).stem}"
    else:
        name = f"{experiment}_{env_id}" if env_id else str(experiment)
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def register_configs() -> None:
    """Register the schema as ``train_schema`` (train.yaml lists it first in its defaults) and the
    ``run_name`` resolver its folder names use."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    if not OmegaConf.has_resolver("run_name"):
        OmegaConf.register_new_resolver("run_name", lambda e, d=None, i=None: run_name(e, d, i))


register_configs()


#: Hydra plugins foxdqn documents: the option Hydra cannot find → (the plugin, foxdqn's extra).
PLUGINS = {
    "hydra/sweeper/optuna": ("hydra-optuna-sweeper", "sweep"),
    "hydra/launcher/joblib": ("hydra-joblib-launcher", "sweep"),
    "hydra/launcher/submitit_local": ("hydra-submitit-launcher", "slurm"),
    "hydra/launcher/submitit_slurm": ("hydra-submitit-launcher", "slurm"),
    "hydra/launcher/ray": ("hydra-ray-launcher", "ray"),
}


def composition_error(exc: BaseException) -> str:
    """One line from a Hydra/OmegaConf composition error: an unknown key names the keys allowed
    there (or where it moved), a bad choice lists the choices, a missing group option lists the
    options, a launcher or sweeper whose plugin is not installed names the extra that installs it
    (:data:`PLUGINS`), and Hydra's own hint (``+experiment=...``) is kept."""
    import re

    text = str(exc).strip() or type(exc).__name__
    missing = re.search(r"Could not find '(hydra/(?:sweeper|launcher)/\w+)'", text)
    if missing and missing.group(1) in PLUGINS:
        plugin, extra = PLUGINS[missing.group(1)]
        option = missing.group(1).rsplit("/", 1)
        return (f"{option[0]}={option[1]} needs the Hydra plugin {plugin}, not installed: "
                f"pip install 'foxdqn[{extra}]' (or pip install {plugin})")
    cause = exc.__cause__ or exc.__context__
    full = text + ("\n" + str(cause) if cause is not None else "")
    group_file = re.match(r"In '(experiment|hparams_search)/([^']+)'", text)
    if group_file and re.search(rf"@{group_file.group(1)}\.|full_key: {group_file.group(1)}(\.|\s|$)", full):
        # a file of these groups without `# @package _global_` lands under the key `experiment` (or
        # `hparams_search`): its `override /head: q` becomes head@experiment.head, its keys experiment.*
        return (f"{group_file.group(1)}/{group_file.group(2)}.yaml: add the line `# @package _global_` at the top "
                f"of the file (its keys and overrides are for the whole config, as in conf/experiment/)")
    key = re.search(r"full_key: (\S+)", full)
    choice = re.search(r"Invalid value '([^']*)', expected one of \[([^\]]*)\]", full)
    if choice and key:
        hint = (" (YAML reads on/off/yes/no/true/false as booleans: quote the word, e.g. graph: 'off')"
                if choice.group(1) in ("True", "False") else "")
        return f"{key.group(1)}={choice.group(1)!r} is not allowed; choose one of {choice.group(2)}{hint}"
    unknown = re.search(r"Could not override '([^']+)'", text)
    if unknown and "No match in the defaults list" not in text:
        return unknown_key_message(unknown.group(1))
    if key and re.search(r"interpolation", full, re.I):  # ${...} that does not resolve
        first = text.splitlines()[0].strip()
        return f"{key.group(1)}: {first} (in a ${{...}} interpolation)"
    if key and re.search(r"not in struct|Key '[^']+' (is )?not in", full):
        where = re.match(r"In '([^']+)'", text)
        return (f"{where.group(1)}: " if where else "") + unknown_key_message(key.group(1))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    cut = next((i for i, ln in enumerate(lines) if ln.startswith("Config search path")), len(lines))
    keep = [ln for ln in lines[:cut] if not ln.startswith(("object_type", "reference_type", "Set the environment variable"))]
    if any(ln.startswith("Available options") for ln in keep):  # "...in 'head':" + one option per line
        i = next(i for i, ln in enumerate(keep) if ln.startswith("Available options"))
        keep = keep[:i] + [keep[i] + " " + ", ".join(keep[i + 1:])]
    if cause is not None and str(cause).strip():
        first = str(cause).strip().splitlines()[0].strip()
        if first not in keep and "$VALUE" not in first:  # OmegaConf's unfilled template repeats the text
            keep.append(first)
    return " ".join(ln if ln.endswith(".") else ln + ";" for ln in keep).rstrip(";") or text
