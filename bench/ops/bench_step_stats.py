"""Benchmark: step_stats (one env step's monitor sums, action histogram and env-step counter).

Providers: the Triton op (many programs, the last one sums their rows), the torch reference,
``torch.compile`` of the reference. Sizes: 32 and 4,096 envs, 45 actions, with trades.

Run: ``python -m bench.ops.bench_step_stats`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from functools import partial

from bench.ops.common import against_compile, print_table


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.step_stats import NUM_FIELDS, StepStatsScratch, step_stats, step_stats_reference

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    out: list[dict] = []
    for n in (32, 4096):
        a = 45
        done = torch.rand(n, device=dev, generator=g) < 0.01
        args = (torch.randint(0, a, (n,), device=dev, generator=g), torch.randn(n, device=dev, generator=g), done,
                torch.randn(n, device=dev, generator=g), torch.randint(1, 256, (n,), device=dev, generator=g),
                torch.rand(n, device=dev, generator=g) < 0.5,
                torch.zeros(NUM_FIELDS, dtype=torch.float64, device=dev), torch.zeros(a, dtype=torch.float64, device=dev),
                torch.zeros((), dtype=torch.int64, device=dev))
        kernel = partial(step_stats, scratch=StepStatsScratch(n, dev))  # the reference takes no scratch
        out += against_compile("bench_step_stats", "step_stats", f"N={n} A={a}", kernel, step_stats_reference, *args)
    return out


if __name__ == "__main__":
    print_table(rows())
