"""bench.ensemble_rules: the rules' parsing, the table, and bad input (exit 2, one line)."""
from __future__ import annotations

import pytest

from bench.ensemble_rules import compare, main, markdown, parse_rules


def test_rules_parse_with_their_values():
    assert parse_rules("mean, consensus:0.8,lcb:1.5,vote") == [("mean", None), ("consensus", 0.8), ("lcb", 1.5),
                                                               ("vote", None)]
    with pytest.raises(ValueError, match="'median' is not an ensemble rule"):
        parse_rules("median")
    with pytest.raises(ValueError, match="must be a number"):
        parse_rules("lcb:x")


def test_table_has_a_column_per_rule_and_dashes_where_absent():
    rows = [{"sweep": "/x/mart", "data": "martingale_1h, seed 0", "members": 5, "oracle": 0.0,
             "rules": {"mean": (-0.0226, 378), "lcb 1": (0.0057, 14)}},
            {"sweep": "/x/eurusd", "data": "eurusd_1h", "members": 5, "oracle": None, "rules": {"mean": (0.01, 3)}}]
    text = markdown(rows)
    assert "| sweep | data | members | oracle | mean | lcb 1 |" in text
    assert "| mart | martingale_1h, seed 0 | 5 | +0.00 % | -2.26 % (378) | +0.57 % (14) |" in text
    assert "| eurusd | eurusd_1h | 5 | — | +1.00 % (3) | — |" in text


def test_bad_input_ends_with_one_line_and_exit_2(tmp_path, capsys):
    assert main([str(tmp_path), "--rules", "median"]) == 2
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "is not an ensemble rule" in err[0] and "two or more */checkpoints/last.pt" in err[1]
    with pytest.raises(FileNotFoundError):
        compare(tmp_path, [("mean", None)])
