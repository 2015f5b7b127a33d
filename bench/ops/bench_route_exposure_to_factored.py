"""Benchmark: route_exposure_to_factored (elementwise; memory-bound).

Providers: the Triton op, the torch reference, ``torch.compile`` of the reference.
``gbps`` = (exposure int64 + spread f32 + volatility f32 read, factored int64 written) / time.
Sizes: environment counts used in training (256 .. 65,536) and large (1M, 16M).

Run: ``python -m bench.ops.bench_route_exposure_to_factored`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import print_table, provider_rows

SIZES = [256, 4096, 65536, 1 << 20, 1 << 24]


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.route_exposure_to_factored import (
        route_exposure_to_factored,
        route_exposure_to_factored_reference,
    )

    dev = torch.device(device)
    out: list[dict] = []
    for n in SIZES:
        e = torch.randint(0, 5, (n,), device=dev)
        torch._dynamo.reset()  # one compiled graph per size, no recompile limit
        compiled = torch.compile(route_exposure_to_factored_reference, dynamic=False)
        s = torch.rand(n, device=dev) * 3
        v = torch.rand(n, device=dev) * 2
        ms, mv = torch.tensor(1.0, device=dev), torch.tensor(1.0, device=dev)
        providers = {
            "triton": lambda: route_exposure_to_factored(e, s, ms, v, mv, backend="triton"),
            "torch": lambda: route_exposure_to_factored_reference(e, s, ms, v, mv),
            "torch.compile": lambda: compiled(e, s, ms, v, mv),
        }
        out += provider_rows("bench_route_exposure_to_factored", "route_exposure_to_factored", f"N={n}", providers,
                             nbytes=n * (8 + 4 + 4 + 8))
    return out


if __name__ == "__main__":
    print_table(rows())
