"""Metrics to an MLflow tracking store (``logger=mlflow``; the optional extra ``foxdqn[mlflow]``).

One MLflow run per foxdqn run, in the MLflow experiment named after the foxdqn experiment, through
:class:`mlflow.tracking.MlflowClient` (no global active run, so the jobs of a multirun in one
process do not share state). At start: the run's resolved config, flattened to dotted keys
(``optim.lr``, ``agent.gamma``, ...), as params, and its folder and command-line overrides as tags;
at every log boundary: the numbers of the row, at ``step`` = env steps; at the end: the evaluated
split's agent metrics and the validation selection, and the run's status. The MLflow run id and
store are kept in ``<run>/mlflow_run_id``, so a resumed run (``resume=auto``) logs into the same
MLflow run; rows it logged after its checkpoint stay in MLflow (MLflow cannot delete metric points),
metrics.csv drops them.

The store is ``logger.mlflow_uri`` or, when that is null (the default), the SQLite file
``mlflow.db`` of the run folder (a single run) or of the sweep folder (the jobs of a ``--multirun``
share it), created readable by its owner only (mode 0600: params and tags name paths and
settings); never the working folder. ``mlflow ui --backend-store-uri sqlite:///<folder>/mlflow.db``
shows the runs (the UI needs the full ``mlflow`` package, which the extra installs).
"""
from __future__ import annotations

import logging
import math
import numbers
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from foxdqn.io_atomic import write_text_atomic

RUN_ID_FILE = "mlflow_run_id"
#: MLflow's limits: params per log_batch call, characters of a param value
PARAMS_PER_BATCH, PARAM_CHARS = 100, 6000


def default_uri(folder: Path) -> str:
    """The default store of the runs in ``folder``: ``sqlite:///<folder>/mlflow.db`` (absolute). The
    file is created here when missing, empty and with mode 0600 (owner only; SQLite gives its
    journal the same mode), before MLflow opens it.

    Raises:
        OSError: the folder or the file cannot be made.
    """
    import os

    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "mlflow.db"
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        pass
    return "sqlite:///" + str(path)


def store_folder(run_dir: Path) -> Path:
    """Where the default store of a run goes: the sweep folder of a ``--multirun`` job (Hydra's
    ``hydra.sweep.dir``), else the run folder."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
            return Path(HydraConfig.get().sweep.dir)
    except (ImportError, ValueError):  # pragma: no cover - hydra is a dependency
        pass
    return Path(run_dir)


def check_store(uri: str | None) -> None:
    """Raises ImportError (naming the extra to install) when mlflow is absent, ValueError (the
    store's own first line) when the store at ``uri`` cannot be opened (the default store, null,
    is made in the run's own folder later: only the import is checked)."""
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise ImportError("logger=mlflow needs mlflow: pip install 'foxdqn[mlflow]' (or pip install "
                          "mlflow-skinny sqlalchemy alembic)") from exc
    if not uri:
        return
    try:
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - any store error: bad URI, unreachable server, old file store
        raise ValueError(f"{uri}: {str(exc).strip().splitlines()[0][:200]}") from None


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"optim": {"lr": 1e-4}, "model": {"hidden": [64, 64]}}`` → ``{"optim.lr": "0.0001",
    "model.hidden": "[64, 64]"}``: nested dicts to dotted keys, leaves (lists too) as strings cut
    to MLflow's 6,000 characters."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_params(value, name + "."))
        else:
            out[name] = str(value)[:PARAM_CHARS]
    return out


class MlflowLogger:
    """Log foxdqn rows to one MLflow run.

    Args:
        run_dir: the foxdqn run folder (its ``mlflow_run_id`` file is read and written here).
        experiment: the MLflow experiment's name (created when missing).
        run_name: the MLflow run's name (the foxdqn run name).
        params: the run's settings, logged once as params: a nested mapping (the resolved config,
            :func:`flat_params` makes dotted keys) or a flat one.
        uri: the tracking store URI; None: :func:`default_uri` of :func:`store_folder`.
        tags: more tags of the MLflow run (str values).

    Attributes:
        run_id, uri: the MLflow run and its store (printed beside ``outputs:``).

    Raises:
        ImportError: mlflow is not installed.
        OSError: the default store cannot be made.
    """

    def __init__(self, run_dir: Path, experiment: str, run_name: str, params: Mapping[str, Any],
                 uri: str | None = None, tags: Mapping[str, str] | None = None) -> None:
        from mlflow.tracking import MlflowClient

        id_file = Path(run_dir) / RUN_ID_FILE
        if id_file.is_file():  # a resumed run continues its MLflow run, in the store it was made in
            lines = id_file.read_text().split()
            self.run_id, self.uri = lines[0], lines[1] if len(lines) > 1 else (uri or default_uri(store_folder(run_dir)))
            self.client = MlflowClient(tracking_uri=self.uri)
            self.client.update_run(self.run_id, status="RUNNING")
            return
        self.uri = uri or default_uri(store_folder(run_dir))
        self.client = MlflowClient(tracking_uri=self.uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        run = self.client.create_run(experiment_id, run_name=run_name,
                                     tags={"foxdqn.run_dir": str(Path(run_dir).resolve()), **(tags or {})})
        self.run_id = run.info.run_id
        write_text_atomic(id_file, f"{self.run_id}\n{self.uri}\n")
        from mlflow.entities import Param

        batch = [Param(k, v) for k, v in flat_params(params).items()]
        for i in range(0, len(batch), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=batch[i:i + PARAMS_PER_BATCH])

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
