"""Benchmark: replay_gather (the uniform draw's rows and their n-step batch, one kernel).

Providers: the Triton op, the torch reference, ``torch.compile`` of the reference. Training sizes:
``eurusd_dqn``'s replay of state codes (4 values per state, 32 envs, 100k transitions) and an
observation replay of 162 values per state (the trading window without codes), batch 256, n = 1
and 3, obs and s' stacked.

Run: ``python -m bench.ops.bench_replay_gather`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile, print_table


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.replay_gather import replay_gather, replay_gather_reference

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    out: list[dict] = []
    n_envs, rows_, batch = 32, 100_000 // 32, 256
    for d in (4, 162):
        for n_step in (1, 3):
            obs = torch.randn(rows_, n_envs, d, device=dev, generator=g)
            store = (obs, obs.clone(), torch.randint(0, 45, (rows_, n_envs), device=dev, generator=g),
                     torch.randn(rows_, n_envs, device=dev, generator=g),
                     (torch.rand(rows_, n_envs, device=dev, generator=g) < 0.01).float(),
                     (torch.rand(rows_, n_envs, device=dev, generator=g) < 0.02).float(),
                     torch.tensor(17, device=dev), torch.tensor(10 * rows_, device=dev),
                     (0.99 ** torch.arange(n_step + 1, device=dev, dtype=torch.float64)).float()[None], n_step)
            u = torch.rand(2, batch, device=dev, generator=g)
            out += against_compile("bench_replay_gather", "replay_gather", f"B={batch} D={d} n={n_step}", replay_gather,
                                   replay_gather_reference, *store, uniforms=u, stacked=True)
    return out


if __name__ == "__main__":
    print_table(rows())
