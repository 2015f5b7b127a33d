"""Benchmark: proportional prioritized replay (foxdqn/ops/per_sample.py, per_update.py).

Measures ``per_sample``, ``per_update`` and sample followed by update at capacities 1M and 10M
(block 1024) and batches 512 / 4096, for the Triton ops, the plain-torch references and
``torch.compile`` of the references; and, for the Triton ops alone at batch 256, the capacities
1M, 10M, 100M and 300M (:data:`SCALE_CAPACITIES`: sampling cost against capacity, where the
chunked prefix takes over above 4M slots; the references are O(capacity) per call there). Two
timing modes, named in the ``size`` column:

* ``graph``: the call captured in a CUDA graph and replayed (``triton.testing.do_bench_cudagraph``);
  this is how training runs it, so launch overhead is the GPU's only. Target for Triton at
  1M / 512: sample + update < 0.050 ms.
* ``eager``: plain calls (``triton.testing.do_bench``), including Python and dispatcher overhead.

``gbps`` is None: these ops are latency-bound (about ``B * block * 4`` bytes per call, 2 MB at
B=512, i.e. under 1 us of HBM time), so bandwidth is not the figure of merit.

Run: ``python -m bench.ops.bench_per [--quick]``. Nothing runs at import time.
"""
import argparse

import torch
import triton
import triton.testing

from bench.ops.common import QUANTILES, op_row, print_table
from foxdqn.ops.per_sample import per_sample, per_sample_reference
from foxdqn.ops.per_state import PERState
from foxdqn.ops.per_update import per_update, per_update_reference

CAPACITIES = (1_000_000, 10_000_000)
BATCHES = (512, 4096)
SCALE_CAPACITIES = (1_000_000, 10_000_000, 100_000_000, 300_000_000)  # Triton only, batch 256
SCALE_BATCH = 256
MODES = ("graph",)
PROVIDERS = ("triton", "torch", "torch.compile")


def _human(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k" if n % 1000 == 0 else str(n)


def _state(capacity: int, device: str) -> PERState:
    st = PERState(capacity, device, alpha=0.6, eps=1e-6, block=1024)
    gen = torch.Generator(device=device).manual_seed(0)
    st.leaves[:capacity] = torch.rand(capacity, generator=gen, device=device).add_(1e-3).pow_(0.6)
    st.rebuild_block_sums()
    return st


def _callables(st: PERState, batch: int, device: str, compiled: dict) -> dict:
    """{(op, provider): zero-argument callable} over fixed inputs."""
    gen = torch.Generator(device=device).manual_seed(1)
    rand = torch.rand(batch, generator=gen, device=device)
    td = torch.rand(batch, generator=gen, device=device) * 2
    size = torch.tensor(st.capacity, dtype=torch.int64, device=device)
    beta = torch.tensor(0.4, device=device)
    skip = torch.tensor(0.0, device=device)
    idx0, _ = per_sample(st, rand, size, beta)  # the Triton op on CUDA (the reference is O(capacity))

    def sample_update_ref(state, rand, size, beta, td, skip):
        idx, w = per_sample_reference(state, rand, size, beta)
        per_update_reference(state, idx, td * w, skip)
        return idx, w

    if not compiled:
        compiled["sample"] = torch.compile(per_sample_reference)
        compiled["update"] = torch.compile(per_update_reference)
        compiled["both"] = torch.compile(sample_update_ref)

    def triton_both():
        idx, w = per_sample(st, rand, size, beta, backend="triton")
        per_update(st, idx, td * w, skip, backend="triton")

    return {
        ("per_sample", "triton"): lambda: per_sample(st, rand, size, beta, backend="triton"),
        ("per_sample", "torch"): lambda: per_sample_reference(st, rand, size, beta),
        ("per_sample", "torch.compile"): lambda: compiled["sample"](st, rand, size, beta),
        ("per_update", "triton"): lambda: per_update(st, idx0, td, skip, backend="triton"),
        ("per_update", "torch"): lambda: per_update_reference(st, idx0, td, skip),
        ("per_update", "torch.compile"): lambda: compiled["update"](st, idx0, td, skip),
        ("per_sample+update", "triton"): triton_both,
        ("per_sample+update", "torch"): lambda: sample_update_ref(st, rand, size, beta, td, skip),
        ("per_sample+update", "torch.compile"): lambda: compiled["both"](st, rand, size, beta, td, skip),
    }


def _time(fn, mode: str):
    for _ in range(3):  # JIT / torch.compile warm-up outside any capture
        fn()
    torch.cuda.synchronize()
    if mode == "graph":
        return triton.testing.do_bench_cudagraph(fn, rep=50, quantiles=QUANTILES)
    return triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=QUANTILES)


def rows(device: str = "cuda", capacities=CAPACITIES, batches=BATCHES, modes=MODES, providers=PROVIDERS) -> list:
    """One dict per (op, capacity, batch, mode, provider): section, op, size, provider, ms
    (median), p20_ms, p80_ms, gbps (None: latency-bound)."""
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        raise RuntimeError("bench_per needs a CUDA device")
    out = []
    compiled: dict = {}
    plan = [(cap, batches, providers) for cap in capacities]
    if capacities == CAPACITIES:  # the scale rows: Triton alone, batch 256, up to 300M slots
        plan += [(cap, (SCALE_BATCH,), ("triton",)) for cap in SCALE_CAPACITIES if "triton" in providers]
    for cap, cap_batches, cap_providers in plan:
        st = _state(cap, device)
        for batch in cap_batches:
            fns = _callables(st, batch, device, compiled)
            for (op, provider), fn in fns.items():
                if provider not in cap_providers:
                    continue
                for mode in modes:
                    try:
                        ms, p20, p80 = _time(fn, mode)
                    except Exception as exc:  # keep the other rows; report the failure in the table
                        print(f"bench_per: {op} {provider} C={_human(cap)} B={batch} {mode} failed: {exc!r}")
                        continue
                    size = f"C={_human(cap)} B={batch} {mode}"
                    out.append(op_row(op, size, provider, float(ms), float(p20), float(p80)))  # gbps None
        del st
        torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1M capacity, batch 512, graph mode only")
    args = ap.parse_args()
    if args.quick:
        print_table(rows("cuda", capacities=(1_000_000,), batches=(512,), modes=("graph",)))
    else:
        print_table(rows("cuda"))
