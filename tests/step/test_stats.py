"""foxdqn.step.stats.DeviceStats: add_step's trades count of an env that trades, and of one that
does not; add_step beside other work on its branch stream (foxdqn.device.side_stream, as the collect step
runs it) equals add_step (CPU; GPU `gpu` marker: eager and in a CUDA graph without host sync)."""
import pytest
import torch

from foxdqn.device.side_stream import beside
from foxdqn.step.stats import EP_COUNT, REWARD_SUM, TRADES, TRANSITIONS, DeviceStats


def test_add_step_counts_trades_and_none_as_no_trades():
    stats = DeviceStats(4, 3, torch.device("cpu"))
    done = torch.tensor([True, False, False])
    args = (torch.tensor([0, 1, 1]), torch.tensor([1.0, 2.0, 3.0]), done, torch.tensor([5.0, 0.0, 0.0]),
            torch.tensor([7, 0, 0]))
    stats.add_step(*args, torch.tensor([True, False, True]))
    stats.add_step(*args, None)  # an env without trades (its collect hook gives None)
    acc = stats.acc
    assert acc[TRADES] == 2.0 and acc[TRANSITIONS] == 6.0 and acc[EP_COUNT] == 2.0 and acc[REWARD_SUM] == 12.0
    assert stats.actions.tolist() == [2.0, 4.0, 0.0, 0.0]


def _step_args(n, device, seed):
    g = torch.Generator().manual_seed(seed)
    done = torch.rand(n, generator=g) < 0.1
    return tuple(t.to(device) for t in (torch.randint(0, 4, (n,), generator=g), torch.randn(n, generator=g).double(),
                                        done, torch.randn(n, generator=g).double() * done,
                                        torch.randint(1, 50, (n,), generator=g) * done,
                                        torch.rand(n, generator=g) < 0.5))


def test_add_step_beside_other_work_on_the_cpu_is_add_step_then_the_work():
    """No CUDA stream on the CPU: the sums, then main_work, with add_step's result."""
    forked, plain = DeviceStats(4, 64, torch.device("cpu")), DeviceStats(4, 64, torch.device("cpu"))
    order = []
    args = _step_args(64, "cpu", 0)
    beside(forked.branch, lambda: forked.add_step(*args), lambda: order.append(forked.acc[TRANSITIONS].item()))
    plain.add_step(*args)
    assert order == [64.0]  # the sums ran first
    assert torch.equal(forked.acc, plain.acc) and torch.equal(forked.actions, plain.actions)


@pytest.mark.gpu
def test_gpu_add_step_on_the_branch_equals_add_step_eager_and_captured():
    """CUDA, 4,096 envs: the sums on the branch beside a main-stream op give add_step's bits, eager
    and replayed from a CUDA graph (two branches) without host sync, and the main-stream op ran."""
    from support import capture_graph, no_host_sync

    dev = torch.device("cuda")
    forked, plain = DeviceStats(4, 4096, dev), DeviceStats(4, 4096, dev)
    env_steps, env_steps_plain = torch.zeros((), dtype=torch.int64, device=dev), torch.zeros((), dtype=torch.int64,
                                                                                                 device=dev)
    side_out = torch.zeros(4096, device=dev)
    main_in = torch.randn(4096, device=dev)
    args = _step_args(4096, dev, 1)

    def step():
        beside(forked.branch, lambda: forked.add_step(*args, env_steps=env_steps), lambda: side_out.add_(main_in))

    step()
    plain.add_step(*args, env_steps=env_steps_plain)
    assert torch.equal(forked.acc, plain.acc) and torch.equal(forked.actions, plain.actions)
    graph, _ = capture_graph(step, warmup=0)
    with no_host_sync():
        for _ in range(3):
            graph.replay()
            plain.add_step(*args, env_steps=env_steps_plain)
    torch.cuda.synchronize()
    assert torch.equal(forked.acc, plain.acc) and torch.equal(forked.actions, plain.actions)
    assert env_steps.item() == env_steps_plain.item() == 4 * 4096
    assert torch.equal(side_out, 4 * main_in)
