"""Benchmark: iql_loss (IQL's L_Q + L_V, td and the gradients w.r.t. Q(s, a) and V(s) of one update).

Providers: the Triton op, the torch reference, ``torch.compile`` of the reference, each timed
forward and backward (the loss's gradient w.r.t. the online Q and V(s), as every update uses it):
the op's forward already computes both gradients and its backward is one multiply each, so a
forward-only time would count the op's gradient work and not the reference's. Training sizes:
batch 256 and 4,096, 45 actions (the factored trading actions), one run's float τ; and a
population of P = 8 members of 256 rows each (a τ per member, loss [P]).

Run: ``python -m bench.ops.bench_iql_loss`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile_grad, print_table

#: (rows B, members P): one run's batch of 256 and of 4,096, a population of 8 members of 256
SIZES = ((256, 1), (4096, 1), (8 * 256, 8))
ACTIONS = 45  #: the factored trading actions


def _inputs(device: str, rows_b: int, members: int, gen) -> tuple:
    """The op's arguments of B rows of ``members`` groups: Q(s, ·) and V(s) with gradient, then
    Q_target(s, ·), V(s'), action, reward, discount, weight (ones) and τ (0.7, a float for one run)."""
    import torch

    shape = (members, rows_b // members)
    new = dict(device=device, generator=gen)
    q, q_target = torch.randn(*shape, ACTIONS, **new).requires_grad_(True), torch.randn(*shape, ACTIONS, **new)
    v, v_next = torch.randn(*shape, **new).requires_grad_(True), torch.randn(*shape, **new)
    tau = 0.7 if members == 1 else torch.full((members,), 0.7, device=device)
    return (q, q_target, v, v_next, torch.randint(0, ACTIONS, (rows_b,), **new), torch.randn(rows_b, **new),
            torch.rand(rows_b, **new), torch.ones(rows_b, device=device), tau)


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.iql_loss import iql_loss, iql_loss_reference

    gen = torch.Generator(device=torch.device(device)).manual_seed(0)
    found = []
    for rows_b, members in SIZES:
        case = f"B={rows_b} A={ACTIONS}" if members == 1 else f"P={members} B={rows_b // members} A={ACTIONS}"
        found += against_compile_grad("bench_iql_loss", "iql_loss_fwd_bwd", case, _first(iql_loss),
                                      _first(iql_loss_reference), *_inputs(device, rows_b, members, gen))
    return found


def _first(fn):
    """``fn``'s loss, its first result (td is computed too, not differentiated)."""
    return lambda *args, **kwargs: fn(*args, **kwargs)[0]


if __name__ == "__main__":
    print_table(rows())
