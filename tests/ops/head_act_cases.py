"""Shared cases of the population heads' fused ε-greedy ops (tests/ops/test_c51_epsilon_greedy.py,
test_branching_epsilon_greedy.py, test_iqn_epsilon_greedy.py): the schedules, and the check that
a kernel's actions are the reference's wherever the reference's argmax is clear."""
from __future__ import annotations

import torch


def schedule(members: int, rows: int, eps: float | None = None, seed: int = 0) -> dict:
    """step, start, end, duration ([P]: member p decays from 1 to 0.1·p over 100·(p + 1) steps,
    so at step 60 every member explores some rows and not others) and uniforms [P, 2, M]; ``eps``
    fixes ε (start = end) instead."""
    g = torch.Generator().manual_seed(seed)
    p = torch.arange(members, dtype=torch.float32)
    if eps is None:
        start, end = torch.ones(members), 0.1 * p
    else:
        start, end = torch.full((members,), eps), torch.full((members,), eps)
    return dict(step=torch.tensor(60, dtype=torch.int64), start=start, end=end, duration=100.0 * (p + 1),
                u=torch.rand(members, 2, rows, generator=g))


def clear_rows(q: torch.Tensor, gap: float = 1e-4) -> torch.Tensor:
    """bool ``[P·M]``: the rows of Q ``[P, M, A]`` whose best action leads the next by more than
    ``gap`` (float rounding cannot swap them); every row for A = 1."""
    q = q.reshape(-1, q.shape[-1])
    if q.shape[1] == 1:
        return torch.ones(q.shape[0], dtype=torch.bool)
    top2 = q.topk(2, dim=1).values
    return (top2[:, 0] - top2[:, 1]) > gap


def assert_network_acts_through_its_op(net, obs: torch.Tensor, actions: int) -> None:
    """``net.fused_epsilon_greedy`` (a population head's network, obs ``[3, M, D]``) is None
    outside :func:`foxdqn.ops.backend.cpu_kernels`; inside, its actions are epsilon_greedy's of
    the network's own Q wherever that Q's argmax is clear (most rows)."""
    from foxdqn.ops import backend as B
    from foxdqn.ops.epsilon_greedy import epsilon_greedy

    sched = schedule(obs.shape[0], obs.shape[1])
    with torch.no_grad():
        assert net.fused_epsilon_greedy(obs, **sched) is None
        q = net(obs)
        with B.cpu_kernels():
            got = net.fused_epsilon_greedy(obs, **sched)
    want = epsilon_greedy(q.reshape(-1, actions), **sched, backend="torch")
    clear = clear_rows(q)
    assert clear.float().mean() > 0.8 and torch.equal(got[clear], want[clear])


def assert_widest_case_equals_reference(op, q_reference, case: tuple, device: str = "cpu") -> None:
    """``op`` (a fused head ε-greedy op) with ``backend="triton"`` on ``case`` (its arguments before
    the schedule, member count 1 or 2, moved to ``device``) gives the torch backend's actions
    wherever ``q_reference(*case)``'s argmax is clear (on CUDA, more than 80 % of the rows), greedy
    (ε = 0) on CPU and with :func:`schedule`'s ε on CUDA."""
    def to(x):
        return x.to(device) if isinstance(x, torch.Tensor) else [to(t) for t in x]

    case = tuple(to(x) for x in case)
    members, rows = case[0].shape[:2]
    sched = {k: to(v) for k, v in schedule(members, rows, eps=0.0 if device == "cpu" else None).items()}
    got = op(*case, **sched, backend="triton")
    want = op(*case, **sched, backend="torch")
    clear = clear_rows(q_reference(*case)).to(device)
    assert torch.equal(got[clear], want[clear])
    if device != "cpu":
        assert clear.float().mean() > 0.8
