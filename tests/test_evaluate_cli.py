"""``python -m foxdqn.evaluate checkpoint=PATH ...`` (foxdqn.evaluate), on a CPU smoke run."""
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from foxdqn.evaluate import evaluate_checkpoint, main
from foxdqn.io_atomic import read_json
from foxdqn.config.compose import load_config
from foxdqn.job.check import market_data

from support import train_run as train

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    cfg = load_config(["debug=smoke", "device=cpu", "log.progress=false", "logger=csv"])
    path = tmp_path_factory.mktemp("run")
    train(cfg, market_data(cfg), path)
    return path


def test_reproduces_the_runs_test_summary(run_dir):
    summary, folder = evaluate_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert folder == run_dir / "evaluations" / "last_test"
    assert summary["metrics"] == read_json(run_dir / "eval" / "summary.json")["metrics"]
    assert summary["run_name"] == "eurusd_dqn"
    for name in ("summary.json", "equity.csv", "equity.png", "trades.csv"):
        assert (folder / name).is_file()
    trades = pd.read_csv(folder / "trades.csv")
    assert list(trades.columns) == ["timestamp", "action", "order_type", "fill_price", "fee", "position", "equity"]
    assert len(trades) == summary["metrics"]["agent"]["num_trades"]
    assert set(trades["order_type"]) <= {"market", "limit_maker", "ioc"} and (trades["fill_price"] > 0).all()


def test_a_run_folder_means_its_last_checkpoint(run_dir):
    from foxdqn.evaluate import parse_args

    assert parse_args([f"checkpoint={run_dir}"])[0] == run_dir / "checkpoints" / "last.pt"


def test_evaluations_with_other_settings_get_their_own_folder(run_dir, tmp_path):
    from foxdqn.evaluate import folder_name

    last = run_dir / "checkpoints" / "last.pt"
    assert folder_name(last, "test", []) == "last_test"
    assert folder_name(last, "test", ["env.execution.taker_fee_bps=5", "data.path=/x/my bars.csv"]) == \
        "last_test_taker_fee_bps=5_my_bars"
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main([f"checkpoint={last}", f"out={blocker / 'sub'}"]) == 2


def test_an_evaluation_of_other_settings_never_takes_a_folder_of_the_same_name(tmp_path):
    """Names keep each key's last part (seed=5 for seed and data.synthetic.seed): a folder holding
    another evaluation is kept, the new one goes to name_2; the same evaluation again replaces its own."""
    import json

    from foxdqn.evaluate import free_folder

    ckpt = tmp_path / "run" / "checkpoints" / "last.pt"
    (tmp_path / "ev" / "last_test_seed=5").mkdir(parents=True)
    (tmp_path / "ev" / "last_test_seed=5" / "summary.json").write_text(
        json.dumps({"checkpoint": str(ckpt.resolve()), "overrides": ["seed=5"]}))
    assert free_folder(tmp_path / "ev", "last_test_seed=5", ckpt, ["seed=5"]).name == "last_test_seed=5"
    assert free_folder(tmp_path / "ev", "last_test_seed=5", ckpt, ["data.synthetic.seed=5"]).name == "last_test_seed=5_2"
    assert free_folder(tmp_path / "ev", "last_test_seed=5", tmp_path / "other.pt", ["seed=5"]).name == "last_test_seed=5_2"
    assert free_folder(tmp_path / "ev", "last_test", ckpt, []).name == "last_test"  # a free name


def test_other_split_costs_and_folder(run_dir, tmp_path):
    summary, folder = evaluate_checkpoint(run_dir / "checkpoints" / "last.pt", "val", tmp_path / "out",
                                          ["env.execution.taker_fee_bps=5"])
    assert folder == tmp_path / "out" and summary["split"] == "val"
    assert summary["period"][0] < read_json(run_dir / "eval" / "summary.json")["period"][0]
    assert summary["out_of_sample"] is False  # the run's validation bars (checkpoint selection)
    other, _ = evaluate_checkpoint(run_dir / "checkpoints" / "last.pt", "val", tmp_path / "other",
                                   ["data.name=googl_1d"])
    test, _ = evaluate_checkpoint(run_dir / "checkpoints" / "last.pt", "test", tmp_path / "test")
    assert other["out_of_sample"] is True and test["out_of_sample"] is True  # another file's bars; the test split
    same, _ = evaluate_checkpoint(run_dir / "checkpoints" / "last.pt", "val", tmp_path / "same", ["data.name=eurusd_1h"])
    moved, _ = evaluate_checkpoint(run_dir / "checkpoints" / "last.pt", "test", tmp_path / "moved",
                                   ["data.split.train=0.4", "data.split.val=0.3", "data.split.test=0.3"])
    assert same["out_of_sample"] is False  # the run's own file named again: its validation bars
    assert moved["out_of_sample"] is False  # a "test" split that starts inside the run's validation bars


def test_a_smoke_checkpoint_evaluates_the_whole_split_with_the_cap_lifted(run_dir, tmp_path):
    """debug=smoke's run walked 256 bars of the test split (debug.max_eval_bars); the evaluation
    walks the same 256 by default, and the whole split with debug.max_eval_bars=null, in a folder
    of its own; the walk's first 256 bars are those of the run's."""
    last = run_dir / "checkpoints" / "last.pt"
    run = read_json(run_dir / "eval" / "summary.json")
    whole, folder = evaluate_checkpoint(last, overrides=["debug.max_eval_bars=null"])
    assert run["bars"] == 256 and whole["bars"] > 900 and folder.name == "last_test_max_eval_bars=null"
    assert whole["period"][0] == run["period"][0] and whole["period"][1] > run["period"][1]
    ours = pd.read_csv(run_dir / "eval" / "equity.csv")
    theirs = pd.read_csv(folder / "equity.csv").iloc[:len(ours)]
    pd.testing.assert_frame_equal(ours, theirs)


@pytest.mark.parametrize("args, needle", [
    ([], "usage"),
    (["checkpoint=MISSING"], "error: checkpoint="),  # the argument as the user named it (not resume=)
    (["checkpoint=FOREIGN"], "not a foxdqn checkpoint"),
    (["checkpoint=LAST", "optim.lr=1"], "agent"),
    (["checkpoint=LAST", "split=future"], "split"),
    (["checkpoint=LAST", "data.nope=1"], "override"),
    (["LAST"], "key=value"),
])
def test_bad_input_is_one_line_and_exit_2(run_dir, tmp_path, capsys, args, needle):
    foreign = tmp_path / "foreign.pt"
    foreign.write_bytes(b"\x00not a checkpoint")
    table = {"MISSING": str(tmp_path / "nope.pt"), "FOREIGN": str(foreign),
             "LAST": str(run_dir / "checkpoints" / "last.pt")}
    args = [a.replace(k, v) for a in args for k, v in [next(((k, v) for k, v in table.items() if k in a), ("", ""))]]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) <= 2


@pytest.mark.slow
def test_module_entry_point(run_dir):
    res = subprocess.run([sys.executable, "-m", "foxdqn.evaluate", f"checkpoint={run_dir / 'checkpoints' / 'last.pt'}",
                          "split=val"], env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "val split" in res.stdout and (run_dir / "evaluations" / "last_val" / "trades.csv").is_file()
    assert "split=val walks bars the run trained or chose its checkpoint on" in res.stderr
    assert "not out of sample" in res.stderr


def test_an_evaluation_is_titled_after_the_run_it_evaluates():
    """A run trained on the user's bars.csv is dqn_bars in its evaluations too, even on other data."""
    from foxdqn.evaluate import trained_name

    cfg = load_config(["data.path=/elsewhere/other.csv"])  # the evaluation's data
    assert trained_name({"config": {"data": {"path": "/x/bars.csv"}, "env": {"id": None}}}, cfg) == "dqn_bars"
    assert trained_name({"config": {"data": {"path": None}, "env": {"id": None}}}, cfg) == "eurusd_dqn"
