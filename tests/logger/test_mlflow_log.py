"""logger=mlflow (foxdqn.logger.mlflow_log): one MLflow run per foxdqn run, its rows and final
metrics, continued by a resumed run; a store that does not open is refused before any work."""
import signal

import pandas as pd
import pytest

from support import skip_module_without

skip_module_without("mlflow")

from foxdqn.run.checkpoint import load_checkpoint  # noqa: E402
from foxdqn.config.compose import load_config  # noqa: E402
from foxdqn.errors import ConfigError  # noqa: E402
from foxdqn.errors import StoppedBySignal as Interrupted  # noqa: E402
from foxdqn.logger.mlflow_log import RUN_ID_FILE  # noqa: E402
from foxdqn.job.check import market_data, preflight  # noqa: E402

from support import interrupt_at, train_run as train  # noqa: E402


def _cfg(uri: str):
    return load_config(["debug=smoke", "debug.max_env_steps=2048", "device=cpu", "log.progress=false",
                        "logger=[csv,mlflow]",
                        f"logger.mlflow_uri={uri}", "log.interval_env_steps=256", "checkpoint.every_env_steps=512"])


@pytest.fixture(scope="module")
def store_tables(tmp_path_factory):
    """An empty MLflow SQLite store with its tables, made once for the file: MLflow's creation of a
    store's tables (its schema migrations, about 2.5 s on 2 cores) is MLflow's own, and a store given
    by logger.mlflow_uri is one that exists; the stores foxdqn makes (the default store of a run
    and of a sweep) are made anew by the tests of them below."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments(max_results=1)
    return path.read_bytes()


def _store(tables: bytes, folder) -> str:
    """The URI of a copy of the empty store ``tables`` in ``folder``."""
    (folder / "mlflow.db").write_bytes(tables)
    return f"sqlite:///{folder / 'mlflow.db'}"


def _run(uri: str, run_dir):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    return client, client.get_run((run_dir / RUN_ID_FILE).read_text().split()[0])


@pytest.mark.slow
def test_a_run_logs_its_rows_params_and_final_metrics(tmp_path, store_tables):
    uri = _store(store_tables, tmp_path)
    cfg = _cfg(uri)
    summary = train(cfg, market_data(cfg), tmp_path / "run")
    client, run = _run(uri, tmp_path / "run")
    assert run.info.status == "FINISHED" and run.info.run_name == "eurusd_dqn"
    # the params are the resolved config, flattened: the keys no override named are there too
    assert run.data.params["seed"] == "0" and run.data.params["experiment"] == "eurusd_dqn"
    assert run.data.params["optim.lr"] == str(cfg.optim.lr) and run.data.params["agent.gamma"] == str(cfg.agent.gamma)
    assert run.data.params["model.hidden"] == str(cfg.model.hidden) and run.data.params["replay.name"] == "uniform"
    assert len(run.data.params) > 100  # more than one log_batch of params (MLflow takes 100 a call)
    assert summary["mlflow"] == {"tracking_uri": uri, "run_id": run.info.run_id}
    csv = pd.read_csv(tmp_path / "run" / "metrics.csv")
    rows = csv.dropna(subset=["train/loss"])
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in history] == rows["step"].tolist()
    assert [m.value for m in history] == pytest.approx(rows["train/loss"].tolist())
    assert run.data.metrics["eval/test/sharpe"] == pytest.approx(summary["metrics"]["agent"]["sharpe"])
    assert run.data.metrics["eval/val_selection"] == pytest.approx(summary["selection"]["value"])


@pytest.mark.slow
def test_a_resumed_run_continues_its_mlflow_run(tmp_path, monkeypatch, store_tables):
    uri = _store(store_tables, tmp_path)
    cfg, run_dir = _cfg(uri), tmp_path / "run"
    market = market_data(cfg)
    interrupt_at(monkeypatch, 20, signal.SIGINT)
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


@pytest.mark.slow
def test_the_default_store_is_in_the_run_folder_and_owner_only(tmp_path, monkeypatch):
    """Null logger.mlflow_uri: mlflow.db of the run folder (mode 0600), nothing in the working folder."""
    import os
    import stat

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    cfg = load_config(["debug=smoke", "debug.max_env_steps=1024", "device=cpu", "log.progress=false",
                       "logger=[csv,mlflow]"])
    preflight(cfg)  # the default store is not opened before the run folder exists
    assert not list(cwd.iterdir())
    summary = train(cfg, market_data(cfg), tmp_path / "run")
    db = tmp_path / "run" / "mlflow.db"
    assert summary["mlflow"]["tracking_uri"] == f"sqlite:///{db}"
    assert stat.S_IMODE(os.stat(db).st_mode) == 0o600
    assert not list(cwd.iterdir())  # no mlflow.db, mlruns/ or mlartifacts/ where the command ran
    client, run = _run(summary["mlflow"]["tracking_uri"], tmp_path / "run")
    assert run.info.status == "FINISHED" and run.info.run_id == summary["mlflow"]["run_id"]
    assert (tmp_path / "run" / RUN_ID_FILE).read_text().split() == [run.info.run_id, f"sqlite:///{db}"]


@pytest.mark.slow
def test_a_sweeps_jobs_share_the_store_of_the_sweep_folder(train_cli, tmp_path):
    """python -m foxdqn.train --multirun logger=mlflow: one mlflow.db in the sweep folder (0600) with
    both jobs' runs; each job prints its run id and the store beside outputs:."""
    import os
    import re
    import stat

    from mlflow.tracking import MlflowClient

    sweep = tmp_path / "sweep"
    res = train_cli(["--multirun", "debug=smoke", "debug.max_env_steps=1024", "logger=[csv,mlflow]", "seed=0,1",
                     f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    db = sweep / "mlflow.db"
    assert stat.S_IMODE(os.stat(db).st_mode) == 0o600 and not (tmp_path / "mlflow.db").exists()
    printed = re.findall(r"mlflow: run (\w+) in (\S+) ", res.stdout)
    assert [uri for _, uri in printed] == [f"sqlite:///{db}"] * 2
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = client.search_runs([client.get_experiment_by_name("eurusd_dqn").experiment_id])
    assert sorted(r.info.run_id for r in runs) == sorted(run_id for run_id, _ in printed)
    assert sorted(r.data.params["seed"] for r in runs) == ["0", "1"]
    assert {r.data.tags["foxdqn.overrides"] for r in runs} == {"debug=smoke debug.max_env_steps=1024 logger=[csv,mlflow]"}
