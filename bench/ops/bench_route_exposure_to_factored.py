"""Benchmark: route_exposure_to_factored (elementwise; memory-bound).

Providers: the Triton op, the torch reference, ``torch.compile`` of the reference.
``gbps`` = (exposure int64 + spread f32 + volatility f32 read, factored int64 written) / time.
Sizes: environment counts used in training (256 .. 65,536) and large (1M, 16M).

Run: ``python -m bench.ops.bench_route_exposure_to_factored`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

import sys

SIZES = [256, 4096, 65536, 1 << 20, 1 << 24]


def _time(fn) -> tuple[float, float, float]:
    import triton.testing

    fn()
    med, p20, p80 = triton.testing.do_bench(fn, quantiles=[0.5, 0.2, 0.8])
    return float(med), float(p20), float(p80)


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
        nbytes = n * (8 + 4 + 4 + 8)
        for name, fn in providers.items():
            try:
                med, p20, p80 = _time(fn)
            except Exception as exc:
                print(f"bench_route_exposure_to_factored: {name} N={n}: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            out.append({"section": "ops", "op": "route_exposure_to_factored", "size": f"N={n}", "provider": name,
                        "ms": med, "p20_ms": p20, "p80_ms": p80, "gbps": nbytes / (med * 1e-3) / 1e9})
    return out


def _print_table(rs: list[dict]) -> None:
    print(f"{'op':<28} {'size':<12} {'provider':<14} {'ms':>10} {'p20_ms':>10} {'p80_ms':>10} {'GB/s':>8}")
    for r in rs:
        gbps = "-" if r["gbps"] is None else f"{r['gbps']:.1f}"
        print(f"{r['op']:<28} {r['size']:<12} {r['provider']:<14} {r['ms']:>10.4f} {r['p20_ms']:>10.4f} "
              f"{r['p80_ms']:>10.4f} {gbps:>8}")


if __name__ == "__main__":
    _print_table(rows())
