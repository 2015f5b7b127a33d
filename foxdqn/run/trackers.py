"""The logger runs of one foxdqn run: its MLflow run (``logger.mlflow``), its W&B run
(``logger.wandb``) and the Prometheus endpoint (``logger.prometheus.port``), made, fed and ended
for each member of a population (:mod:`foxdqn.population.train`, whose members share one
endpoint; a single run is a population of one). docs/usage.md#loggers.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from foxdqn.analysis.results_table import tracker_lines
from foxdqn.config.schema import TrainConfig, run_name, to_plain
from foxdqn.logger.mlflow_log import MlflowLogger, store_folder
from foxdqn.logger.prometheus_log import PrometheusExporter
from foxdqn.logger.wandb_log import WandbLogger
from foxdqn.run.finish import final_metrics, hparams
from foxdqn.timings import mark

log = logging.getLogger(__name__)

#: The row labels of a population's endpoint: the member's index, its Hydra job number, its seed.
MEMBER_LABELS = ("member", "job", "seed")


def open_prometheus(cfg: TrainConfig) -> PrometheusExporter | None:
    """The population's Prometheus endpoint (foxdqn.logger.prometheus_log), or None when
    ``logger.prometheus.port`` is null. Its gauges carry the label ``run`` and, per member's rows
    and guard gauges, :data:`MEMBER_LABELS`.

    Raises:
        ConfigError: the port or address cannot be bound (one line naming the key).
    """
    p = cfg.logger.prometheus
    if p.port is None:
        return None
    labels = {"run": run_name(cfg.experiment, cfg.data.path, cfg.env.id)}
    try:
        exporter = PrometheusExporter(p.port, p.addr, labels, row_labels=MEMBER_LABELS)
    except OSError as exc:
        raise p.bind_error(exc) from None
    log.info("Prometheus metrics on %s while the training runs", exporter.url)
    return exporter


class Trackers:
    """The MLflow run (``logger.mlflow``) and W&B run (``logger.wandb``) of one foxdqn run; either
    attribute is None when its logger is off.

    Args:
        cfg: the run's validated config (its resolved form is logged as the runs' params/config).
        run_dir: the run folder (each logger keeps its run id there).
        overrides: the overrides that tell the run apart in a sweep (the MLflow tag
            ``foxdqn.overrides``); None: the running Hydra job's (a population member gives its own).
        job: the Hydra job number of a population member: the lines naming its runs go to its own
            ``train.log`` and the console (None: a single run; those lines are printed with its results).

    Raises:
        ImportError: mlflow or wandb is not installed.
        OSError: the default MLflow store cannot be made.
    """

    def __init__(self, cfg: TrainConfig, run_dir: Path, overrides: Sequence[str] | None = None,
                 job: int | None = None) -> None:
        self.mlflow = mlflow_run(cfg, run_dir, overrides)
        self.wandb = wandb_run(cfg, run_dir)
        self.ended = False
        if job is not None:
            for line in self.lines():
                log.info("job %d: %s", job, line, extra={"foxdqn_job": job})

    @property
    def sinks(self) -> list:
        """The runs that get every metrics row (:class:`~foxdqn.logger.MetricsLogger`'s ``sinks``)."""
        return [s for s in (self.mlflow, self.wandb) if s is not None]

    def summary(self) -> dict:
        """The summary's entries that say where the runs are: ``mlflow`` (``tracking_uri``,
        ``run_id``) with ``logger=mlflow``, ``wandb`` (``mode``, ``run_id``, ``folder``) with ``logger=wandb``."""
        out = {}
        if self.mlflow is not None:
            out["mlflow"] = {"tracking_uri": self.mlflow.uri, "run_id": self.mlflow.run_id}
        if self.wandb is not None:
            out["wandb"] = {"mode": self.wandb.mode, "run_id": self.wandb.run_id,
                            "folder": None if self.wandb.folder is None else str(self.wandb.folder)}
        return out

    def lines(self) -> list[str]:
        """One line per run, the text the results print (:func:`~foxdqn.analysis.results_table.tracker_lines`)."""
        return [f"{name}: {text}" for name, text in tracker_lines(self.summary())]

    def end(self, status: str, exit_code: int) -> None:
        """End both runs without final metrics: MLflow's with ``status`` (``FAILED``, ``KILLED``),
        W&B's with ``exit_code`` (1: a halt or a failure, 128 + the signal). Once: later calls do nothing."""
        if self.ended:
            return
        self.ended = True
        if self.mlflow is not None:
            self.mlflow.finish(status)
        if self.wandb is not None:
            self.wandb.finish(exit_code)

    def report(self, summary: dict, run_dir: Path) -> None:
        """Log the run's final metrics (:func:`~foxdqn.run.finish.final_metrics` of ``summary``, at its
        last env step; W&B also ``eval/equity.png``) and end both runs as finished."""
        if self.ended:
            return
        self.ended = True
        if self.mlflow is not None:
            self.mlflow.log(int(summary["env_steps"]), final_metrics(summary))
            self.mlflow.finish()
            mark("report")
        if self.wandb is not None:
            self.wandb.log_final(int(summary["env_steps"]), final_metrics(summary), Path(run_dir) / "eval" / "equity.png")
            self.wandb.finish()
            mark("report")


def mlflow_run(cfg: TrainConfig, run_dir: Path, overrides: Sequence[str] | None = None) -> MlflowLogger | None:
    """The run's :class:`~foxdqn.logger.mlflow_log.MlflowLogger` with ``logger.mlflow``, else None."""
    if not cfg.logger.mlflow:
        return None
    tag = " ".join(f"{k}={v}" for k, v in hparams(cfg, None if overrides is None else list(overrides)).items()
                   if k not in ("experiment", "seed"))
    return MlflowLogger(run_dir, cfg.experiment, run_name(cfg.experiment, cfg.data.path, cfg.env.id), to_plain(cfg),
                        cfg.logger.mlflow_uri, tags={"foxdqn.overrides": tag})


def wandb_run(cfg: TrainConfig, run_dir: Path) -> WandbLogger | None:
    """The run's :class:`~foxdqn.logger.wandb_log.WandbLogger` with ``logger.wandb``, else None
    (grouped by the sweep folder in a ``--multirun``)."""
    if not cfg.logger.wandb:
        return None
    folder = store_folder(run_dir)
    group = str(folder.resolve()) if folder != Path(run_dir) else None
    return WandbLogger(run_dir, run_name(cfg.experiment, cfg.data.path, cfg.env.id), to_plain(cfg),
                       mode=str(cfg.logger.wandb_mode), project=cfg.logger.wandb_project,
                       entity=cfg.logger.wandb_entity, group=group)
