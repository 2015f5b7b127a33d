"""Which jobs of a multirun may train together as one population.

Members of a population share every setting that gives a tensor its shape or picks a code path;
they may differ only in :data:`MEMBER_KEYS` (the seed and scalar hyperparameters, held as [P]
device tensors by the population trainer, or read per member at setup: :data:`SETUP_KEYS`).
:func:`group_key` is the canonical text of everything else, :func:`batch_refusal` says why a
config cannot run in a population at all (the supported settings are the named constants below,
which the trainer checks against too), and :func:`plan` turns a multirun's jobs into the groups
the population launcher trains.
docs/usage.md#a-sweep-in-one-process-hydralauncherpopulation.
"""
from __future__ import annotations

import json
from functools import reduce
from typing import TYPE_CHECKING, Any, Callable, Sequence

from foxdqn.config.schema import to_plain

if TYPE_CHECKING:
    from foxdqn.config.schema import TrainConfig
    from foxdqn.population.jobs import Member

#: MemberParams field (foxdqn.population.hparams) → the dotted config key it is read from.
KEYS = {
    "lr": "optim.lr", "adam_eps": "optim.adam_eps", "grad_clip": "optim.grad_clip", "gamma": "agent.gamma",
    "eps_start": "explore.eps_start", "eps_end": "explore.eps_end", "eps_decay_fraction": "explore.eps_decay_fraction",
    "tau": "target.tau", "period": "target.period", "huber_delta": "loss.huber_delta",
    "reward_scale": "loss.reward_scale", "loss_clip": "guard.loss_clip", "nan_at": "debug.inject_nan_at_step",
    "cql_alpha": "objective.cql_alpha", "iql_expectile": "objective.iql_expectile",
    "per_alpha": "replay.alpha", "per_beta_start": "replay.beta_start", "per_eps": "replay.eps", "kappa": "head.kappa",
    "lr_spike_at": "debug.inject_lr_spike_at_step", "max_weight": "guard.max_weight",
    "collapse_multiplier": "guard.collapse_multiplier", "collapse_patience": "guard.collapse_patience",
    "warmup_updates": "guard.warmup_updates", "q_divergence": "guard.q_divergence",
}

#: Dotted config keys read per member once, while the population is built (host values, no [P]
#: tensor: nothing in the iteration reads them): each member's resampled training paths are drawn
#: with its own mean block length (foxdqn.population.envs.member_paths).
SETUP_KEYS: tuple[str, ...] = ("data.augment.block_length",)

#: Member keys held by each member's network rather than by MemberParams: C51's support bounds
#: (foxdqn.population.distributional.MemberC51Network: float64 [P] buffers and a [P, K] support, each
#: member's from its own config; the atom count head.atoms gives the layers their shape and is shared).
NETWORK_KEYS: tuple[str, ...] = ("head.v_min", "head.v_max")

#: Dotted config keys in which the members of one population may differ.
MEMBER_KEYS: tuple[str, ...] = ("seed", *SETUP_KEYS, *KEYS.values(), *NETWORK_KEYS)

#: (dotted key, the test its value must pass, what is supported), checked in this order: the settings
#: the population trainer refuses (none now). Every env.name (cartpole, bitflip, trading, and gym:
#: foxdqn.population.gym_env), every model.encoder (mlp, attention, nature_cnn: foxdqn.population.conv),
#: every head.name (q, dueling, c51, iqn: foxdqn.population.state.member_network), every action.mode
#: (factored, exposure_routed, branching: foxdqn.population.branching) and resume=
#: (foxdqn.population.resume) trains in a population.
SUPPORTED: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
)


def dotted_value(tc: "TrainConfig", dotted: str) -> Any:
    """The value of the dotted key ``dotted`` (``optim.lr``) of ``tc``."""
    return reduce(getattr, dotted.split("."), tc)


def batch_refusal(tc: "TrainConfig") -> str | None:
    """None when the population trainer supports ``tc``, else one short reason naming the first
    key (in :data:`SUPPORTED`'s order) whose value it does not support, e.g.
    ``"regime.enabled=true: a population supports false only"``."""
    for key, ok, supported in SUPPORTED:
        value = dotted_value(tc, key)
        if not ok(value):
            shown = json.dumps(value) if value is None or isinstance(value, bool) else str(value)
            return f"{key}={shown}: a population supports {supported} only"
    return None


def group_key(tc: "TrainConfig") -> str:
    """The canonical text (sorted-key JSON) of ``tc`` without :data:`MEMBER_KEYS`: two jobs may
    share a population exactly when their keys are equal. Values are those of the validated config
    (debug caps applied), so two settings the caps make equal are equal here."""
    values = to_plain(tc)
    for dotted in MEMBER_KEYS:
        *parents, leaf = dotted.split(".")
        reduce(lambda node, part: node[part], parents, values).pop(leaf)
    return json.dumps(values, sort_keys=True, separators=(",", ":"), default=str)


def plan(members: Sequence["Member"], max_members: int | None = None,
         cap: Callable[["TrainConfig", Any], int | None] | None = None) -> list[list["Member"]]:
    """The groups to train, in the order of their first job.

    Members with equal :func:`group_key` that continue from the same point (new, or resumed from
    their population checkpoints at the same env step: foxdqn.population.resume.resume_point) form
    one group, in job order, split into groups of at most
    ``max_members`` (the first ``max_members``, then the next, ...) and of at most what fits in
    the device's memory (``cap(tc, market)``: the launcher passes :func:`foxdqn.job.memory.memory_cap`;
    None: no memory cap). A member that
    :func:`batch_refusal` refuses, or whose checkpoint is not a resumable member's, is a group of its
    own. A group of one is trained alone (foxdqn.job.run.run_job: a population of one) unless it
    continues a population checkpoint, a larger group by the population trainer.

    Raises:
        ValueError: ``max_members`` below 1.
    """
    if max_members is not None and max_members < 1:
        raise ValueError(f"max_members={max_members} must be >= 1 (or None: no limit)")
    groups: list[list[Member]] = []
    filling: dict[str, list[Member]] = {}  # group key -> the group its next member joins
    limits: dict[str, int | None] = {}  # group key -> the most members of one of its groups
    from foxdqn.population.resume import CLASSIC, resume_point

    for member in members:
        point = resume_point(member.payload)
        if batch_refusal(member.tc) is not None or point == CLASSIC:
            groups.append([member])
            continue
        key = f"{point}|{group_key(member.tc)}"
        if key not in limits:
            caps = [n for n in (max_members, None if cap is None else cap(member.tc, member.market)) if n is not None]
            limits[key] = min(caps) if caps else None
        group, limit = filling.get(key), limits[key]
        if group is None or (limit is not None and len(group) >= limit):
            group = filling[key] = []
            groups.append(group)
        group.append(member)
    return groups
