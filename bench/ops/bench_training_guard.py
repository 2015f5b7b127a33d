"""Benchmark: training_guard (one scalar kernel per training step; latency-bound).

Providers: the Triton op, the torch reference, ``torch.compile`` of the reference. The guard is
launch-bound, so ``gbps`` is None. Sizes: the real configuration (ring in pinned host memory,
where the torch reference must synchronise to find the slot) and a device-resident ring (the
reference's best case, no sync).

Run: ``python -m bench.ops.bench_training_guard`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import print_table, provider_rows


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.device import ring_record as R
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
        out += provider_rows("bench_training_guard", "training_guard", f"R={ring_size} ring={ring_where}", providers)
    return out


if __name__ == "__main__":
    print_table(rows())
