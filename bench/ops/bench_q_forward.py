"""Benchmark: q_forward (the no-gradient forward of an MLP Q network with its head, one kernel).

At ``eurusd_dqn``'s sizes (MLP 162 → 256 → 256 with the dueling head of 45 actions, built by
``foxdqn/step/build.py``, the network's own parameters): the collect step's forward of the
4,096 envs' observations (``bench/ops/training.py``'s ``TRADING_ENVS``), the target network's
forward of ``agent.batch_size`` = 128 next states, and a population of 8 members of 512 envs each
(the same 4,096 rows; :class:`foxdqn.population.network.MemberQNetwork`'s ``[P, in, out]``
weights, 8 copies of the network). Providers: ``triton`` (the op), ``torch`` (the reference:
``F.linear`` / ``torch.baddbmm`` + ``torch.relu`` per layer and the dueling combine written out,
eager), ``torch.compile`` of the reference, and for the single network ``modules``: ``QNetwork``'s
own forward under ``torch.no_grad()`` with ``chain_backend="torch"`` (which keeps this op and
``mlp_chain`` out: the modules): one cuBLASLt GEMM with the
bias + ReLU epilogue per hidden layer (foxdqn/ops/linear_relu.py), the value and advantage GEMMs
and foxdqn/ops/dueling_combine.py (the population's path without the op is the reference's
``torch.baddbmm`` per layer). Matmul precision as in training (``agent.matmul_precision``, TF32 by
default).

Run: ``python -m bench.ops.bench_q_forward`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile, print_table, provider_rows
from bench.ops.training import DEFAULT, at_training_precision

BENCH = "bench_q_forward"
MEMBERS = 8  # members of the population row (their rows split the collect step's envs)


def rows(device: str = "cuda") -> list[dict]:
    """The rows, timed under the experiment's matmul precision (restored after)."""
    return at_training_precision(DEFAULT, device, _rows)


def _no_grad(fn):
    import torch

    def call():
        with torch.no_grad():
            return fn()
    return call


def _rows(t, dev) -> list[dict]:
    import copy

    import torch

    from foxdqn.nn.heads import DuelingHead
    from foxdqn.ops.q_forward import q_forward, q_forward_reference
    from foxdqn.population.network import MemberQNetwork

    g = torch.Generator(device=dev).manual_seed(0)
    net = copy.deepcopy(t.net).requires_grad_(False)
    net.chain_backend = "torch"  # QNetwork's modules (no fused op)
    dueling = isinstance(net.head, DuelingHead)
    linears = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]  # encoder, then (value, advantage | q)
    ws = [m.weight for m in linears]
    bs = [m.bias for m in linears]
    hidden = linears[:len(linears) - (2 if dueling else 1)]
    dims = "->".join(str(d) for d in [t.obs_dim, *(m.weight.shape[0] for m in hidden)])
    head = f"{'dueling ' if dueling else 'Q '}{t.num_actions}"
    out: list[dict] = []
    for n in (t.num_envs, t.batch_size):  # collect step; target network on s'
        x = torch.randn(n, t.obs_dim, device=dev, generator=g)
        size = f"M={n} {dims}->{head}"
        out += against_compile(BENCH, "q_forward", size, q_forward, q_forward_reference, x, ws, bs, dueling=dueling)
        out += provider_rows(BENCH, "q_forward", size, {"modules": _no_grad(lambda x=x: net(x))})

    members = MemberQNetwork.from_networks([net] * MEMBERS, "relu").to(dev).requires_grad_(False)
    pws, pbs = list(members.weights), list(members.biases)
    m = t.num_envs // MEMBERS
    x = torch.randn(MEMBERS, m, t.obs_dim, device=dev, generator=g)
    size = f"P={MEMBERS} M={m} {dims}->{head}"
    out += against_compile(BENCH, "q_forward", size, q_forward, q_forward_reference, x, pws, pbs, dueling=dueling)
    return out


if __name__ == "__main__":
    print_table(rows())
