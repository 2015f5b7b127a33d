"""Benchmark: branching_loss (BDQ's loss from the heads' raw outputs: the dueling aggregation per
branch, the mean-operator target, the Huber terms, |td|, the joint Q and the gradients w.r.t. every
branch's A_d and V(s) of one update).

Providers: the Triton op, the torch reference (the population's torch ops before the op), and
``torch.compile`` of the reference, each timed forward and backward (the gradient w.r.t. the online
heads' outputs, as every update uses it): the op's forward already computes the gradient and its
backward is one multiply, so a forward-only time would count the op's gradient work and not the
reference's. Training sizes: trading's three branches (5, 3, 3) with dueling and Double DQN, batch
256 and 4,096 of one run, and a population of P = 8 members of 256 rows each (a δ per member).

Run: ``python -m bench.ops.bench_branching_loss`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile_grad, print_table

#: (rows B, members P): one run's batch of 256 and of 4,096, a population of 8 members of 256
SIZES = ((256, 1), (4096, 1), (8 * 256, 8))
BRANCHES = (5, 3, 3)  #: trading's exposure, order type and urgency


def _inputs(device: str, rows_b: int, members: int, gen) -> tuple:
    """The op's arguments of B rows of ``members`` groups: the online heads at s (with gradient), the
    target's and the online's at s', then action, reward, discount, weight (ones) and δ (1.0 each)."""
    import torch

    shape = (members, rows_b // members)
    new = dict(device=device, generator=gen)

    def head(grad: bool):
        adv = [torch.randn(*shape, n, **new).requires_grad_(grad) for n in BRANCHES]
        return adv, torch.randn(*shape, 1, **new).requires_grad_(grad)

    joint = BRANCHES[0] * BRANCHES[1] * BRANCHES[2]
    return (head(True), head(False), head(False), torch.randint(0, joint, (rows_b,), **new),
            torch.randn(rows_b, **new), torch.rand(rows_b, **new), torch.ones(rows_b, device=device),
            torch.ones(members, device=device))


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.branching_loss import branching_loss, branching_loss_reference

    gen = torch.Generator(device=torch.device(device)).manual_seed(0)
    found = []
    for rows_b, members in SIZES:
        case = f"B={rows_b} D=3" if members == 1 else f"P={members} B={rows_b // members} D=3"
        args = _inputs(device, rows_b, members, gen)
        online, rest = args[0], args[1:]
        leaves = [*online[0], online[1]]  # the tensors against_compile_grad differentiates: flat arguments

        def kernel(*flat, backend="triton"):
            return branching_loss((list(flat[:3]), flat[3]), *rest, backend=backend)[0]

        def reference(*flat):
            return branching_loss_reference((list(flat[:3]), flat[3]), *rest)[0]

        found += against_compile_grad("bench_branching_loss", "branching_loss_fwd_bwd", case, kernel, reference,
                                      *leaves)
    return found


if __name__ == "__main__":
    print_table(rows())
