"""logger=mlflow (foxdqn.monitor.mlflow_log): one MLflow run per foxdqn run, its rows and final
metrics, continued by a resumed run; a store that does not open is refused before any work."""
import signal

import pandas as pd
import pytest

pytest.importorskip("mlflow")

from foxdqn.checkpoint import load_checkpoint  # noqa: E402
from foxdqn.compose import load_config  # noqa: E402
from foxdqn.errors import ConfigError  # noqa: E402
from foxdqn.loop import Interrupted, train  # noqa: E402
from foxdqn.monitor.mlflow_log import RUN_ID_FILE  # noqa: E402
from foxdqn.train import market_data, preflight  # noqa: E402

from support import interrupt_at  # noqa: E402


def _cfg(uri: str):
    return load_config(["debug=smoke", "device=cpu", "log.progress=false", "logger=[csv,mlflow]",
                        f"logger.mlflow_uri={uri}", "log.interval_env_steps=256", "checkpoint.every_env_steps=512"])


def _run(uri: str, run_dir):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    return client, client.get_run((run_dir / RUN_ID_FILE).read_text().strip())


def test_a_run_logs_its_rows_params_and_final_metrics(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = _cfg(uri)
    summary = train(cfg, market_data(cfg), tmp_path / "run")
    client, run = _run(uri, tmp_path / "run")
    assert run.info.status == "FINISHED" and run.info.run_name == "eurusd_dqn"
    assert run.data.params["seed"] == "0" and run.data.params["experiment"] == "eurusd_dqn"
    csv = pd.read_csv(tmp_path / "run" / "metrics.csv")
    rows = csv.dropna(subset=["train/loss"])
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in history] == rows["step"].tolist()
    assert [m.value for m in history] == pytest.approx(rows["train/loss"].tolist())
    assert run.data.metrics["eval/test/sharpe"] == pytest.approx(summary["metrics"]["agent"]["sharpe"])
    assert run.data.metrics["eval/val_selection"] == pytest.approx(summary["selection"]["value"])


def test_a_resumed_run_continues_its_mlflow_run(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg, run_dir = _cfg(uri), tmp_path / "run"
    market = market_data(cfg)
    interrupt_at(monkeypatch, 40, signal.SIGINT)
    with pytest.raises(Interrupted):
        train(cfg, market, run_dir)
    monkeypatch.undo()
    _, cut = _run(uri, run_dir)
    assert cut.info.status == "KILLED"
    train(cfg, market, run_dir, resume=load_checkpoint(run_dir / "checkpoints" / "last.pt"))
    client, done = _run(uri, run_dir)
    assert done.info.run_id == cut.info.run_id and done.info.status == "FINISHED"
    assert len(client.search_runs([done.info.experiment_id])) == 1
    last = max(m.step for m in client.get_metric_history(done.info.run_id, "train/loss"))
    assert last == cfg.agent.total_env_steps


def test_a_store_that_does_not_open_is_refused_before_any_work(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match=r"^logger\.mlflow_uri: the MLflow store sqlite:///.*a_file/mlflow\.db: "):
        preflight(_cfg(f"sqlite:///{blocker / 'mlflow.db'}"))
