"""Benchmark: mlp_chain (a ReLU MLP with its Q head: forward one kernel, backward two).

Two ops at ``cartpole_cleanrl``'s sizes (MLP 4 → 120 → 84 → 2, built by
``foxdqn/step/build.py``, the network's own parameters): ``mlp_chain`` (no-grad forward: the
collect step's 10 envs, the target network's batch of ``agent.batch_size`` = 128 next states) and
``mlp_chain_fwd_bwd`` (forward of the update's stacked [s; s'] batch, 2 × 128 rows, then
``torch.autograd.grad`` w.r.t. every weight and bias with one fixed upstream gradient). Providers:
``triton`` (the op), ``torch`` (the reference: ``F.linear`` + ``torch.relu`` per layer, eager, and
autograd of it), ``torch.compile`` of the reference, and ``modules``: the network's forward before
this op (``QNetwork`` with ``chain_backend="torch"``: one cuBLASLt GEMM with the bias + ReLU
epilogue per hidden layer, foxdqn/ops/linear_relu.py, and the head's GEMM), with its autograd
backward. Matmul precision as in training (``agent.matmul_precision``, TF32 by default).

Run: ``python -m bench.ops.bench_mlp_chain`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile, print_table, provider_rows
from bench.ops.training import CARTPOLE, at_training_precision, linear_chain

BENCH = "bench_mlp_chain"


def rows(device: str = "cuda") -> list[dict]:
    """The rows, timed under the experiment's matmul precision (restored after)."""
    return at_training_precision(CARTPOLE, device, _rows)


def _rows(t, dev) -> list[dict]:
    import copy

    import torch

    from foxdqn.ops.mlp_chain import mlp_chain, mlp_chain_reference

    g = torch.Generator(device=dev).manual_seed(0)
    ws, bs, dims = linear_chain(t)
    net = copy.deepcopy(t.net).requires_grad_(False)
    net.chain_backend = "torch"
    out: list[dict] = []
    for n in (t.num_envs, t.batch_size):  # collect step; target network on s'
        x = torch.randn(n, t.obs_dim, device=dev, generator=g)
        out += against_compile(BENCH, "mlp_chain", f"B={n} {dims}", mlp_chain, mlp_chain_reference, x, ws, bs)
        out += provider_rows(BENCH, "mlp_chain", f"B={n} {dims}", {"modules": lambda x=x: net(x)})

    r = 2 * t.batch_size  # the update's stacked [s; s']
    x = torch.randn(r, t.obs_dim, device=dev, generator=g)
    wg = [w.clone().requires_grad_(True) for w in ws]
    bg = [b.clone().requires_grad_(True) for b in bs]
    params = wg + bg
    up = torch.randn(r, ws[-1].shape[0], device=dev, generator=g)
    trained = copy.deepcopy(t.net).requires_grad_(True)
    trained.chain_backend = "torch"
    torch._dynamo.reset()
    compiled = torch.compile(mlp_chain_reference, dynamic=False)

    def fwd_bwd(fn, inputs=params):
        return lambda: torch.autograd.grad(fn(), inputs, up)

    providers = {
        "triton": fwd_bwd(lambda: mlp_chain(x, wg, bg, backend="triton")),
        "torch": fwd_bwd(lambda: mlp_chain_reference(x, wg, bg)),
        "torch.compile": fwd_bwd(lambda: compiled(x, wg, bg)),
        "modules": fwd_bwd(lambda: trained(x), list(trained.parameters())),
    }
    out += provider_rows(BENCH, "mlp_chain_fwd_bwd", f"B={r} {dims}", providers)
    return out


if __name__ == "__main__":
    print_table(rows())
