"""foxdqn.logger.csv_log.CsvLogger."""
import csv

import numpy as np
import pytest

from foxdqn.logger.csv_log import CsvLogger, format_cell


def _read(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_header_widening_keeps_earlier_rows(tmp_path):
    path = tmp_path / "metrics.csv"
    with CsvLogger(path) as log:
        log.log({"step": 1, "loss": 0.5})
        log.log({"step": 2, "loss": 0.25})
        # flushed on every write: readable while the logger is still open
        assert _read(path) == [["step", "loss"], ["1", "0.5"], ["2", "0.25"]]
        log.log({"step": 3, "eval/sharpe": 1.5})  # new key, 'loss' missing
        log.log({"step": 4, "loss": 0.125, "eval/sharpe": -0.5})
    assert _read(path) == [
        ["step", "loss", "eval/sharpe"],
        ["1", "0.5", ""],
        ["2", "0.25", ""],
        ["3", "", "1.5"],
        ["4", "0.125", "-0.5"],
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.csv"]  # no temp file left


def test_resume_appends_to_existing_file(tmp_path):
    path = tmp_path / "metrics.csv"
    with CsvLogger(path) as log:
        log.log({"step": 1, "loss": 0.5})
    with CsvLogger(path) as log:
        assert log.fieldnames == ["step", "loss"]
        log.log({"step": 2, "loss": 0.25})
        log.log({"step": 3, "eps": 0.1})
    assert _read(path) == [
        ["step", "loss", "eps"],
        ["1", "0.5", ""],
        ["2", "0.25", ""],
        ["3", "", "0.1"],
    ]


def test_cell_formatting():
    assert format_cell(0.1) == "0.1"
    assert format_cell(np.float64(0.1)) == "0.1"  # not 'np.float64(0.1)'
    assert format_cell(np.float32(0.5)) == "0.5"
    assert format_cell(1 / 3) == "0.3333333333333333"  # repr: round-trips exactly
    assert float(format_cell(1 / 3)) == 1 / 3
    assert format_cell(float("nan")) == "nan"
    assert format_cell(float("-inf")) == "-inf"
    assert format_cell(np.int64(7)) == "7"
    assert format_cell(True) == "True"
    assert format_cell(None) == ""
    assert format_cell("a,b") == "a,b"


def test_commas_and_quotes_are_escaped(tmp_path):
    path = tmp_path / "m.csv"
    with CsvLogger(path) as log:
        log.log({"note": 'a,"b"', "x": 1})
    assert _read(path) == [["note", "x"], ['a,"b"', "1"]]


def test_rejects_tensors_and_closed_logger(tmp_path):
    torch = pytest.importorskip("torch")
    log = CsvLogger(tmp_path / "m.csv")
    with pytest.raises(TypeError, match="tensor|Tensor"):
        log.log({"loss": torch.tensor(1.0)})
    log.close()
    log.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        log.log({"loss": 1.0})
