"""Benchmark: qvalue_stats (one-program reduction over the [B, A] Q batch; memory-bound).

Providers: the Triton op, the torch reference, ``torch.compile`` of the reference; the ring is
device-resident for the torch providers (their no-sync best case) and pinned host memory for
Triton (the real configuration). ``gbps`` = bytes of Q read / time. Training sizes
(B <= 8192, A <= 64) and one large size that shows the one-program ceiling.

Run: ``python -m bench.ops.bench_qvalue_stats`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import print_table, provider_rows

SIZES = [(32, 5), (256, 45), (1024, 45), (8192, 64), (65536, 64)]


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.device import ring_record as R
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
        out += provider_rows("bench_qvalue_stats", "qvalue_stats", f"B={B} A={A}", providers, nbytes=B * A * 4)
    return out


if __name__ == "__main__":
    print_table(rows())
