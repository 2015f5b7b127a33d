"""The report of a sweep folder (foxdqn.report.tables) on hand-made job folders: a 2x2 sweep (two learning
rates x two seeds), jobs without results, an episodic sweep, plot failures and bad input. The real
2x2 multirun that ends with this report: tests/test_train_cli.py."""
import json
import math

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from support import fake_job

from foxdqn.cli.callbacks import SweepReport
from foxdqn.report import __main__ as report_cli
from foxdqn.report import plots as report_plot
from foxdqn.report import seeds as sweep_seeds
from foxdqn.report import tables as report

PNG = b"\x89PNG"
VALS = [("1e-3", 0, -1.0), ("1e-3", 1, -3.0), ("3e-4", 0, 2.0), ("3e-4", 1, 0.0)]  # job i: lr, seed, val


@pytest.fixture
def sweep(tmp_path):
    """A 2x2 trading sweep; every job logs a validation curve at steps 256 and 512."""
    rng = np.random.default_rng(0)
    common, bh = rng.normal(0, 1e-2, 200), rng.normal(2e-4, 1e-2, 200)
    root = tmp_path / "sweep"
    for num, (lr, seed, val) in enumerate(VALS):
        fake_job(root, str(num), ["debug=smoke", f"optim.lr={lr}", f"seed={seed}"], val,
                 returns=common + rng.normal(0, 1e-3, 200), bh_returns=bh,
                 val_curve={256: rng.normal(), 512: val})
    (root / "multirun.yaml").write_text("hydra: {}\n")
    return root


def test_a_2x2_sweep(sweep, capsys):
    assert report_cli.main([str(sweep)]) == 0
    out = capsys.readouterr().out
    data = json.loads((sweep / "report.json").read_text())
    # every job, best validation first; the swept key and the common overrides told apart
    assert [j["job"] for j in data["jobs"]] == ["2", "3", "0", "1"]
    assert [j["val"] for j in data["jobs"]] == sorted((v for *_, v in VALS), reverse=True)
    assert data["swept"] == ["optim.lr"] and data["common_overrides"] == ["debug=smoke"]
    assert [j["optim.lr"] for j in data["jobs"]] == ["3e-4", "3e-4", "1e-3", "1e-3"]
    assert all(j["status"] == "ok" for j in data["jobs"])
    # the settings are sweep_seeds' aggregation, labelled by the swept key
    expected = sweep_seeds.summarise(sweep_seeds.load_jobs(sweep))
    assert [e["label"] for e in data["settings"]] == ["optim.lr=3e-4", "optim.lr=1e-3"]
    assert [e["selection"]["mean"] for e in data["settings"]] == [e["selection"]["mean"] for e in expected]
    csv = pd.read_csv(sweep / "report.csv")
    assert len(csv) == 4 and {"test_sharpe", "test_total_return", "buy_and_hold_sharpe", "seed"} <= set(csv)
    assert csv["test_sharpe"].tolist() == pytest.approx([j["test_sharpe"] for j in data["jobs"]])
    md = (sweep / "report.md").read_text()
    assert "## Settings over seeds" in md and md.count("| optim.lr=") == 2
    jobs_table = md.split("## Jobs")[1].split("## Plots")[0]
    assert [line.split("|")[1].strip() for line in jobs_table.splitlines() if line.startswith("| ") and
            line.split("|")[1].strip().isdigit()] == ["2", "3", "0", "1"]
    assert sorted(data["plots"]) == ["plots/curves_val_sharpe.png", "plots/vs_optim.lr.png"]
    for rel in data["plots"]:
        assert (sweep / rel).read_bytes()[:4] == PNG and f"]({rel})" in md
    assert not data["warnings"] and not list(sweep.rglob("*.tmp*"))
    assert "| job" in out and "optim.lr=3e-4" in out and f"report: {sweep / 'report.md'}" in out


def test_learning_curves_mean_and_band_over_seeds(sweep):
    data = report.build_report(sweep)
    curves = report._curves(data, "val/sharpe")
    assert list(curves) == ["optim.lr=3e-4", "optim.lr=1e-3"]
    c = curves["optim.lr=3e-4"]
    assert list(c.columns) == ["2", "3"] and list(c.index) == [256, 512]
    assert c.loc[512].tolist() == [2.0, 0.0]  # the last validation value of each seed


def _pandas_by_step(path, column):
    """The learning curve's values as pandas reads them: what ``_metric_by_step`` keeps."""
    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError):
        return None
    if column not in frame or "step" not in frame:
        return None
    s = pd.to_numeric(frame.set_index("step")[column], errors="coerce").dropna()
    return dict(s[~s.index.duplicated(keep="last")].items())


@pytest.mark.parametrize("text", [
    "step,val/sharpe,x\n256,1.5,a\n512,nan,b\n768,-2,c\n",  # a NaN value skipped
    "step,val/sharpe\n256,1.0\n512,2.0\n256,3.0\n1024,4.0\n",  # a repeated step: the last row, at its place
    "step,val/sharpe\n256,1.0\n512,oops\n\n768,0.5\n",  # not a number, a blank line
    "step,val/sharpe,x\n256,1.0,a\n512\n768,0.5,c\n",  # a short row
    "step,val/sharpe\n256,1.0\n512,2.0,9\n",  # more fields than the header: a torn file, no curve
    "step,loss\n256,1.0\n",  # no such column
    "",  # empty
])
def test_metric_by_step_keeps_what_pandas_keeps(tmp_path, text):
    path = tmp_path / "metrics.csv"
    path.write_text(text)
    got, want = report._metric_by_step(path, "val/sharpe"), _pandas_by_step(path, "val/sharpe")
    assert (got is None or got == {}) if want is None else (got == want and list(got) == list(want))


def test_jobs_without_results_are_rows_not_crashes(sweep, capsys):
    (sweep / "4" / ".hydra").mkdir(parents=True)
    (sweep / "4" / ".hydra" / "overrides.yaml").write_text("- debug=smoke\n- optim.lr=1e-2\n- seed=0\n")
    (sweep / "4" / "HALTED").write_text("halt_nan at update 5\n")
    summary = json.loads((sweep / "1" / "eval" / "summary.json").read_text())
    summary["selection"]["value"] = "nan"
    (sweep / "1" / "eval" / "summary.json").write_text(json.dumps(summary))
    (sweep / "0" / "metrics.csv").write_text("")  # a torn log: no curve for that job
    assert report_cli.main([str(sweep)]) == 0
    data = json.loads((sweep / "report.json").read_text())
    assert [j["job"] for j in data["jobs"]] == ["2", "3", "0", "1", "4"]  # no finite value: last
    status = {j["job"]: j["status"] for j in data["jobs"]}
    assert status["4"] == "halted: halt_nan at update 5" and status["1"] == "no finite validation value"
    assert data["jobs"][-1]["val"] is None and "optim.lr=1e-2" not in [e["label"] for e in data["settings"]]
    assert "halted: halt_nan at update 5" in (sweep / "report.md").read_text()
    assert "2 of 5 jobs without results" in capsys.readouterr().out


def test_an_episodic_sweep(tmp_path):
    for num, (lr, seed, ret) in enumerate([("1e-3", 0, 20.0), ("1e-3", 1, 30.0), ("3e-4", 0, 50.0), ("3e-4", 1, 70.0)]):
        fake_job(tmp_path, str(num), [f"optim.lr={lr}", f"seed={seed}"], ret, metric="mean_return", mean_return=ret,
                 val_curve={100: ret / 2, 200: ret})
    data = report.write_report(tmp_path)
    assert data["jobs"]["job"].tolist() == ["3", "2", "1", "0"]
    assert "test_sharpe" not in data["jobs"] and data["settings"][0]["test"]["mean_return"]["mean"] == 60.0
    md = (tmp_path / "report.md").read_text()
    assert "test mean return" in md and "ensemble" not in md and "Sharpe" not in md
    assert sorted(data["plots"]) == ["plots/curves_val_mean_return.png", "plots/vs_optim.lr.png"]


def test_a_folder_of_trading_and_episodic_runs_gets_a_seeds_table_of_each(tmp_path):
    """Runs of both kinds in one folder (a multirun over experiments, or copied runs): one seeds table
    of the trading settings, one of the episodic ones (the first setting's kind was every row's)."""
    rng = np.random.default_rng(3)
    for num, seed in enumerate((0, 1)):
        fake_job(tmp_path, str(num), ["+experiment=eurusd_dqn", f"seed={seed}"], 0.1 * num,
                 returns=rng.normal(0, 1e-2, 50), bh_returns=rng.normal(0, 1e-2, 50))
    for num, seed in enumerate((0, 1), start=2):
        fake_job(tmp_path, str(num), ["+experiment=cartpole_cleanrl", f"seed={seed}"], 30.0 + num,
                 metric="mean_return", mean_return=40.0 + num)
    assert report_cli.main([str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "val mean_return | test mean return |" in md and "ensemble Sharpe" in md
    assert "| experiment=cartpole_cleanrl | 2 |" in md and "| experiment=eurusd_dqn | 2 |" in md


def test_one_setting_per_job_has_no_settings_table(tmp_path):
    for num, gamma in enumerate(["0.9", "0.99", "0.999"]):
        fake_job(tmp_path, str(num), [f"agent.gamma={gamma}"], float(num), metric="mean_return", mean_return=1.0)
    data = report.write_report(tmp_path, plots=False)
    assert report.settings_markdown(data) == "" and "seed" not in report.jobs_markdown(data).splitlines()[0]
    assert "## Settings" not in (tmp_path / "report.md").read_text() and not (tmp_path / "plots").exists()


def test_a_plot_failure_is_a_warning(sweep, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no renderer")

    monkeypatch.setattr(report_plot, "plot_metric_vs_param", broken)
    assert report_cli.main([str(sweep)]) == 0
    data = json.loads((sweep / "report.json").read_text())
    assert data["warnings"] == ["plots/vs_optim.lr.png not drawn: no renderer"]
    assert data["plots"] == ["plots/curves_val_sharpe.png"] and len(data["jobs"]) == 4
    assert "plots/vs_optim.lr.png not drawn: no renderer" in (sweep / "report.md").read_text()


def test_numeric_axis():
    assert report_plot.numeric_axis(["q", "dueling"]) == (None, False)
    x, log = report_plot.numeric_axis(["3e-4", "1e-3"])
    assert x.tolist() == [3e-4, 1e-3] and log
    assert not report_plot.numeric_axis(["0.9", "0.99"])[1] and report_plot.numeric_axis(["nan", "1"])[0] is None
    x, log = report_plot.numeric_axis(["1", "3", "5"])  # an integer key (n-step, batch size): linear
    assert x.tolist() == [1, 3, 5] and not log
    assert report_plot.numeric_axis(["1.0", "5.0"])[1]  # written as floats: a log axis where it spans 3x


def test_a_search_lists_what_it_did_not_count_last_with_rounded_values(tmp_path, capsys):
    """An Optuna-like sweep: unrounded values shown to 4 significant figures; the agent that never
    trades (val 0.0, the highest) and a pruned job are not crowned: listed last, with their status."""
    rng = np.random.default_rng(1)
    root = tmp_path / "search"
    jobs = [("0.000123456789", -1.0, {}), ("0.000987654321", 0.0, {"trades": 0.0, "excluded": "never trades on val"}),
            ("0.000555555555", -0.5, {}), ("0.000333333333", -2.0, {"excluded": "pruned",
                                                                  "stop": {"reason": "pruned", "at_env_steps": 512}})]
    for num, (lr, val, extra) in enumerate(jobs):
        fake_job(root, str(num), [f"optim.lr={lr}", f"replay.n_step={num + 1}", f"replay.prioritized={num % 2 == 0}"], val,
                 returns=rng.normal(0, 1e-2, 100), bh_returns=rng.normal(0, 1e-2, 100), **extra)
    (root / "multirun.yaml").write_text("hydra: {}\n")
    assert report_cli.main([str(root)]) == 0
    out = capsys.readouterr().out
    data = json.loads((root / "report.json").read_text())
    assert [j["job"] for j in data["jobs"]] == ["2", "0", "1", "3"]
    assert [j["status"] for j in data["jobs"]] == ["ok", "ok", "never trades on val and test",
                                                   "pruned at 512 env steps"]
    assert [j["optim.lr"] for j in data["jobs"]][:2] == ["0.000555555555", "0.000123456789"]  # exact in the data
    md = (root / "report.md").read_text()
    assert "| 0.0005556 " in md and "0.000555555555" not in md  # 4 significant figures in the tables
    assert "| true " in md and "| false " in md and "False" not in md  # an Optuna boolean (Python's True) as YAML writes it
    assert [j["replay.prioritized"] for j in data["jobs"]] == ["true", "true", "false", "false"]  # report.json too
    assert "2 of 4 jobs not counted by the search" in out


def test_the_callback_reports_this_multiruns_jobs_only(sweep, capsys):
    callback = SweepReport()
    for num in ("2", "3"):  # 0 and 1: an earlier multirun into the same folder
        callback.on_job_end(OmegaConf.create({"hydra": {"runtime": {"output_dir": str(sweep / num)}}}))
    callback.on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    out = capsys.readouterr().out
    assert [j["job"] for j in json.loads((sweep / "report.json").read_text())["jobs"]] == ["2", "3"]
    assert "| job" in out and "report:" in out


@pytest.mark.parametrize("case", ["missing", "file", "run folder", "empty"])
def test_bad_input_is_one_line_and_exit_2(sweep, tmp_path, capsys, case):
    target = {"missing": tmp_path / "nope", "file": sweep / "multirun.yaml", "run folder": sweep / "0",
              "empty": tmp_path / "empty"}[case]
    if case == "empty":
        target.mkdir()
    assert report_cli.main([str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("foxdqn: error: ")
    assert not list(tmp_path.rglob("report.*"))


def test_usage(capsys):
    assert report_cli.main([]) == 2 and "usage" in capsys.readouterr().err
    assert report_cli.main(["--help"]) == 0 and "usage" in capsys.readouterr().out
    assert math.isnan(report._num("x"))


def test_the_console_shows_the_best_jobs_and_those_without_results_and_says_how_many_are_left(tmp_path, monkeypatch):
    """More jobs than report.CONSOLE_JOBS: the console lists the best ones with results and the
    failed ones, then how many rows report.md adds; report.md has every row."""
    monkeypatch.setattr(report, "CONSOLE_JOBS", 3)
    for num in range(7):
        fake_job(tmp_path, str(num), [f"seed={num}"], float(num), metric="mean_return", mean_return=float(num))
    (tmp_path / "7" / ".hydra").mkdir(parents=True)
    (tmp_path / "7" / ".hydra" / "overrides.yaml").write_text("- seed=7\n")
    (tmp_path / "7" / "HALTED").write_text("halt_nan at update 5\n")
    data = report.write_report(tmp_path, plots=False)
    out = report.console_text(data)
    table = out.split("…")[0]
    rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ") and "job" not in line]
    assert rows == ["6", "5", "4", "7"]
    assert "… 4 more jobs in report.md" in out
    md = (tmp_path / "report.md").read_text()
    assert "more jobs in report.md" not in md and all(f"| {j} " in md for j in range(8))
