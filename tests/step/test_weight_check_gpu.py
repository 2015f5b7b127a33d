"""guard.max_weight on CUDA: the post-step weight check inside the captured iteration. A learning-rate
spike injected after capture is rejected in the graph (weights, targets and Adam's state unchanged,
halt_weight in the ring) with no host sync; graph == eager with the check on; the trial step equals
the real one bit for bit; the check adds a handful of kernels per update and nothing when off."""
import pytest
import torch

from foxdqn.ops import backend as B
from foxdqn.step.iteration import Iteration

from support import (adam_state, iterate, all_equal, captured_iteration, clone_all, no_host_sync, require_compiled_kernels,
                     small_state)

pytestmark = pytest.mark.gpu
_need_compiled = require_compiled_kernels(B.INTERPRET)

BOUND = 100.0
NEVER = 10**9  # a spike step far past the run: the spike code is captured, moved onto an update later


def test_spike_is_rejected_inside_the_graph_without_sync():
    s, _ = small_state([f"guard.max_weight={BOUND}", f"debug.inject_lr_spike_at_step={NEVER}", "device=cuda"],
                       device="cuda")
    full = captured_iteration(s)
    k = s.cfg.agent.updates_per_iter
    reader = s.monitors.guard.reader
    assert reader.halt_reason(reader.latest()) is None
    first_of_next = int(s.updates)  # the first update of the next replay
    bad = first_of_next + k  # the first update of the replay after it
    s.lr_spike_at.fill_(bad)  # a device tensor: the captured graph reads it
    with no_host_sync():
        full()
        reader.latest()
    torch.cuda.synchronize()
    online, target, adam = clone_all(s.nets.online.parameters()), clone_all(s.nets.target.parameters()), adam_state(s)
    with no_host_sync():
        full()  # contains update `bad`: every update of this replay is skipped (bad, then the latch)
        reader.latest()
    torch.cuda.synchronize()
    assert all_equal(clone_all(s.nets.online.parameters()), online)
    assert all_equal(clone_all(s.nets.target.parameters()), target)
    assert all_equal(adam_state(s), adam)
    first = reader.first_halt()
    assert first is not None and first["step"] == bad and first["halt_weight"] and first["max_weight"] > 1e20
    assert not first["halt_nan"]
    assert f"halt_weight at step {bad}" in reader.halt_reason(first)
    assert torch.equal(s.optim.lr.cpu(), torch.tensor(s.cfg.optim.lr, dtype=torch.float32))  # lr restored exactly
    assert int(s.monitors.guard.weight_bits) == 0


def _run(use_graph: bool, iters: int = 30):
    s, _ = small_state([f"guard.max_weight={BOUND}", "device=cuda"], device="cuda")
    return iterate(s, use_graph, 4, iters).s


def test_graph_equals_eager_with_the_check_on_and_trial_equals_real():
    torch.backends.cudnn.deterministic = True
    se, sg = _run(False), _run(True)
    assert sg.monitors.guard.acc[3].item() == se.monitors.guard.acc[3].item() == 0  # nothing skipped
    for a, b in zip(sg.nets.online.parameters(), se.nets.online.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for s in (se, sg):
        wc = s.optim.weight_check
        assert all_equal(clone_all(wc.weights), clone_all(s.nets.trainable))  # the checked weights are the applied ones
        assert all_equal(clone_all(wc.exp_avgs), [s.optim.optimizer.state[p]["exp_avg"] for p in s.nets.trainable])
        rec = s.monitors.guard.reader.latest()
        assert rec["max_weight"] == max(p.abs().max().item() for p in s.nets.trainable)


def _kernels_per_update(extra):
    """CUDA kernels of one eager update (after warm-up), by name."""
    from torch.profiler import ProfilerActivity, profile

    s, _ = small_state([*extra, "device=cuda"], device="cuda")
    collect, one = Iteration(s, False, updates=0), Iteration(s, False, updates=1)
    for _ in range(4):
        collect()
    for _ in range(3):
        one()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        one()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type.name == "CUDA"]


def test_kernels_added_per_update():
    off = _kernels_per_update([])
    on = _kernels_per_update([f"guard.max_weight={BOUND}"])
    added = len(on) - len(off)
    print(f"kernels per update: off {len(off)}, on {len(on)} (+{added})")
    print("added:", sorted(set(on) - set(off)))
    # foreach copy, step increment, fused Adam (trial), max_abs_bits; the guard is still one launch
    assert 3 <= added <= 5, (added, on)
    assert any("max_abs_bits" in n for n in on) and not any("max_abs_bits" in n for n in off)
    assert sum("training_guard" in n for n in on) == sum("training_guard" in n for n in off) == 1
