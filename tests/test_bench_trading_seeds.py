"""bench.trading_seeds' gate table: per experiment, the seeds the deployment gate kept flat and the
seeds and ensemble as trained, read from the sweep's summaries (bench.gate_rows)."""
import json

from bench.trading_seeds import gate_markdown, gate_row


def write_job(sweep, name, chosen, trained_return, trades, ensemble=None):
    (sweep / name / "eval").mkdir(parents=True)
    summary = {"split": "test", "metrics": {"agent": {"total_return": 0.0, "num_trades": 0}},
               "gate": {"chosen": chosen, "candidates": [
                   {"policy": "flat", "switch_margin": None, "test": {"total_return": 0.0, "num_trades": 0}},
                   {"policy": "agent", "switch_margin": 0.0,
                    "test": {"total_return": trained_return, "num_trades": trades}}]}}
    if ensemble is not None:
        summary["ensemble_policy"] = {"rule": "mean", "gate": ensemble}
    (sweep / name / "eval" / "summary.json").write_text(json.dumps(summary))


def test_the_gate_table(tmp_path):
    ens = {"chosen": "flat", "candidates": [{"test": {"total_return": 0.0, "num_trades": 0}},
                                            {"test": {"total_return": 0.05, "num_trades": 300}}]}
    gated = tmp_path / "gated"
    write_job(gated, "0", "flat", -0.02, 400, ens)
    write_job(gated, "1", "switch_margin=0", 0.04, 200, ens)
    row = gate_row(gated)
    assert row["gate_flat"] == 1 and row["seeds"] == 2 and row["ungated_trades"] == 300
    assert abs(row["ungated_return"] - 0.01) < 1e-12 and row["gate_policy_flat"] is True
    plain = tmp_path / "plain"
    (plain / "0" / "eval").mkdir(parents=True)
    (plain / "0" / "eval" / "summary.json").write_text(json.dumps({"split": "test", "metrics": {"agent": {}}}))
    assert gate_row(plain) is None
    text = gate_markdown([{"experiment": "e", "gate": row}, {"experiment": "p", "gate": None}])
    assert "| e | 1 of 2 | +1.00 %, 300 | +5.00 %, 300 (gated: flat) |" in text and "| p |" not in text
    assert gate_markdown([{"experiment": "p", "gate": None}]) == ""
