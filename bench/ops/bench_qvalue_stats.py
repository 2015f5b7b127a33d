"""Benchmark: qvalue_stats (one-program reduction over the [B, A] Q batch; memory-bound).

Providers: the Triton op, the torch reference, ``torch.compile`` of the reference; the ring is
device-resident for the torch providers (their no-sync best case) and pinned host memory for
Triton (the real configuration). ``gbps`` = bytes of Q read / time. Training sizes
(B <= 8192, A <= 64) and one large size that shows the one-program ceiling.

Run: ``python -m bench.ops.bench_qvalue_stats`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

import sys

SIZES = [(32, 5), (256, 45), (1024, 45), (8192, 64), (65536, 64)]


def _time(fn) -> tuple[float, float, float]:
    import triton.testing

    fn()
    med, p20, p80 = triton.testing.do_bench(fn, quantiles=[0.5, 0.2, 0.8])
    return float(med), float(p20), float(p80)


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops import record as R
    from foxdqn.ops.qvalue_stats import qvalue_stats, qvalue_stats_reference

    dev = torch.device(device)
    out: list[dict] = []
    for B, A in SIZES:
        q = torch.randn(B, A, device=dev)
        torch._dynamo.reset()  # one compiled graph per size, no recompile limit
        compiled = torch.compile(qvalue_stats_reference, dynamic=False)
        step = torch.tensor(77, device=dev)
        thr = torch.tensor(1e4, device=dev)
        acc = torch.zeros(2, device=dev)
        pinned = R.new_ring(64)
        dev_ring = R.new_ring(64, pin_memory=False).to(dev)
        providers = {
            "triton": lambda: qvalue_stats(q, step, acc, pinned, thr, backend="triton"),
            "torch": lambda: qvalue_stats_reference(q, step, acc, dev_ring, thr),
            "torch.compile": lambda: compiled(q, step, acc, dev_ring, thr),
        }
        nbytes = B * A * 4
        for name, fn in providers.items():
            try:
                med, p20, p80 = _time(fn)
            except Exception as exc:
                print(f"bench_qvalue_stats: {name} {B}x{A}: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            out.append({"section": "ops", "op": "qvalue_stats", "size": f"B={B} A={A}", "provider": name,
                        "ms": med, "p20_ms": p20, "p80_ms": p80, "gbps": nbytes / (med * 1e-3) / 1e9})
    return out


def _print_table(rs: list[dict]) -> None:
    print(f"{'op':<16} {'size':<18} {'provider':<14} {'ms':>10} {'p20_ms':>10} {'p80_ms':>10} {'GB/s':>8}")
    for r in rs:
        gbps = "-" if r["gbps"] is None else f"{r['gbps']:.1f}"
        print(f"{r['op']:<16} {r['size']:<18} {r['provider']:<14} {r['ms']:>10.4f} {r['p20_ms']:>10.4f} "
              f"{r['p80_ms']:>10.4f} {gbps:>8}")


if __name__ == "__main__":
    _print_table(rows())
