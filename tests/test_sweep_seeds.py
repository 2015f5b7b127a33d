"""The seeds report of a multirun folder (foxdqn.sweep_seeds), on hand-made job folders."""
import json

import numpy as np
import pandas as pd
import pytest

from foxdqn import sweep_seeds
from foxdqn.significance import probabilistic_sharpe_ratio


def _job(root, num, overrides, val, returns, bh_returns):
    job = root / str(num)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (job / "eval").mkdir()
    equity = np.concatenate([[1.0], np.cumprod(1 + returns)])
    bh = np.concatenate([[1.0], np.cumprod(1 + bh_returns)])
    pd.DataFrame({"timestamp": range(equity.size), "agent_equity": equity, "buy_and_hold_equity": bh,
                  "flat_equity": 1.0}).to_csv(job / "eval" / "equity.csv", index=False)
    summary = {"split": "test", "bars_per_year": 252.0, "selection": {"metric": "sharpe", "value": val},
               "metrics": {"agent": {"total_return": equity[-1] - 1, "sharpe": float(np.mean(returns) / np.std(returns, ddof=1) * np.sqrt(252)),
                                     "max_drawdown": 0.1, "num_trades": 10.0},
                           "buy_and_hold": {"total_return": bh[-1] - 1, "sharpe": 1.0}}}
    (job / "eval" / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def sweep(tmp_path):
    rng = np.random.default_rng(0)
    common = rng.normal(0, 1e-2, 300)  # the bars every seed trades
    bh = rng.normal(2e-4, 1e-2, 300)
    for num, (lr, seed, val) in enumerate([("1e-3", 0, -1.0), ("1e-3", 1, -3.0), ("3e-4", 0, 2.0), ("3e-4", 1, 0.0)]):
        noise = rng.normal(0, 1e-3, 300)
        _job(tmp_path, num, [f"optim.lr={lr}", f"seed={seed}"], val, common + noise, bh)
    (tmp_path / "multirun.yaml").write_text("hydra: {}\n")
    return tmp_path


def test_groups_by_everything_but_the_seed_and_sorts_by_validation(sweep):
    settings = sweep_seeds.write_report(sweep)
    assert [e["setting"] for e in settings] == ["optim.lr=3e-4", "optim.lr=1e-3"]  # val means 1.0 > -2.0
    assert [e["seeds"] for e in settings] == [2, 2]
    assert settings[0]["selection"] == {"mean": 1.0, "std": pytest.approx(np.sqrt(2.0)), "min": 0.0, "max": 2.0}
    assert (sweep / "seeds.md").read_text().count("| optim.lr=") == 2
    assert json.loads((sweep / "seeds.json").read_text())[0]["setting"] == "optim.lr=3e-4"


def test_the_ensemble_averages_the_seeds_returns_bar_by_bar(sweep):
    settings = sweep_seeds.summarise(sweep_seeds.load_jobs(sweep))
    curves = [pd.read_csv(sweep / j / "eval" / "equity.csv")["agent_equity"].to_numpy() for j in ("2", "3")]
    mean_r = np.mean([c[1:] / c[:-1] - 1 for c in curves], axis=0)
    ens = settings[0]["ensemble"]
    assert ens["psr_vs_zero"] == pytest.approx(probabilistic_sharpe_ratio(mean_r))
    assert ens["sharpe_ci95_low"] < ens["sharpe"] < ens["sharpe_ci95_high"]
    assert 0 <= ens["psr_vs_buy_and_hold"] <= 1


def test_only_this_multiruns_jobs_and_failed_ones_listed(sweep):
    (sweep / "4" / "eval").mkdir(parents=True)
    (sweep / "4" / "HALTED").write_text("halt_nan at step 5\n")
    settings = sweep_seeds.write_report(sweep, [sweep / "2", sweep / "3", sweep / "4"])  # 0 and 1: an older sweep
    assert [e["setting"] for e in settings] == ["optim.lr=3e-4"]
    assert "job 4: halted: halt_nan at step 5" in (sweep / "seeds.md").read_text()


def test_cli(sweep, tmp_path, capsys):
    assert sweep_seeds.main([str(sweep)]) == 0 and "seeds report:" in capsys.readouterr().out
    assert sweep_seeds.main([str(tmp_path / "missing")]) == 2
    assert sweep_seeds.main([str(sweep / "0")]) == 2 and not (sweep / "0" / "seeds.md").exists()  # not a sweep
    assert sweep_seeds.main([]) == 2 and "usage" in capsys.readouterr().err
