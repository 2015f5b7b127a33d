"""The training environments of a population: P × N envs in one batched env.

Member p owns envs ``p·N .. (p+1)·N − 1`` of a classic env built for P·N envs
(:class:`~foxdqn.envs.cartpole.CartPoleEnv`, :class:`~foxdqn.envs.trading.TradingEnv`,
:class:`~foxdqn.envs.bitflip.BitFlipEnv`); envs never interact, so only the randomness changes:
each env class draws all its randomness in one method (CartPole's reset uniforms ``_uniform``, the
trading env's episode starts ``_starts``, bit flipping's start states and goals ``_draw_starts``),
and the member classes below take those draws from
:class:`~foxdqn.population.random.MemberRandom`, so member p's envs see the same draws whatever P
is. Gymnasium envs (``env.name=gym``) step on the host and draw from their seeds:
:mod:`foxdqn.population.gym_env`. With ``data.augment`` the trading env walks P members' resampled paths, each member's drawn from
its own seed (:func:`member_paths`).
"""
from __future__ import annotations

import torch

from foxdqn.config.schema import TrainConfig
from foxdqn.envs.base import StepOut
from foxdqn.envs.bitflip import BitFlipEnv
from foxdqn.envs.cartpole import CartPoleEnv
from foxdqn.envs.trading import TradingEnv
from foxdqn.ops.bitflip_step import bitflip_step, start_and_goal
from foxdqn.population.random import MemberRandom
from foxdqn.step.build import ENV_DTYPES


class MemberCartPoleEnv(CartPoleEnv):
    """CartPole with P × N envs; reset uniforms from ``rng`` (``[P, 4N]`` per step, drawn as the
    float64 the step takes: one kernel on CUDA)."""

    def __init__(self, rng: MemberRandom, envs_per_member: int, device: torch.device):
        super().__init__(rng.num_members * envs_per_member, device, torch.Generator(device=device))
        self.rng, self.envs_per_member = rng, envs_per_member

    def _uniform(self) -> torch.Tensor:
        return self.rng.uniform(4 * self.envs_per_member, torch.float64).view(self.num_envs, 4)


#: Bit flipping's goal masks: at least this many random bits of candidate masks per reset
#: (:class:`MemberBitFlipEnv`), so that no candidate is non-zero with probability at most 2^-64.
GOAL_MASK_BITS = 64


class MemberBitFlipEnv(BitFlipEnv):
    """Bit flipping with P × N envs of n bits; start states and goals from ``rng``.

    Per draw (every reset and every step, as the classic env draws) member p takes its next
    ``(1 + K)·n·N`` uniforms in one kernel (``[P, (1 + K)·n·N]``, each env's ``(1 + K)·n`` in a row),
    ``K = ceil(64 / n)``, each a fair bit (``u < 0.5``: the uniforms have 24 random bits): the
    first n the start state, then K candidate goal masks; the goal is ``state XOR`` the first
    non-zero candidate, uniform over the ``2^n − 1`` non-zero masks like the classic env's goal
    (:class:`~foxdqn.envs.bitflip.BitFlipEnv` draws one code of ``[1, 2^n)``, which
    :meth:`MemberRandom.randint` cannot: it takes at most 2^24 values, with a bias near that).
    Where all K candidates are zero (probability ``2^-nK ≤ 2^-64``) the mask is bit 0."""

    def __init__(self, rng: MemberRandom, envs_per_member: int, n_bits: int, device: torch.device):
        super().__init__(rng.num_members * envs_per_member, n_bits, device, torch.Generator(device=device))
        self.rng, self.envs_per_member = rng, envs_per_member
        self.candidates = -(-GOAL_MASK_BITS // n_bits)  # K

    def _uniforms(self) -> torch.Tensor:
        """The next reset draw: float32 ``[P·N, (1 + K)·n]``, env i's row its start bits, then K masks."""
        return self.rng.uniform((1 + self.candidates) * self.n_bits * self.envs_per_member).view(self.num_envs, -1)

    def _draw_starts(self) -> tuple[torch.Tensor, torch.Tensor]:
        return start_and_goal(self._uniforms(), self.n_bits)

    def step(self, action: torch.Tensor) -> StepOut:
        """:meth:`BitFlipEnv.step <foxdqn.envs.bitflip.BitFlipEnv.step>` with this class's draws:
        the members' uniforms (one kernel), then the step, the start draw and the auto-reset as one
        kernel where the fused kernels run (:func:`foxdqn.ops.bitflip_step.bitflip_step`; its torch
        reference, the classic env's ops, elsewhere: the same bits)."""
        out = bitflip_step(self.state, self.goal, self.steps, action, self._uniforms(), self.dtype)
        info = {"episode_return": out.episode_return, "episode_done": out.done,
                "episode_length": out.episode_length, "is_success": out.is_success}
        return StepOut(next_obs=out.next_obs, reward=out.reward, terminated=out.terminated,
                       truncated=out.truncated, obs=out.obs, info=info)


class MemberTradingEnv(TradingEnv):
    """Trading env with P × N envs on one market split; episode starts from ``rng``.

    With resampled training paths (``data.augment``, ``market`` the members' paths laid end to end:
    member p's ``paths_per_member`` paths first at path ``p·paths_per_member``,
    :func:`member_paths`) member p's envs start only on its own paths: each start draws a path of
    the member (``randint(paths_per_member, N)``) then a start inside it (``randint(starts, N)``),
    2·N values per member per draw, made even where a member has one start (so the stream's
    counter moves by the same amount whatever P and the path sizes are)."""

    def __init__(self, rng: MemberRandom, envs_per_member: int, market, cfg: TrainConfig, device: torch.device,
                 paths_per_member: int | None = None):
        e = cfg.env
        super().__init__(market, "train", num_envs=rng.num_members * envs_per_member, window=e.window,
                         episode_length=e.episode_length, execution=e.execution, device=device,
                         dtype=ENV_DTYPES[e.dtype], generator=torch.Generator(device=device), eval_mode=False)
        self.rng, self.envs_per_member, self.paths_per_member = rng, envs_per_member, paths_per_member
        if self.path_bars is not None:
            if paths_per_member is None or paths_per_member * rng.num_members != self.num_paths:
                raise ValueError(f"MemberTradingEnv: {self.num_paths} training paths are not paths_per_member="
                                 f"{paths_per_member} for each of {rng.num_members} members")
            first = torch.arange(rng.num_members, device=device) * paths_per_member  # member p's first path
            self._first_path = first.repeat_interleave(envs_per_member)

    def _draw_starts(self) -> torch.Tensor | None:
        if self.path_bars is not None:  # every member draws, whatever its number of starts (class docstring)
            return self._starts()
        return super()._draw_starts()

    def _starts(self) -> torch.Tensor:
        if self.path_bars is not None:
            n = self.envs_per_member
            path = self._first_path + self.rng.randint(self.paths_per_member, n).view(self.num_envs)
            return self._path_start(path, self.rng.randint(self._path_starts, n).view(self.num_envs))
        if self.start_high == self.first_valid:
            return super()._starts()
        span = self.start_high + 1 - self.first_valid
        return self.rng.randint(span, self.envs_per_member, low=self.first_valid).view(self.num_envs)


def member_paths(cfgs: list[TrainConfig], market, device: torch.device):
    """The members' resampled training paths (``data.augment``), laid end to end in member order:
    member p's are the paths a single run of its seed and its ``data.augment.block_length`` trains
    on (:func:`foxdqn.data.augment.source_bars`, drawn from its own seed on the CPU, built together by
    :func:`foxdqn.data.augment.paths_of`), ``P · data.augment.paths`` paths in all."""
    from foxdqn.data.augment import paths_of, source_bars

    source = torch.cat([source_bars(market, c.data.augment, c.seed) for c in cfgs])
    return paths_of(market, cfgs[0].data, source, device)


def build_member_env(cfgs: list[TrainConfig], market, rng: MemberRandom, device: torch.device,
                     envs_per_member: int | None = None, seed_offset: int = 0):
    """The population's training env: ``env.num_envs`` envs per member (``envs_per_member`` if
    given: the greedy episodes of an episodic env, foxdqn.population.evaluate); a trading env with
    ``data.augment`` walks each member's own resampled paths (:func:`member_paths`). A Gymnasium
    env (``env.name=gym``, :class:`foxdqn.population.gym_env.MemberGymEnv`) seeds member p's envs
    from ``seed_p + seed_offset`` (its host envs do not draw from ``rng``); ``seed_offset`` > 0 (the
    greedy episodes) makes an evaluation env (Atari: full games, unclipped scores), as a single run's.

    Raises:
        ValueError: ``env.name`` is not cartpole, bitflip, trading or gym.
        ConfigError: a Gymnasium env that :class:`~foxdqn.envs.gym_adapter.GymVectorEnv` refuses.
    """
    cfg = cfgs[0]
    n = envs_per_member or cfg.env.num_envs
    if cfg.env.name == "gym":
        from foxdqn.population.gym_env import MemberGymEnv  # gymnasium: for env=gym only

        return MemberGymEnv(cfg.env, [c.seed + seed_offset for c in cfgs], n, device, train=seed_offset == 0)
    if cfg.env.name == "cartpole":
        return MemberCartPoleEnv(rng, n, device)
    if cfg.env.name == "bitflip":
        return MemberBitFlipEnv(rng, n, cfg.env.n_bits, device)
    if cfg.env.name == "trading":
        if cfg.data.augment.method == "none":
            return MemberTradingEnv(rng, n, market, cfg, device)
        return MemberTradingEnv(rng, n, member_paths(cfgs, market, device), cfg, device,
                                paths_per_member=cfg.data.augment.paths)
    raise ValueError(f"build_member_env: env.name={cfg.env.name!r}; the population path runs cartpole, bitflip, "
                     "trading or gym")
