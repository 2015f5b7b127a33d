"""Benchmark: dqn_td_loss (the (Double) DQN target, Huber loss, |TD| and dL/dQ of one update).

Providers: the Triton op (forward; its backward is one multiply), the torch reference (forward,
autograd records its graph), ``torch.compile`` of the reference. Training sizes: batch 256 and
4,096, 45 actions (the factored trading actions), Double DQN with the stacked [s; s'] online Q;
and a population of P = 8 members of 256 rows each (a δ per member, loss [P]).

Run: ``python -m bench.ops.bench_dqn_td_loss`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile, print_table


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
        out += against_compile("bench_dqn_td_loss", "dqn_td_loss", case, dqn_td_loss, dqn_td_loss_reference, *args,
                               double=True, huber_delta=delta)
    return out


if __name__ == "__main__":
    print_table(rows())
