"""foxdqn.device.side_stream: two pieces of work on two streams, joined; on the CPU one after the other."""
import contextlib

import pytest
import torch

from foxdqn.device.side_stream import beside


def test_cpu_runs_side_then_main_and_returns_both():
    order = []
    res = beside(None, lambda: order.append("side") or 1, lambda: order.append("main") or 2)
    assert res == (1, 2) and order == ["side", "main"]


class _Stream:
    """A stand-in stream that records the waits (the fork and the join)."""

    device = torch.device("cpu")

    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_stream(self, other):
        self.log.append(f"{self.name} waits for {other.name}")


@pytest.mark.parametrize("raises", [False, True])
def test_fork_side_main_join_also_when_main_raises(raises, monkeypatch):
    """The branch waits for the current stream, the side runs on the branch, main on the current
    stream, and the current stream waits for the branch last, also when main raises."""
    log = []
    current, branch = _Stream("current", log), _Stream("branch", log)
    on = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)

    @contextlib.contextmanager
    def stream(s):
        on.append(s.name)
        try:
            yield
        finally:
            on.pop()

    monkeypatch.setattr(torch.cuda, "stream", stream)

    def main():
        log.append(f"main on {on[-1] if on else 'current'}")
        if raises:
            raise RuntimeError("boom")
        return 2

    if raises:
        with pytest.raises(RuntimeError, match="boom"):
            beside(branch, lambda: log.append(f"side on {on[-1]}"), main)
    else:
        assert beside(branch, lambda: log.append(f"side on {on[-1]}") or 1, main) == (1, 2)
    assert log == ["branch waits for current", "side on branch", "main on current", "current waits for branch"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_branches_join_eagerly_and_in_a_graph():
    """The side's result (made on the second stream, after a long kernel queued before the fork on
    the current stream) is ready for the current stream's next kernel, eagerly and captured: the
    graph has two branches and replays to the eager values."""
    from support import capture_graph

    dev = torch.device("cuda")
    branch = torch.cuda.Stream(dev)
    x = torch.randn(4096, 4096, device=dev)
    src = torch.arange(10, device=dev, dtype=torch.float32)

    def work():
        y = x @ x  # queued before the fork: the branch must wait for it
        side, main = beside(branch, lambda: y[:10, 0] + src, lambda: y[:10, 1] * 2)
        return side + main

    expect = (x @ x)[:10, 0] + src + (x @ x)[:10, 1] * 2
    torch.testing.assert_close(work(), expect)
    graph, out = capture_graph(work, warmup=1)
    src.add_(1.0)
    graph.replay()
    torch.testing.assert_close(out, (x @ x)[:10, 0] + src + (x @ x)[:10, 1] * 2)
