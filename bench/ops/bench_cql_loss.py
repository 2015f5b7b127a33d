"""Benchmark: cql_loss (each member's α · CQL(H) regulariser and its dL/dQ, one kernel).

Providers: the Triton op, the torch reference (α · ``cql_regulariser``), ``torch.compile`` of
the reference, each timed forward and backward (the op's forward already computes ∂loss/∂Q and
its backward is one multiply). Training sizes: 45 actions (the factored trading actions), one
member of 256 and of 4,096 rows, and populations of 8 and 64 members of 256 rows; Q is the s rows
of the stacked [s; s'] online forward (a strided view), as an update passes it.

Run: ``python -m bench.ops.bench_cql_loss`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile_grad, print_table


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.cql_loss import cql_loss, cql_loss_reference

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    out: list[dict] = []
    for b, members in ((256, 1), (4096, 1), (256, 8), (256, 64)):
        a = 45
        stacked = torch.randn(members, 2 * b, a, device=dev, generator=g).requires_grad_(True)
        q = stacked[:, :b]  # the s rows
        args = (q, torch.randint(0, a, (members * b,), device=dev, generator=g),
                torch.rand(members * b, device=dev, generator=g) + 0.5, torch.ones(members, device=dev))
        out += against_compile_grad("bench_cql_loss", "cql_loss_fwd_bwd", f"P={members} B={b} A={a}",
                                    _summed(cql_loss), _summed(cql_loss_reference), *args)
    return out


def _summed(fn):
    """``fn``'s members' losses summed (one scalar to differentiate; the update sums them too)."""
    return lambda *args, **kwargs: fn(*args, **kwargs).sum()


if __name__ == "__main__":
    print_table(rows())
