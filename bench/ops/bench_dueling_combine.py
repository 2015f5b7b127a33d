"""Benchmark: dueling_combine (Q = V + A − mean_a A; forward one kernel, backward one kernel).

Two ops are timed: ``dueling_combine`` (forward, as the collect step's no-grad forward runs it) and
``dueling_combine_fwd_bwd`` (forward, then ``torch.autograd.grad`` w.r.t. V and A, as an update
runs it). Providers: the Triton op, the torch reference (``value + adv − adv.mean(-1)`` and
autograd of it), ``torch.compile`` of the reference. Training sizes: ``eurusd_dqn``'s 45 actions at
the collect step's 4,096 envs, and the update's stacked online forward of [s; s'] (2 ×
``agent.batch_size`` rows).

Run: ``python -m bench.ops.bench_dueling_combine`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile, against_compile_grad, print_table
from bench.ops.training import DEFAULT, training


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.dueling_combine import dueling_combine, dueling_combine_reference

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    t = training(DEFAULT, device)
    a = t.num_actions
    n = t.num_envs
    out = against_compile("bench_dueling_combine", "dueling_combine", f"R={n} A={a}", dueling_combine,
                          dueling_combine_reference, torch.randn(n, 1, device=dev, generator=g),
                          torch.randn(n, a, device=dev, generator=g))
    r = 2 * t.batch_size  # the update's [s; s'] rows
    value = torch.randn(r, 1, device=dev, generator=g).requires_grad_(True)
    adv = torch.randn(r, a, device=dev, generator=g).requires_grad_(True)
    out += against_compile_grad("bench_dueling_combine", "dueling_combine_fwd_bwd", f"R={r} A={a}", dueling_combine,
                                dueling_combine_reference, value, adv)
    return out


if __name__ == "__main__":
    print_table(rows())
