"""``python -m foxdqn.train`` end to end (CPU, debug=smoke): outputs, bad input, exit codes."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from foxdqn.data.synthetic import make_synthetic_ohlcv, write_csv

ROOT = Path(__file__).resolve().parents[1]
METRIC_KEYS = {"total_return", "sharpe", "sortino", "max_drawdown", "profit_factor", "hit_rate", "turnover",
               "num_trades"}


ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def run(args, cwd):
    return subprocess.run([sys.executable, "-m", "foxdqn.train", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=300)


def assert_outputs(run_dir: Path):
    for rel in ["config.yaml", "metrics.csv", "checkpoints/last.pt", "eval/summary.json", "eval/equity.png"]:
        assert (run_dir / rel).is_file() and (run_dir / rel).stat().st_size > 0, rel
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert set(summary["metrics"]) == {"agent", "buy_and_hold", "flat"}
    for m in summary["metrics"].values():
        assert METRIC_KEYS <= set(m)
    assert summary["metrics"]["flat"]["total_return"] == 0
    return summary


@pytest.mark.slow
def test_default_smoke_writes_every_output(tmp_path):
    res = run(["debug=smoke", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = assert_outputs(tmp_path / "run")
    assert summary["experiment"] == "eurusd_dqn"
    assert "outputs:" in res.stdout
    assert "PSR(SR > 0)" in res.stdout and "selected on val sharpe" in res.stdout and "turnover (x equity/yr)" in res.stdout
    agent, gate = summary["metrics"]["agent"], summary["gate"]  # the deployment gate is on for trading
    assert gate["chosen"] == "flat" and "gate: flat on the test split" in res.stdout  # a smoke agent shows no edge
    assert agent["num_trades"] == 0 and gate["candidates"][-1]["test"]["num_trades"] > 0  # as trained, it trades
    assert 0 <= agent["psr_vs_buy_and_hold"] <= 1
    assert agent["sharpe_ci95_low"] <= agent["sharpe_ci95_high"]
    assert summary["selection"]["split"] == "val" and summary["selection"]["metric"] == "sharpe"
    assert "turnover" in summary["units"]
    equity = (tmp_path / "run" / "eval" / "equity.csv").read_text().splitlines()
    assert equity[0] == "timestamp,agent_equity,buy_and_hold_equity,flat_equity,agent_exposure"
    assert len(equity) == summary["bars"] + 2
    assert summary["bars"] == 256  # debug=smoke: debug.max_eval_bars, the test walk's first 256 bars
    log = (tmp_path / "run" / "train.log").read_text()
    assert_timings(tmp_path / "run", summary, log)
    # the console ends with the results; the action-diversity lines and the breakdown are in train.log only
    assert res.stdout.rstrip().splitlines()[-1].startswith("outputs: ")
    assert "actions at " in log and "actions at " not in res.stdout + res.stderr
    assert "start-up breakdown" not in res.stdout + res.stderr


def assert_timings(run_dir: Path, summary: dict, log: str):
    """timings.json (foxdqn.timings): the phases a CPU run passes, consecutive (they sum to the total)."""
    from foxdqn.timings import PHASES

    times = json.loads((run_dir / "timings.json").read_text())
    phases = times["phases"]
    assert {"imports", "compose", "validate", "data_load", "preflight", "build", "warmup", "training", "validation",
            "checkpoint", "final_evaluation", "report", "summary"} <= set(phases) <= set(PHASES), phases
    assert all(v >= 0 for v in phases.values())
    assert abs(sum(phases.values()) - times["total_s"]) < 1e-3 * len(phases)
    assert times["overhead_s"] == pytest.approx(times["total_s"] - phases["training"], abs=1e-3)
    assert phases["imports"] > 0.1 and phases["training"] > 0  # torch alone takes longer to import
    assert times["training_wall_s"] == summary["wall_time_s"] and times["env_steps"] == summary["env_steps"]
    assert "start-up breakdown: wall" in log


@pytest.mark.slow
def test_multirun_writes_the_report(train_cli, tmp_path):
    """foxdqn.report.tables on a real 2x2 sweep (two learning rates x two seeds), written by the callback."""
    sweep = tmp_path / "sweep"
    res = train_cli(["--multirun", "debug=smoke", "debug.max_env_steps=1024", "eval.interval_env_steps=512", "seed=0,1",
               "optim.lr=3e-4,1e-3", f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads((sweep / "report.json").read_text())
    settings = report["settings"]
    assert len(settings) == 2 and all(e["seeds"] == 2 for e in settings)
    assert {e["setting"] for e in settings} == {
        "debug=smoke debug.max_env_steps=1024 eval.interval_env_steps=512 optim.lr=0.0003",
        "debug=smoke debug.max_env_steps=1024 eval.interval_env_steps=512 optim.lr=0.001"}
    assert report["swept"] == ["optim.lr"] and len(report["jobs"]) == 4
    for values in ([e["selection"]["mean"] for e in settings], [j["val"] for j in report["jobs"]]):
        assert values == sorted(values, reverse=True)  # best validation first
    assert all(j["status"] in ("ok", "gate: flat") for j in report["jobs"])
    assert sorted(report["plots"]) == ["plots/curves_val_sharpe.png", "plots/vs_optim.lr.png"]
    assert all((sweep / p).stat().st_size > 0 for p in report["plots"])
    assert "| job" in res.stdout and f"report: {sweep / 'report.md'}" in res.stdout


@pytest.mark.parametrize("kind", ["googl", "csv"])
def test_other_data_smoke(train_cli, tmp_path, kind):
    if kind == "googl":
        args = ["+experiment=googl_dqn"]
    else:
        csv = write_csv(make_synthetic_ohlcv(1500, drift_per_bar=2e-4, vol=3e-3, seed=5), tmp_path / "my bars.csv")
        args = [f"data.path={csv}"]
    res = train_cli([*args, "debug=smoke"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    (run_dir,) = (tmp_path / "outputs").glob("*/*")
    summary = assert_outputs(run_dir)
    name = {"googl": "googl_dqn", "csv": "dqn_my_bars"}[kind]  # the user's file names the run, not eurusd_dqn
    assert run_dir.parent.name == summary["run_name"] == name
    assert f"{name} — test split" in res.stdout


def _bad_csv(tmp_path):
    df = make_synthetic_ohlcv(400, seed=1)
    df = df.drop(columns=["low"])
    return write_csv(df, tmp_path / "no_low.csv")


@pytest.mark.parametrize("args, needle", [
    (["agent.gamma=2"], "agent.gamma"),
    (["optim.lr=fast"], "optim.lr"),
    (["+experiment=nope"], "experiment"),
    (["data.path=/no/such/file.csv"], "/no/such/file.csv"),
    (["BAD_CSV"], "low"),
    (["env.execution.taker_fee_bps=-1"], "env.execution.taker_fee_bps"),
    (["agent.lrr=1e-3"], "agent.lrr"),
    (["optim.lr=nan"], "optim.lr"),
    (["replay.capacity=1000000000000"], "replay.capacity"),
    (["--multirun", "optim.lr=1e-4,-1", "debug=smoke"], "optim.lr"),
    (["env.execution.ioc_fill_rule=range"], "env.execution.ioc_fill_rule: removed"),
    (["experiment=googl_dqn"], "use +experiment=googl_dqn"),  # Hydra's own hint is kept
    (["agent.lr=1e-3"], "agent.lr moved to optim.lr"),
    (["head.name=c99"], "head.name='c99' is not allowed; choose one of q, dueling, c51, iqn"),
    (["graph=false"], "quote the word"),
    (["optim.lr=${oops}"], "optim.lr: Interpolation key 'oops' not found"),
    (["--multirun", "seed=0,1", "data.path=${oc.env:FOXDQN_NO_SUCH_VAR}"], "data.path:"),
    (["--multirun", "head=q,c99", "debug=smoke"], "job head=c99"),
    (["--multirun", "head=glob(*)", "+experiment=eurusd_iql", "debug=smoke"], "job head=c51"),  # globs listed too
    (["+env.execution.ioc_fill_rule=marketable"], "env.execution.ioc_fill_rule: removed"),
    (["data.name=martingale_1h", "data.synthetic.phi=0.2"],
     "data.synthetic.phi is not a parameter of data.name=martingale_1h"),
])
def test_bad_input_one_line_exit_2_no_run_dir(train_cli, tmp_path, args, needle):
    args = [f"data.path={_bad_csv(tmp_path)}" if a == "BAD_CSV" else a for a in args]
    res = train_cli([*args, f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert needle in lines[0] and "Traceback" not in res.stderr
    assert not (tmp_path / "run").exists()


def test_output_folder_under_a_file_is_one_line_exit_2(train_cli, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    res = train_cli(["debug=smoke", f"hydra.run.dir={blocker / 'run'}"], cwd=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "is a file" in res.stderr and str(blocker) in res.stderr


def _user_conf(tmp_path) -> Path:
    """A config folder of the user's own: one good experiment, one that sets a key that moved."""
    folder = tmp_path / "myconf" / "experiment"
    folder.mkdir(parents=True)
    (folder / "mine.yaml").write_text("# @package _global_\ndefaults:\n  - override /head: q\n"
                                      "experiment: mine\noptim:\n  lr: 1.0e-3\n")
    (folder / "old.yaml").write_text("# @package _global_\nexperiment: old\nagent:\n  lr: 1.0e-3\n")
    return tmp_path / "myconf"


def test_user_experiment_runs_from_its_own_config_dir(train_cli, tmp_path):
    conf = _user_conf(tmp_path)
    res = train_cli(["--config-dir", str(conf), "+experiment=mine", "debug=smoke", "debug.max_env_steps=1024",
               f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = assert_outputs(tmp_path / "run")
    assert summary["experiment"] == "mine"
    written = (tmp_path / "run" / "config.yaml").read_text()
    assert "name: q" in written and "lr: 0.001" in written


def test_a_primary_config_of_ones_own_starts_from_train_yaml(train_cli, tmp_path):
    conf = tmp_path / "myconf"
    conf.mkdir()
    (conf / "mytrain.yaml").write_text("defaults:\n  - train\n  - override head: q\n  - _self_\noptim:\n  lr: 1.0e-3\n")
    res = train_cli(["--config-dir", str(conf), "--config-name", "mytrain", "debug=smoke", "debug.max_env_steps=1024",
               f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    written = (tmp_path / "run" / "config.yaml").read_text()
    assert "name: q" in written and "lr: 0.001" in written


@pytest.mark.parametrize("how", ["config-dir", "searchpath"])
def test_user_config_folder_is_checked_like_ours(train_cli, tmp_path, how):
    """Every job of a multirun is composed from the user's folder too, before any runs."""
    conf = _user_conf(tmp_path)
    where = ["--config-dir", str(conf)] if how == "config-dir" else [f"hydra.searchpath=[file://{conf}]"]
    res = train_cli(["--multirun", *where, "+experiment=mine,old", "debug=smoke", f"hydra.sweep.dir={tmp_path / 's'}"],
              cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip() == ("foxdqn: error: job +experiment=old debug=smoke: experiment/old: agent.lr moved to "
                                  "optim.lr; set optim.lr=... (docs/configuration.md)")
    assert not (tmp_path / "s").exists()


def test_help_is_foxdqns_own(train_cli, tmp_path):
    """--help: the commands, the experiments and groups, where the docs are; not Hydra's 200-line default."""
    from foxdqn.config.compose import experiment_names

    res = train_cli(["--help"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    assert len(lines) < 45 and "Powered by Hydra" not in res.stdout
    assert "python -m foxdqn.train" in res.stdout and "python -m foxdqn.evaluate" in res.stdout
    experiments = next(line for line in lines if line.startswith("experiment: "))
    assert experiments.split(": ", 1)[1].split(", ") == experiment_names()
    assert "hparams_search: " in res.stdout and "docs/" in res.stdout and "usage.md" in res.stdout
    assert not list(tmp_path.iterdir())  # no run folder
