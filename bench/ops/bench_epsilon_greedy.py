"""Benchmark: epsilon_greedy (linear ε schedule, explore test, random action and argmax, one kernel).

Providers: the Triton op, the torch reference, ``torch.compile`` of the reference. Training sizes:
``eurusd_dqn``'s collect step at 4,096 envs and 45 actions, ``cartpole_cleanrl``'s 10 envs and 2
actions (one group, a single run), and a population of 64 ``eurusd_dqn`` members of 32 envs (64
groups, one launch). Q-values and uniforms are random of the collect step's shapes.

Run: ``python -m bench.ops.bench_epsilon_greedy`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile, print_table
from bench.ops.training import CARTPOLE, DEFAULT, training


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.epsilon_greedy import epsilon_greedy, epsilon_greedy_reference

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    out: list[dict] = []
    eurusd, cartpole = training(DEFAULT, device), training(CARTPOLE, device)
    cases = ((eurusd.num_envs, eurusd.num_actions, 1), (cartpole.num_envs, cartpole.num_actions, 1),
             (64 * 32, eurusd.num_actions, 64))
    for n, a, groups in cases:
        q = torch.randn(n, a, device=dev, generator=g)
        step = torch.tensor(5_000, device=dev)  # mid-schedule: some envs explore
        start, end = torch.ones(groups, device=dev), torch.full((groups,), 0.05, device=dev)
        duration = torch.full((groups,), 10_000.0, device=dev)
        u = torch.rand(groups, 2, n // groups, device=dev, generator=g)
        out += against_compile("bench_epsilon_greedy", "epsilon_greedy", f"N={n} A={a} G={groups}", epsilon_greedy,
                               epsilon_greedy_reference, q, step, start, end, duration, u)
    return out


if __name__ == "__main__":
    print_table(rows())
