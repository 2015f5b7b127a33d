"""The steady-state loop never reads the device from Python.

Inside the loop body (iterations and the guard poll) every Tensor method that copies device
data to the host is patched to raise. On the GPU the same property is checked with
``torch.cuda.set_sync_debug_mode("error")`` (tests marked gpu).
"""
import pytest
import torch

from foxdqn.step.iteration import Iteration

from support import HostSync, forbid_syncs, small_state


@pytest.mark.parametrize("head", ["q", "dueling"])
def test_steady_state_loop_never_syncs(monkeypatch, head):
    s, _ = small_state([f"head={head}"])
    collect = Iteration(s, use_graph=False, updates=0)
    full = Iteration(s, use_graph=False)
    for _ in range(4):
        collect()
    full()  # first update allocates Adam state (not steady state)
    with monkeypatch.context() as m:
        forbid_syncs(m)
        for _ in range(5):
            full()
            s.monitors.guard.reader.latest()
    assert int(s.updates) == 6 * s.cfg.agent.updates_per_iter


def test_forbid_patch_catches_a_sync(monkeypatch):
    """The patch is live: a deliberate .item() inside it raises."""
    with monkeypatch.context() as m:
        forbid_syncs(m)
        with pytest.raises(HostSync):
            torch.zeros(()).item()
