"""Benchmark: iqn_loss (IQN's loss of a population's update after the heads: the taken action's
quantiles, a* by the expected Q at s', the targets, the quantile Huber loss, the weighted mean per
member and the gradient w.r.t. the online quantiles).

Providers: the Triton op, the torch reference (the population's ops before it: gathers, argmax,
the quantile Huber loss's two kernels, the weighted mean), and ``torch.compile`` of the reference,
each timed forward and backward (the op's forward computes the gradient, its backward is one
multiply). Training sizes: ``eurusd_iqn``'s N = N' = 32 quantiles and 45 actions, batch 256 and
4,096 of one run, and a population of P = 8 members of 256 rows each (a κ per member).

Run: ``python -m bench.ops.bench_iqn_loss`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile_grad, print_table

#: (rows B, members P): one run's batch of 256 and of 4,096, a population of 8 members of 256
SIZES = ((256, 1), (4096, 1), (8 * 256, 8))
QUANTILES, ACTIONS = 32, 45  #: eurusd_iqn's N = N' and the factored trading actions


def _inputs(device: str, rows_b: int, members: int, gen) -> tuple:
    """The op's arguments of B rows of ``members`` groups: Z(s, τ) with gradient, Z'(s', τ'), the
    select Q, τ, action, reward, discount, weight (ones) and κ (1.0 each)."""
    import torch

    shape = (members, rows_b // members)
    new = dict(device=device, generator=gen)
    return (torch.randn(*shape, QUANTILES, ACTIONS, **new).requires_grad_(True),
            torch.randn(*shape, QUANTILES, ACTIONS, **new), torch.randn(*shape, ACTIONS, **new),
            torch.rand(*shape, QUANTILES, **new), torch.randint(0, ACTIONS, (rows_b,), **new),
            torch.randn(rows_b, **new), torch.rand(rows_b, **new), torch.ones(rows_b, device=device),
            torch.ones(members, device=device))


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.iqn_loss import iqn_loss, iqn_loss_reference

    gen = torch.Generator(device=torch.device(device)).manual_seed(0)
    found = []
    for rows_b, members in SIZES:
        case = f"B={rows_b} N={QUANTILES} A={ACTIONS}" if members == 1 else \
            f"P={members} B={rows_b // members} N={QUANTILES} A={ACTIONS}"
        found += against_compile_grad("bench_iqn_loss", "iqn_loss_fwd_bwd", case, _first(iqn_loss),
                                      _first(iqn_loss_reference), *_inputs(device, rows_b, members, gen))
    return found


def _first(fn):
    """``fn``'s loss, its first result (ρ is computed too, not differentiated)."""
    return lambda *args, **kwargs: fn(*args, **kwargs)[0]


if __name__ == "__main__":
    print_table(rows())
