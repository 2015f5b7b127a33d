"""Benchmark: mlp_chain_epsilon_greedy (a plain ReLU MLP Q network's ε-greedy actions, one kernel).

At ``cartpole_cleanrl``'s sizes (MLP 4 → 120 → 84 → 2, built by ``foxdqn/step/build.py``, the
network's own parameters): the collect step's 10 envs, and 4,096 envs (``bench/ops/training.py``'s
``TRADING_ENVS``: the same network on a GPU env's batch). ε = 0.5 at the step counter (half the rows
explore). Providers: ``triton`` (the op), ``torch`` (the reference: the torch MLP then the torch
ε-greedy, eager), ``torch.compile`` of the reference, and ``two ops``:
:func:`foxdqn.ops.mlp_chain.mlp_chain` then :func:`foxdqn.ops.epsilon_greedy.epsilon_greedy` (two
kernels: the collect step's path before this op). Matmul precision as in training (TF32 by default).

Run: ``python -m bench.ops.bench_mlp_chain_epsilon_greedy`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile, print_table, provider_rows
from bench.ops.training import CARTPOLE, TRADING_ENVS, at_training_precision, linear_chain

BENCH = "bench_mlp_chain_epsilon_greedy"


def rows(device: str = "cuda") -> list[dict]:
    """The rows, timed under the experiment's matmul precision (restored after)."""
    return at_training_precision(CARTPOLE, device, _rows)


def _rows(t, dev) -> list[dict]:
    import torch

    from foxdqn.ops.epsilon_greedy import epsilon_greedy
    from foxdqn.ops.mlp_chain import mlp_chain
    from foxdqn.ops.mlp_chain_epsilon_greedy import mlp_chain_epsilon_greedy, mlp_chain_epsilon_greedy_reference

    g = torch.Generator(device=dev).manual_seed(0)
    ws, bs, dims = linear_chain(t)
    out: list[dict] = []
    for n in (t.num_envs, TRADING_ENVS):
        x = torch.randn(n, t.obs_dim, device=dev, generator=g)
        sched = dict(step=torch.tensor(50, device=dev), start=torch.ones(1, device=dev),
                     end=torch.zeros(1, device=dev), duration=torch.full((1,), 100.0, device=dev),
                     u=torch.rand(1, 2, n, device=dev, generator=g))
        size = f"B={n} {dims}"
        out += against_compile(BENCH, "mlp_chain_epsilon_greedy", size, mlp_chain_epsilon_greedy,
                               mlp_chain_epsilon_greedy_reference, x, ws, bs, **sched)

        def two_ops(x=x, sched=sched):
            return epsilon_greedy(mlp_chain(x, ws, bs), sched["step"], sched["start"], sched["end"],
                                  sched["duration"], sched["u"])
        out += provider_rows(BENCH, "mlp_chain_epsilon_greedy", size, {"two ops": two_ops})
    return out


if __name__ == "__main__":
    print_table(rows())
