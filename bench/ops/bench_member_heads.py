"""Benchmark: member_heads (P members' narrow linear heads on one input: one kernel forward, two backward).

Providers: the Triton op; ``layers``, what a branching population's head runs without it
(:mod:`foxdqn.population.branching` with ``BRANCH_HEAD_KERNELS`` off: each head through
``foxdqn.population.layers.member_linear``, which takes ``baddbmm`` for the branches' widths 5
and 3 and the op :mod:`foxdqn.ops.member_linear` for the value's 1); the torch reference (one
``baddbmm`` per head) and ``torch.compile`` of it; forward only and forward + backward (every
input's gradient, as in the update). Sizes: ``eurusd_branching``'s head (its last hidden width, the
branches 5, 3, 3 and the value) at 1, 64 and 512 members, of the update's online pair
(2 × ``agent.batch_size`` rows) and of the target's ``agent.batch_size`` rows, at the experiment's
matmul precision (TF32).

Run: ``python -m bench.ops.bench_member_heads`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import print_table, provider_rows
from bench.ops.training import at_training_precision

EXPERIMENT = "eurusd_branching"
MEMBERS = (1, 64, 512)


def _layers(x, weights, biases):
    """The heads as the population network's layers run them (module docstring)."""
    from foxdqn.population.layers import member_linear

    return [member_linear(x, w, b) for w, b in zip(weights, biases)]


def rows(device: str = "cuda") -> list[dict]:
    return at_training_precision(EXPERIMENT, device, _rows)


def _rows(t, dev) -> list[dict]:
    import torch

    from foxdqn.ops.member_heads import member_heads, member_heads_reference

    g = torch.Generator(device=dev).manual_seed(0)
    k = int(t.cfg.model.hidden[-1])
    widths = (*t.net.head.branch_sizes, 1)
    out = []
    for p in MEMBERS:
        for m in (2 * t.batch_size, t.batch_size):
            x = torch.randn(p, m, k, device=dev, generator=g)
            ws = [torch.randn(p, k, n, device=dev, generator=g) / k ** 0.5 for n in widths]
            bs = [torch.randn(p, 1, n, device=dev, generator=g) * 0.1 for n in widths]
            size = f"P={p} M={m} K={k} N={'+'.join(map(str, widths))}"
            torch._dynamo.reset()
            compiled = torch.compile(member_heads_reference, dynamic=False)
            forwards = {"triton": lambda: member_heads(x, ws, bs, backend="triton"),
                        "layers": lambda: _layers(x, ws, bs),
                        "torch": lambda: member_heads_reference(x, ws, bs),
                        "torch.compile": lambda: compiled(x, ws, bs)}
            out += provider_rows("bench_member_heads", "member_heads", size, forwards)
            inputs = [x, *ws, *bs]
            for t_ in inputs:
                t_.requires_grad_(True)
            ups = [torch.randn(p, m, n, device=dev, generator=g) for n in widths]
            out += provider_rows("bench_member_heads", "member_heads+grad", size,
                                 {name: (lambda fn=fn: torch.autograd.grad(fn(), inputs, ups))
                                  for name, fn in forwards.items()})
            for t_ in inputs:
                t_.requires_grad_(False)
    return out


if __name__ == "__main__":
    print_table(rows())
