"""Builders: config → device, environment, action mode, network, replay storage.

Each builder reads one config group (mirroring ``conf/``) and returns a live object. The
environments, the objectives and the training-path resampler are imported where they are built
(start-up: each imports its own Triton ops, or Gymnasium, so a run loads only the ones it uses);
the networks and the replay are light and imported here.
"""
from __future__ import annotations

import torch

from foxdqn.actions.modes import build_action_mode as _build_action_mode
from foxdqn.config.schema import TrainConfig
from foxdqn.errors import ConfigError
from foxdqn.nn.attention import AttentionEncoder
from foxdqn.nn.branching import BranchingHead, BranchingNetwork
from foxdqn.nn.c51 import C51Head, C51Network
from foxdqn.nn.heads import DuelingHead, QHead
from foxdqn.nn.iqn import IQNHead, IQNNetwork
from foxdqn.nn.mlp import MLPEncoder
from foxdqn.nn.nature_cnn import NatureCNNEncoder, check_obs_shape
from foxdqn.nn.qnet import QNetwork

ENV_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def resolve_device(name: str) -> torch.device:
    """``auto`` → cuda when available, else cpu; ``cpu``, ``cuda`` or ``cuda:N`` as given.

    Raises:
        ConfigError: ``cuda`` without a GPU.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no CUDA device is available; use device=auto or device=cpu")
    return torch.device(name)


def build_env(cfg: TrainConfig, market, split: str, device: torch.device, generator: torch.Generator,
              num_envs: int | None = None, eval_mode: bool = False):
    """The configured environment (:class:`foxdqn.envs.base.BatchedEnv`). ``market``
    (foxdqn.data.MarketData) and ``split`` (its split name) are used by ``trading`` only.
    ``num_envs`` defaults to ``env.num_envs`` (1 in ``eval_mode``, a trading walk). A training
    trading env (``split="train"``, not ``eval_mode``) with ``data.augment.method`` other than
    ``none`` walks resampled paths of the training split, built here on ``device``
    (:func:`foxdqn.data.augment.build_training_paths`, deterministic given ``seed``); every other
    env walks ``market`` itself."""
    n = num_envs or (1 if eval_mode else cfg.env.num_envs)
    name = cfg.env.name
    if name == "gym":  # a Gymnasium vector env stepped on the host; split != "train": evaluation env
        from foxdqn.envs.gym_adapter import GymVectorEnv  # start-up: the configured env only (docstring)

        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator, device=generator.device))
        return GymVectorEnv(cfg.env, n, device, seed, train=split == "train")
    if name == "cartpole":
        from foxdqn.envs.cartpole import CartPoleEnv  # start-up: the configured env only (docstring)

        return CartPoleEnv(n, device, generator)
    if name == "bitflip":
        from foxdqn.envs.bitflip import BitFlipEnv  # start-up: the configured env only (docstring)

        return BitFlipEnv(n, cfg.env.n_bits, device, generator)
    from foxdqn.envs.trading import TradingEnv  # start-up: the configured env only (docstring)

    if split == "train" and not eval_mode and cfg.data.augment.method != "none":
        from foxdqn.data.augment import build_training_paths  # start-up: with data.augment only

        market = build_training_paths(market, cfg.data, cfg.seed, device)
    return TradingEnv(
        market, split, num_envs=n, window=cfg.env.window, episode_length=cfg.env.episode_length,
        execution=cfg.env.execution, device=device, dtype=ENV_DTYPES[cfg.env.dtype], generator=generator,
        eval_mode=eval_mode, max_eval_bars=cfg.debug.max_eval_bars,
    )


def build_action_mode(cfg: TrainConfig, env):
    return _build_action_mode(cfg.action.mode, env)


def num_features(env) -> int:
    """F, features per bar of a trading observation (obs_dim = W·F + 2)."""
    return (env.obs_dim - 2) // env.window


def check_encoder(encoder: str, obs_shape: tuple, env_id: str) -> None:
    """Image observations ``[C, H, W]`` (Atari frames) need ``model=nature_cnn``, and only they fit it.

    Raises:
        ConfigError: naming ``model.encoder``, ``env.id`` and the env's observation shape (also for
            the encoder's own check, :func:`foxdqn.nn.nature_cnn.check_obs_shape`: images of at
            least 36x36 pixels).
    """
    image = len(obs_shape) == 3
    if image and encoder != "nature_cnn":
        raise ConfigError(f"model.encoder={encoder!r} cannot read the image observations {list(obs_shape)} of "
                          f"env.id={env_id}; use model=nature_cnn (as +experiment=pong_dqn does)")
    if encoder == "nature_cnn":
        try:
            check_obs_shape(obs_shape)
        except ValueError as exc:
            hint = "" if image else "; use model=mlp"
            raise ConfigError(f"model.encoder='nature_cnn' cannot read the observations {list(obs_shape)} of "
                              f"env.id={env_id}: {exc}{hint}") from None


def build_encoder(cfg: TrainConfig, env):
    m = cfg.model
    if env.on_host:
        check_encoder(m.encoder, env.obs_shape, cfg.env.id)
    if m.encoder == "nature_cnn":
        return NatureCNNEncoder(env.obs_shape, list(m.hidden))
    if m.encoder == "attention":
        return AttentionEncoder(env.obs_dim, env.window, num_features(env), m.width, m.heads, m.layers,
                                pooling=m.pooling)
    return MLPEncoder(env.obs_dim, list(m.hidden), m.activation)


def build_network(cfg: TrainConfig, env, num_actions: int) -> torch.nn.Module:
    """Online network obs [B, D] → expected Q [B, num_actions]."""
    h = cfg.head
    encoder = build_encoder(cfg, env)
    if cfg.action.mode == "branching":
        return BranchingNetwork(encoder, BranchingHead(encoder.out_dim))
    if h.name == "c51":
        return C51Network(encoder, C51Head(encoder.out_dim, num_actions, h.atoms, h.v_min, h.v_max, h.dueling))
    if h.name == "iqn":
        return IQNNetwork(encoder, IQNHead(encoder.out_dim, num_actions, h.embedding_dim, h.dueling),
                          h.num_quantiles_policy)
    head = DuelingHead if h.name == "dueling" else QHead
    return QNetwork(encoder, head(encoder.out_dim, num_actions))


def build_iql_value(cfg: TrainConfig, env) -> torch.nn.Module:
    """IQL's value network obs [B, D] → V [B] (``objective.iql``,
    :class:`foxdqn.nn.iql_value.IQLValueNetwork`): an encoder of its own, built like the Q
    network's (``model``), initialised from torch's global generator; a population builds one for
    each member after that member's Q network (:func:`foxdqn.population.state.initial_networks`)."""
    from foxdqn.nn.iql_value import IQLValueNetwork

    return IQLValueNetwork(build_encoder(cfg, env))


def replay_storage(env):
    """``(codec, row_dim, row_dtype)`` of what a replay of ``env`` stores per state: its hook's
    :class:`~foxdqn.replay.buffer.ReplayCodec` and that codec's rows (the trading env's state codes,
    docs/design/replay.md#windowed-trading-replay), or ``(None, env.obs_dim, env.obs_dtype)``: the
    observations (uint8 for images)."""
    codec = env.collect_hook.replay_codec(env)
    return (None, env.obs_dim, env.obs_dtype) if codec is None else (codec, codec.dim, codec.dtype)


def attach_codec(replay, env, codec) -> None:
    """Decode ``replay``'s sampled rows with ``codec`` (None: nothing to do) and tell ``env``'s hook
    that the replay stores codes (the trading env then skips ``next_obs``)."""
    if codec is not None:
        replay.set_decoder(codec.decode)
        env.collect_hook.replay_stores_codes(env)
