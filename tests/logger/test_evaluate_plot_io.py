"""foxdqn.analysis.equity_plot and foxdqn.io_atomic: PNG and JSON written atomically."""
import json
import math
import os

import numpy as np
import pytest

from foxdqn.analysis.equity_plot import plot_equity
from foxdqn.io_atomic import read_json, write_json_atomic, write_text_atomic

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _curves(n=50):
    rng = np.random.default_rng(0)
    agent = np.cumprod(np.concatenate([[1.0], 1 + 0.01 * rng.standard_normal(n - 1)]))
    bh = np.cumprod(np.concatenate([[1.0], 1 + 0.01 * rng.standard_normal(n - 1)]))
    return {"agent": agent, "buy_and_hold": bh, "flat": np.ones(n)}


def test_plot_writes_png_and_no_temp_file(tmp_path):
    out = tmp_path / "eval" / "equity.png"  # parent does not exist yet
    ts = np.datetime64("2024-01-01") + np.arange(50).astype("timedelta64[D]")
    plot_equity(out, ts, _curves(), "agent vs baselines")
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000
    assert sorted(os.listdir(out.parent)) == ["equity.png"]


def test_plot_overwrites_atomically_and_accepts_no_timestamps(tmp_path):
    out = tmp_path / "equity.png"
    out.write_bytes(b"old")
    curves = _curves()
    curves["agent"] = curves["agent"] - 2.0  # non-positive values: linear-scale fallback
    plot_equity(str(out), None, curves, "t")
    assert out.read_bytes().startswith(PNG_MAGIC)
    assert os.listdir(tmp_path) == ["equity.png"]


def test_plot_rejects_mismatched_lengths_without_writing(tmp_path):
    out = tmp_path / "equity.png"
    with pytest.raises(ValueError, match="buy_and_hold"):
        plot_equity(out, None, {"agent": np.ones(10), "buy_and_hold": np.ones(9)}, "t")
    with pytest.raises(ValueError, match="timestamps"):
        plot_equity(out, np.arange(5), {"agent": np.ones(10)}, "t")
    with pytest.raises(ValueError, match="empty"):
        plot_equity(out, None, {}, "t")
    assert os.listdir(tmp_path) == []


def test_json_atomic_round_trip_with_nonfinite(tmp_path):
    path = tmp_path / "summary.json"
    obj = {
        "sharpe": float("nan"),
        "profit_factor": math.inf,
        "worst": -math.inf,
        "np": np.float32(0.5),
        "arr": np.array([1.0, np.nan]),
        "n": np.int64(3),
        "nested": [{"x": (1, 2.5)}],
        "name": "run",
    }
    write_json_atomic(path, obj)
    text = path.read_text()
    # strict JSON: no NaN/Infinity tokens; non-finite values are the strings nan/inf/-inf
    raw = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard token {c}"))
    assert raw["sharpe"] == "nan" and raw["profit_factor"] == "inf" and raw["worst"] == "-inf"
    assert raw["arr"] == [1.0, "nan"]
    assert "\n  \"sharpe\"" in text  # indent 2
    back = read_json(path)
    assert math.isnan(back["sharpe"])
    assert back["profit_factor"] == math.inf and back["worst"] == -math.inf
    assert back["np"] == 0.5 and back["n"] == 3
    assert back["arr"][0] == 1.0 and math.isnan(back["arr"][1])
    assert back["nested"] == [{"x": [1, 2.5]}]
    assert back["name"] == "run"
    assert os.listdir(tmp_path) == ["summary.json"]


def test_atomic_write_failure_keeps_old_file_and_no_temp(tmp_path):
    path = tmp_path / "summary.json"
    write_text_atomic(path, "old\n")
    with pytest.raises(TypeError):
        write_json_atomic(path, {"bad": {1, 2}})  # a set is not JSON
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["summary.json"]


def test_atomic_write_rename_failure_removes_temp(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    write_text_atomic(path, "old\n")

    def boom(src, dst):
        assert os.path.dirname(src) == str(tmp_path)  # temp file is in the same directory
        assert os.path.exists(src)
        raise OSError("simulated rename failure")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="simulated"):
        write_json_atomic(path, {"a": 1})
    monkeypatch.undo()
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["summary.json"]


def test_atomic_write_file_mode_follows_umask_or_existing_file(tmp_path, monkeypatch):
    import foxdqn.io_atomic as io_atomic

    monkeypatch.setattr(io_atomic, "_UMASK", 0o022)
    new = tmp_path / "new.txt"
    write_text_atomic(new, "x")
    assert new.stat().st_mode & 0o777 == 0o644  # 0666 minus umask, not mkstemp's 0600
    existing = tmp_path / "existing.txt"
    existing.write_text("old")
    existing.chmod(0o640)
    write_text_atomic(existing, "new")
    assert existing.stat().st_mode & 0o777 == 0o640 and existing.read_text() == "new"
