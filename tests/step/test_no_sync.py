"""The steady-state loop (a single run: a population of one) never reads the device from Python.

Inside the loop body (the iterations) every Tensor method that copies device
data to the host is patched to raise. On the GPU the same property is checked with
``torch.cuda.set_sync_debug_mode("error")`` (tests marked gpu).
"""
import pytest
import torch

from foxdqn.step.iteration import Iteration

from support import HostSync, forbid_syncs, small_state, step_fns


@pytest.mark.parametrize("head", ["q", "dueling"])
def test_steady_state_loop_never_syncs(monkeypatch, head):
    s, _ = small_state([f"head={head}"])
    collect = Iteration(s, use_graph=False, updates=0, **step_fns(s))
    full = Iteration(s, use_graph=False, **step_fns(s))
    for _ in range(4):
        collect()
    full()  # first update allocates Adam state (not steady state)
    with monkeypatch.context() as m:
        forbid_syncs(m)
        for _ in range(5):
            full()
    assert int(s.updates) == 6 * s.cfg.agent.updates_per_iter


def test_forbid_patch_catches_a_sync(monkeypatch):
    """The patch is live: a deliberate .item() inside it raises."""
    with monkeypatch.context() as m:
        forbid_syncs(m)
        with pytest.raises(HostSync):
            torch.zeros(()).item()
