"""Benchmark: member_uniform (counter-based uniforms, one independent stream per population member,
one kernel).

Providers: the Triton op, the torch reference (int64 hash arithmetic), ``torch.compile`` of the
reference. Training sizes, as :class:`foxdqn.population.random.MemberRandom` draws them: the
ε-greedy uniforms of one collect step (2 per env) for one member of ``eurusd_dqn`` at 4,096 envs,
for 64 members of 32 envs and for 128 ``cartpole_cleanrl`` members of 10 envs, and the replay's
draw of one update (2 per row of ``agent.batch_size``) for 64 ``eurusd_dqn`` members.

Run: ``python -m bench.ops.bench_member_uniform`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile, print_table
from bench.ops.training import CARTPOLE, DEFAULT, training


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.member_uniform import member_keys, member_uniform, member_uniform_reference

    dev = torch.device(device)
    eurusd, cartpole = training(DEFAULT, device), training(CARTPOLE, device)
    cases = ((1, 2 * eurusd.num_envs, "collect"), (64, 2 * 32, "collect"), (128, 2 * cartpole.num_envs, "collect"),
             (64, 2 * eurusd.batch_size, "replay"))
    out: list[dict] = []
    for members, n, what in cases:
        keys = member_keys(range(members), dev)
        counter = torch.tensor(12_345, device=dev)
        out += against_compile("bench_member_uniform", "member_uniform", f"P={members} n={n} {what}", member_uniform,
                               member_uniform_reference, keys, counter, n)
    return out


if __name__ == "__main__":
    print_table(rows())
