"""The end of a training run: select on validation, evaluate once, write the report.

:func:`finish` writes the report of each member of a population (:mod:`foxdqn.population.train`; a
single run is a population of one): it reads only an :class:`Agent` (config, greedy network, action
mode, device) and a :class:`RunEnd` (how the training ended), never the training state.
docs/backtest.md says which split is read when; docs/outputs.md what is written.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from foxdqn.run.checkpoint import load_checkpoint
from foxdqn.config.schema import TrainConfig, run_name
from foxdqn.run.early_stop import EarlyStopper, resolve_metric, stop_summary
from foxdqn.analysis.backtest import evaluate, evaluate_episodes, write_report
from foxdqn.io_atomic import write_json_atomic
from foxdqn.logger.tensorboard_log import TensorBoardLogger
from foxdqn.run.search import excluded
from foxdqn.timings import mark

log = logging.getLogger(__name__)


@dataclass
class Agent:
    """What an evaluation reads: the run's config, its online network (obs ``[B, D]`` → Q
    ``[B, A]``; None when :class:`RunEnd` brings the evaluations, a population member), the action
    mode and the device."""

    cfg: TrainConfig
    online: torch.nn.Module | None
    action_mode: object
    device: torch.device


@dataclass
class RunEnd:
    """How a training ended: ``graph`` (captured or eager), ``wall`` (training seconds),
    ``env_steps`` and ``updates`` done, the ``checkpoint`` written last, the early stopper (or
    None), the collapse monitor (foxdqn.logger.diversity), ``best_path`` (early stopping's best
    weights), the ``overrides`` that tell this run apart in a sweep (None: read Hydra's) and
    ``extra`` entries for the summary (a population member's ``population``), ``name`` a prefix of
    its log line (a population member's ``"job N: "``). ``val_metrics`` and
    ``test_result`` are the validation metrics and the evaluation (:func:`foxdqn.analysis.backtest.evaluate`'s
    result, or the episode metrics of a non-trading env) when already computed (a population
    evaluates its members together); None: :func:`finish` computes them. ``pruned_at``: the env
    steps where a search's pruner stopped the run (foxdqn.run.search), None when it did not.
    ``plots``: a list to which the report's plot is appended for the caller to draw once every
    member's summary is written (:func:`foxdqn.analysis.backtest.write_report`); None: drawn here."""

    graph: bool
    wall: float
    env_steps: int
    updates: int
    checkpoint: Path
    stopper: EarlyStopper | None = None
    collapse: object = None
    best_path: Path | None = None
    overrides: list[str] | None = field(default=None)
    extra: dict = field(default_factory=dict)
    name: str = ""
    job: int | None = None
    val_metrics: dict | None = None
    test_result: dict | None = None
    pruned_at: int | None = None
    plots: list | None = None


#: Validation of an episodic env: at most this many greedy episodes, from another seed offset than the
#: final evaluation's (1). Shared with the population's validation (foxdqn.population.train).
VAL_EPISODES, VAL_SEED_OFFSET = 20, 2


def evaluate_val(agent: Agent, market) -> dict:
    """Validation metrics of the greedy agent (trading: the val split; others: 20 episodes from
    another seed than the final evaluation's)."""
    cfg = agent.cfg
    if cfg.env.name == "trading":
        return evaluate(cfg, market, agent.online, agent.device, split="val", action_mode=agent.action_mode,
                        policies=("agent",))["metrics"]["agent"]
    return evaluate_episodes(cfg, agent.online, agent.action_mode, agent.device,
                             episodes=min(VAL_EPISODES, cfg.eval.episodes), seed_offset=VAL_SEED_OFFSET)


def selection(agent: Agent, market, stopper: EarlyStopper | None, weights: str, val_metrics: dict | None = None) -> dict:
    """The validation metric of the weights that will be evaluated: the value a sweep optimises,
    with ``trades``, the number of trades those weights make on val (trading; None elsewhere).

    With early stopping it is the best validation value (the weights kept); otherwise the final
    weights are validated once here (or ``val_metrics``, their validation already computed). The
    test split is never read.
    """
    metric = resolve_metric(agent.cfg.early_stop.metric, agent.cfg.env.name)
    if stopper is not None and stopper.best is not None and weights == "best":
        value, trades = stopper.best, getattr(stopper, "best_trades", None)
    else:
        val = val_metrics if val_metrics is not None else evaluate_val(agent, market)
        value, trades = val.get(metric, float("nan")), val.get("num_trades")
    return {"split": "val", "metric": metric, "value": float(value), "weights": weights,
            "trades": None if trades is None else int(trades)}


def finish(agent: Agent, market, run_dir: Path, end: RunEnd) -> dict:
    """Select (validation), evaluate once (``eval.split``, test by default) and write the report
    into ``run_dir/eval``; returns the summary (also ``eval/summary.json``). With early stopping
    and a best checkpoint, ``agent.online`` is loaded with the best weights first (a population
    member, ``agent.online`` None, brings the evaluations of its best weights in ``end``)."""
    cfg, device, stopper = agent.cfg, agent.device, end.stopper
    stop = stop_summary(stopper, end.env_steps)
    evaluated = {"checkpoint": "last", "env_steps": end.env_steps, "metric": None, "value": None}
    if stopper is not None and stopper.best_env_steps is not None and end.best_path is not None \
            and end.best_path.is_file():
        best = load_checkpoint(end.best_path, map_location=device)
        if agent.online is not None:  # None: a population member, evaluated with these weights already
            agent.online.load_state_dict(best["online"])
        evaluated = {"checkpoint": "best", "env_steps": best["env_steps"], "metric": stopper.metric,
                     "value": stopper.best}
    if end.pruned_at is not None:
        stop = {**stop, "reason": "pruned", "at_env_steps": int(end.pruned_at),
                "detail": "search.pruner=median: validation below the median of the sweep's finished jobs"}
    chosen = selection(agent, market, stopper, evaluated["checkpoint"], end.val_metrics)
    chosen["excluded"] = excluded(cfg, chosen, stop["reason"])  # the search does not count it (foxdqn.run.search)
    mark("validation")  # foxdqn.timings
    log.info("%strained in %.1f s (stop: %s at %d env steps); val %s = %.4g; evaluating the %s weights (%d env "
             "steps) once on %s", end.name, end.wall, stop["reason"], stop["at_env_steps"], chosen["metric"], chosen["value"],
             evaluated["checkpoint"], evaluated["env_steps"], cfg.eval.split,
             # a population member's line: its own train.log only (the sweep's report has one table for all)
             extra={"foxdqn_job": end.job, "foxdqn_detail": end.job is not None})
    extra = {
        "experiment": cfg.experiment,
        "run_name": run_name(cfg.experiment, cfg.data.path, cfg.env.id),
        "data": market.source if market is not None else None,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "graph": end.graph,
        "torch": torch.__version__,
        "env_steps": end.env_steps,
        "updates": end.updates,
        "wall_time_s": round(end.wall, 2),
        "checkpoint": str(end.checkpoint.relative_to(run_dir)),
        "stop": stop,
        "evaluated": evaluated,
        "selection": chosen,
        **end.extra,
    }
    if cfg.diversity.enabled and end.collapse is not None:
        extra["diversity"] = {"collapse_warnings": end.collapse.warnings, "collapsed_at_end": end.collapse.collapsed,
                              "min_entropy": cfg.diversity.min_entropy}
    if cfg.env.name != "trading":
        episodes = end.test_result if end.test_result is not None else \
            evaluate_episodes(cfg, agent.online, agent.action_mode, device, episodes=cfg.eval.episodes)
        mark("final_evaluation")
        summary = {**extra, "env": cfg.env.name, "metrics": {"agent": episodes}}
        if cfg.env.name == "gym":
            summary["env_id"] = cfg.env.id
        write_json_atomic(run_dir / "eval" / "summary.json", summary)
        log_final(run_dir, cfg, summary, end.overrides)
        mark("report")
        return summary
    result = end.test_result if end.test_result is not None else \
        evaluate(cfg, market, agent.online, device, split=cfg.eval.split, action_mode=agent.action_mode)
    mark("final_evaluation")
    data_name = cfg.data.name if cfg.data.path is None else Path(cfg.data.path).name
    title = f"{extra['run_name']}: {data_name}, {cfg.eval.split} split"
    summary = write_report(run_dir / "eval", result, market, cfg.eval.split, title, extra, plots=end.plots)
    gated_flat = (extra.get("gate") or {}).get("chosen") == "flat"  # the deployment gate's choice: its own line
    if summary["metrics"]["agent"].get("num_trades") == 0 and not gated_flat:
        log.warning("%sthe agent never trades on the %s split (0 trades): its numbers are flat's%s", end.name,
                    cfg.eval.split, f"; excluded from the search ({chosen['excluded']})" if chosen["excluded"] else "")
    log_final(run_dir, cfg, summary, end.overrides)
    mark("report")
    return summary


def final_metrics(summary: dict) -> dict:
    """The evaluated split's agent metrics (``eval/<split>/*``) and the selection value."""
    agent = summary["metrics"]["agent"]
    metrics = {f"eval/{summary.get('split', 'episodes')}/{k}": v for k, v in agent.items()}
    metrics["eval/val_selection"] = summary["selection"]["value"]
    return metrics


def log_final(run_dir: Path, cfg: TrainConfig, summary: dict, overrides: list[str] | None = None) -> None:
    """:func:`final_metrics` into TensorBoard at the last env step, with one HParams row (the run's
    overrides, or seed and experiment)."""
    if not cfg.logger.tensorboard:
        return
    with TensorBoardLogger(run_dir / "tb") as tb:
        tb.log_hparams(hparams(cfg, overrides), final_metrics(summary), int(summary["env_steps"]))


def hparams(cfg: TrainConfig, overrides: list[str] | None = None) -> dict:
    """The settings that tell runs of a sweep apart: ``overrides`` when given, else the Hydra
    overrides of the running job (when run by Hydra), with seed and experiment."""
    hp = {"experiment": cfg.experiment, "seed": cfg.seed}
    if overrides is None:
        try:
            from hydra.core.hydra_config import HydraConfig

            if HydraConfig.initialized():
                overrides = [str(item) for item in HydraConfig.get().overrides.task]
        except ImportError:  # pragma: no cover - hydra is a dependency
            pass
    for item in overrides or []:
        key, _, value = item.lstrip("+~").partition("=")
        if not key.startswith("hydra"):
            hp[key] = value
    return hp
