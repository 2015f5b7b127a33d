"""foxdqn.ops.per_schedule: the kernel (TRITON_INTERPRET=1 on CPU) writes the same bits as its torch
reference (the ops it replaced: ``ReplayBuffer.filled() · envs`` and ``LinearSchedule``'s β) for
counters below, at and past their bounds, a 0-d β₀ and one per group (more groups than a block),
durations that do not divide the counter; bad arguments are refused naming the argument; a
prioritized replay's draw reads the counters' current values (one buffer, rewritten per draw)."""
from __future__ import annotations

import pytest
import torch

from foxdqn.device.schedules import LinearSchedule
from foxdqn.ops.per_schedule import per_schedule, per_schedule_reference


def _outputs(start):
    return torch.full((), -1, dtype=torch.int64), torch.full_like(start, float("nan"))


@pytest.mark.parametrize("groups", [0, 1, 3, 70])  # 0: a 0-d β₀ (one run)
@pytest.mark.parametrize("written,updates", [(0, 0), (5, 7), (12, 333), (13, 334), (10_000, 10**7)])
def test_kernel_equals_reference_bit_for_bit(groups, written, updates):
    start = torch.tensor(0.4) if groups == 0 else torch.linspace(0.0, 0.9, groups)
    sched = LinearSchedule(start, 1.0, 333.0, torch.device("cpu"))
    w, u = torch.tensor(written), torch.tensor(updates)
    got, want = _outputs(start), _outputs(start)
    per_schedule(w, 12, 7, u, sched.start, sched.end, sched.duration, *got, backend="triton")
    per_schedule_reference(w, 12, 7, u, sched.start, sched.end, sched.duration, *want)
    assert torch.equal(got[0], want[0]) and got[0].item() == min(written, 12) * 7
    assert torch.equal(got[1], want[1])
    assert torch.equal(want[1], sched(u).view(start.shape))  # the reference is the schedule's own value
    if updates >= 333:
        assert (got[1] == 1.0).all()


@pytest.mark.parametrize("kw,match", [
    (dict(written=torch.tensor(1.0)), "written must be torch.int64 0-d"),
    (dict(updates=torch.zeros(1, dtype=torch.int64)), "updates must be torch.int64 0-d"),
    (dict(beta_start=torch.zeros(2, 2)), "beta_start must be float32 0-d or"),
    (dict(beta_out=torch.zeros(4)), "beta_out must be contiguous float32"),
    (dict(rows=0), "rows must be an int >= 1"),
    (dict(envs=True), "envs must be an int >= 1"),
    (dict(size_out=torch.zeros(())), "size_out must be torch.int64 0-d"),
])
def test_bad_arguments(kw, match):
    args = dict(written=torch.tensor(3), rows=4, envs=2, updates=torch.tensor(5), beta_start=torch.zeros(3),
                beta_end=torch.tensor(1.0), duration=torch.tensor(10.0), size_out=torch.zeros((), dtype=torch.int64),
                beta_out=torch.zeros(3))
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        per_schedule(**args, backend="triton")


def test_a_prioritized_draw_reads_the_counters_of_its_call():
    """Two draws of one replay around an add and an update: each uses its own moment's size and β,
    as the torch ops it replaced (the schedule's β, the filled rows), from the same two buffers."""
    from foxdqn.ops.backend import cpu_kernels
    from foxdqn.replay.prioritized import PrioritizedReplayBuffer

    updates = torch.zeros((), dtype=torch.int64)
    r = PrioritizedReplayBuffer(8, 2, 3, torch.device("cpu"), beta_start=0.4, beta_updates=10, updates=updates)
    pr = r.priorities
    for step in range(3):
        r.add(torch.randn(2, 3), torch.zeros(2, dtype=torch.int64), torch.ones(2), torch.randn(2, 3),
              torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.bool))
        updates += 4
        with cpu_kernels():
            pr.draw(torch.rand(4))
        assert pr._size.item() == (step + 1) * 2
        assert torch.equal(pr._beta, pr.beta(updates))
