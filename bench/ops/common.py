"""Shared plumbing of the op benchmarks: timing one provider, the result row, the console table.

Nothing runs at import time, and Triton is imported only when something is timed.
"""
from __future__ import annotations

import sys

QUANTILES = [0.5, 0.2, 0.8]
CALLS_PER_GRAPH = 16  #: calls of a provider captured back to back in one CUDA graph (docs/bench.md#ops)
ROUNDS = 5  #: timing rounds; each round times every provider of a row once, in turn


def prepare(fn) -> tuple:
    """``(run, calls, timing)`` for timing ``fn``: ``run`` replays a CUDA graph holding
    ``CALLS_PER_GRAPH`` back-to-back calls of ``fn`` (``timing`` ``"graph x16"``), or is ``fn`` itself
    with ``calls`` = 1 (``"eager"``) where ``fn`` cannot be captured (a host sync) or there is no
    CUDA. Two untimed calls first (compile / warm up), the second on a side stream before a capture."""
    import torch

    fn()
    if not torch.cuda.is_available():
        return fn, 1, "eager"
    from foxdqn.device.capture import capture, run_on_side_stream  # the training loop's capture sequence

    current, dev = torch.cuda.current_stream(), torch.device("cuda")

    def many():
        for _ in range(CALLS_PER_GRAPH):
            fn()

    try:
        run_on_side_stream(dev, fn)
        return capture(dev, many).replay, CALLS_PER_GRAPH, f"graph x{CALLS_PER_GRAPH}"
    except Exception as exc:  # not capturable: timed eagerly, said in the row
        print(f"prepare: not captured ({type(exc).__name__}: {str(exc)[:120]}); timed eagerly", file=sys.stderr)
        torch.cuda.set_stream(current)  # a failed capture can leave its side stream current
        torch.cuda.synchronize()
        return fn, 1, "eager"


def bench_all(fns: dict, rounds: int = ROUNDS) -> dict:
    """Time each ``{name: fn}``: ``{name: (median, p20, p80, timing)}`` in ms per call of ``fn``, or
    ``{name: exception}`` for one that raised (the others still run).

    Each ``fn`` is captured as :func:`prepare` says; then ``rounds`` rounds each time every prepared
    provider once, in turn (``triton.testing.do_bench``: 5 ms of warm-up, 20 ms of repetitions),
    so that a drift of the machine's speed falls on all providers alike. The quantiles are over
    all repetitions of all rounds, each divided by the calls per replay: the time of one call
    inside a graph of back-to-back calls, as the op runs inside the training iteration's graph,
    with the replay's own launch (about 5 µs on the H200, the same for every provider) spread over
    the calls."""
    import statistics

    from triton.testing import do_bench

    prepared, out, times = {}, {}, {}
    for name, fn in fns.items():
        try:
            prepared[name] = prepare(fn)
        except Exception as exc:  # reported by the caller
            out[name] = exc
    for _ in range(rounds):
        for name, (run, calls, _timing) in list(prepared.items()):
            try:
                times.setdefault(name, []).extend(t / calls for t in do_bench(run, warmup=5, rep=20, return_mode="all"))
            except Exception as exc:
                out[name] = exc
                del prepared[name]
    for name, (_run, _calls, timing) in prepared.items():
        qs = statistics.quantiles(times[name], n=10, method="inclusive")
        out[name] = (statistics.median(times[name]), qs[1], qs[7], timing)
    return {name: out[name] for name in fns}


def op_row(op: str, size: str, provider: str, ms: float, p20: float, p80: float, nbytes: int | None = None,
           timing: str | None = None) -> dict:
    """One result row of the ``ops`` section; ``gbps`` = ``nbytes`` / time (None without ``nbytes``);
    ``timing``: "graph x16" or "eager" (:func:`prepare`)."""
    return {"section": "ops", "op": op, "size": size, "provider": provider, "ms": ms, "p20_ms": p20, "p80_ms": p80,
            "gbps": None if nbytes is None else nbytes / (ms * 1e-3) / 1e9, "timing": timing}


def provider_rows(bench: str, op: str, size: str, providers: dict, nbytes: int | None = None) -> list[dict]:
    """A row per ``{provider: callable}``, the providers timed together by :func:`bench_all`. A
    provider that raises is reported on stderr (``"{bench}: {provider} {size}: ..."``) and left
    out; the others still run."""
    out = []
    for name, res in bench_all(providers).items():
        if isinstance(res, Exception):  # a provider that cannot run this configuration is reported, not fatal
            print(f"{bench}: {name} {size}: {type(res).__name__}: {res}", file=sys.stderr)
            continue
        med, p20, p80, timing = res
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
