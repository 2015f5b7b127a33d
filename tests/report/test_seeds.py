"""Seeds aggregation of a multirun folder (foxdqn.report.seeds), on hand-made job folders."""
import numpy as np
import pandas as pd
import pytest
from support import fake_job

from foxdqn.report import seeds as sweep_seeds
from foxdqn.analysis.significance import probabilistic_sharpe_ratio


@pytest.fixture
def sweep(tmp_path):
    rng = np.random.default_rng(0)
    common = rng.normal(0, 1e-2, 300)  # the bars every seed trades
    bh = rng.normal(2e-4, 1e-2, 300)
    for num, (lr, seed, val) in enumerate([("1e-3", 0, -1.0), ("1e-3", 1, -3.0), ("3e-4", 0, 2.0), ("3e-4", 1, 0.0)]):
        noise = rng.normal(0, 1e-3, 300)
        fake_job(tmp_path, str(num), [f"optim.lr={lr}", f"seed={seed}"], val, returns=common + noise, bh_returns=bh)
    (tmp_path / "multirun.yaml").write_text("hydra: {}\n")
    return tmp_path


def test_groups_by_everything_but_the_seed_and_sorts_by_validation(sweep):
    settings = sweep_seeds.summarise(sweep_seeds.load_jobs(sweep))
    assert [e["setting"] for e in settings] == ["optim.lr=3e-4", "optim.lr=1e-3"]  # val means 1.0 > -2.0
    assert [e["seeds"] for e in settings] == [2, 2]
    assert settings[0]["selection"] == {"mean": 1.0, "std": pytest.approx(np.sqrt(2.0)), "min": 0.0, "max": 2.0}


def test_lower_is_better_for_max_drawdown(tmp_path):
    for num, (lr, val) in enumerate([("1e-3", 0.3), ("3e-4", 0.1)]):
        fake_job(tmp_path, str(num), [f"optim.lr={lr}"], val, metric="max_drawdown", mean_return=1.0)
    assert [e["setting"] for e in sweep_seeds.summarise(sweep_seeds.load_jobs(tmp_path))] == \
        ["optim.lr=3e-4", "optim.lr=1e-3"]


def test_the_ensemble_averages_the_seeds_returns_bar_by_bar(sweep):
    settings = sweep_seeds.summarise(sweep_seeds.load_jobs(sweep))
    curves = [pd.read_csv(sweep / j / "eval" / "equity.csv")["agent_equity"].to_numpy() for j in ("2", "3")]
    mean_r = np.mean([c[1:] / c[:-1] - 1 for c in curves], axis=0)
    ens = settings[0]["ensemble"]
    assert ens["psr_vs_zero"] == pytest.approx(probabilistic_sharpe_ratio(mean_r))
    assert ens["sharpe_ci95_low"] < ens["sharpe"] < ens["sharpe_ci95_high"]
    assert 0 <= ens["psr_vs_buy_and_hold"] <= 1


def test_a_broken_equity_csv_drops_the_ensemble_only(sweep):
    (sweep / "2" / "eval" / "equity.csv").write_text("timestamp,other\n0,1\n1,1\n2,1\n3,1\n")
    settings = sweep_seeds.summarise(sweep_seeds.load_jobs(sweep))
    assert settings[0]["ensemble"] is None and settings[1]["ensemble"] is not None


def test_job_folders_in_number_order_and_why_a_job_has_no_results(sweep):
    for name in ("10", "11", "12"):
        (sweep / name / ".hydra").mkdir(parents=True)
        (sweep / name / ".hydra" / "overrides.yaml").write_text("- seed=5\n")
    (sweep / "10" / "HALTED").write_text("halt_nan at step 5\n")
    (sweep / "11" / "INCOMPLETE").write_text("started\n")
    (sweep / "12" / "eval").mkdir()
    (sweep / "12" / "eval" / "summary.json").write_text("{not json")
    dirs = sweep_seeds.find_job_dirs(sweep)
    assert [d.name for d in dirs] == ["0", "1", "2", "3", "10", "11", "12"]
    problems = {d.name: sweep_seeds.read_job(d)["problem"] for d in dirs}
    assert problems["0"] is None and problems["10"] == "halted: halt_nan at step 5"
    assert problems["11"].startswith("no eval/summary.json (INCOMPLETE")
    assert problems["12"].startswith("unreadable eval/summary.json")
    assert [j["dir"].name for j in sweep_seeds.load_jobs(sweep)] == ["0", "1", "2", "3"]


@pytest.mark.parametrize("text,want", [
    ("- optim.lr=3e-4\n- seed=2\n", ["optim.lr=3e-4", "seed=2"]),
    ("- env.random_start=True\n- 'model.hidden=[64,64]'\n- +x=${y}\n",  # a sweeper's True; quoted; raw
     ["env.random_start=true", "model.hidden=[64,64]", "+x=${y}"]),
    ("", []),
])
def test_overrides_as_hydra_wrote_them(tmp_path, text, want):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text(text)
    assert sweep_seeds.read_job(tmp_path)["overrides"] == want


@pytest.mark.parametrize("text", ["just a string\n", "- [unclosed\n"])
def test_an_overrides_file_that_is_not_a_list_is_the_jobs_problem(tmp_path, text):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text(text)
    job = sweep_seeds.read_job(tmp_path)
    assert job["overrides"] == [] and job["problem"].startswith("unreadable .hydra/overrides.yaml")


def test_the_ensemble_policy_is_read_when_every_seed_holds_the_same_entry(sweep):
    import json

    policy = {"rule": "mean", "members": [2, 3], "split": "test",
              "metrics": {"total_return": 0.05, "sharpe": 1.5, "max_drawdown": 0.02, "num_trades": 7,
                          "psr_vs_zero": 0.9, "sortino": 2.0}}
    for job in ("2", "3"):
        path = sweep / job / "eval" / "summary.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "ensemble_policy": policy}))
    settings = sweep_seeds.summarise(sweep_seeds.load_jobs(sweep))
    assert settings[0]["ensemble_policy"] == {"rule": "mean", "members": [2, 3], "total_return": 0.05, "sharpe": 1.5,
                                              "max_drawdown": 0.02, "num_trades": 7, "psr_vs_zero": 0.9}
    assert settings[1]["ensemble_policy"] is None  # its seeds did not train as one population
    table = sweep_seeds.to_markdown(settings)
    assert "+5.00 %, 7 (mean)" in table and table.splitlines()[1].count("---") == table.splitlines()[0].count("|") - 1
    path = sweep / "3" / "eval" / "summary.json"  # one seed of another population: no shared policy
    path.write_text(json.dumps({**json.loads(path.read_text()), "ensemble_policy": {**policy, "members": [3, 9]}}))
    assert sweep_seeds.summarise(sweep_seeds.load_jobs(sweep))[0]["ensemble_policy"] is None
