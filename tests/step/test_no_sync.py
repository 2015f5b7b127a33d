"""The steady-state loop never reads the device from Python.

Inside the loop body (iterations and the guard poll) every Tensor method that copies device
data to the host is patched to raise. On the GPU the same property is checked with
``torch.cuda.set_sync_debug_mode("error")`` (tests marked gpu).
"""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from helpers import small_state  # noqa: E402

from foxdqn.step.iteration import Iteration  # noqa: E402

FORBIDDEN = ["item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"]


class Synced(AssertionError):
    pass


def _forbid(monkeypatch):
    for name in FORBIDDEN:
        def boom(self, *a, _name=name, **k):
            raise Synced(f"Tensor.{_name} called in the steady-state loop")
        monkeypatch.setattr(torch.Tensor, name, boom)


@pytest.mark.parametrize("head", ["q", "dueling"])
def test_steady_state_loop_never_syncs(monkeypatch, head):
    s, _ = small_state([f"head={head}"])
    collect = Iteration(s, use_graph=False, updates=0)
    full = Iteration(s, use_graph=False)
    for _ in range(4):
        collect()
    full()  # first update allocates Adam state (not steady state)
    with monkeypatch.context() as m:
        _forbid(m)
        for _ in range(5):
            full()
            s.guard.reader.latest()
    assert int(s.updates) == 6 * s.cfg.agent.updates_per_iter


def test_forbid_patch_catches_a_sync(monkeypatch):
    """The patch is live: a deliberate .item() inside it raises."""
    with monkeypatch.context() as m:
        _forbid(m)
        with pytest.raises(Synced):
            torch.zeros(()).item()
