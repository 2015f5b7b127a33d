"""Uniform replay of a population: one time-major ring of P × N env columns, sampled per member.

Storage is the classic :class:`~foxdqn.replay.buffer.ReplayBuffer` with ``num_envs = P·N``: all
members write one time row per collect step together, so member p's transitions are columns
``p·N .. (p+1)·N − 1``, and its own ring (capacity C, N envs) is exactly those columns of the
``C // N`` time rows. Member p's B samples are drawn from its own columns only, with its own
random draws (:class:`~foxdqn.population.random.MemberRandom`), and its n-step returns use its own
γ. A sampled batch holds P·B rows, member-major (rows ``p·B .. (p+1)·B − 1`` are member p's).
"""
from __future__ import annotations

import torch

from foxdqn.ops.replay_gather import replay_gather
from foxdqn.population.random import MemberRandom
from foxdqn.replay.buffer import Batch, ReplayBuffer


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
        ``[P·B, D]`` observations by one more kernel."""
        p = self.members
        u = self.rng.uniform(2 * batch_size).view(p, 2, batch_size)
        g = replay_gather(*self._ring(), uniforms=u, stacked=self.decoder is None)
        return self.decode(self._batch(g, self._ones(p * batch_size)))
