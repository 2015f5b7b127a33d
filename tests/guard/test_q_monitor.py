"""QValueMonitor (foxdqn.guard.q_monitor): mean max-Q, reset, in-place threshold, records shared with
the guard; the named view QTotals of its accumulator."""
import math

import pytest
import torch

from foxdqn.device import ring_record as R
from foxdqn.guard.host import TrainingGuard
from foxdqn.guard.q_monitor import QTotals, QValueMonitor
from foxdqn.device.host_ring import HostRingReader


def test_monitor_mean_max_q_and_reset():
    mon = QValueMonitor(R.new_ring(4, pin_memory=False), "cpu")
    assert mon.read_mean_max_q() != mon.read_mean_max_q()  # NaN when empty
    mon.update(torch.tensor([[1.0, 2.0], [3.0, -1.0]]), torch.tensor(0))
    mon.update(torch.tensor([[5.0, 0.0]]), torch.tensor(1))
    assert mon.read_mean_max_q() == pytest.approx((2 + 3 + 5) / 3)
    mon.threshold.fill_(4.0)  # in-place threshold change
    mon.update(torch.tensor([[4.5, 0.0]]), torch.tensor(2))
    assert mon.ring[2, R.Q_DIVERGENCE] == 1.0
    mon.reset()
    assert mon.acc.tolist() == [0.0, 0.0]


def test_guard_and_monitor_share_records():
    guard = TrainingGuard("cpu", ring_size=4)
    mon = QValueMonitor(guard.ring, "cpu", threshold=100.0)
    for step in range(6):
        s = torch.tensor(step)
        if step != 5:  # no Q stats at step 5
            mon.update(torch.full((2, 3), float(step)), s)
        guard.check(torch.tensor(1.0), torch.tensor(1.0), s)
    rec = guard.reader.latest()
    assert rec["step"] == 5 and rec["q_min"] is None and not rec["q_divergence"]
    recs = {r["step"]: r for r in guard.reader.records()}
    assert sorted(recs) == [2, 3, 4, 5]
    assert recs[4]["q_min"] == 4.0 and recs[4]["q_max"] == 4.0 and recs[4]["q_mean"] == 4.0
    # divergence reaches the host as a halt reason
    mon.update(torch.tensor([[1e3, 0.0]]), torch.tensor(6))
    guard.check(torch.tensor(1.0), torch.tensor(1.0), torch.tensor(6))
    rec = guard.reader.latest()
    assert rec["q_divergence"] and HostRingReader.halt_reason(rec).startswith("q_divergence at step 6")
    assert not rec["skip"]  # the Q monitor does not drive the skip flag


def test_qtotals_name_the_kernel_accumulator():
    mon = QValueMonitor(R.new_ring(4, pin_memory=False), "cpu")
    mon.update(torch.tensor([[1.0, 2.0], [3.0, -1.0], [7.0, 0.0]]), torch.tensor(0))
    totals = QTotals.from_host(mon.acc.tolist())
    assert totals == (12.0, 3.0) and totals.max_q_sum == 12.0 and totals.samples == 3.0
    assert totals.mean_max_q == pytest.approx(4.0)
    assert QTotals._fields == ("max_q_sum", "samples") and len(QTotals._fields) == mon.acc.numel()


def test_qtotals_empty_and_wrong_length():
    assert math.isnan(QTotals.from_host([0.0, 0.0]).mean_max_q)
    with pytest.raises(ValueError, match="expected 2"):
        QTotals.from_host([1.0, 2.0, 3.0, 4.0])
