"""One collect step and one gradient update of a population (device ops only, capturable).

A single run's steps with a member axis (a single run is a population of one): ε-greedy per member (its own ε; on the expected Q of a C51 or IQN head), one env step
of P × N envs, one replay row; then per member B samples (uniform, or by its own priorities with
its importance weights), its loss (the (Double) DQN loss with its Huber δ, the C51 cross-entropy on
its own support, the IQN quantile Huber loss with its κ and τ draws, or IQL's with its expectile
τ; plus CQL(H) with its α), its gradient clipped to its own norm, the guard's per-member skip,
Adam with its lr and ε, its target update (its Polyak τ or hard period), and with
``replay.name=per`` its |TD| written back as its priorities (not for a member the guard skipped).
With ``optim.accumulate`` = M > 1 each member's B rows are back-propagated as M micro-batches
(:func:`accumulate_member_gradients`: in one pass by default, or M), then clipped, checked and stepped once. With ``prune.enabled`` each member's weight
matrices are pruned by its own masks (:class:`foxdqn.population.pruning.MemberPruner`, the single
run's order: gradients masked before the clip, masks after Adam, the target after its update).
docs/design/population.md.

After backward an update runs the single run's three multi-tensor ops with ``members=P``, each
one kernel launch per 8 parameter tensors on CUDA whatever P is: the per-member gradient norm and
clip coefficient (:func:`foxdqn.ops.grad_norm.grad_norm_coefficient`; none where the online MLP
chain's weight-gradient kernel leaves them, :attr:`PopulationState.chain_norm`); then, after the guard, Adam
with the clip's multiply, the skip and the step counts (:meth:`foxdqn.population.optim.MemberAdam.step`,
:func:`foxdqn.ops.adam_step.adam_step_`) and the target update with its weight and the update
counter's ``+= 1`` (:func:`foxdqn.ops.target_lerp.target_lerp_`; Polyak averaging inside Adam's
launch where the targets follow its params, :func:`target_follow`). The ``.grad`` tensors are left
as backward wrote them (Adam multiplies by the clip coefficient as it reads them).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from foxdqn.device.scalars import device_vector
from foxdqn.envs.base import DRAW
from foxdqn.objectives.base import LossOutput
from foxdqn.ops.grad_norm import grad_norm_coefficient
from foxdqn.ops.replay_gather import stacked_pair
from foxdqn.ops.target_lerp import TargetFollow, target_lerp_
from foxdqn.population.objective import member_loss, member_taus
from foxdqn.population.state import PopulationState
from foxdqn.replay.buffer import Batch
from foxdqn.step.act import act

#: torch's engine call behind ``Tensor.backward`` (torch.autograd.backward's last step), where this
#: torch has it under that name
_ENGINE_BACKWARD = getattr(torch.autograd.graph, "_engine_run_backward", None)


def backward_seeded(loss: torch.Tensor, seed: torch.Tensor) -> None:
    """``loss.backward(seed)``: the members' losses ``[P]`` back-propagated with the seed ``[P]``
    (each member's dℓ/dℓ_p), gradients accumulated into the leaves. Called straight on torch's
    autograd engine, as ``torch.autograd.backward`` ends, without its Python-side check of a given
    seed's shape, which imports ``torch.fx.experimental.symbolic_shapes`` and with it sympy (about
    0.5 s on the first update of every process, 2-core CPU); that check is this function's
    (metadata only). Where the engine call is missing (another torch), ``loss.backward(seed)``.

    Raises:
        ValueError: seed and loss of other shapes or dtypes.
    """
    if seed.shape != loss.shape or seed.dtype != loss.dtype:
        raise ValueError(f"backward_seeded: the seed must have the loss's shape and dtype, got "
                         f"{tuple(seed.shape)} {seed.dtype} for {tuple(loss.shape)} {loss.dtype}")
    if _ENGINE_BACKWARD is None or not loss.requires_grad:  # torch raises its own error for the latter
        loss.backward(seed)
        return
    _ENGINE_BACKWARD((loss,), (seed,), False, False, (), allow_unreachable=True, accumulate_grad=True)


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


def collect_step(s: PopulationState) -> None:
    """N env steps per member: act ε-greedily on ``s.obs``, step, insert (rewards × each
    member's ``loss.reward_scale``), advance ``s.obs`` and ``s.env_steps`` by N.

    The ε-greedy op reads each member's schedule row (G = P groups of N envs) and its next 2·N
    uniforms: the N explore tests, then the N random actions, the values ``MemberRandom.uniform(N)``
    then ``MemberRandom.randint(A, N)`` drew (:mod:`foxdqn.ops.epsilon_greedy`)."""
    p, n, prm = s.members, s.cfg.env.num_envs, s.params
    with torch.no_grad():
        u = s.rng.uniform(2 * n).view(p, 2, n)
        penalty = None if s.switch is None else s.switch.acting()  # action.switch_margin: [P·N, A], unfused
        action = act(s.online, s.obs.view(p, n, -1), s.env_steps, prm.eps_start, prm.eps_end, s.eps_duration, u,
                     penalty=penalty)
    env_action = s.action_mode.to_env(action, s.env)
    extras = s.env.collect_hook.replay_extras(s.env, s.replay)  # regime.enabled: the state's volatility ratio
    out = s.env.step(env_action)
    store(s.replay, s.env.collect_hook, s.env, s.obs, action, out, prm.reward_scale, **extras)
    info = out.info  # the monitor's sums and `env_steps += N`: one kernel
    s.stats.add_step(env_action, out.reward, info["episode_done"], info["episode_return"], info["episode_length"],
                     s.env.collect_hook.trades(out), s.env_steps)


def draw_taus(s: PopulationState, rows: int, micro_batches: int = 1) -> tuple[torch.Tensor, torch.Tensor] | None:
    """With ``head.name=iqn``, each member's τ then τ' for one pass over ``rows`` rows of its own
    (:func:`foxdqn.population.objective.member_taus`; with ``micro_batches`` = M those of M
    consecutive micro-batches of rows/M rows); None for the other heads (no draw)."""
    h = s.cfg.head
    if h.name != "iqn":
        return None
    return member_taus(s.rng, rows, h.num_quantiles, h.num_target_quantiles, micro_batches)


def population_loss(s: PopulationState, batch, micro_batches: int = 1, taus=DRAW) -> LossOutput:
    """:class:`~foxdqn.objectives.base.LossOutput` (loss float32 ``[P]``, td_abs ``[P·B]``, online
    expected Q float32 ``[P, B, A]`` detached) of every member on ``batch`` (B rows each,
    member-major): :func:`foxdqn.population.objective.member_loss` with the members'
    hyperparameters; with ``head.name=iqn`` each member's τ and τ' (:func:`draw_taus`, drawn now
    unless ``taus`` holds the pair drawn ahead). On CUDA the target network's forward runs on
    ``s.target_branch`` beside the online forward (the same bits)."""
    h = s.cfg.head
    b = batch.reward.shape[0] // s.members
    if taus is DRAW:
        taus = draw_taus(s, b, micro_batches)
    penalty = None
    if s.switch is not None and s.value is None:  # branching: the exposure branch pays each exposure's
        penalty = s.switch.target_exposures(batch) if s.action_mode.name == "branching" else s.switch.target(batch)
    return member_loss(s.online, s.target, batch, s.members, s.params.huber_delta, h.double, value=s.value,
                       expectile=s.params.iql_expectile, cql_alpha=s.params.cql_alpha if s.cql else None,
                       penalty=penalty, weighted=s.cfg.replay.name == "per" or s.cfg.regime.enabled,
                       kappa=s.params.kappa, taus=taus, branch=s.target_branch)


def member_micro_batches(batch: Batch, members: int, m: int) -> list[Batch]:
    """Split a member-major batch of P·B rows (:meth:`MemberReplay.sample_members`) into ``m``
    batches of P·B/m rows, member-major: micro-batch k holds each member's rows k·B/m ..
    (k + 1)·B/m − 1 of its own B (B % m == 0, checked by the config as ``optim.accumulate``). A ``[P, B, D]``
    field (obs, next_obs) becomes ``[P, B/m, D]``, a ``[P·B, ...]`` one ``[P·B/m, ...]``; None stays
    None. Views for P = 1. For P > 1 a member's rows of a micro-batch are not adjacent: each
    ``[P·B, ...]`` field is copied once, micro-batch-major (``[m, P, B/m, ...]``), and the micro-batches
    are views of it; obs and next_obs, the halves of the replay's stacked pair ``[P, 2, B, D]``
    (:func:`foxdqn.ops.replay_gather.stacked_pair`), become the halves of one ``[P, 2, B/m, D]``
    copy per micro-batch, which the Double DQN forward reads without a concatenation (else one
    copy each). The values, layouts and hence the losses are those of copying every field of every
    micro-batch."""
    if m == 1:
        return [batch]
    b = batch.reward.shape[0] // members
    rows = b // m

    def part(f: torch.Tensor | None, k: int) -> torch.Tensor | None:
        if f is None:
            return None
        flat = f.shape[0] == members * b  # [P·B, ...]; else [P, B, D]
        rest = f.shape[1:] if flat else f.shape[2:]
        piece = f.view(members, b, *rest).narrow(1, k * rows, rows)
        return piece.reshape(members * rows, *rest) if flat else piece.contiguous()

    if members == 1:
        return [type(batch)(*(part(f, k) for f in batch)) for k in range(m)]

    def major(f: torch.Tensor | None) -> torch.Tensor | None:  # [m, P·B/m, ...]: one copy
        if f is None:
            return None
        rest = f.shape[1:]
        return f.view(members, m, rows, *rest).transpose(0, 1).contiguous().view(m, members * rows, *rest)

    fields = {name: major(f) for name, f in batch._asdict().items() if name not in ("obs", "next_obs")}
    pair = stacked_pair(batch.obs, batch.next_obs)
    out = []
    for k in range(m):
        if pair is not None:
            halves = pair.narrow(2, k * rows, rows).contiguous().unbind(1)  # [P, 2, B/m, D]: its halves
        else:
            halves = part(batch.obs, k), part(batch.next_obs, k)
        out.append(type(batch)(obs=halves[0], next_obs=halves[1],
                               **{name: None if f is None else f[k] for name, f in fields.items()}))
    return out


def accumulate_member_gradients(s: PopulationState, batch: Batch, taus: list | None = None) -> LossOutput:
    """Zero the gradients, back-propagate ``batch`` in ``optim.accumulate`` = M micro-batches
    (:func:`member_micro_batches`; each member's loss of a micro-batch back-propagated as ℓ_m / M,
    as a population of one does), and return the whole update's
    :class:`~foxdqn.objectives.base.LossOutput`: loss float32 ``[P]``, each member's (1/M) Σ_m ℓ_m;
    td_abs ``[P·B]`` and q_values ``[P, B, A]`` member-major, its micro-batches' in order. With
    ``debug.inject_nan_at_step`` a member's loss is poisoned in every micro-batch of that update, as
    a single run's.

    With ``optim.accumulate_one_pass`` (the default) the M micro-batches are one forward and one
    backward of all B rows: every objective's loss is a weighted mean of per-row terms
    (:func:`foxdqn.objectives.base.weighted_mean`), so (1/M) Σ_m ℓ_m is the mean over the B rows and
    its gradient is that of the M passes to float rounding; IQN reads the τ the M passes would
    draw (:func:`foxdqn.population.objective.member_taus`). docs/design/update.md#accumulation.
    ``taus``: each pass's τ pair drawn ahead (:attr:`UpdateDraws.taus`); None: each pass draws its own."""
    p, m = s.members, s.cfg.optim.accumulate
    s.optimizer.zero_grad(set_to_none=True)
    one_pass = m == 1 or s.cfg.optim.accumulate_one_pass
    passes = [batch] if one_pass else member_micro_batches(batch, p, m)
    seed = device_vector(s.device, p, 1.0 / len(passes))  # each member's dℓ/dℓ_p: no sum, no ones_like
    outs = []
    for k, mb in enumerate(passes):
        out = population_loss(s, mb, micro_batches=m if one_pass else 1, taus=DRAW if taus is None else taus[k])
        loss = out.loss
        if s.inject_nan:  # debug.inject_nan_at_step of some member: poison its loss at that update
            loss = loss + torch.where(s.updates == s.params.nan_at, float("nan"), 0.0)
        backward_seeded(loss, seed)
        outs.append(LossOutput(loss.detach(), out.td_abs, out.q_values))
    if len(outs) == 1:
        return outs[0]
    total = outs[0].loss
    for out in outs[1:]:  # a fixed order of additions per member, whatever P
        total = total + out.loss
    td_abs = torch.cat([out.td_abs.view(p, -1) for out in outs], dim=1).view(-1)
    return LossOutput(total / m, td_abs, torch.cat([out.q_values for out in outs], dim=1))


class UpdateDraws(NamedTuple):
    """An update's random draws, made ahead of it (:func:`draw_update`): its batch (the replay's
    sample, with any HER relabelling) and each backward pass's IQN (τ, τ') pair (None entries for
    the other heads): one entry, or ``optim.accumulate`` = M with ``accumulate_one_pass`` false."""

    batch: Batch
    taus: list


def draw_update(s: PopulationState) -> UpdateDraws:
    """Every random draw of one update, in the order :func:`update_step` makes them: the batch
    (``agent.batch_size`` rows per member, :meth:`MemberReplay.sample_members`), then the τ pair of
    each pass. After it the update reads nothing of the replay (uniform replay) and draws nothing."""
    b, m = s.cfg.agent.batch_size, s.cfg.optim.accumulate
    batch = s.replay.sample_members(b)
    if m == 1 or s.cfg.optim.accumulate_one_pass:
        return UpdateDraws(batch, [draw_taus(s, b, m)])
    return UpdateDraws(batch, [draw_taus(s, b // m) for _ in range(m)])


def update_step(s: PopulationState, drawn: UpdateDraws | None = None,
                join: Callable[[], None] | None = None) -> None:
    """One gradient update of every member (skipped per member by the guard). The guard's state
    reaches the host once per iteration (:func:`publish_guard`), not per update.

    ``drawn``: the update's draws made ahead (:func:`draw_update`); None: drawn now. ``join``:
    called once the gradients and their norms are queued, before anything reads the env counters or
    writes the weights (the guard, Adam): :func:`collect_beside_update` waits there for its
    branch.

    Raises:
        ValueError: a ``join`` without ``drawn`` (the draws would run beside the branch's, on the
            shared generator's counter and the replay it writes).
    """
    if join is not None and drawn is None:
        raise ValueError("update_step: a join needs the update's draws made before the fork (drawn=draw_update(s))")
    p = s.members
    drawn = draw_update(s) if drawn is None else drawn
    batch = drawn.batch
    chain = s.chain_norm
    if chain is not None:
        chain.backwards = 0
    out = accumulate_member_gradients(s, batch, drawn.taus)
    loss = out.loss
    if s.pruner is not None:  # prune.enabled: pruned entries get no gradient (norm, clip, Adam)
        s.pruner.mask_grads()
    # each member's clip_grad_norm_ norm and coefficient; Adam's kernel multiplies the grads by it
    # (over every trained parameter: Q's, and IQL's V after them, as a single run clips); where one
    # backward through the online MLP chain made every gradient, its weight-gradient kernel left them
    if chain is not None and chain.backwards == 1:
        grad_norm, clip = chain.total, chain.coef
    else:
        grad_norm, clip = grad_norm_coefficient([w.grad for w in s.optimizer.params], s.params.grad_clip, members=p)
    if join is not None:
        join()
    spike = None
    if s.inject_lr_spike:  # debug.inject_lr_spike_at_step of some member: its lr x 2**100 for that update
        spike = torch.where(s.updates == s.params.lr_spike_at, 2.0 ** 100, 1.0)
        s.optimizer.lr.mul_(spike)
    # guard.max_weight: Adam's step (with the spike) tried on a copy, each member's max |w| after it
    weight_max = None if s.weight_check is None else s.weight_check.run(clip)
    # the guard's skip flags, the update's monitor sums and the Q monitor's flags (guard.q_divergence): one
    # kernel (and the weight check's flags)
    skip = s.guard.check(loss.detach(), grad_norm, s.updates, s.env_steps, s.stats.update_columns(),
                         out.q_values, weight_max=weight_max)
    # the target update: w = τ or the hard copy's 1, times (1 − skip); then `updates += 1` (nothing
    # below reads the counter); Polyak's in Adam's launch where the targets follow its params as stored
    follow = target_follow(s)
    s.optimizer.step(skip, grad_scale=clip, follow=follow)
    if spike is not None:
        s.optimizer.lr.div_(spike)  # a power of two: every member's lr is restored exactly
    if s.pruner is not None:  # each member's masks (when due and not skipped), applied to its weights
        s.pruner.step(s.updates, skip)
    if follow is None:
        target_lerp_(list(s.target.parameters()), [w.detach() for w in s.online.parameters()], s.updates, skip,
                     s.params.tau, s.params.period, hard=s.cfg.target.update == "hard", advance=True, members=p)
    if s.pruner is not None:
        s.pruner.mask_target()
    s.replay.update_priorities(batch.index, out.td_abs, skip)  # PER: each member's |TD|, unless skipped


def target_follow(s: PopulationState) -> TargetFollow | None:
    """Polyak averaging as Adam's ``follow`` (:class:`~foxdqn.ops.target_lerp.TargetFollow`: one
    launch for both, the same bits, one read of the params fewer) where the targets follow Adam's
    params as it stores them: Adam trains exactly the online network (no IQL V after it) and no
    pruning masks come between the step and the target update. Else None: ``target_lerp_`` after
    the step, as for the hard copy, whose launch reads each member's weight once and skips its rows
    when no copy is due, where inside Adam every program would (cartpole_cleanrl at P = 512: 1.008
    of the separate launch's iteration; Polyak at P = 1 and 64: 0.98; docs/bench.md#pythons-bytecode-cache-and-levers-for-the-iteration)."""
    online = list(s.online.parameters())
    if s.cfg.target.update == "hard" or s.pruner is not None or len(online) != len(s.optimizer.params) \
            or any(a is not b for a, b in zip(online, s.optimizer.params)):
        return None
    return TargetFollow(list(s.target.parameters()), s.updates, s.params.tau, s.params.period, False)


def collect_beside_update(s: PopulationState, collect_steps: int, branch: torch.cuda.Stream | None) -> None:
    """One iteration of ``collect_steps`` = T collect steps and one update, the collect steps on
    ``branch`` beside the update (docs/design/hot_loop.md#the-collect-beside-the-update).

    The order of its effects, on the CPU and in a CUDA graph alike: the update's draws
    (:func:`draw_update`: the batch, from the replay as it stood before this iteration's T steps),
    then the T collect steps (:func:`collect_step`, acting with the weights before this update),
    then the rest of the update (:func:`update_step`). On CUDA the collect steps are forked onto
    ``branch`` after the draws and joined before the guard: they run beside the update's forward,
    backward and gradient norms, which read neither what they write (env state, observations, the
    replay's rows and counters, the step monitors, ``env_steps``, the shared generator's counter)
    nor write what they read (the online weights, which Adam writes after the join). Where the
    update reads the replay after sampling (``replay.name=per`` writes priorities of sampled slots
    that an insert may have overwritten), use :func:`collect_step` and :func:`update_step` in
    turn instead (:func:`iteration_steps` does).

    ``branch``: a second stream of ``s.device``, or None (the CPU): the same three parts in turn.
    """
    drawn = draw_update(s)
    if branch is None:
        for _ in range(collect_steps):
            collect_step(s)
        update_step(s, drawn)
        return
    current = torch.cuda.current_stream(branch.device)
    branch.wait_stream(current)  # fork after the draws (the batch gathered)
    joined = False

    def join() -> None:
        nonlocal joined
        current.wait_stream(branch)
        joined = True

    try:
        with torch.cuda.stream(branch):
            for _ in range(collect_steps):
                collect_step(s)
        update_step(s, drawn, join=join)
    finally:
        if not joined:
            join()


def collects_beside(cfg) -> bool:
    """Whether the full iteration of config ``cfg`` runs its collect steps beside its update
    (:func:`collect_beside_update`): ``agent.collect_beside_update`` on, one update per iteration,
    uniform replay and an env on the device; else the collect steps, then the updates."""
    a = cfg.agent
    return bool(a.collect_beside_update) and a.updates_per_iter == 1 and cfg.replay.name != "per" \
        and cfg.env.name != "gym"


def iteration_steps(s: PopulationState) -> dict:
    """The step functions of ``s``'s training iteration (:class:`~foxdqn.step.iteration.Iteration`'s
    keyword arguments): ``collect`` (:func:`collect_step`), ``update`` (:func:`update_step`),
    ``after_updates`` (:func:`publish_guard`) and ``beside``: :func:`collect_beside_update` where
    :func:`collects_beside`, else None."""
    return dict(collect=collect_step, update=update_step, after_updates=publish_guard,
                beside=collect_beside_update if collects_beside(s.cfg) else None)


def publish_guard(s: PopulationState) -> None:
    """Copy the guard's per-member state to its pinned host copy (once per iteration: the host reads
    it only between iterations; :meth:`foxdqn.population.member_guard.MemberGuard.publish`)."""
    s.guard.publish()
