"""Builds training states for benchmarks (synthetic bars for trading; no dataset file needed): a
single run's (:func:`make_state`: a population of one, as foxdqn.train trains it) and a
population's (:func:`make_population`), and their iterations (:func:`iteration`)."""
from __future__ import annotations

import copy

import torch

from foxdqn.data import market_data_from_frame
from foxdqn.data.synthetic import make_synthetic_ohlcv
from foxdqn.step.iteration import Iteration
from foxdqn.config.compose import load_config


def bench_market(cfg, bars: int = 4000):
    """Synthetic market data for a trading ``cfg`` (``bars`` hourly bars, seed 0), else None."""
    if cfg.env.name != "trading":
        return None
    frame = make_synthetic_ohlcv(bars, drift_per_bar=1e-4, vol=2e-3, seed=0)
    return market_data_from_frame(frame, cfg.data, cfg.env.window, cfg.env.episode_length)


def fill_rounds(cfg, envs_per_round: int) -> int:
    """Collect rounds of ``envs_per_round`` transitions until the replay holds a few batches
    (two, and at least ``replay.n_step`` + 1 rounds)."""
    return max(cfg.replay.n_step + 1, -(-cfg.agent.batch_size * 2 // envs_per_round))


def make_state(overrides: list[str], device: str, bars: int = 4000, fill: bool = True):
    """A single run's state for ``overrides`` on ``device``: a population of one member (seed 0
    unless ``overrides`` gives ``seed=``), :func:`make_population`."""
    seed = next((int(o.split("=", 1)[1]) for o in overrides if o.startswith("seed=")), 0)
    s = make_population([o for o in overrides if not o.startswith("seed=")], 1, device, bars, fill, first_seed=seed)
    return s


def iteration(s, use_graph: bool, collect_steps: int | None = None, updates: int | None = None) -> Iteration:
    """The training iteration of population ``s`` (:class:`~foxdqn.step.iteration.Iteration` with
    :mod:`foxdqn.population.step`'s steps, as foxdqn.population.train builds it): T collect steps
    (default ``agent.steps_per_iter``), K updates (default ``agent.updates_per_iter``), the
    guard's host copy after the updates; captured in a CUDA graph with ``use_graph``."""
    from foxdqn.population import step as P

    return Iteration(s, use_graph, collect_steps, updates, **P.iteration_steps(s))


def make_population(overrides: list[str], members: int, device: str, bars: int = 4000, fill: bool = True,
                    first_seed: int = 0):
    """PopulationState (:func:`foxdqn.population.state.build_population`) of ``members`` members of
    ``overrides`` on ``device``, seeds ``first_seed`` .. ``first_seed`` + members − 1 (as a sweep ``seed=range(0,P)`` in one
    population: the config composed once, each member a copy with its own seed, as
    :class:`~foxdqn.config.compose.JobComposer` derives a job that differs only in ``seed``).
    ``fill`` runs eager population collect steps until each member's replay holds a few batches."""
    from foxdqn.population.grouping import batch_refusal
    from foxdqn.population.state import build_population
    from foxdqn.population.step import collect_step

    cfg = load_config([f"device={device}", "log.progress=false", *overrides])
    refusal = batch_refusal(cfg)
    if refusal is not None:
        raise ValueError(f"a population cannot train {cfg.experiment}: {refusal}")
    cfgs = []
    for seed in range(first_seed, first_seed + members):
        member = copy.deepcopy(cfg)
        member.seed = seed
        cfgs.append(member)
    s = build_population(cfgs, bench_market(cfg, bars), torch.device(device))
    if fill:
        for _ in range(fill_rounds(cfg, cfg.env.num_envs)):
            collect_step(s)
    return s
