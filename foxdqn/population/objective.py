"""The loss of P members at once: (Double) DQN with each member's Huber δ, C51 with each member's
support, IQN with each member's κ and τ draws, or IQL with its expectile τ and value network, plus
CQL(H) with its α.

The losses of :class:`foxdqn.objectives.dqn.DQNObjective` (van Hasselt et al. 2016, eq. 4; Huber
"error clipping" of Mnih et al. 2015), :class:`foxdqn.objectives.c51.C51Objective` (Bellemare,
Dabney & Munos 2017, Algorithm 1), :class:`foxdqn.objectives.iqn.IQNObjective` (Dabney et al.
2018, eq. 3), :class:`foxdqn.objectives.iql.IQLObjective` (Kostrikov, Nair & Levine 2021, eqs.
5–6) and :class:`foxdqn.objectives.cql.CQLObjective` (Kumar et al. 2020, eq. 4) computed on
``[P, B]`` batches, each member's from its own rows, networks and hyperparameters: member p's DQN
loss is ``mean_b w_b · Huber_δp(Q_p(s, a) − y)`` with ``y = R + discount · Q'_p(s', argmax_a
Q_p(s', a))`` (``max_a Q'_p(s', a)`` without Double DQN) and ``w_b`` its prioritized replay's
importance weights (Schaul et al. 2016, §3.4; 1 with uniform replay); its C51 loss ``mean_b w_b ·
CE_b`` with its target projected onto its own support; its IQN loss ``mean_b w_b · ρ_b`` with its
κ and its quantile fractions τ, τ' drawn from its own counter-based generator. The
members' losses are returned separately; their sum is back-propagated, which gives each member
exactly the gradient of its own loss (members share no parameters). With them comes each row's
unweighted |TD| (the single run's ``LossOutput.td_abs``), which prioritized replay writes back as
the member's priorities. The arithmetic is the single run's own
(:func:`foxdqn.objectives.dqn_forward.dqn_forward`, :func:`foxdqn.ops.dqn_td_loss.dqn_td_loss`,
:func:`foxdqn.objectives.c51.c51_cross_entropy`, :func:`foxdqn.objectives.iqn.iqn_quantile_loss`,
:func:`foxdqn.objectives.iql.iql_loss`, :func:`foxdqn.ops.cql_loss.cql_loss` (α times
:func:`foxdqn.objectives.cql.cql_regulariser`, in one kernel), each with a
leading member axis), not a copy.
"""
from __future__ import annotations

import torch

from foxdqn.device.side_stream import beside
from foxdqn.nn.branching import combine_branches, factor_branches
from foxdqn.nn.qnet import forward_hooked
from foxdqn.objectives.base import LossOutput, weighted_mean
from foxdqn.objectives.branching import branching_target
from foxdqn.objectives.c51 import c51_cross_entropy
from foxdqn.objectives.dqn_forward import dqn_forward
from foxdqn.objectives.iqn import iqn_quantile_loss
from foxdqn.objectives.iql import iql_loss
from foxdqn.ops.backend import fused_forward
from foxdqn.ops.branching_loss import MAX_BRANCHES as BRANCHING_LOSS_BRANCHES, branching_loss
from foxdqn.ops.cql_loss import cql_loss
from foxdqn.ops.c51_loss import MAX_ATOMS as C51_LOSS_MAX_ATOMS, C51Biases, c51_weighted_loss
from foxdqn.ops.dqn_td_loss import dqn_td_loss, huber_per_group
from foxdqn.ops.iqn_loss import iqn_loss
from foxdqn.ops.replay_gather import stacked_pair
from foxdqn.population.branching import MemberBranchingNetwork
from foxdqn.population.distributional import MemberC51Network, MemberIQNNetwork
from foxdqn.population.network import MemberQNetwork, MemberValueNetwork
from foxdqn.population.random import MemberRandom
from foxdqn.replay.buffer import Batch


def member_dqn_loss(online: MemberQNetwork, target: MemberQNetwork, batch: Batch, members: int,
                    huber_delta: torch.Tensor, double: bool, *, stack_double: bool = True,
                    penalty: torch.Tensor | None = None, weighted: bool = False,
                    cql_alpha: torch.Tensor | None = None,
                    branch: torch.cuda.Stream | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss float32 ``[P]``, td_abs float32 ``[P·B]``, online Q of s float32 ``[P, B, A]`` with its
    gradient) of a member-major batch of ``P·B`` rows (:meth:`MemberReplay.sample_members`);
    td_abs is each row's unweighted ``|Q(s, a) − y|``, detached (the PER priority signal).

    ``weighted``: apply ``batch.weight`` (float32 ``[P·B]``, prioritized replay's importance weights,
    :class:`~foxdqn.population.replay.MemberPrioritizedReplay`) to each row's Huber loss, as the
    single run's ``DQNObjective`` does; False (uniform replay, whose weights are ones): not read.

    The loss, its |TD| and its gradient are one kernel (:func:`foxdqn.ops.dqn_td_loss.dqn_td_loss`
    with a δ per member). The forwards are :func:`foxdqn.objectives.dqn_forward.dqn_forward`: with
    Double DQN and ``stack_double`` the online Q of s and of s' come from one forward of the
    ``[P, 2B, D]`` stacked batch (the replay's ``stacked`` pair when the batch is one, else a
    concatenation; the s' rows get no gradient), else from two forwards (s' under no_grad). The
    online network computes each row on its own, so both equal each other to float rounding (the
    GEMM shapes differ).

    ``penalty``: None, or float32 ``[P·B, A]``, the switch penalty of each s' (``action.switch_margin``,
    :meth:`foxdqn.population.switch.MemberSwitch.target`): the target's action is then
    ``argmax_a [Q_online(s', a) − penalty]`` (Double DQN; ``Q_target`` without it) through the
    kernel's explicit selection, from two online forwards; the value bootstrapped is the
    unpenalised ``Q_target(s', a*)``.

    ``cql_alpha``: None, or float32 ``[P]``: each member's α · CQL(H) (Kumar et al. 2020, eq. 4) added
    to its loss inside the same kernel (``dqn_td_loss``'s ``cql_alpha``), weighted as the Huber loss
    is (uniform replay's weights are ones).

    ``branch``: None, or a second CUDA stream on which the target network's forward runs beside
    the online forward (``dqn_forward``'s ``branch``: the same bits)."""
    weight = batch.weight if weighted else None
    if penalty is None:
        f = dqn_forward(online, target, batch.obs, batch.next_obs, double=double, stack=stack_double,
                        members=members, branch=branch)
        loss, td_abs = dqn_td_loss(f.q, f.q_next_target, batch.action, batch.reward, batch.discount, weight,
                                   q_next_online=f.q_next_online, double=double, huber_delta=huber_delta,
                                   cql_alpha=cql_alpha)
        return loss, td_abs, f.q_s
    f = dqn_forward(online, target, batch.obs, batch.next_obs, double=double, stack=False, members=members,
                    branch=branch)
    chooser = f.q_next_online if double else f.q_next_target
    loss, td_abs = dqn_td_loss(f.q, f.q_next_target, batch.action, batch.reward, batch.discount, weight,
                               q_next_online=chooser - penalty.view_as(chooser), double=True, huber_delta=huber_delta,
                               cql_alpha=cql_alpha)
    return loss, td_abs, f.q_s


def _member_view(batch: Batch, members: int) -> tuple[torch.Tensor, ...]:
    """(obs, next_obs ``[P, B, D]``, action, reward, discount ``[P, B]``) of a member-major batch."""
    d = batch.obs.shape[-1]
    return (batch.obs.reshape(members, -1, d), batch.next_obs.reshape(members, -1, d), batch.action.view(members, -1),
            batch.reward.view(members, -1), batch.discount.view(members, -1))


def member_c51_loss(online: MemberC51Network, target: MemberC51Network, batch: Batch, members: int, double: bool,
                    *, penalty: torch.Tensor | None = None, q_grad: bool = False,
                    branch: torch.cuda.Stream | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss float32 ``[P]``, td_abs float32 ``[P·B]``, expected Q of s float32 ``[P, B, A]`` with its
    gradient) of the C51 cross-entropy (Bellemare et al. 2017, Algorithm 1) of a member-major batch
    of ``P·B`` rows: member p's loss is ``Σ_b w_b · CE_b / B`` over its own rows (``batch.weight``:
    ones with uniform replay, the importance weights with prioritized replay, as the single run's
    ``C51Objective`` weighs), its target projected onto its own support
    (:func:`foxdqn.ops.c51_project.c51_project` with the members' ``[P]`` bounds); td_abs is each
    row's CE, detached (the single run's PER priority, Rainbow's). ``penalty``: None, or float32
    ``[P·B, A]``, the switch penalty of each s' (:meth:`foxdqn.population.switch.MemberSwitch.target`),
    subtracted from the Q that picks a*.

    Where the fused kernels run (:func:`foxdqn.ops.backend.fused_forward`: CUDA, or the CPU inside
    ``cpu_kernels``) and Q needs no gradient (``q_grad`` False: no CQL term), the selection of a*,
    the projection, the cross-entropy and the weighted mean are one forward and one backward kernel
    (:func:`foxdqn.ops.c51_loss.c51_weighted_loss`, the same loss to float32 rounding); on the CPU
    otherwise the ops of :func:`foxdqn.objectives.c51.c51_cross_entropy`, whose bits the tests compare.
    ``branch``: as :func:`member_dqn_loss`'s (the fused path's target forward beside the online one)."""
    if not q_grad and fused_forward(batch.obs) and online.atoms <= C51_LOSS_MAX_ATOMS:
        obs, next_obs, action, reward, discount = _member_view(batch, members)

        def online_parts():
            if double:  # the online network's s (grad) and s' rows, each layer's in one launch where it can
                return online.logit_parts_pair(obs, next_obs)
            # [P, B, A, K] logits (dueling: advantages, and V), grad; the heads' biases where not added
            value, logits, value_bias, bias = online.logit_parts(obs)
            return (value, logits), (None, None), (value_bias, bias)

        def target_parts():
            with torch.no_grad():
                return target.logit_parts(next_obs)

        (target_value, target_logits, target_value_bias, target_bias), \
            ((value, logits), (select_value, select_logits), (value_bias, bias)) = beside(branch, target_parts,
                                                                                       online_parts)
        if (bias is None) != (target_bias is None):
            raise RuntimeError("member_c51_loss: the online and target networks' heads left their biases differently")
        biases = None if bias is None else C51Biases(
            bias, target_bias.detach(), bias.detach() if double else None, value_bias,
            None if target_value_bias is None else target_value_bias.detach(),
            value_bias.detach() if double and value_bias is not None else None)
        p, b, a, k = logits.shape
        flat = lambda t: None if t is None else t.reshape(p * b, a, k)  # noqa: E731
        rows = lambda t: None if t is None else t.reshape(p * b, k)  # noqa: E731
        loss, ce, q = c51_weighted_loss(flat(logits), action.reshape(-1), flat(target_logits), flat(select_logits),
                                        None if penalty is None else penalty.reshape(p * b, a), reward.reshape(-1),
                                        discount.reshape(-1), online.support.view(p, k), online.v_min,
                                        online.v_max, batch.weight.reshape(-1), table=online.projection_table,
                                        value=rows(value), target_value=rows(target_value),
                                        select_value=rows(select_value), bias=biases)
        return loss, ce, q.view(p, b, a)
    ce, q = c51_cross_entropy(online, target, *_member_view(batch, members), double=double, penalty=penalty)
    return weighted_mean(ce, batch.weight), ce.detach().view(-1), q


def member_branching_loss(online: MemberBranchingNetwork, target: MemberBranchingNetwork, batch: Batch,
                          members: int, huber_delta: torch.Tensor, double: bool, *,
                          penalty: torch.Tensor | None = None, q_grad: bool = False,
                          branch: torch.cuda.Stream | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss float32 ``[P]``, td_abs float32 ``[P·B]``, joint Q of s float32 ``[P, B, Π n_d]``) of the
    BDQ loss (Tavakoli et al. 2018; :class:`foxdqn.objectives.branching.BranchingObjective`
    with a member axis) of a member-major batch of ``P·B`` rows: one target per row, the mean over
    branches of the target network's Q_d at the online network's per-branch argmax of s' (eq. 6;
    the target's own with ``double`` False, :func:`foxdqn.objectives.branching.branching_target`);
    member p's loss is ``Σ_b w_b · (1/D) Σ_d Huber_δp(Q_d(s, a_d) − y_b) / B`` over its own rows
    with its δ (``batch.weight``: ones with uniform replay, the importance weights with prioritized
    replay, as the single run's objective weighs), td_abs each row's ``(1/D) Σ_d |Q_d(s, a_d) − y|``.
    ``penalty``: None, or float32 ``[P·B, 5]``, the switch penalty of each exposure at s'
    (:meth:`foxdqn.population.switch.MemberSwitch.target_exposures`), paid by the exposure branch's
    selection.

    Where the fused kernels run (:func:`foxdqn.ops.backend.fused_forward`: CUDA, or the CPU inside
    :func:`foxdqn.ops.backend.cpu_kernels`) and ``q_grad`` is False, the joint Q is detached and the
    loss is :func:`foxdqn.ops.branching_loss.branching_loss` of the heads' raw outputs (one kernel
    for the dueling aggregation, the targets, the Huber terms, |td|, the joint Q and the
    gradients; with Double DQN and the replay's stacked pair, the online network's s and s' rows
    come from one forward of the pair, as :func:`member_dqn_loss`'s, the s' rows without
    gradient); elsewhere, and with ``q_grad`` (CQL's term reads the joint Q, with its gradient),
    the same arithmetic in torch ops. ``branch``: as :func:`member_dqn_loss`'s (the fused path's
    target forward beside the online one)."""
    obs, next_obs, action, reward, discount = _member_view(batch, members)
    if not q_grad and fused_forward(batch.obs) and len(online.branch_sizes) <= BRANCHING_LOSS_BRANCHES:
        pair = stacked_pair(batch.obs, batch.next_obs) if double else None

        def online_heads():
            if pair is not None:  # Double DQN: one online forward of the replay's [s; s'] pair, s' rows selecting
                return online.head_outputs(pair.view(members, -1, pair.shape[-1])), None
            heads = online.head_outputs(obs)  # grad
            with torch.no_grad():
                return heads, online.head_outputs(next_obs) if double else None

        def target_outputs():
            with torch.no_grad():
                return target.head_outputs(next_obs)

        target_heads, (heads, select) = beside(branch, target_outputs, online_heads)
        if pair is None and not double:
            select = target_heads
        loss, td_abs, joint = branching_loss(heads, target_heads, select, batch.action, batch.reward,
                                             batch.discount, batch.weight, huber_delta, penalty=penalty,
                                             stacked=pair is not None)
        return loss, td_abs, joint.view(members, -1, joint.shape[-1])
    q_branches = online.branch_q(obs)  # D × [P, B, n_d], grad
    actions = factor_branches(action, online.branch_sizes)  # D × [P, B]
    q_sa = torch.stack([q.gather(-1, a[..., None]).squeeze(-1) for q, a in zip(q_branches, actions)])  # [D, P, B]
    exposure_penalty = None if penalty is None else penalty.view(members, -1, penalty.shape[-1])
    y = branching_target(online, target, next_obs, reward, discount, double, exposure_penalty)  # [P, B]
    x = (q_sa - y).transpose(0, 1)  # [P, D, B]
    per_sample = huber_per_group(x, huber_delta).mean(dim=1)  # [P, B]
    td_abs = x.detach().abs().mean(dim=1).reshape(-1)
    return weighted_mean(per_sample, batch.weight), td_abs, combine_branches(q_branches)


def member_taus(rng: MemberRandom, batch_size: int, num_quantiles: int,
                num_target_quantiles: int, micro_batches: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(τ float32 ``[P, B, N]``, τ' float32 ``[P, B, N']``) in [0, 1): each member's quantile
    fractions for one IQN update, τ drawn first, then τ' (the order of a single run's
    :class:`foxdqn.objectives.iqn.IQNObjective`), from its own counter-based generator, so member
    p draws what a population of one of its seed draws.

    ``micro_batches`` = M > 1 (``optim.accumulate`` in one pass): the draws of M consecutive
    micro-batches of B/M rows each (τ then τ' of the first, then of the second, ...), joined along
    the rows, so one pass over B rows reads the τ that M passes would draw (B % M == 0)."""
    p = rng.num_members
    rows = batch_size // micro_batches
    n, nt = rows * num_quantiles, rows * num_target_quantiles
    # one launch: the generator is counter-based, so one draw of M (n + n') values is the 2M draws' values
    u = rng.uniform(micro_batches * (n + nt)).view(p, micro_batches, n + nt)
    return (u[:, :, :n].reshape(p, micro_batches * rows, num_quantiles),  # views where M = 1
            u[:, :, n:].reshape(p, micro_batches * rows, num_target_quantiles))


def member_iqn_loss(online: MemberIQNNetwork, target: MemberIQNNetwork, batch: Batch, members: int,
                    taus: torch.Tensor, target_taus: torch.Tensor, kappa: torch.Tensor, double: bool, *,
                    penalty: torch.Tensor | None = None, q_grad: bool = False,
                    branch: torch.cuda.Stream | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss float32 ``[P]``, td_abs float32 ``[P·B]``, expected Q of s float32 ``[P, B, A]``, with its
    gradient when ``q_grad``) of the IQN quantile Huber loss (Dabney et al. 2018, eq. 3) of a
    member-major batch of ``P·B`` rows: member p's loss is ``Σ_b w_b · ρ_b / B`` over its own rows
    with its κ_p (weights as :func:`member_c51_loss`); td_abs is each row's ρ, detached.

    ``taus``, ``target_taus``: float32 ``[P, B, N]`` and ``[P, B, N']`` (:func:`member_taus`).
    ``kappa``: float32 ``[P]`` (``head.kappa``; :func:`foxdqn.ops.quantile_huber_loss.quantile_huber_loss`
    takes a κ per member). ``penalty``: as :func:`member_c51_loss`.

    Where the fused kernels run (:func:`foxdqn.ops.backend.fused_forward`) and ``q_grad`` is False,
    everything after the heads' forwards (the taken action's quantiles, a*, the targets, ρ, the
    weighted mean and the gradient) is one kernel, :func:`foxdqn.ops.iqn_loss.iqn_loss`; elsewhere
    :func:`foxdqn.objectives.iqn.iqn_quantile_loss`'s torch ops (the same arithmetic). ``branch``:
    as :func:`member_dqn_loss`'s (the fused path's target forward beside the online one)."""
    if not q_grad and fused_forward(batch.obs):
        obs, next_obs = _member_view(batch, members)[:2]
        pair = double and not forward_hooked([online])  # online(next_obs) would run the hooks

        def online_parts():
            h, h_online_next = online.encoder_pair(obs, next_obs) if pair else (online.encoder(obs), None)
            z, bias = online.head_parts(h, taus)  # [P, B, N, A], grad; the output layer's bias where not added
            with torch.no_grad():  # as iqn_quantile_loss: the monitors' Q of s, then s' by both networks
                if pair:  # the monitors' Q of s and the selection's of s': one pass over both rows
                    both = online.policy_q(h, h_online_next)
                    return z, bias, both[:, :h.shape[1]], both[:, h.shape[1]:]
                return z, bias, online.policy_q(h), online(next_obs) if double else None

        def target_parts():
            with torch.no_grad():
                h_next = target.encoder(next_obs)
                select = target.policy_q(h_next) if not double else None
                return target.head_parts(h_next, target_taus), select

        ((z_next, target_bias), target_select), (z, bias, q, select) = beside(branch, target_parts, online_parts)
        if not double:
            select = target_select
        if (bias is None) != (target_bias is None):
            raise RuntimeError("member_iqn_loss: the online and target heads left their output biases differently")
        loss, rho = iqn_loss(z, z_next, select, taus, batch.action, batch.reward, batch.discount, batch.weight, kappa,
                             penalty=penalty, bias=bias, target_bias=target_bias)
        return loss, rho, q
    rho, q = iqn_quantile_loss(online, target, *_member_view(batch, members), taus, target_taus, kappa,
                               double=double, penalty=penalty, q_grad=q_grad)
    return weighted_mean(rho, batch.weight), rho.detach().view(-1), q


def member_loss(online: MemberQNetwork, target: MemberQNetwork, batch: Batch, members: int,
                huber_delta: torch.Tensor, double: bool, *, value: MemberValueNetwork | None = None,
                expectile: torch.Tensor | None = None, cql_alpha: torch.Tensor | None = None,
                penalty: torch.Tensor | None = None, weighted: bool = False, kappa: torch.Tensor | None = None,
                taus: tuple[torch.Tensor, torch.Tensor] | None = None,
                branch: torch.cuda.Stream | None = None) -> LossOutput:
    """:class:`~foxdqn.objectives.base.LossOutput` (loss float32 ``[P]``, td_abs float32 ``[P·B]``
    unweighted and detached, online (expected) Q of s float32 ``[P, B, A]`` detached) of the
    members' objective on a member-major batch of ``P·B`` rows: by the online network,
    :func:`member_branching_loss` (a :class:`~foxdqn.population.branching.MemberBranchingNetwork`),
    :func:`member_c51_loss` (a :class:`~foxdqn.population.distributional.MemberC51Network`),
    :func:`member_iqn_loss` (a :class:`~foxdqn.population.distributional.MemberIQNNetwork`, with
    ``kappa`` and ``taus``) or :func:`member_dqn_loss`; or with ``value``
    IQL's L_Q + L_V (Kostrikov et al. 2021, eqs. 5–6; :func:`foxdqn.objectives.iql.iql_loss` with
    each member's expectile τ and its own value network); plus, with ``cql_alpha``,
    ``α_p · Σ_b w_b (logsumexp_a Q_p(s_b, a) − Q_p(s_b, a_b)) / B`` (CQL(H), Kumar et al. 2020
    eq. 4, member p's own rows: inside :func:`~foxdqn.ops.dqn_td_loss.dqn_td_loss`'s kernel for a plain Q
    head, :func:`~foxdqn.ops.cql_loss.cql_loss` for the others). IQL and CQL
    weight their rows by ``batch.weight`` as their single-run objectives do (ones with uniform
    replay, the importance weights with prioritized replay), and so do BDQ, C51 and IQN; the DQN
    loss does with ``weighted``. td_abs is the single run's: DQN's ``|Q(s, a) − y|`` (CQL keeps it),
    BDQ's mean over branches of ``|Q_d(s, a_d) − y|``, C51's cross-entropy, IQN's ρ, IQL's
    ``|R + discount · V(s') − Q(s, a)|``.

    Member p's loss is its single run's objective loss (``DQNObjective``, ``BranchingObjective``,
    ``C51Objective``, ``IQNObjective`` or ``IQLObjective``, in ``CQLObjective`` when α > 0, with its δ, support, κ,
    τ and α) on its rows, to float rounding; a member with α = 0 adds 0 · its term (finite), i.e.
    its loss and gradients are those without CQL.

    Args:
        online, target, batch, members, huber_delta, double, penalty, weighted: as
            :func:`member_dqn_loss` (IQL reads neither δ, ``double``, ``penalty`` nor ``weighted``:
            its target V(s') has no argmax, and its rows are always weighted). A branching
            network's ``penalty`` is per exposure, ``[P·B, 5]`` (:func:`member_branching_loss`).
        value: None, or the members' IQL value networks (``objective.iql``): obs ``[P, B, D]`` →
            V ``[P, B]``, trained by the same optimizer (no target copy).
        expectile: with ``value``, float32 ``[P]``, each member's IQL expectile τ in (0, 1).
        cql_alpha: None (no member has ``objective.cql_alpha`` > 0), or float32 ``[P]``, each
            member's CQL α >= 0.
        kappa, taus: with an IQN network, float32 ``[P]`` (each member's κ) and (τ, τ') of
            :func:`member_taus`.
        branch: None, or a second CUDA stream: the target network's forward runs on it beside the
            online forward (:func:`member_dqn_loss`; C51, IQN and branching heads on their fused
            paths); IQL's value and target forwards and the torch-op paths run in turn.

    Raises:
        ValueError: ``value`` without ``expectile``; an IQN network without ``kappa`` and ``taus``.
    """
    if value is not None:
        if expectile is None:
            raise ValueError("member_loss: IQL (value given) needs each member's expectile τ, float32 [P]")
        loss, td_abs, q = iql_loss(online, target, value, batch, expectile, members=members)
        td_abs = td_abs.view(-1)  # |td|, written by the loss's kernel
    elif isinstance(online, MemberBranchingNetwork):
        loss, td_abs, q = member_branching_loss(online, target, batch, members, huber_delta, double, penalty=penalty,
                                                q_grad=cql_alpha is not None, branch=branch)
    elif isinstance(online, MemberC51Network):
        loss, td_abs, q = member_c51_loss(online, target, batch, members, double, penalty=penalty,
                                          q_grad=cql_alpha is not None, branch=branch)
    elif isinstance(online, MemberIQNNetwork):
        if kappa is None or taus is None:
            raise ValueError("member_loss: IQN needs each member's κ (float32 [P]) and its τ, τ' draws")
        loss, td_abs, q = member_iqn_loss(online, target, batch, members, *taus, kappa, double, penalty=penalty,
                                          q_grad=cql_alpha is not None, branch=branch)
    else:
        loss, td_abs, q = member_dqn_loss(online, target, batch, members, huber_delta, double, penalty=penalty,
                                          weighted=weighted, cql_alpha=cql_alpha, branch=branch)
        return LossOutput(loss, td_abs, q.detach())  # CQL(H), if any, inside the TD loss's kernel
    if cql_alpha is not None:  # α · CQL(H) and its gradient in one kernel (foxdqn/ops/cql_loss.py)
        loss = loss + cql_loss(q, batch.action, batch.weight, cql_alpha)
    return LossOutput(loss, td_abs, q.detach())
