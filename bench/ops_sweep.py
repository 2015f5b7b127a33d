"""Sweep the launch constants of ops against ``torch.compile`` of their references (CUDA only).

For each op named (default: all of :data:`SWEEPS`), in one process: the op's bench module
(``bench/ops/bench_<op>.py``) runs once with every provider (its ``torch.compile`` rows are the
yardstick), then once per combination of the op module's launch constants (set on the module:
every op listed reads them at each launch), timing the op alone (``bench.ops.common.bench_all``:
a CUDA graph of back-to-back calls; only the op's own rows are kept, not another provider a bench
module adds). A combination that cannot run (e.g. Triton's shared-memory limit) gets no time for
that size (``provider_rows`` prints the error on stderr) and is not ranked; one whose bench
module itself raises is recorded with the error. Prints, per op and size, compile's time and the
three fastest combinations, then the combinations ranked by their worst kernel/compile ratio over
the sizes; writes everything as JSON. The constants are restored after each op. Results of the sweeps that
set today's constants: bench/results/2026-12-01_NVIDIA-H200_ops-sweep-issue17.md.

Run: ``python -m bench.ops_sweep [OP ...] [--out DIR]`` (matmul precision "high", as training).
"""
from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os

KERNEL_PROVIDERS = ("triton", "fused")  #: the providers that are the op itself (bench.ops.common.against_compile)

#: op → its launch constants and the values to try (the op module is foxdqn.ops.<op>)
SWEEPS = {
    "epsilon_greedy": {"BLOCK": [8, 16, 32, 64, 128], "NUM_WARPS": [1, 2, 4], "MAX_BLOCK_A": [16, 64]},
    "trading_observation": {"BLOCK": [1, 2, 4, 8], "NUM_WARPS": [1, 2, 4], "CHUNK": [64, 128, 256]},
    "dueling_combine": {"TILE": [256, 512, 1024, 2048, 4096], "NUM_WARPS": [1, 2, 4, 8]},
    "dqn_td_loss": {"TILE": [512, 1024, 2048], "MIN_PROGRAMS": [32, 64, 128], "NUM_WARPS": [1, 2, 4]},
    "replay_gather": {"BLOCK_B": [2, 4, 8, 16, 32], "MAX_BLOCK_D": [64, 128, 256], "NUM_WARPS": [1, 2, 4]},
    "her_relabel": {"BLOCK_R": [8, 16, 32, 64], "MAX_BLOCK_D": [32, 64, 128], "NUM_WARPS": [1, 2, 4]},
    "relu_bias_grad": {"BLOCK_H": [8, 16, 32], "BLOCK_M": [32, 64, 128], "NUM_WARPS": [1, 2, 4]},
    "q_forward": {"BLOCK_M": [16, 32, 64], "NUM_WARPS": [4, 8], "NUM_WARPS_LINEAR": [4, 8], "BLOCK_K": [32, 64],
                  "BLOCK_N": [32, 64], "NUM_STAGES": [2, 3]},
    "member_uniform": {"BLOCK": [128, 256, 512, 1024], "NUM_WARPS": [1, 2, 4]},
    "adam_step": {"BLOCK": [256, 512, 1024, 2048], "NUM_WARPS": [2, 4, 8]},
    "member_dueling_head": {"BLOCK_K": [64, 128], "STAGES_FORWARD": [1, 3], "WARPS_FORWARD": [4, 8],
                            "BLOCK_R": [64, 128], "BLOCK_DW": [32, 128], "STAGES_DW": [1, 3]},
}
#: op → (its bench module, the op name of its rows there) where the module is not ``bench_<op>``
#: or holds other ops' rows too
BENCH_OF = {"adam_step": ("bench_update_tail", "adam_step_")}


def _kernel_only(common):
    """Replacements of ``against_compile`` / ``against_compile_grad`` that time the op alone."""
    import torch

    def plain(bench, op, size, kernel, reference, *args, kernel_backend="triton", **kw):
        return common.provider_rows(bench, op, size, {kernel_backend: lambda: kernel(*args, **kw, backend=kernel_backend)})

    def grad(bench, op, size, kernel, reference, *args, kernel_backend="triton", **kw):
        inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        up = torch.randn_like(reference(*args, **kw).detach())
        return common.provider_rows(bench, op, size, {kernel_backend: lambda: torch.autograd.grad(
            kernel(*args, **kw, backend=kernel_backend), inputs, up)})

    return plain, grad


def sweep(op: str, device: str = "cuda") -> dict:
    """``{"base": {"op | size | provider": µs}, "configs": [{"cfg": {...}, "us": {"op | size": µs}} | {"cfg", "error"}]}``."""
    from bench.ops import common

    opmod = importlib.import_module(f"foxdqn.ops.{op}")
    module, row_op = BENCH_OF.get(op, (f"bench_{op}", None))
    bm = importlib.import_module(f"bench.ops.{module}")

    def mine(r: dict) -> bool:
        return row_op is None or r["op"] == row_op

    grid = SWEEPS[op]
    base = {" | ".join((r["op"], r["size"], r["provider"])): r["ms"] * 1e3 for r in bm.rows(device) if mine(r)}
    res = {"base": base, "configs": []}
    saved = (getattr(bm, "against_compile", None), getattr(bm, "against_compile_grad", None))
    defaults = {k: getattr(opmod, k) for k in grid}
    bm.against_compile, bm.against_compile_grad = _kernel_only(common)
    try:
        for values in itertools.product(*grid.values()):
            cfg = dict(zip(grid, values))
            for k, v in cfg.items():
                setattr(opmod, k, v)
            try:  # the op's own rows only (a bench module may add providers, e.g. q_forward's modules)
                res["configs"].append({"cfg": cfg, "us": {f"{r['op']} | {r['size']}": round(r["ms"] * 1e3, 2)
                                                          for r in bm.rows(device) if r["provider"] in KERNEL_PROVIDERS and mine(r)}})
            except Exception as exc:  # a combination that cannot launch is recorded, not fatal
                res["configs"].append({"cfg": cfg, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
    finally:
        for k, v in defaults.items():
            setattr(opmod, k, v)
        bm.against_compile, bm.against_compile_grad = saved
    return res


def summary(op: str, res: dict) -> list[str]:
    """The printed lines of one op's sweep (module docstring)."""
    ok = [c for c in res["configs"] if "us" in c]
    sizes = sorted({s for c in ok for s in c["us"]})
    lines = [f"== {op}"]
    for s in sizes:
        best = sorted(((c["us"][s], c["cfg"]) for c in ok if s in c["us"]), key=lambda t: t[0])[:3]
        lines.append(f"  {s}: compile {res['base'].get(s + ' | torch.compile', float('nan')):.2f} best {best}")
    ranked = []
    for c in ok:
        if all(s in c["us"] and s + " | torch.compile" in res["base"] for s in sizes):
            ranked.append((round(max(c["us"][s] / res["base"][s + " | torch.compile"] for s in sizes), 3), c["cfg"]))
    lines.append(f"  worst kernel/compile ratio, best first: {sorted(ranked, key=lambda t: t[0])[:4]}")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ops", nargs="*", help=f"ops to sweep (default: all): {', '.join(SWEEPS)}")
    ap.add_argument("--out", default="bench/results", help="folder of ops_sweep.json")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.ops) - set(SWEEPS))
    if unknown:
        ap.error(f"unknown ops {unknown}; allowed: {', '.join(SWEEPS)}")
    import torch

    if not torch.cuda.is_available():
        ap.error("needs CUDA (the op is timed as a CUDA-graph replay)")
    from foxdqn.ops.library import register_ops

    torch.set_float32_matmul_precision("high")
    register_ops()  # the torch.compile rows trace the ops' references, which may call registered ops
    out = {}
    for op in args.ops or list(SWEEPS):
        out[op] = sweep(op)
        print("\n".join(summary(op, out[op])), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ops_sweep.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
