"""An injected NaN is caught within one iteration; the bad update changes no weight; the run
stops with the checkpoint of the last good weights and a message naming the flag and step."""
import math

import pytest
import torch

from foxdqn.errors import HaltError
from foxdqn.step.iteration import Iteration

from support import small_state

BAD = 5  # the update whose loss is poisoned


def _params(module):
    return [p.detach().clone() for p in module.parameters()]


def run_until_nan(device: str, use_graph: bool):
    s, _ = small_state([f"debug.inject_nan_at_step={BAD}", f"device={device}"], device=device)
    collect, full = Iteration(s, use_graph, updates=0), Iteration(s, use_graph)
    for _ in range(4):
        collect()
    k = s.cfg.agent.updates_per_iter
    for _ in range(BAD // k):  # updates 0 .. BAD-1 (all good)
        full()
    before_online, before_target = _params(s.nets.online), _params(s.nets.target)
    assert s.monitors.guard.reader.halt_reason(s.monitors.guard.reader.latest()) is None
    full()  # contains update BAD
    if device == "cuda":
        torch.cuda.synchronize()
    record = s.monitors.guard.reader.latest()
    return s, record, before_online, before_target


def check(s, record, before_online, before_target):
    reason = s.monitors.guard.reader.halt_reason(record)
    assert reason is not None and "halt_nan" in reason
    assert s.monitors.guard.reader.first_halt()["step"] == BAD
    for a, b in zip(_params(s.nets.online), before_online):
        assert torch.equal(a, b)
    for a, b in zip(_params(s.nets.target), before_target):
        assert torch.equal(a, b)


def test_injected_nan_skips_update_cpu():
    check(*run_until_nan("cpu", use_graph=False))


@pytest.mark.gpu
def test_injected_nan_skips_update_graph():
    check(*run_until_nan("cuda", use_graph=True))


def test_train_halts_with_checkpoint_and_message(tmp_path):
    from foxdqn.run.checkpoint import load_checkpoint
    from foxdqn.run.loop import train

    s, market = small_state([f"debug.inject_nan_at_step={BAD}"])
    with pytest.raises(HaltError) as info:
        train(s.cfg, market, tmp_path)
    assert "halt_nan" in str(info.value) and f"step {BAD}" in str(info.value)
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert all(torch.isfinite(v).all() for v in ckpt["online"].values())
    assert (tmp_path / "HALTED").is_file()
    assert not (tmp_path / "eval" / "summary.json").exists()
