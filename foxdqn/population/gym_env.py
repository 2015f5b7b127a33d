"""A population's Gymnasium envs (``env.name=gym``): P × N host envs in one vector env.

Member p owns envs ``p·N .. (p+1)·N − 1`` of one :class:`foxdqn.envs.gym_adapter.GymVectorEnv`
of P·N envs (Atari preprocessing, frame stack and uint8 frames as a single run's, that module).
A Gymnasium env draws its randomness (initial states, Atari's no-op starts) from the seed of its
first reset, so member p's envs see the same draws whatever P is when their seeds depend on p's
seed only: env i of member p is seeded ``gym_seed(seed_p) + i``, where :func:`gym_seed` is the
value a single run of that seed on the CPU draws for its vector env (foxdqn.step.build.build_env:
the first ``torch.randint(0, 2**31 − 1)`` of a CPU generator seeded with it). A population of one
therefore steps the envs a CPU single run of its seed steps, and member p of P the same ones
(docs/design/population.md, contract 3). The envs step on the host: the population's iteration
runs its collect steps eagerly and captures its updates only
(:class:`foxdqn.step.iteration.HostEnvIteration`).
"""
from __future__ import annotations

from typing import Sequence

import torch

from foxdqn.envs.gym_adapter import GymVectorEnv

#: The largest value :func:`gym_seed` returns is ``GYM_SEED_HIGH − 1`` (a single run's range).
GYM_SEED_HIGH = 2**31 - 1


def gym_seed(seed: int) -> int:
    """The first seed of the vector env a single run of ``seed`` builds on the CPU: the first
    ``torch.randint(0, 2**31 − 1, (1,))`` of a CPU ``torch.Generator`` seeded with ``seed``, an int
    in ``[0, 2**31 − 1)``."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed))
    return int(torch.randint(0, GYM_SEED_HIGH, (1,), generator=gen))


def member_gym_seeds(seeds: Sequence[int], envs_per_member: int) -> list[int]:
    """The first-reset seed of each of the P·N envs, member-major: env i of member p gets
    ``gym_seed(seeds[p]) + i`` (ints, ``len(seeds) · envs_per_member`` of them)."""
    return [gym_seed(s) + i for s in seeds for i in range(envs_per_member)]


class MemberGymEnv(GymVectorEnv):
    """P × N copies of Gymnasium env ``e.id`` (:class:`~foxdqn.envs.gym_adapter.GymVectorEnv`),
    member p's N envs seeded from its own seed (:func:`member_gym_seeds`).

    Args:
        e: :class:`foxdqn.config.schema.EnvConfig` (``id``, ``vectorization``, Atari keys).
        seeds: the members' seeds (P ints): ``seed`` of each job, or ``seed + offset`` for the
            greedy episodes of validation and evaluation (:mod:`foxdqn.population.evaluate`).
        envs_per_member: N ≥ 1.
        device: the training device.
        train: a training env (Atari: life-loss terminals when configured, clipped rewards) or an
            evaluation env.

    Raises:
        ConfigError: what :class:`~foxdqn.envs.gym_adapter.GymVectorEnv` raises (unknown ``env.id``,
            a non-Discrete action space, a non-Box observation space).

    Attributes:
        envs_per_member: N.  num_members: P.  generator: None (the envs draw from their seeds, on
            the host; nothing to register with a CUDA graph).
    """

    generator = None

    def __init__(self, e, seeds: Sequence[int], envs_per_member: int, device: torch.device, train: bool = True):
        super().__init__(e, len(seeds) * envs_per_member, device, member_gym_seeds(seeds, envs_per_member), train=train)
        self.envs_per_member, self.num_members = envs_per_member, len(seeds)
