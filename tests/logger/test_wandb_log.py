"""logger=wandb (foxdqn.logger.wandb_log): one offline W&B run per foxdqn run with the resolved
config, every metrics row, the final test metrics and the equity plot; a halt or a signal marks it
crashed and a resumed run continues it. Offline: no network."""
import json
import signal

import pandas as pd
import pytest

from support import skip_module_without

skip_module_without("wandb")

from foxdqn.run.checkpoint import load_checkpoint  # noqa: E402
from foxdqn.config.compose import load_config  # noqa: E402
from foxdqn.errors import ConfigError  # noqa: E402
from foxdqn.errors import StoppedBySignal as Interrupted  # noqa: E402
from foxdqn.logger.wandb_log import RUN_ID_FILE  # noqa: E402
from foxdqn.job.check import market_data, preflight  # noqa: E402

from support import interrupt_at, train_run as train, wandb_history, wandb_offline_runs  # noqa: E402


def _cfg(*more):
    return load_config(["debug=smoke", "debug.max_env_steps=2048", "device=cpu", "log.progress=false",
                        "logger=[csv,wandb]", "log.interval_env_steps=256", "checkpoint.every_env_steps=512", *more])


def test_an_offline_run_has_the_config_every_row_the_final_metrics_and_the_equity_plot(tmp_path):
    cfg = _cfg()
    summary = train(cfg, market_data(cfg), tmp_path / "run")
    run_id = (tmp_path / "run" / RUN_ID_FILE).read_text().strip()
    files, (records,) = wandb_offline_runs(tmp_path / "run")
    assert files[0].name == f"run-{run_id}.wandb"
    assert summary["wandb"] == {"mode": "offline", "run_id": run_id, "folder": str(files[0].parent)}
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["optim"]["lr"] == cfg.optim.lr and config["agent"]["gamma"] == cfg.agent.gamma  # resolved, nested
    assert config["experiment"] == "eurusd_dqn" and run.display_name == "eurusd_dqn" and run.project == "foxdqn"
    history = wandb_history(records)
    csv = pd.read_csv(tmp_path / "run" / "metrics.csv").dropna(subset=["train/loss"])
    losses = [(h["_step"], h["train/loss"]) for h in history if "train/loss" in h]
    assert [s for s, _ in losses] == csv["step"].tolist()
    assert [v for _, v in losses] == pytest.approx(csv["train/loss"].tolist())
    final = [h for h in history if "eval/test/sharpe" in h]
    assert len(final) == 1 and final[0]["_step"] == summary["env_steps"]
    assert final[0]["eval/test/sharpe"] == pytest.approx(summary["metrics"]["agent"]["sharpe"])
    assert final[0]["eval/val_selection"] == pytest.approx(summary["selection"]["value"])
    assert final[0]["eval/equity/_type"] == "image-file"  # the equity plot, as an image
    assert list(files[0].parent.glob("files/media/images/eval/equity_*.png"))
    exits = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert [e.exit_code for e in exits] == [0]


def test_a_signal_marks_the_run_crashed_and_resume_continues_it(tmp_path, monkeypatch):
    cfg, run_dir = _cfg(), tmp_path / "run"
    market = market_data(cfg)
    interrupt_at(monkeypatch, 20, signal.SIGINT)
    with pytest.raises(Interrupted):
        train(cfg, market, run_dir)
    monkeypatch.undo()
    run_id = (run_dir / RUN_ID_FILE).read_text().strip()
    train(cfg, market, run_dir, resume=load_checkpoint(run_dir / "checkpoints" / "last.pt"))
    files, runs = wandb_offline_runs(run_dir)
    assert [f.name for f in files] == [f"run-{run_id}.wandb"] * 2  # the same W&B run, continued
    exits = [[r.exit.exit_code for r in recs if r.WhichOneof("record_type") == "exit"] for recs in runs]
    assert exits == [[130], [0]]
    steps = [h["_step"] for h in wandb_history(runs[1]) if "train/loss" in h]
    assert steps and steps[-1] == cfg.agent.total_env_steps


def test_online_without_a_login_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))
    with pytest.raises(ConfigError, match=r"^logger\.wandb_mode=online needs a W&B login"):
        preflight(_cfg("logger.wandb_mode=online"))
