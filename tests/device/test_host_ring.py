"""HostRingReader (foxdqn.device.host_ring): newest complete record, torn records, halt reasons."""
import pytest
import torch

from foxdqn.device import ring_record as R
from foxdqn.guard.host import TrainingGuard
from foxdqn.device.host_ring import HostRingReader

INF = float("inf")


def test_reader_empty_ring():
    reader = HostRingReader(R.new_ring(4, pin_memory=False))
    assert reader.latest() is None and reader.records() == [] and reader.first_halt() is None
    assert HostRingReader.halt_reason(None) is None


def test_reader_newest_complete_record_and_torn_records():
    guard = TrainingGuard("cpu", ring_size=4)
    for step in range(11):
        guard.check(torch.tensor(float(step)), torch.tensor(1.0), torch.tensor(step))
    rec = guard.reader.latest()
    assert rec["step"] == 10 and rec["raw_loss"] == 10.0 and not rec["skip"]
    assert [r["step"] for r in guard.reader.records()] == [7, 8, 9, 10]
    assert HostRingReader.halt_reason(rec) is None
    # a record being written (STEP advanced, COMMIT not yet) is ignored
    guard.ring[10 % 4, R.STEP] = 14.0
    assert guard.reader.latest()["step"] == 9
    # a torn record (COMMIT from an older lap) is ignored
    guard.ring[10 % 4, R.STEP] = 10.0
    guard.ring[10 % 4, R.COMMIT] = 6.0
    assert guard.reader.latest()["step"] == 9
    assert [r["step"] for r in guard.reader.records()] == [7, 8, 9]


def test_reader_halt_reasons():
    guard = TrainingGuard("cpu", loss_clip=10.0, ring_size=8)
    for step, (loss, norm) in enumerate([(1.0, 1.0), (INF, 1.0), (1.0, 1.0)]):
        guard.check(torch.tensor(loss), torch.tensor(norm), torch.tensor(step))
    latest = guard.reader.latest()
    assert latest["step"] == 2 and latest["halted"] and latest["skip"]
    assert HostRingReader.halt_reason(latest) == "halted (latched by an earlier step) as of step 2"
    first = guard.reader.first_halt()
    assert first["step"] == 1
    assert HostRingReader.halt_reason(first).startswith("halt_nan, halt_loss_clip at step 1 (loss=inf")


def test_reader_rejects_bad_ring():
    with pytest.raises(ValueError):
        HostRingReader(torch.zeros(4, 16))  # float32
