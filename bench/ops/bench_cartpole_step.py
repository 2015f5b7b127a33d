"""Benchmark of ``foxdqn.ops.cartpole_step`` (one CartPole-v1 step with auto-reset, N envs).

Providers: the Triton op (one launch), the plain-torch reference (about 60 small ops, the env's
step before the op existed), and ``torch.compile`` of the reference. Sizes: the experiments'
env counts (1, 10, 64) are launch-bound; 4096 and 1M envs show the memory-bound regime. ``gbps``
counts the state, step counter, action and reset draws read, and the state, step counter,
two observations, reward, three flags and episode return/length written. The state evolves
between calls (episodes end and reset), as in training.

Run: ``python -m bench.ops.bench_cartpole_step`` (needs CUDA). Nothing runs at import time.
"""
from __future__ import annotations

from bench.ops.common import print_table, provider_rows

SIZES = [1, 10, 64, 4096, 1 << 20]


def rows(device: str = "cuda") -> list[dict]:
    """One row per (size, provider): ms (median per call, bench.ops.common.bench_all: in-graph, providers interleaved), p20_ms, p80_ms, gbps."""
    import torch

    from foxdqn.ops.cartpole_step import cartpole_step, cartpole_step_reference

    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        raise RuntimeError("bench_cartpole_step needs a CUDA device (the Triton kernel runs on CUDA tensors)")
    out = []
    for n in SIZES:
        g = torch.Generator(device=device).manual_seed(0)
        state = 0.1 * torch.rand(n, 4, device=device, dtype=torch.float64, generator=g) - 0.05
        steps = torch.zeros(n, device=device, dtype=torch.int64)
        action = torch.randint(0, 2, (n,), device=device, generator=g)
        u = torch.rand(n, 4, device=device, dtype=torch.float64, generator=g)
        # read: state 32 + steps 8 + action 8 + u 32; written: state 32 + steps 8 + 2 obs 32 + reward 4 + flags 3
        # + return 4 + length 8 bytes per env
        nbytes = n * (32 + 8 + 8 + 32 + 32 + 8 + 32 + 4 + 3 + 4 + 8)
        torch._dynamo.reset()
        compiled = torch.compile(cartpole_step_reference, dynamic=False)
        out += provider_rows("bench_cartpole_step", "cartpole_step", f"N={n}", {
            "triton": lambda: cartpole_step(state, steps, action, u, 500, backend="triton"),
            "torch": lambda: cartpole_step_reference(state, steps, action, u, 500, torch.float32),
            "torch.compile": lambda: compiled(state, steps, action, u, 500, torch.float32),
        }, nbytes=nbytes)
    return out


if __name__ == "__main__":
    print_table(rows())
