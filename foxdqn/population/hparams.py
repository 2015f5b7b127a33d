"""The hyperparameters members may differ in, as ``[P]`` device tensors.

Each field is read from member p's own config (the job's). The keys that change shapes or code
paths are the same for all members of a population (they are part of
:func:`foxdqn.population.grouping.group_key`). A captured graph reads these tensors, so changing
one in place takes effect at the next replay.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from foxdqn.config.schema import TrainConfig
from foxdqn.population.grouping import KEYS, dotted_value

@dataclass
class MemberParams:
    """float32 ``[P]`` unless said: lr, adam_eps (Adam ε), grad_clip (max L2 norm), gamma (γ),
    eps_start / eps_end / eps_decay_fraction (ε-greedy schedule), tau (Polyak τ), period (int64,
    hard-update period in updates), huber_delta (Huber δ), reward_scale, loss_clip (guard), nan_at
    (int64, the update whose loss ``debug.inject_nan_at_step`` poisons; −1 never), cql_alpha (CQL α
    >= 0 of ``objective.cql_alpha``, Kumar et al. 2020 eq. 4; read when some member's α > 0),
    iql_expectile (IQL expectile τ in (0, 1) of ``objective.iql_expectile``, Kostrikov et al. 2021
    eq. 5; read with ``objective.iql``), per_alpha / per_beta_start / per_eps (prioritized replay's
    α, β₀ and ε added to |TD|, Schaul et al. 2016 eq. 1 and §3.4; read with ``replay.name=per``),
    kappa (IQN's quantile Huber threshold κ >= 0 of ``head.kappa``, return units, Dabney et al.
    2018 eq. 3; read with ``head.name=iqn``), lr_spike_at (int64, the update whose learning rate
    ``debug.inject_lr_spike_at_step`` multiplies by 2**100; −1 never), max_weight (the post-step
    weight check's bound ``guard.max_weight``; 0 for null or 0: that member's check is off),
    collapse_multiplier (``guard.collapse_multiplier``, 0: the collapse check is off),
    collapse_patience and warmup_updates (int64, ``guard.collapse_patience``,
    ``guard.warmup_updates``), q_divergence (the Q monitor's |Q| bound ``guard.q_divergence``;
    read with ``early_stop.on_q_divergence``)."""

    lr: torch.Tensor
    adam_eps: torch.Tensor
    grad_clip: torch.Tensor
    gamma: torch.Tensor
    eps_start: torch.Tensor
    eps_end: torch.Tensor
    eps_decay_fraction: torch.Tensor
    tau: torch.Tensor
    period: torch.Tensor
    huber_delta: torch.Tensor
    reward_scale: torch.Tensor
    loss_clip: torch.Tensor
    nan_at: torch.Tensor
    cql_alpha: torch.Tensor
    iql_expectile: torch.Tensor
    per_alpha: torch.Tensor
    per_beta_start: torch.Tensor
    per_eps: torch.Tensor
    kappa: torch.Tensor
    lr_spike_at: torch.Tensor
    max_weight: torch.Tensor
    collapse_multiplier: torch.Tensor
    collapse_patience: torch.Tensor
    warmup_updates: torch.Tensor
    q_divergence: torch.Tensor

    @classmethod
    def from_configs(cls, cfgs: list[TrainConfig], device: torch.device) -> "MemberParams":
        values = {}
        for f in fields(cls):
            column = [dotted_value(c, KEYS[f.name]) for c in cfgs]
            if f.name in ("period", "nan_at", "lr_spike_at", "collapse_patience", "warmup_updates"):
                values[f.name] = torch.tensor([-1 if v is None else int(v) for v in column], dtype=torch.int64,
                                              device=device)
            else:  # None: off (guard.max_weight)
                values[f.name] = torch.tensor([0.0 if v is None else float(v) for v in column], dtype=torch.float32,
                                              device=device)
        return cls(**values)

    def eps_duration(self, total_env_steps: int) -> torch.Tensor:
        """Steps of each member's linear ε decay (float32 ``[P]``, at least 1):
        ``eps_decay_fraction · total_env_steps``, computed on the device (device ops only)."""
        return torch.clamp(self.eps_decay_fraction * float(total_env_steps), min=1.0)
