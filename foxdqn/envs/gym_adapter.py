"""Any Gymnasium environment with a ``Discrete`` action space, vectorised with Gymnasium's vector API.

:class:`GymVectorEnv` wraps ``gymnasium.make_vec(env.id, num_envs, ...)`` behind the env interface
(:class:`foxdqn.envs.base.BatchedEnv`) of the device envs: ``reset_all()`` and
``step(action) -> StepOut`` take and return tensors on the training device, so the collect step
(:func:`foxdqn.population.step.collect_step`) and the evaluation (:func:`foxdqn.analysis.backtest.evaluate_episodes`)
run unchanged. The environments themselves step on the host (CPU): every env step copies the
actions device → host once (``action.cpu()``, the one synchronisation per env step a CPU env
needs) and the results host → device once (through pinned staging buffers on CUDA). The env
step therefore cannot be captured in a CUDA graph; :class:`foxdqn.step.iteration.HostEnvIteration`
runs the T collect steps eagerly and the K updates as a captured update-only iteration.

Auto-reset
----------
The vector env is made with ``autoreset_mode=AutoresetMode.SAME_STEP``: an env whose episode ends
is reset inside the same ``step``, which returns the reset observation and puts the last
observation of the finished episode in ``info["final_obs"]``. :meth:`GymVectorEnv.step` returns
that final observation as ``StepOut.next_obs`` (what the replay stores as s') and the reset
observation as ``StepOut.obs`` (what the agent acts on next), so every stored transition is a real
(s, a, r, s') and no reset transition is ever stored (Gymnasium's default ``NEXT_STEP`` mode would
return one extra step per episode whose transition is not an env transition).
``terminated`` (a terminal state: no bootstrap) and ``truncated`` (time limit: bootstrap from s')
are passed through; where Gymnasium reports both (``TimeLimit`` on a terminating step),
``truncated`` is cleared, as in the device envs, so the two flags are never both true.

Observations
------------
A ``Box`` observation space of any shape is flattened to ``[N, D]``, ``D = prod(shape)``; its
dtype is kept when it is ``uint8`` (images: 1 byte per value in the replay) and is float32
otherwise. ``obs_shape`` keeps the unflattened shape for image encoders (foxdqn.nn.nature_cnn).

Atari (``ALE/*`` ids, ale-py)
-----------------------------
The preprocessing of Mnih et al. (2015), "Human-level control through deep reinforcement
learning", Methods: action repeat (frame skip) 4 with a max over the last two frames, greyscale,
84×84 resize, a stack of the last 4 frames (uint8 ``[4, 84, 84]``), up to 30 no-op starts,
rewards clipped to [−1, 1] during training (evaluation reports the game score) and, optionally,
a training episode ending at each life loss (evaluation plays full games). With
``env.vectorization=auto`` this is ale-py's own vector env (``ale_py.vector_env.AtariVectorEnv``,
Gymnasium's vector API, threaded C++); with ``sync``/``async`` it is Gymnasium's
``AtariPreprocessing`` + ``FrameStackObservation`` wrappers on envs made with ``frameskip=1``
(these need ``opencv-python``).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from foxdqn.errors import ConfigError

from foxdqn.envs.base import NO_HOOK, StepOut

__all__ = ["GymVectorEnv", "describe", "make_vector_env"]

ALE_MAX_FRAMES = 108_000  # ALE v5 default max_num_frames_per_episode


def _gym():
    import gymnasium

    return gymnasium


def is_atari(env_id: str) -> bool:
    return env_id.startswith("ALE/")


def _spec(env_id: str):
    """Gymnasium spec of ``env_id``; ConfigError naming env.id when it is not registered."""
    gym = _gym()
    if is_atari(env_id):
        try:
            import ale_py
        except ImportError:
            raise ConfigError(f"env.id={env_id} needs ale-py: pip install 'foxdqn[atari]'") from None
        gym.register_envs(ale_py)
    try:
        return gym.spec(env_id)
    except Exception as exc:  # gymnasium.error.NameNotFound / VersionNotFound / NamespaceNotFound
        raise ConfigError(f"env.id={env_id} is not a registered Gymnasium environment "
                          f"({str(exc).strip().splitlines()[0]})") from None


def make_vector_env(e, num_envs: int, train: bool = True):
    """``gymnasium.make_vec`` for env config ``e`` (:class:`foxdqn.config.schema.EnvConfig`) with SAME_STEP
    auto-reset. ``train=False`` (evaluation): no life-loss terminals, no reward clipping.

    Raises:
        ConfigError: unknown ``env.id``; Atari with ``sync``/``async`` without opencv-python.
    """
    gym = _gym()
    spec = _spec(e.id)
    same_step = gym.vector.AutoresetMode.SAME_STEP
    mode = e.vectorization
    if is_atari(e.id):
        if mode == "auto" and spec.vector_entry_point is not None:
            return gym.make_vec(
                e.id, num_envs, vectorization_mode="vector_entry_point", autoreset_mode=same_step,
                frameskip=e.frame_skip, img_height=e.screen_size, img_width=e.screen_size, grayscale=True,
                stack_num=e.frame_stack, noop_max=e.noop_max, repeat_action_probability=e.repeat_action_probability,
                episodic_life=bool(train and e.terminal_on_life_loss), reward_clipping=train,
                max_num_frames_per_episode=ALE_MAX_FRAMES)
        _check_opencv(e, mode)
        from gymnasium.wrappers import AtariPreprocessing, ClipReward, FrameStackObservation

        def preprocess(env):
            env = AtariPreprocessing(env, noop_max=e.noop_max, frame_skip=e.frame_skip, screen_size=e.screen_size,
                                     terminal_on_life_loss=bool(train and e.terminal_on_life_loss),
                                     grayscale_obs=True, scale_obs=False)
            env = FrameStackObservation(env, e.frame_stack)
            return ClipReward(env, -1.0, 1.0) if train else env

        return gym.make_vec(e.id, num_envs, vectorization_mode="sync" if mode == "auto" else mode,
                            vector_kwargs={"autoreset_mode": same_step}, wrappers=[preprocess], frameskip=1,
                            repeat_action_probability=e.repeat_action_probability,
                            max_num_frames_per_episode=ALE_MAX_FRAMES)
    if mode == "auto":
        mode = "sync"
    return gym.make_vec(e.id, num_envs, vectorization_mode=mode, vector_kwargs={"autoreset_mode": same_step})


def _uses_atari_wrappers(e) -> bool:
    """Atari through gymnasium's AtariPreprocessing (not ale-py's own vector env)."""
    return is_atari(e.id) and not (e.vectorization == "auto" and _spec(e.id).vector_entry_point is not None)


def _check_opencv(e, mode: str) -> None:
    try:
        import cv2  # noqa: F401  (AtariPreprocessing resizes with it)
    except ImportError:
        raise ConfigError(f"env.vectorization={mode} for env.id={e.id} uses gymnasium's AtariPreprocessing, "
                          "which needs opencv-python; use env.vectorization=auto (ale-py's vector env)") from None


def _make_one(env_id: str):
    """``gym.make(env_id)``; an env whose optional dependency is missing (Box2D, MuJoCo, ...) is a
    :class:`ConfigError` naming ``env.id``."""
    gym = _gym()
    try:
        return gym.make(env_id)
    except gym.error.DependencyNotInstalled as exc:
        raise ConfigError(f"env.id={env_id} cannot be made here: {str(exc).splitlines()[0]}") from None


def _check_spaces(env_id: str, action_space, observation_space) -> None:
    gym = _gym()
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(f"env.id={env_id} has action space {action_space}; foxdqn needs a Discrete action space")
    if not isinstance(observation_space, gym.spaces.Box):
        raise ConfigError(f"env.id={env_id} has observation space {observation_space}; foxdqn needs a Box")


def describe(e) -> dict:
    """Observation shape and dtype and action count of ``e.id`` without stepping it (for the memory
    precheck): ``{"obs_shape": tuple, "obs_dtype": torch.dtype, "num_actions": int}``.

    Raises:
        ConfigError: unknown id, an env whose optional dependency is not installed, Atari through
            gymnasium's wrappers without opencv, not a Discrete action space, not a Box observation space.
    """
    _spec(e.id)
    if _uses_atari_wrappers(e):  # fail before any run folder, not when the env is built
        _check_opencv(e, e.vectorization)
    if is_atari(e.id):  # the preprocessed frames, known without making an env
        gym = _gym()
        env = _make_one(e.id)
        try:
            _check_spaces(e.id, env.action_space, gym.spaces.Box(0, 255, (1,), np.uint8))
            n = int(env.action_space.n)
        finally:
            env.close()
        return {"obs_shape": (e.frame_stack, e.screen_size, e.screen_size), "obs_dtype": torch.uint8,
                "num_actions": n}
    env = _make_one(e.id)
    try:
        _check_spaces(e.id, env.action_space, env.observation_space)
        space = env.observation_space
        return {"obs_shape": tuple(space.shape), "obs_dtype": _obs_dtype(space.dtype),
                "num_actions": int(env.action_space.n)}
    finally:
        env.close()


def _obs_dtype(np_dtype) -> torch.dtype:
    return torch.uint8 if np.dtype(np_dtype) == np.uint8 else torch.float32


class GymVectorEnv:
    """``num_envs`` copies of Gymnasium env ``e.id`` behind the device-env interface (module docstring).

    Args:
        e: :class:`foxdqn.config.schema.EnvConfig` (``id``, ``vectorization``, Atari keys).
        num_envs: N ≥ 1.
        device: the training device (actions come from it, observations go to it).
        seed: seeds the vector env's first reset: an int (env i gets ``seed + i``) or a sequence of
            ``num_envs`` ints, env i's seed (a population's envs: foxdqn.population.gym_env).
        train: training env (Atari: life-loss terminals when configured, clipped rewards) or evaluation env.

    Raises:
        ConfigError: unknown ``e.id``, a non-Discrete action space or a non-Box observation space.

    Attributes:
        num_envs: N.  obs_shape: the env's observation shape.  obs_dim: D = prod(obs_shape).
        obs_dtype: torch.uint8 for uint8 observations, else torch.float32.  num_actions: n of Discrete(n).
        max_episode_steps: the time limit in env steps (Atari: 108000 frames / frame_skip).
        on_host: True (the env steps on the CPU; the collect step cannot be captured).
        collect_hook: :data:`~foxdqn.envs.base.NO_HOOK`.
    """

    on_host = True
    collect_hook = NO_HOOK

    def __init__(self, e, num_envs: int, device: torch.device, seed: int | Sequence[int], train: bool = True):
        self.venv = make_vector_env(e, num_envs, train=train)
        try:
            _check_spaces(e.id, self.venv.single_action_space, self.venv.single_observation_space)
        except ConfigError:
            self.venv.close()
            raise
        space = self.venv.single_observation_space
        self.env_id, self.num_envs, self.device = e.id, num_envs, torch.device(device)
        self.seed = int(seed) if isinstance(seed, (int, np.integer)) else [int(v) for v in seed]
        if isinstance(self.seed, list) and len(self.seed) != num_envs:
            self.venv.close()
            raise ValueError(f"GymVectorEnv: {len(self.seed)} seeds for num_envs={num_envs}; pass one int or one per env")
        self.obs_shape = tuple(space.shape)
        self.obs_dim = int(math.prod(self.obs_shape))
        self.obs_dtype = _obs_dtype(space.dtype)
        self._np_obs_dtype = np.uint8 if self.obs_dtype == torch.uint8 else np.float32
        self.num_actions = int(self.venv.single_action_space.n)
        self._action_start = int(self.venv.single_action_space.start)
        spec = self.venv.spec
        if is_atari(e.id):
            self.max_episode_steps = ALE_MAX_FRAMES // e.frame_skip
        else:
            self.max_episode_steps = int(spec.max_episode_steps) if spec and spec.max_episode_steps else 1000
        pin = self.device.type == "cuda"
        self._obs_host = torch.empty(num_envs, self.obs_dim, dtype=self.obs_dtype, pin_memory=pin)
        self._next_host = torch.empty(num_envs, self.obs_dim, dtype=self.obs_dtype, pin_memory=pin)
        # reward, terminated, truncated, episode_done, episode_return, episode_length
        self._scalars_host = torch.empty(6, num_envs, dtype=torch.float64, pin_memory=pin)
        self._ep_return = np.zeros(num_envs, dtype=np.float64)
        self._ep_length = np.zeros(num_envs, dtype=np.int64)
        self._seeded = False
        self._copied = torch.cuda.Event() if pin else None  # the last host → device copies of the staging buffers

    # ------------------------------------------------------------------ device-side API

    def _flat(self, obs) -> np.ndarray:
        return np.asarray(obs, dtype=self._np_obs_dtype).reshape(self.num_envs, self.obs_dim)

    def _to_device(self, host: Tensor) -> Tensor:
        if self.device.type == "cpu":
            return host.clone()
        return host.to(self.device, non_blocking=True)

    def _staging_free(self) -> None:
        """Wait until the previous step's copies out of the pinned staging buffers are done (already
        true after the action copy of the collect step; a no-op on CPU)."""
        if self._copied is not None:
            self._copied.synchronize()

    def _copies_queued(self) -> None:
        if self._copied is not None:
            self._copied.record(torch.cuda.current_stream(self.device))

    def _reset_seed(self):
        """The first reset's ``seed`` argument: the int, or the per-env seeds as the vector env takes
        them (ale-py's vector env: an int64 array; Gymnasium's: a list of ints)."""
        if isinstance(self.seed, int):
            return self.seed
        return np.asarray(self.seed, dtype=np.int64) if type(self.venv).__module__.startswith("ale_py") else self.seed

    def reset_all(self) -> Tensor:
        """Reset every env (seeded with ``seed + i``, or the i-th of the given seeds, the first time).
        Returns obs ``[N, D]`` obs_dtype."""
        if self._seeded:
            obs, _ = self.venv.reset()
        else:
            obs, _ = self.venv.reset(seed=self._reset_seed())
            self._seeded = True
        self._ep_return[:] = 0.0
        self._ep_length[:] = 0
        self._staging_free()
        self._obs_host.copy_(torch.from_numpy(self._flat(obs)))
        out = self._to_device(self._obs_host)
        self._copies_queued()
        return out

    def step(self, action: Tensor) -> StepOut:
        """Step every env with ``action`` (int64 ``[N]`` on the device, in ``[0, num_actions)``).

        Returns:
            :class:`~foxdqn.envs.StepOut` on the device: ``next_obs`` ``[N, D]`` (the episode's last
            observation where it ended), ``obs`` ``[N, D]`` (after auto-reset), ``reward`` float32
            ``[N]``, ``terminated`` / ``truncated`` bool ``[N]`` (never both), ``info`` with
            ``episode_return`` float32 (undiscounted return of an episode that ended, else 0),
            ``episode_done`` bool and ``episode_length`` int64.
        """
        a = action.cpu().numpy()  # the one device → host copy of the env step
        obs, reward, terminated, truncated, info = self.venv.step(a + self._action_start)
        terminated = np.asarray(terminated, dtype=bool)
        truncated = np.asarray(truncated, dtype=bool) & ~terminated
        done = terminated | truncated
        reward = np.asarray(reward, dtype=np.float64)
        flat = self._flat(obs)
        self._staging_free()
        self._obs_host.copy_(torch.from_numpy(flat))
        self._next_host.copy_(self._obs_host)
        if done.any():
            final = info["final_obs"]
            for i in np.flatnonzero(done):
                self._next_host[i].copy_(torch.from_numpy(
                    np.asarray(final[i], dtype=self._np_obs_dtype).reshape(self.obs_dim)))
        self._ep_return += reward
        self._ep_length += 1
        sc = self._scalars_host.numpy()
        sc[0], sc[1], sc[2], sc[3] = reward, terminated, truncated, done
        sc[4] = np.where(done, self._ep_return, 0.0)
        sc[5] = np.where(done, self._ep_length, 0)
        self._ep_return[done] = 0.0
        self._ep_length[done] = 0
        dev = self._to_device(self._scalars_host)
        info_out = {
            "episode_return": dev[4].to(torch.float32),
            "episode_done": dev[3] > 0,
            "episode_length": dev[5].to(torch.int64),
        }
        out = StepOut(next_obs=self._to_device(self._next_host), reward=dev[0].to(torch.float32),
                      terminated=dev[1] > 0, truncated=dev[2] > 0, obs=self._to_device(self._obs_host),
                      info=info_out)
        self._copies_queued()
        return out

    def close(self) -> None:
        """Close the vector env (ends async workers / threads)."""
        self.venv.close()
