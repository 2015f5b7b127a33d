"""foxdqn.population.writer: checkpoint batches written in a background thread; a failure is
raised in the owner's thread, at the next wait or submit."""
from __future__ import annotations

import threading

import pytest
import torch

from foxdqn.population.writer import BackgroundWriter
from foxdqn.run.checkpoint import decode


def test_a_batch_is_written_in_another_thread_and_wait_returns_when_it_is_complete(tmp_path, monkeypatch):
    import foxdqn.population.writer as writer_module

    threads, real = [], writer_module.write_payload
    monkeypatch.setattr(writer_module, "write_payload",
                        lambda path, payload: threads.append(threading.current_thread()) or real(path, payload))
    writer = BackgroundWriter()
    items = [(tmp_path / f"m{p}" / "last.pt", {"format": 4, "w": torch.full((3,), float(p))}) for p in range(4)]
    writer.submit(items)
    writer.wait()
    assert len(threads) == 4 and all(t is not threading.main_thread() for t in threads)
    for p in range(4):
        path = tmp_path / f"m{p}" / "last.pt"
        assert torch.equal(decode(path.read_bytes(), path)["w"], torch.full((3,), float(p)))
    writer.wait()  # nothing in flight: returns


def test_a_failed_write_is_raised_by_the_next_wait_or_submit_once(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    writer = BackgroundWriter()
    writer.submit([(blocker / "last.pt", {"format": 4})])
    with pytest.raises(OSError) as info:
        writer.wait()
    assert str(blocker / "last.pt") in str(info.value)
    writer.wait()  # raised once
    writer.submit([(blocker / "again.pt", {"format": 4})])
    writer.join()  # keeps the failure
    with pytest.raises(OSError):
        writer.submit([(tmp_path / "ok.pt", {"format": 4})])
    assert not (tmp_path / "ok.pt").exists()
