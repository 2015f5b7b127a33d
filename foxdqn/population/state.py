"""Everything a population keeps on the device, built from its members' configs.

:func:`build_population` turns P validated configs that share a
:func:`~foxdqn.population.grouping.group_key` into a :class:`PopulationState`: one batched env of
P × N envs, one member network (online; :func:`member_network`: Q, dueling, C51, IQN or branching) and its
target (and with ``objective.iql`` a :class:`~foxdqn.population.network.MemberValueNetwork`), one
replay with a member axis (uniform or prioritized; with ``replay.her`` its relabeler),
:class:`~foxdqn.population.optim.MemberAdam`, the per-member hyperparameters, guard and accumulators,
and the counters (int64 0-d, per member: every member has done the same number of env steps and
updates).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from foxdqn.config.schema import TrainConfig
from foxdqn.ops.member_mlp_chain import ChainGradNorm
from foxdqn.nn.branching import BranchingNetwork
from foxdqn.nn.c51 import C51Network
from foxdqn.nn.iqn import IQNNetwork
from foxdqn.population.branching import MemberBranchingNetwork
from foxdqn.population.distributional import MemberC51Network, MemberIQNNetwork
from foxdqn.population.envs import build_member_env
from foxdqn.population.member_guard import MemberGuard
from foxdqn.population.hparams import MemberParams
from foxdqn.population.network import MemberQNetwork, MemberValueNetwork
from foxdqn.population.optim import MemberAdam
from foxdqn.population.pruning import MemberPruner
from foxdqn.population.random import MemberRandom
from foxdqn.population.replay import MemberReplay, build_member_replay
from foxdqn.population.stats import MemberStats
from foxdqn.population.weight_check import MemberWeightCheck
from foxdqn.step.build import attach_codec, build_action_mode, build_iql_value, build_network, replay_storage

ADAM_BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults, as a single run uses


@dataclass
class PopulationState:
    """The population's state. ``cfg`` is member 0's config (the shared keys), ``cfgs`` every
    member's; ``obs``: float32 ``[P·N, D]`` (uint8 for an env of uint8 observations: Atari frames),
    the observations to act on next; ``env_steps`` and
    ``updates``: int64 0-d, per member. ``inject_nan``: some member has ``debug.inject_nan_at_step``;
    ``inject_lr_spike``: some member has ``debug.inject_lr_spike_at_step``.
    ``generator`` is None (members draw from ``rng``). ``eps_duration``: float32 ``[P]``, the steps
    of each member's linear ε decay (:meth:`MemberParams.eps_duration`, made once). ``switch``:
    the members' switch penalty (``action.switch_margin`` > 0), else None. ``cql``: some member has
    ``objective.cql_alpha`` > 0: every member's loss adds its α (``params.cql_alpha``, 0 for some)
    times its CQL(H) term. ``value``: with ``objective.iql``, the members' IQL value networks (their
    parameters follow the Q network's in ``optimizer.params``, as a single run's ``extra_parameters``
    follow its Q network's), else None. ``weight_check``: with some member's ``guard.max_weight``,
    the members' trial Adam step (:class:`~foxdqn.population.weight_check.MemberWeightCheck`), else None.
    ``pruner``: with ``prune.enabled``, the members' weight masks
    (:class:`~foxdqn.population.pruning.MemberPruner`), else None. ``target_branch``: on CUDA a
    second stream for the target network's forward beside the online forward (the same bits), else None.
    :attr:`chain_norm`: where the online network's MLP-chain backward computes the update's whole
    gradient, the :class:`~foxdqn.ops.member_mlp_chain.ChainGradNorm` it leaves each member's
    gradient norm and clip coefficient in (``online.grad_norm``, :func:`chain_grad_norm`), else None."""

    cfg: TrainConfig
    cfgs: list[TrainConfig]
    device: torch.device
    rng: MemberRandom
    params: MemberParams
    env: object
    action_mode: object
    obs: torch.Tensor
    online: MemberQNetwork
    target: MemberQNetwork
    optimizer: MemberAdam
    replay: MemberReplay
    guard: MemberGuard
    stats: MemberStats
    env_steps: torch.Tensor
    updates: torch.Tensor
    eps_duration: torch.Tensor
    inject_nan: bool = False
    inject_lr_spike: bool = False
    generator: None = None
    switch: object = None  # action.switch_margin > 0: MemberSwitch (foxdqn.population.switch), else None
    cql: bool = False
    value: MemberValueNetwork | None = None  # objective.iql: the members' value networks V(s), else None
    weight_check: MemberWeightCheck | None = None  # some member's guard.max_weight: the trial step, else None
    pruner: MemberPruner | None = None  # prune.enabled: the members' weight masks, else None
    #: CUDA: the stream the target network's forward runs on, beside the online forward
    #: (:func:`foxdqn.population.objective.member_loss`'s ``branch``); None on the CPU
    target_branch: torch.cuda.Stream | None = None

    @property
    def chain_norm(self) -> ChainGradNorm | None:
        """The online network's ``grad_norm`` (None where it has none): the one place it is kept."""
        return getattr(self.online, "grad_norm", None)

    @property
    def members(self) -> int:
        return len(self.cfgs)


def initial_networks(cfgs: list[TrainConfig], env, num_actions: int,
                     device: torch.device) -> tuple[list[torch.nn.Module], list[torch.nn.Module]]:
    """(Q networks, IQL value networks) of the members: member p's classic networks initialised as
    a single run of its seed initialises them (the CPU generator seeded with ``seed``, then
    :func:`foxdqn.step.build.build_network` and, with ``objective.iql``, right after it
    :func:`foxdqn.step.build.build_iql_value`, both built on the CPU and moved to ``device``; the
    value list is empty without IQL). The CPU generator alone: ``torch.manual_seed`` would also
    queue a seeding of every accelerator backend not yet initialised (XPU, MTIA, and CUDA before
    its first call), each with a formatted stack trace, about 1 ms a member."""
    nets, values = [], []
    for c in cfgs:
        torch.default_generator.manual_seed(c.seed)
        nets.append(build_network(c, env, num_actions).to(device))
        if c.objective.iql:
            values.append(build_iql_value(c, env).to(device))
    return nets, values


def member_network(nets: list[torch.nn.Module], activation: str) -> MemberQNetwork:
    """The P classic networks ``nets`` stacked into one member network: a
    :class:`~foxdqn.population.branching.MemberBranchingNetwork` for branching networks
    (``action.mode=branching``), a :class:`~foxdqn.population.distributional.MemberC51Network` for
    C51 networks, a :class:`~foxdqn.population.distributional.MemberIQNNetwork` for IQN ones, else a
    :class:`~foxdqn.population.network.MemberQNetwork` (Q or dueling head)."""
    if isinstance(nets[0], BranchingNetwork):
        return MemberBranchingNetwork.from_networks(nets, activation)
    if isinstance(nets[0], C51Network):
        return MemberC51Network.from_networks(nets, activation)
    if isinstance(nets[0], IQNNetwork):
        return MemberIQNNetwork.from_networks(nets, activation)
    return MemberQNetwork.from_networks(nets, activation)


def chain_grad_norm(cfg: TrainConfig, online: MemberQNetwork, trainable: list[torch.Tensor],
                    max_norm: torch.Tensor) -> None:
    """Attach a :class:`~foxdqn.ops.member_mlp_chain.ChainGradNorm` of ``max_norm`` (float32 ``[P]``,
    ``optim.grad_clip``) to ``online`` as its ``grad_norm``, where a backward through its
    MLP chain can be the update's whole gradient: a plain Q head on an MLP of ReLUs (the layers
    :func:`~foxdqn.ops.member_mlp_chain.member_mlp_chain` computes, where it runs), trained alone
    (``trainable`` is its parameters: no IQL V), no pruning masks between the gradients and their
    norm, one backward per update (``optim.accumulate`` 1 or ``accumulate_one_pass``); else nothing.
    :func:`foxdqn.population.step.update_step` still reads it only after exactly one backward wrote it."""
    if type(online) is not MemberQNetwork or online.dueling or online.member_encoder is not None \
            or type(online.act) is not torch.nn.ReLU or cfg.prune.enabled:
        return
    if [id(t) for t in trainable] != [id(t) for t in online.parameters()]:
        return
    if cfg.optim.accumulate != 1 and not cfg.optim.accumulate_one_pass:
        return
    online.grad_norm = ChainGradNorm(max_norm, online.num_members)


def build_population(cfgs: list[TrainConfig], market, device: torch.device) -> PopulationState:
    """The state of the population ``cfgs`` (one config per member, validated, sharing their
    group key) on ``device``; ``market``: foxdqn.data.MarketData for trading, else None."""
    cfg = cfgs[0]
    if device.type == "cuda":
        torch.set_float32_matmul_precision(str(cfg.matmul_precision))
    elif cfg.cpu_threads > 0:
        torch.set_num_threads(cfg.cpu_threads)
    rng = MemberRandom([c.seed for c in cfgs], device)
    params = MemberParams.from_configs(cfgs, device)
    env = build_member_env(cfgs, market, rng, device)
    mode = build_action_mode(cfg, env)
    nets, values = initial_networks(cfgs, env, mode.num_actions, device)
    online = member_network(nets, str(cfg.model.activation))
    target = copy.deepcopy(online).requires_grad_(False)
    # IQL's V: trained with Q by one Adam (a single run's extra_parameters), no target copy
    value = MemberValueNetwork.from_networks(values, str(cfg.model.activation)) if values else None
    trainable = list(online.parameters()) + ([] if value is None else list(value.parameters()))
    # guard.keep_last_good: a halted member keeps its weights from before its last applied update
    optimizer = MemberAdam(trainable, params.lr, params.adam_eps, ADAM_BETAS, keep_last_good=cfg.guard.keep_last_good)
    zero = dict(dtype=torch.int64, device=device)
    updates = torch.zeros((), **zero)  # PER's β reads it
    codec, row_dim, row_dtype = replay_storage(env)  # trading: state codes, decoded at sample time
    replay = build_member_replay(cfg, params, rng, device, updates, row_dim, row_dtype)
    attach_codec(replay, env, codec)
    if cfg.replay.her:  # each member relabels its own rows with its own γ, reward scale and uniforms
        from foxdqn.population.her import MemberHindsightRelabeler

        replay.set_relabeler(MemberHindsightRelabeler(env, cfg.replay.her_k, params.gamma, params.reward_scale, rng))
    # images (a Gymnasium env's uint8 frames) stay 1 byte per value, as a single run keeps them
    obs = env.reset_all().to(torch.uint8 if env.obs_dtype == torch.uint8 else torch.float32).clone()
    switch = None
    if cfg.action.switch_margin > 0:  # the greedy choice's switch penalty, each member's reward scale
        from foxdqn.population.switch import MemberSwitch

        switch = MemberSwitch(cfg.action.switch_margin, params.reward_scale, mode.name, env, device)
    checks_weights = any(c.guard.max_weight for c in cfgs)  # guard.max_weight: Adam's step is tried on a copy first
    collapse = None
    if any(c.guard.collapse_multiplier for c in cfgs):  # the collapse check: lr x multiplier, as a single run rounds it
        threshold = torch.tensor([c.optim.lr * c.guard.collapse_multiplier for c in cfgs], dtype=torch.float32,
                                 device=device)
        collapse = (threshold, params.warmup_updates, params.collapse_patience)
    # each member's Q-monitor divergence flag (guard.q_divergence): a halt, or with early_stop.on_q_divergence a stop
    guard = MemberGuard(params.loss_clip, device, max_weight=params.max_weight if checks_weights else None,
                        collapse=collapse, q_divergence=params.q_divergence)
    chain_grad_norm(cfg, online, trainable, params.grad_clip)
    pruner = None
    if cfg.prune.enabled:  # the prune.* keys are group keys: one schedule, each member's own masks
        g = cfg.prune
        pruner = MemberPruner(online, target, g.initial_sparsity, g.final_sparsity, g.start_update, g.end_update,
                              g.frequency, device)
    return PopulationState(
        cfg=cfg, cfgs=list(cfgs), device=device, rng=rng, params=params, env=env, action_mode=mode, obs=obs,
        online=online, target=target, optimizer=optimizer, replay=replay, guard=guard,
        stats=MemberStats(len(cfgs), cfg.env.num_envs, device, env.num_actions), env_steps=torch.zeros((), **zero),
        updates=updates, eps_duration=params.eps_duration(cfg.agent.total_env_steps),
        inject_nan=any(c.debug.inject_nan_at_step is not None for c in cfgs),
        inject_lr_spike=any(c.debug.inject_lr_spike_at_step is not None for c in cfgs), switch=switch,
        cql=any(c.objective.cql_alpha > 0 for c in cfgs), value=value,
        weight_check=MemberWeightCheck(optimizer) if checks_weights else None, pruner=pruner,
        target_branch=torch.cuda.Stream(device) if device.type == "cuda" else None)
