"""Replay of a population: one time-major ring of P × N env columns, sampled per member.

Storage is the classic :class:`~foxdqn.replay.buffer.ReplayBuffer` with ``num_envs = P·N``: all
members write one time row per collect step together, so member p's transitions are columns
``p·N .. (p+1)·N − 1``, and its own ring (capacity C, N envs) is exactly those columns of the
``C // N`` time rows. Member p's B samples are drawn from its own columns only, with its own
random draws (:class:`~foxdqn.population.random.MemberRandom`), and its n-step returns use its own
γ. A sampled batch holds P·B rows, member-major (rows ``p·B .. (p+1)·B − 1`` are member p's).

Uniform (:class:`MemberReplay`) or proportional prioritized (:class:`MemberPrioritizedReplay`,
``replay.name=per``): then member p has its own priority sum over its own slots ``t·N + e`` (the
slots a population of one would have), its own α, ε and β₀ (``replay.alpha``, ``replay.eps``,
``replay.beta_start``, member keys), draws its B slots from it with its own uniforms, gets
importance weights normalised by its own batch maximum, and writes its own |TD| back, unless its
own guard flag skipped the update (:class:`~foxdqn.replay.prioritized.Priorities` with a member
axis). With regime weights (``regime.enabled``) each stored transition carries its state's
volatility ratio (member p's envs' bars: its own resampled paths with ``data.augment``) and a
sampled row's weight is multiplied by its regime's weight (:mod:`foxdqn.replay.regime`). With
``replay.her`` each member's sampled rows are then relabelled with its own uniforms, γ and reward
scale (:class:`~foxdqn.population.her.MemberHindsightRelabeler`).
"""
from __future__ import annotations

import torch

from foxdqn.config.schema import TrainConfig, total_updates
from foxdqn.ops.per_rows import per_rows
from foxdqn.ops.regime_weight import regime_weight
from foxdqn.ops.replay_gather import replay_gather
from foxdqn.population.hparams import MemberParams
from foxdqn.population.random import MemberRandom
from foxdqn.replay.buffer import Batch, ReplayBuffer
from foxdqn.replay.prioritized import Priorities
from foxdqn.replay.regime import RegimeWeights


class MemberReplay(ReplayBuffer):
    """Uniform n-step replay of P members.

    Args:
        capacity: transitions kept per member (``replay.capacity``; rounded down to a multiple of N).
        envs_per_member: N.
        obs_dim: D, values per stored row (the observation, or the env's state code with a decoder).
        gamma: float32 ``[P]`` device tensor, each member's γ.
        rng: the members' random source.
        device, n_step, obs_dtype: as :class:`~foxdqn.replay.buffer.ReplayBuffer` (with
            :meth:`~foxdqn.replay.buffer.ReplayBuffer.set_decoder` sampled batches are decoded).

    Raises:
        ValueError: as :class:`~foxdqn.replay.buffer.ReplayBuffer` (capacity below (n + 1)·N).
    """

    def __init__(self, capacity: int, envs_per_member: int, obs_dim: int, gamma: torch.Tensor, rng: MemberRandom,
                 device: torch.device, n_step: int = 1, obs_dtype: torch.dtype = torch.float32):
        members = rng.num_members
        rows = capacity // envs_per_member
        if rows < n_step + 1:  # checked per member, before the base class counts all members' envs
            raise ValueError(f"MemberReplay: capacity={capacity} must hold at least (n_step + 1) * num_envs = "
                             f"{(n_step + 1) * envs_per_member} transitions")
        super().__init__(rows * envs_per_member * members, envs_per_member * members, obs_dim, device,
                         n_step, gamma=0.0, obs_dtype=obs_dtype)
        self.rng, self.members, self.envs_per_member = rng, members, envs_per_member
        powers = torch.arange(n_step + 1, device=device, dtype=torch.float64)
        table = gamma.to(torch.float64)[:, None] ** powers[None]  # [P, n + 1] γ_p^m
        self._member_gamma_m = table.to(torch.float32)

    def _gamma_table(self) -> torch.Tensor:
        """float32 ``[P, n + 1]``: member p's γ_p^0 .. γ_p^n (its envs are group p)."""
        return self._member_gamma_m

    def sample_members(self, batch_size: int) -> Batch:
        """B transitions per member, ``[P·B]`` rows member-major; weights are ones.

        One kernel after the members' draws (:func:`foxdqn.ops.replay_gather.replay_gather` with
        ``uniforms`` ``[P, 2, B]``, ``stacked``): obs and next_obs are ``[P, B, D]`` views of one
        ``[P, 2, B, D]`` tensor (the shape :func:`foxdqn.population.objective.member_dqn_loss`
        takes; for P = 1 ``[B, D]``). Stored state codes (:meth:`set_decoder`) are decoded into
        the same layout, the halves of one ``[P, 2, B, D]`` tensor, by one more kernel
        (:meth:`foxdqn.envs.trading.TradingEnv.decode_observations` with ``members``)."""
        p = self.members
        u = self.rng.uniform(2 * batch_size).view(p, 2, batch_size)
        g = replay_gather(*self._ring(), uniforms=u, stacked=self.decoder is None)
        return self._relabel(self.decode(self._batch(g, self._regime_weight(g.index, self._ones(p * batch_size))),
                                          members=p))

    def _regime_weight(self, index: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``weight`` (float32 ``[P·B]``) times the regime weight of each sampled row's stored
        volatility ratio (``regime.enabled``, :meth:`~foxdqn.replay.buffer.ReplayBuffer.set_regime`:
        ``w_b = w_b^PER · w_regime(b)``, the single run's :meth:`ReplayBuffer.sample`); ``weight``
        itself without regime weights. ``index``: int64 ``[P·B]``, the ring's flat rows."""
        if self.regime is None:
            return weight
        g = self.regime  # one kernel: the gather, the regime and the product
        return regime_weight(self.vol_ratio.view(-1), index, weight, g.low, g.high, g.weights)

    def _relabel(self, batch: Batch) -> Batch:
        """``batch`` with each member's hindsight goals (``replay.her``: a
        :class:`~foxdqn.population.her.MemberHindsightRelabeler` set by ``set_relabeler``; it draws
        each member's next 2·B uniforms), else unchanged."""
        return batch if self.relabeler is None else self.relabeler.relabel(self, batch)


class MemberPrioritizedReplay(MemberReplay):
    """Proportional prioritized n-step replay of P members (Schaul et al. 2016, §3.3, §3.4; module
    docstring): a :class:`MemberReplay` whose members sample by priority.

    Args (beyond :class:`MemberReplay`'s):
        alpha: float32 ``[P]`` device tensor, each member's α (kept, not copied).
        beta_start: float32 ``[P]``, each member's β₀, annealed to 1 over ``beta_updates``.
        beta_updates: updates over which β reaches 1 (the run's updates, shared).
        eps: float32 ``[P]``, each member's ε added to |TD|.
        updates: int64 0-d device counter of gradient updates (the population's).

    Attributes:
        priorities: the :class:`~foxdqn.replay.prioritized.Priorities` (member axis P, N envs each);
        per: its :class:`~foxdqn.ops.per_state.PERState` (``leaves`` ``[P, ...]``).
    """

    def __init__(self, capacity: int, envs_per_member: int, obs_dim: int, gamma: torch.Tensor, rng: MemberRandom,
                 device: torch.device, n_step: int = 1, obs_dtype: torch.dtype = torch.float32, *,
                 alpha: torch.Tensor, beta_start: torch.Tensor, beta_updates: int, eps: torch.Tensor,
                 updates: torch.Tensor):
        super().__init__(capacity, envs_per_member, obs_dim, gamma, rng, device, n_step, obs_dtype)
        self.priorities = Priorities(self, envs_per_member, members=self.members, alpha=alpha, beta_start=beta_start,
                                     beta_updates=beta_updates, eps=eps, updates=updates)
        self.per = self.priorities.per
        self._sampled: tuple[torch.Tensor, torch.Tensor] | None = None  # (batch.index, slots) of the last sample

    def _after_add(self, row: torch.Tensor) -> None:
        self.priorities.insert(row)

    def sample_members(self, batch_size: int) -> Batch:
        """B transitions per member by priority, ``[P·B]`` rows member-major, with their importance
        weights (float32 ``[P·B]``, each member's normalised by its own largest). Member p draws
        its next B uniforms (``MemberRandom.uniform(B)``), its slots ``t·N + e`` come from its own
        sum, and the ring's rows ``t·P·N + p·N + e`` are gathered by one kernel (stacked as
        :meth:`MemberReplay.sample_members`; ``batch.index`` holds those rows)."""
        slots, weight = self.priorities.draw(self.rng.uniform(batch_size))  # [P, B]
        # the n-step move-back and each member's column: one kernel (Priorities.sample's rule)
        rows, slots = per_rows(slots, self.ptr, self.rows, self.envs_per_member, self.n_step)
        g = replay_gather(*self._ring(), index=rows, stacked=self.decoder is None)
        batch = self._relabel(self.decode(self._batch(g, self._regime_weight(rows.view(-1), weight.view(-1))),
                                          members=self.members))
        self._sampled = (batch.index, slots)  # update_priorities reads these slots back for this index
        return batch

    def update_priorities(self, index: torch.Tensor, td_abs: torch.Tensor, skip: torch.Tensor) -> None:
        """Member p's priorities from its rows of ``index`` (int64 ``[P·B]``, the ring's rows of
        :meth:`sample_members`) and ``td_abs`` (float32 ``[P·B]``, unweighted |TD|); ``skip``:
        float32 ``[P]``, the guard's flags (a flagged member's sum is left bit-identical)."""
        n, p = self.envs_per_member, self.members
        if self._sampled is not None and index is self._sampled[0]:  # the batch just sampled: its slots
            slots = self._sampled[1]
        else:
            slots = (index // self.num_envs) * n + index % n  # column p·N + e → the member's env e
        self.priorities.update(slots.view(p, -1), td_abs.view(p, -1), skip)


def build_member_replay(cfg: TrainConfig, params: MemberParams, rng: MemberRandom, device: torch.device,
                        updates: torch.Tensor, row_dim: int, row_dtype: torch.dtype) -> MemberReplay:
    """The population's replay for member 0's (shared) ``cfg``: :class:`MemberPrioritizedReplay`
    for ``replay.name=per`` (each member's α, β₀, ε from ``params``; β reaches 1 at the run's last
    update, as a single run's), else :class:`MemberReplay`; ``row_dim`` values of ``row_dtype`` per
    stored state (:func:`foxdqn.step.build.replay_storage`). With ``regime.enabled`` (its keys are
    group keys) the replay stores each transition's volatility ratio and weights its samples by
    their regime (:class:`foxdqn.replay.regime.RegimeWeights`, as a single run's replay)."""
    r = cfg.replay
    args = (r.capacity, cfg.env.num_envs, row_dim, params.gamma, rng, device, r.n_step, row_dtype)
    if r.name == "per":
        replay = MemberPrioritizedReplay(*args, alpha=params.per_alpha, beta_start=params.per_beta_start,
                                         beta_updates=max(total_updates(cfg), 1), eps=params.per_eps, updates=updates)
    else:
        replay = MemberReplay(*args)
    if cfg.regime.enabled:
        g = cfg.regime
        replay.set_regime(RegimeWeights(g.low_threshold, g.high_threshold, g.weights, device))
    return replay
