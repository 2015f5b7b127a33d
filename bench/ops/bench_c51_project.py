"""Benchmark of ``foxdqn.ops.c51_project`` (C51 categorical projection).

Providers: the Triton op, the plain-torch reference (scatter_add), and ``torch.compile`` of the
reference. Sizes: training batches with the usual 51 atoms, then large batches and wider
supports. ``gbps`` is the effective bandwidth (next_probs, rewards, discounts read + output
written, divided by time); the kernel does O(B K^2) hat-weight arithmetic, so at K >= 101 it is
compute-bound and the figure is a throughput measure, not a roofline.

Run: ``python -m bench.ops.bench_c51_project`` (needs CUDA). Nothing runs at import time.
"""
from __future__ import annotations

from bench.ops.common import print_table, provider_rows

V_MIN, V_MAX = -10.0, 10.0
SIZES = [(32, 51), (256, 51), (1024, 51), (4096, 51), (65536, 51), (1024, 101), (4096, 256)]


def _inputs(num_rows: int, k: int, device: str):
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    p = torch.softmax(torch.randn(num_rows, k, device=device, generator=g) * 2, dim=1)
    r = torch.randn(num_rows, device=device, generator=g) * 3
    d = torch.where(torch.rand(num_rows, device=device, generator=g) < 0.05, 0.0, 0.99)
    return p, r, d


def rows(device: str = "cuda") -> list[dict]:
    """One row per (size, provider): ms (median per call, bench.ops.common.bench_all: in-graph, providers interleaved), p20_ms, p80_ms, gbps."""
    import torch

    from foxdqn.ops.c51_project import c51_project, c51_project_reference

    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        raise RuntimeError("bench_c51_project needs a CUDA device (the Triton kernel runs on CUDA tensors)")
    out = []
    for num_rows, k in SIZES:
        p, r, d = _inputs(num_rows, k, device)
        nbytes = 4 * (2 * num_rows * k + 2 * num_rows)
        torch._dynamo.reset()  # one compiled graph per size, no recompile limit
        compiled = torch.compile(c51_project_reference, dynamic=False)
        providers = {
            "triton": lambda: c51_project(p, r, d, V_MIN, V_MAX, backend="triton"),
            "torch": lambda: c51_project_reference(p, r, d, V_MIN, V_MAX),
            "torch.compile": lambda: compiled(p, r, d, V_MIN, V_MAX),
        }
        out += provider_rows("bench_c51_project", "c51_project", f"B={num_rows},K={k}", providers, nbytes=nbytes)
    return out


if __name__ == "__main__":
    print_table(rows())
