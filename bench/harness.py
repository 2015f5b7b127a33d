"""Builds training states for benchmarks (synthetic bars for trading; no dataset file needed): a
single run's (:func:`make_state`) and a population's (:func:`make_population`)."""
from __future__ import annotations

import copy

import torch

from foxdqn.data import market_data_from_frame
from foxdqn.data.synthetic import make_synthetic_ohlcv
from foxdqn.step.iteration import Iteration
from foxdqn.step.state import build_state
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
    """TrainState for ``overrides`` on ``device``; ``fill`` runs collect-only iterations until the
    replay holds a few batches."""
    cfg = load_config([f"device={device}", "log.progress=false", *overrides])
    s = build_state(cfg, bench_market(cfg, bars), torch.device(device))
    if fill:
        collect = Iteration(s, use_graph=False, updates=0)
        for _ in range(fill_rounds(cfg, cfg.env.num_envs * cfg.agent.steps_per_iter)):
            collect()
    return s


def make_population(overrides: list[str], members: int, device: str, bars: int = 4000, fill: bool = True):
    """PopulationState (:func:`foxdqn.population.state.build_population`) of ``members`` members of
    ``overrides`` on ``device``, seeds 0 .. members − 1 (as a sweep ``seed=range(0,P)`` in one
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
    for seed in range(members):
        member = copy.deepcopy(cfg)
        member.seed = seed
        cfgs.append(member)
    s = build_population(cfgs, bench_market(cfg, bars), torch.device(device))
    if fill:
        for _ in range(fill_rounds(cfg, cfg.env.num_envs)):
            collect_step(s)
    return s
