"""Metrics to an MLflow tracking store (``logger=mlflow``; the optional extra ``foxdqn[mlflow]``).

One MLflow run per foxdqn run, in the MLflow experiment named after the foxdqn experiment, through
:class:`mlflow.tracking.MlflowClient` (no global active run, so the jobs of a multirun in one
process do not share state). At start: the run's settings as params (the Hydra overrides, or seed
and experiment) and its folder as a tag; at every log boundary: the numbers of the row, at
``step`` = env steps; at the end: the evaluated split's agent metrics and the validation
selection, and the run's status. The MLflow run id is kept in ``<run>/mlflow_run_id``, so a resumed
run (``resume=auto``) logs into the same MLflow run; rows it logged after its checkpoint stay in
MLflow (MLflow cannot delete metric points), metrics.csv drops them.

The store is ``logger.mlflow_uri``, by default the local SQLite file ``mlflow.db`` of the working
folder (MLflow 3 keeps its plain-folder store ``mlruns/`` for old data only;
``mlflow ui --backend-store-uri sqlite:///mlflow.db`` shows the runs).
"""
from __future__ import annotations

import logging
import math
import numbers
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RUN_ID_FILE = "mlflow_run_id"


def tracking_uri(uri: str | None) -> str:
    """``uri``, or the SQLite store ``mlflow.db`` of the working folder (an absolute ``sqlite:`` URI)."""
    return uri if uri else "sqlite:///" + str((Path.cwd() / "mlflow.db").resolve())


def check_store(uri: str | None) -> None:
    """Raises ImportError (naming the extra to install) when mlflow is absent, ValueError (the
    store's own first line) when the store at ``uri`` cannot be opened."""
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise ImportError("logger=mlflow needs mlflow: pip install 'foxdqn[mlflow]' (or pip install "
                          "mlflow-skinny sqlalchemy alembic)") from exc
    try:
        MlflowClient(tracking_uri=tracking_uri(uri)).search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - any store error: bad URI, unreachable server, old file store
        raise ValueError(f"{tracking_uri(uri)}: {str(exc).strip().splitlines()[0][:200]}") from None


class MlflowLogger:
    """Log foxdqn rows to one MLflow run.

    Args:
        run_dir: the foxdqn run folder (its ``mlflow_run_id`` file is read and written here).
        experiment: the MLflow experiment's name (created when missing).
        run_name: the MLflow run's name (the foxdqn run name).
        params: settings logged once as params (str values, at most 6000 characters each).
        uri: the tracking store URI (see :func:`tracking_uri`).

    Raises:
        ImportError: mlflow is not installed.
    """

    def __init__(self, run_dir: Path, experiment: str, run_name: str, params: Mapping[str, Any],
                 uri: str | None = None) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri(uri))
        id_file = Path(run_dir) / RUN_ID_FILE
        if id_file.is_file():  # a resumed run continues its MLflow run
            self.run_id = id_file.read_text().strip()
            self.client.update_run(self.run_id, status="RUNNING")
            return
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        run = self.client.create_run(experiment_id, run_name=run_name, tags={"foxdqn.run_dir": str(run_dir)})
        self.run_id = run.info.run_id
        from foxdqn.io_atomic import write_text_atomic

        write_text_atomic(id_file, self.run_id + "\n")
        from mlflow.entities import Param

        self.client.log_batch(self.run_id, params=[Param(str(k), str(v)[:6000]) for k, v in params.items()])

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Log the numeric values of ``metrics`` (name → Python number; others are skipped) at ``step``.
        A store that fails (a server gone) costs a warning, never the training run."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(str(k), float(v), now, int(step)) for k, v in metrics.items()
                 if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v))]
        try:
            for i in range(0, len(batch), 1000):  # MLflow's limit per batch
                self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])
        except Exception as exc:  # noqa: BLE001 - logging is not worth a lost run
            logging.getLogger(__name__).warning("MLflow: the rows at step %d were not logged (%s)", step,
                                                str(exc).splitlines()[0][:200])

    def finish(self, status: str = "FINISHED") -> None:
        """Mark the MLflow run ``FINISHED``, ``FAILED`` or ``KILLED`` (a failing store: a warning)."""
        try:
            self.client.set_terminated(self.run_id, status=status)
        except Exception as exc:  # noqa: BLE001
            logging.getLogger(__name__).warning("MLflow: the run's status %s was not set (%s)", status,
                                                str(exc).splitlines()[0][:200])
