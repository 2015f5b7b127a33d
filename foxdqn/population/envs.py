"""The training environments of a population: P × N envs in one batched env.

Member p owns envs ``p·N .. (p+1)·N − 1`` of a classic env built for P·N envs
(:class:`~foxdqn.envs.cartpole.CartPoleEnv`, :class:`~foxdqn.envs.trading.TradingEnv`); envs
never interact, so only the randomness changes: each env class draws all its randomness in one
method (CartPole's reset uniforms ``_uniform``, the trading env's episode starts ``_starts``), and
the member classes below take those draws from :class:`~foxdqn.population.random.MemberRandom`,
so member p's envs see the same draws whatever P is.
"""
from __future__ import annotations

import torch

from foxdqn.config.schema import TrainConfig
from foxdqn.envs.cartpole import CartPoleEnv
from foxdqn.envs.trading import TradingEnv
from foxdqn.population.random import MemberRandom
from foxdqn.step.build import ENV_DTYPES


class MemberCartPoleEnv(CartPoleEnv):
    """CartPole with P × N envs; reset uniforms from ``rng`` (``[P, 4N]`` float32 per step)."""

    def __init__(self, rng: MemberRandom, envs_per_member: int, device: torch.device):
        super().__init__(rng.num_members * envs_per_member, device, torch.Generator(device=device))
        self.rng, self.envs_per_member = rng, envs_per_member

    def _uniform(self) -> torch.Tensor:
        u = self.rng.uniform(4 * self.envs_per_member)
        return u.view(self.num_envs, 4).to(torch.float64)


class MemberTradingEnv(TradingEnv):
    """Trading env with P × N envs on one market split; episode starts from ``rng``."""

    def __init__(self, rng: MemberRandom, envs_per_member: int, market, cfg: TrainConfig, device: torch.device):
        e = cfg.env
        super().__init__(market, "train", num_envs=rng.num_members * envs_per_member, window=e.window,
                         episode_length=e.episode_length, execution=e.execution, device=device,
                         dtype=ENV_DTYPES[e.dtype], generator=torch.Generator(device=device), eval_mode=False)
        self.rng, self.envs_per_member = rng, envs_per_member

    def _starts(self) -> torch.Tensor:
        if self.start_high == self.first_valid:
            return super()._starts()
        span = self.start_high + 1 - self.first_valid
        return self.first_valid + self.rng.randint(span, self.envs_per_member).view(self.num_envs)


def build_member_env(cfg: TrainConfig, market, rng: MemberRandom, device: torch.device):
    """The population's training env: ``env.num_envs`` envs per member.

    Raises:
        ValueError: ``env.name`` is not cartpole or trading (grouping.POPULATION_ENVS).
    """
    if cfg.env.name == "cartpole":
        return MemberCartPoleEnv(rng, cfg.env.num_envs, device)
    if cfg.env.name == "trading":
        return MemberTradingEnv(rng, cfg.env.num_envs, market, cfg, device)
    raise ValueError(f"build_member_env: env.name={cfg.env.name!r}; the population path runs cartpole or trading "
                     "(foxdqn.population.grouping.POPULATION_ENVS)")
