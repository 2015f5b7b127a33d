"""Shared plumbing of the op benchmarks: timing one provider, the result row, the console table.

Nothing runs at import time, and Triton is imported only when something is timed.
"""
from __future__ import annotations

import sys

QUANTILES = [0.5, 0.2, 0.8]


def bench_ms(fn) -> tuple[float, float, float, str]:
    """Median, 20th and 80th percentile of one call of ``fn`` in ms (``triton.testing.do_bench``:
    25 ms warm-up, 100 ms of repetitions), and how it was timed: ``"graph"``, the replay of a CUDA
    graph holding one call (no Python; the replay's launch included, a floor of about 5 µs on the
    H200), or ``"eager"``, plain calls, when ``fn`` cannot be captured (a host sync). Two
    untimed calls first (compile / warm up), on a side stream before a capture."""
    import torch
    from triton.testing import do_bench

    fn()
    timing, run = "eager", fn
    if torch.cuda.is_available():
        from foxdqn.step.capture import capture, run_on_side_stream  # the training loop's capture sequence

        current, dev = torch.cuda.current_stream(), torch.device("cuda")
        try:
            run_on_side_stream(dev, fn)
            timing, run = "graph", capture(dev, fn).replay
        except Exception as exc:  # not capturable: timed eagerly, said in the row
            print(f"bench_ms: not captured ({type(exc).__name__}: {str(exc)[:120]}); timed eagerly", file=sys.stderr)
            torch.cuda.set_stream(current)  # a failed capture can leave its side stream current
            torch.cuda.synchronize()
    med, p20, p80 = do_bench(run, warmup=25, rep=100, quantiles=QUANTILES)
    return float(med), float(p20), float(p80), timing


def op_row(op: str, size: str, provider: str, ms: float, p20: float, p80: float, nbytes: int | None = None,
           timing: str | None = None) -> dict:
    """One result row of the ``ops`` section; ``gbps`` = ``nbytes`` / time (None without ``nbytes``);
    ``timing``: "graph" or "eager" (:func:`bench_ms`)."""
    return {"section": "ops", "op": op, "size": size, "provider": provider, "ms": ms, "p20_ms": p20, "p80_ms": p80,
            "gbps": None if nbytes is None else nbytes / (ms * 1e-3) / 1e9, "timing": timing}


def provider_rows(bench: str, op: str, size: str, providers: dict, nbytes: int | None = None) -> list[dict]:
    """A row per ``{provider: callable}`` timed with :func:`bench_ms`. A provider that raises is
    reported on stderr (``"{bench}: {provider} {size}: ..."``) and left out; the others still run."""
    out = []
    for name, fn in providers.items():
        try:
            med, p20, p80, timing = bench_ms(fn)
        except Exception as exc:  # a provider that cannot run this configuration is reported, not fatal
            print(f"{bench}: {name} {size}: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        out.append(op_row(op, size, name, med, p20, p80, nbytes, timing))
    return out


def against_compile(bench: str, op: str, size: str, kernel, reference, *args, kernel_backend: str = "triton",
                    **kwargs) -> list[dict]:
    """The three rows of an op at one size: ``triton`` (``kernel(*args, **kwargs, backend="triton")``),
    ``torch`` (``reference(*args, **kwargs)``) and ``torch.compile`` of the reference (compiled
    afresh for this size, ``dynamic=False``). ``kernel_backend``: the backend name passed to
    ``kernel`` and used as its row's provider (``"fused"`` for :mod:`foxdqn.ops.linear_relu`)."""
    import torch

    torch._dynamo.reset()
    compiled = torch.compile(reference, dynamic=False)
    providers = {
        kernel_backend: lambda: kernel(*args, **kwargs, backend=kernel_backend),
        "torch": lambda: reference(*args, **kwargs),
        "torch.compile": lambda: compiled(*args, **kwargs),
    }
    return provider_rows(bench, op, size, providers)


def against_compile_grad(bench: str, op: str, size: str, kernel, reference, *args, kernel_backend: str = "triton",
                         **kwargs) -> list[dict]:
    """As :func:`against_compile`, each row timing forward and backward: the op's output, then
    ``torch.autograd.grad`` of it w.r.t. every tensor of ``args`` that requires grad, with one fixed
    random upstream gradient (a standard normal of the output's shape, drawn once). The
    ``torch.compile`` row runs the compiled forward and the backward AOTAutograd compiled with it."""
    import torch

    inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    grad_out = torch.randn_like(reference(*args, **kwargs).detach())
    torch._dynamo.reset()
    compiled = torch.compile(reference, dynamic=False)

    def fwd_bwd(fn):
        return lambda: torch.autograd.grad(fn(), inputs, grad_out)

    providers = {
        kernel_backend: fwd_bwd(lambda: kernel(*args, **kwargs, backend=kernel_backend)),
        "torch": fwd_bwd(lambda: reference(*args, **kwargs)),
        "torch.compile": fwd_bwd(lambda: compiled(*args, **kwargs)),
    }
    return provider_rows(bench, op, size, providers)


def print_table(rows: list[dict]) -> None:
    """The rows as a fixed-width table: op, size, provider, ms, p20_ms, p80_ms, GB/s ("-" if None)."""
    w_op = max([len("op"), *(len(r["op"]) for r in rows)]) + 1
    w_size = max([len("size"), *(len(r["size"]) for r in rows)]) + 1
    print(f"{'op':<{w_op}} {'size':<{w_size}} {'provider':<14} {'ms':>10} {'p20_ms':>10} {'p80_ms':>10} {'GB/s':>8}")
    for r in rows:
        gbps = "-" if r["gbps"] is None else f"{r['gbps']:.1f}"
        print(f"{r['op']:<{w_op}} {r['size']:<{w_size}} {r['provider']:<14} {r['ms']:>10.4f} {r['p20_ms']:>10.4f} "
              f"{r['p80_ms']:>10.4f} {gbps:>8}")
