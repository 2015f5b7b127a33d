"""Benchmark: member_iqn_embedding (P members' ψ(s) ⊙ φ(τ) of IQN, eq. 4: one kernel forward, three
launches backward).

Providers: the Triton op; ``layers``, what an IQN population runs without it
(:mod:`foxdqn.population.distributional` with ``IQN_EMBEDDING_KERNEL`` off: τ·π i, ``cos``, the
embedding's ``foxdqn.population.layers.member_linear`` with its ReLU, the multiply by ψ(s)); the
torch reference and ``torch.compile`` of it; forward only and forward + backward (h's, W's and b's
gradients, as in the update). Sizes: ``eurusd_iqn``'s head (its last hidden width, the cosine
basis ``head.embedding_dim``, ``head.num_quantiles`` fractions per row) at the update's
``agent.batch_size`` rows, 1, 64 and 512 members, at the experiment's matmul precision (TF32).

Run: ``python -m bench.ops.bench_member_iqn_embedding`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import print_table, provider_rows
from bench.ops.training import at_training_precision

EXPERIMENT = "eurusd_iqn"
MEMBERS = (1, 64, 512)


def _layers(h, taus, pi_i, w, b):
    """ψ(s) ⊙ φ(τ) as the population network's layers run it (module docstring)."""
    import torch

    from foxdqn.population.layers import member_linear

    p, m, n = taus.shape
    phi = member_linear(torch.cos(taus[..., None] * pi_i).view(p, m * n, -1), w, b, True)
    return (h[:, :, None, :] * phi.view(p, m, n, -1)).view(p, m * n, -1)


def rows(device: str = "cuda") -> list[dict]:
    return at_training_precision(EXPERIMENT, device, _rows)


def _rows(t, dev) -> list[dict]:
    import math

    import torch

    from foxdqn.ops.member_iqn_embedding import member_iqn_embedding, member_iqn_embedding_reference

    g = torch.Generator(device=dev).manual_seed(0)
    hd, e, n = int(t.cfg.model.hidden[-1]), int(t.cfg.head.embedding_dim), int(t.cfg.head.num_quantiles)
    m = t.batch_size
    pi_i = torch.arange(e, dtype=torch.float32, device=dev) * math.pi
    out = []
    for p in MEMBERS:
        h = torch.randn(p, m, hd, device=dev, generator=g)
        taus = torch.rand(p, m, n, device=dev, generator=g)
        w = torch.randn(p, e, hd, device=dev, generator=g) / e ** 0.5
        b = torch.randn(p, 1, hd, device=dev, generator=g) * 0.1
        args = (h, taus, pi_i, w, b)
        size = f"P={p} M={m} N={n} n={e} H={hd}"
        torch._dynamo.reset()
        compiled = torch.compile(member_iqn_embedding_reference, dynamic=False)
        forwards = {"triton": lambda: member_iqn_embedding(*args, backend="triton"),
                    "layers": lambda: _layers(*args),
                    "torch": lambda: member_iqn_embedding_reference(*args),
                    "torch.compile": lambda: compiled(*args)}
        out += provider_rows("bench_member_iqn_embedding", "member_iqn_embedding", size, forwards)
        inputs = [h, w, b]
        for t_ in inputs:
            t_.requires_grad_(True)
        up = torch.randn(p, m * n, hd, device=dev, generator=g)
        out += provider_rows("bench_member_iqn_embedding", "member_iqn_embedding+grad", size,
                             {name: (lambda fn=fn: torch.autograd.grad(fn(), inputs, up))
                              for name, fn in forwards.items()})
    return out


if __name__ == "__main__":
    print_table(rows())
