"""foxdqn.logger.tensorboard_log.TensorBoardLogger and foxdqn.logger.MetricsLogger."""
import csv
import math

import numpy as np
import pytest

from foxdqn.logger import MetricsLogger
from foxdqn.logger.tensorboard_log import TensorBoardLogger


def _scalars(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_writes_events_file(tmp_path):
    with TensorBoardLogger(tmp_path / "tb") as tb:
        tb.log(100, {"train/loss": 0.5, "train/epsilon": np.float64(0.9), "note": "skip me"})
        tb.log(200, {"train/loss": 0.25, "train/nan": float("nan")})
    files = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert len(files) == 1 and files[0].stat().st_size > 0
    s = _scalars(tmp_path / "tb")
    assert s["train/loss"] == [(100, 0.5), (200, 0.25)]
    assert s["train/epsilon"] == [(100, pytest.approx(0.9))]
    assert math.isnan(s["train/nan"][0][1])
    assert "note" not in s


def test_tensorboard_rejects_bad_values(tmp_path):
    torch = pytest.importorskip("torch")
    tb = TensorBoardLogger(tmp_path / "tb")
    with pytest.raises(TypeError, match="Tensor"):
        tb.log(1, {"train/loss": torch.tensor(1.0)})
    with pytest.raises(TypeError, match="step"):
        tb.log(1.5, {"train/loss": 1.0})
    with pytest.raises(TypeError, match="not a number"):
        tb.log(1, {"train/loss": [1.0]})
    tb.close()
    tb.close()
    with pytest.raises(RuntimeError, match="closed"):
        tb.log(1, {"train/loss": 1.0})


def test_metrics_logger_fans_out(tmp_path):
    run = tmp_path / "run"
    with MetricsLogger(run) as logger:
        logger.log(10, {"train/loss": 1.0})
        logger.log(np.int64(20), {"train/loss": 0.5, "eval/return": 2.0})
        with pytest.raises(ValueError, match="step"):
            logger.log(30, {"step": 30})
    with open(run / "metrics.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows == [["step", "train/loss", "eval/return"], ["10", "1.0", ""], ["20", "0.5", "2.0"]]
    s = _scalars(run / "tb")
    assert s["train/loss"] == [(10, 1.0), (20, 0.5)]
    assert s["eval/return"] == [(20, 2.0)]


def test_metrics_logger_without_tensorboard(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(1, {"a": 1.0})
    assert not (tmp_path / "tb").exists()
    assert (tmp_path / "metrics.csv").read_text() == "step,a\n1,1.0\n"
