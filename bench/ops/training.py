"""Training sizes of the op benches, built as the training code builds them (not a bench module:
``bench.run`` runs only ``bench_*`` modules).

:func:`training` composes an experiment's config (``conf/``), builds its train env
(:func:`foxdqn.step.build.build_env`: the trading env on the bundled EURUSD 1h bars) and its online
network (:func:`foxdqn.step.build.build_network`); the benches read their shapes, the env's state
and market, and the config's batch size, clip bound, τ and target period from it. Trading
experiments run at :data:`TRADING_ENVS` envs, the size of issue 17's kernel counts
(docs/bench.md#kernels); the others as shipped. Nothing runs at import.
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

TRADING_ENVS = 4096  # envs of the trading sets here and in the kernels section (bench/kernels_bench.py)
DEFAULT = "eurusd_dqn"  # the default experiment (conf/train.yaml)
CARTPOLE = "cartpole_cleanrl"


class Training(NamedTuple):
    """One experiment's built pieces on one device.

    cfg: the composed :class:`foxdqn.config.schema.TrainConfig`.  env: its train env (N envs, stepped by
    the benches that need its state).  net: the online network (float32, on the device).
    num_envs: N.  num_actions: the network's outputs.  obs_dim: values per observation.
    batch_size: ``agent.batch_size``.  param_shapes: shapes of ``net``'s parameters, in order.
    """

    cfg: object
    env: object
    net: object
    num_envs: int
    num_actions: int
    obs_dim: int
    batch_size: int
    param_shapes: tuple


@lru_cache(maxsize=None)
def training(experiment: str, device: str) -> Training:
    """The experiment's :class:`Training` on ``device`` (built once per process; the env's state
    then evolves with every bench that steps it, as in training)."""
    import torch

    from foxdqn.config.compose import load_config
    from foxdqn.step.build import build_action_mode, build_env, build_network

    overrides = [f"+experiment={experiment}", f"device={device}", "log.progress=false"]
    probe = load_config(overrides)
    if probe.env.name == "trading":
        overrides.append(f"env.num_envs={TRADING_ENVS}")
    cfg = load_config(overrides)
    dev = torch.device(device)
    market = None
    if cfg.env.name == "trading":
        from foxdqn.data import load_market_data

        market = load_market_data(cfg.data, cfg.env.window, cfg.env.episode_length)
    generator = torch.Generator(device=dev).manual_seed(0)
    env = build_env(cfg, market, "train", dev, generator)
    env.reset_all()
    num_actions = build_action_mode(cfg, env).num_actions
    net = build_network(cfg, env, num_actions).to(dev)
    return Training(cfg, env, net, env.num_envs, num_actions, int(env.obs_dim), cfg.agent.batch_size,
                    tuple(tuple(p.shape) for p in net.parameters()))


def at_training_precision(experiment: str, device: str, body):
    """``body(training(experiment, device), torch.device(device))`` under the experiment's float32
    matmul precision (``agent.matmul_precision``, TF32 by default), restored after: the rows of a
    bench whose kernels follow that choice (:mod:`foxdqn.ops.mlp_chain`, :mod:`foxdqn.ops.q_forward`)."""
    import torch

    t = training(experiment, device)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(str(t.cfg.matmul_precision))
    try:
        return body(t, torch.device(device))
    finally:
        torch.set_float32_matmul_precision(before)


def linear_chain(t: Training) -> tuple[list, list, str]:
    """The online network's ``nn.Linear`` weights and biases in order (detached: the benches'
    inputs to :func:`foxdqn.ops.mlp_chain.mlp_chain` and its fused ε-greedy), and their widths
    as ``"D0->D1->...->Dn"`` for the rows' size labels."""
    import torch

    linears = [m for m in t.net.modules() if isinstance(m, torch.nn.Linear)]
    ws = [m.weight.detach() for m in linears]
    bs = [m.bias.detach() for m in linears]
    return ws, bs, "->".join(str(d) for d in [ws[0].shape[1], *(w.shape[0] for w in ws)])
