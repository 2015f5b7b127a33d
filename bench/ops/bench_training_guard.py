"""Benchmark: training_guard (one scalar kernel per training step; latency-bound).

Providers: the Triton op, the torch reference, ``torch.compile`` of the reference. The guard is
launch-bound, so ``gbps`` is None. Sizes: the real configuration (ring in pinned host memory,
where the torch reference must synchronise to find the slot) and a device-resident ring (the
reference's best case, no sync).

Run: ``python -m bench.ops.bench_training_guard`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

import sys


def _time(fn) -> tuple[float, float, float]:
    import triton.testing

    fn()  # compile / warm up outside the timed region
    med, p20, p80 = triton.testing.do_bench(fn, quantiles=[0.5, 0.2, 0.8])
    return float(med), float(p20), float(p80)


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops import record as R
    from foxdqn.ops.training_guard import training_guard, training_guard_reference

    dev = torch.device(device)
    out: list[dict] = []
    for ring_where in ("pinned", "device"):
        ring_size = 64
        ring = R.new_ring(ring_size) if ring_where == "pinned" else R.new_ring(ring_size, pin_memory=False).to(dev)
        args = dict(
            loss=torch.tensor(0.5, device=dev), grad_norm=torch.tensor(1.5, device=dev),
            step=torch.tensor(12345, device=dev), loss_clip=torch.tensor(1e6, device=dev),
            collapse_threshold=torch.tensor(1e-6, device=dev), warmup_steps=torch.tensor(100, device=dev),
            patience=torch.tensor(10, device=dev), collapse_count=torch.zeros((), dtype=torch.int64, device=dev),
            acc=torch.zeros(4, device=dev), skip=torch.zeros((), device=dev), halted=torch.zeros((), device=dev),
            ring=ring,
        )
        torch._dynamo.reset()  # one compiled graph per configuration
        compiled = torch.compile(training_guard_reference, dynamic=False)
        providers = {
            "triton": lambda: training_guard(**args, backend="triton"),
            "torch": lambda: training_guard_reference(**args),
            "torch.compile": lambda: compiled(**args),
        }
        for name, fn in providers.items():
            try:
                med, p20, p80 = _time(fn)
            except Exception as exc:  # a provider that cannot run this configuration is reported, not fatal
                print(f"bench_training_guard: {name} ring={ring_where}: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            out.append({"section": "ops", "op": "training_guard", "size": f"R={ring_size} ring={ring_where}",
                        "provider": name, "ms": med, "p20_ms": p20, "p80_ms": p80, "gbps": None})
    return out


def _print_table(rs: list[dict]) -> None:
    print(f"{'op':<16} {'size':<22} {'provider':<14} {'ms':>10} {'p20_ms':>10} {'p80_ms':>10} {'GB/s':>8}")
    for r in rs:
        gbps = "-" if r["gbps"] is None else f"{r['gbps']:.1f}"
        print(f"{r['op']:<16} {r['size']:<22} {r['provider']:<14} {r['ms']:>10.4f} {r['p20_ms']:>10.4f} "
              f"{r['p80_ms']:>10.4f} {gbps:>8}")


if __name__ == "__main__":
    _print_table(rows())
