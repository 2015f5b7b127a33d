"""The console's results (foxdqn.analysis.results_table): the table, a note for an agent that never trades
or that a search did not count, the logger runs, and outputs: last."""
from pathlib import Path

import pytest

from foxdqn.analysis.results_table import print_summary

METRICS = {"total_return": 0.0, "sharpe": 0.0, "sortino": 0.0, "max_drawdown": 0.0, "profit_factor": float("nan"),
           "hit_rate": float("nan"), "turnover": 0.0, "num_trades": 0, "sharpe_ci95_low": 0.0,
           "sharpe_ci95_high": 0.0, "psr_vs_zero": 0.5, "psr_vs_buy_and_hold": 0.1}


def summary(trades: int, excluded: str | None, **extra) -> dict:
    return {"run_name": "dqn_bars", "split": "test", "bars": 100, "period": ["2020-01-01", "2020-02-01"],
            "metrics": {"agent": {**METRICS, "num_trades": trades}, "buy_and_hold": METRICS, "flat": METRICS},
            "selection": {"metric": "sharpe", "value": 0.0, "excluded": excluded}, "stop": {"at_env_steps": 512},
            "wall_time_s": 1.0, "gpu": None, "device": "cpu", **extra}


@pytest.mark.parametrize("trades, excluded, note", [
    (0, "never trades on val", "note: the agent never trades on the test split (0 trades: its numbers are flat's); "
                               "it never trades on val: not counted by a search (search.exclude_no_trades=true)"),
    (0, None, "note: the agent never trades on the test split (0 trades: its numbers are flat's)"),
    (5, "pruned", "note: pruned at 512 env steps by the search's median pruner: not counted by the search"),
    (5, None, None),
])
def test_a_run_that_never_trades_says_so_and_outputs_come_last(capsys, tmp_path, trades, excluded, note):
    print_summary(summary(trades, excluded, mlflow={"tracking_uri": "sqlite:///x/mlflow.db", "run_id": "abc"}),
                  tmp_path)
    lines = capsys.readouterr().out.rstrip().splitlines()
    assert lines[-1].startswith(f"outputs: {Path(tmp_path).resolve()}")
    assert lines[-2] == "mlflow: run abc in sqlite:///x/mlflow.db  (mlflow ui --backend-store-uri sqlite:///x/mlflow.db)"
    notes = [line for line in lines if line.startswith("note:")]
    assert notes == ([note] if note else [])


GATE = {"chosen": "flat", "confidence": 0.95, "switch_margin": None, "candidates": [
    {"policy": "flat", "switch_margin": None, "val": {"total_return": 0.0, "num_trades": 0},
     "test": {"total_return": 0.0, "num_trades": 0}},
    {"policy": "agent", "switch_margin": 0.0, "val": {"total_return": -0.05, "num_trades": 400},
     "test": {"total_return": -0.07, "num_trades": 450}}]}


@pytest.mark.parametrize("excluded, note", [
    (None, None),  # flat by the gate's choice: its own line, not "never trades"
    ("never trades on val", "note: it never trades on val: not counted by a search (search.exclude_no_trades=true)")])
def test_the_gate_line_and_the_search_note(capsys, tmp_path, excluded, note):
    print_summary(summary(0, excluded, gate=GATE), tmp_path)
    lines = capsys.readouterr().out.rstrip().splitlines()
    assert [line for line in lines if line.startswith("gate: flat on the test split")]
    assert [line for line in lines if line.startswith("note:")] == ([note] if note else [])


def test_one_bar_and_one_trade_are_singular(capsys, tmp_path):
    """The table's title and the gate's line count in words: 1 bar, 1 trade; 100 bars, 450 trades."""
    one = {**GATE, "candidates": [GATE["candidates"][0], {**GATE["candidates"][1], "test": {"total_return": 0.01,
                                                                                             "num_trades": 1}}]}
    print_summary({**summary(0, None, gate=one), "bars": 1}, tmp_path)
    out = capsys.readouterr().out
    assert "test split, 1 bar (" in out and "with 1 trade on test," in out
    print_summary(summary(0, None, gate=GATE), tmp_path)
    out = capsys.readouterr().out
    assert "test split, 100 bars (" in out and "with 450 trades on test," in out


def test_a_psr_without_variance_says_why(capsys, tmp_path):
    """A flat agent's returns have no variance: its PSR is NaN, printed as "n/a (...)", not "nan"."""
    flat = summary(0, None)
    flat["metrics"]["agent"] = {**METRICS, "num_trades": 0, "psr_vs_zero": float("nan")}
    print_summary(flat, tmp_path)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("agent Sharpe"))
    assert "PSR(SR > 0) = n/a (returns without variance); PSR(return - buy-and-hold > 0) = 0.100" in line
    assert "nan" not in line
