"""Benchmark: dqn_td_loss (the (Double) DQN target, Huber loss, |TD| and dL/dQ of one update).

Providers: the Triton op, the torch reference, ``torch.compile`` of the reference, each timed
forward and backward (the loss's gradient w.r.t. the stacked Q, as every update uses it): the
op's forward already computes ∂loss/∂q and its backward is one multiply, so a forward-only time
would count the op's gradient work and not the reference's. Training sizes: batch 256 and
4,096, 45 actions (the factored trading actions), Double DQN with the stacked [s; s'] online Q;
and a population of P = 8 members of 256 rows each (a δ per member, loss [P]).

Run: ``python -m bench.ops.bench_dqn_td_loss`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile_grad, print_table


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.dqn_td_loss import dqn_td_loss, dqn_td_loss_reference

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    out: list[dict] = []
    for b, members in ((256, 1), (4096, 1), (8 * 256, 8)):
        a = 45
        q = torch.randn(2 * b, a, device=dev, generator=g).requires_grad_(True)  # rows of s, then of s'
        args = (q, torch.randn(b, a, device=dev, generator=g), torch.randint(0, a, (b,), device=dev, generator=g),
                torch.randn(b, device=dev, generator=g), torch.rand(b, device=dev, generator=g),
                torch.ones(b, device=dev))
        if members == 1:
            case, delta = f"B={b} A={a} double stacked", 1.0
        else:
            case, delta = f"P={members} B={b // members} A={a} double stacked", torch.ones(members, device=dev)
        out += against_compile_grad("bench_dqn_td_loss", "dqn_td_loss_fwd_bwd", case, _loss_of(dqn_td_loss),
                                    _loss_of(dqn_td_loss_reference), *args, double=True, huber_delta=delta)
    return out


def _loss_of(fn):
    """``fn``'s loss (its first result; |TD| is computed too and not differentiated)."""
    return lambda *args, **kwargs: fn(*args, **kwargs)[0]


if __name__ == "__main__":
    print_table(rows())
