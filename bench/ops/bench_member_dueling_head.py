"""Benchmark: member_dueling_head (P dueling heads: both streams' Linear layers and eq. 9 in one kernel
forward, two backward).

Providers: the Triton op; ``layers``, what a population's dueling head runs without it
(:mod:`foxdqn.population.network` with ``DUELING_HEAD_KERNELS`` off: the value stream through
``foxdqn.population.layers.member_linear``, the advantage stream's ``baddbmm``, the
:mod:`foxdqn.ops.dueling_combine` kernel); the torch reference (two ``baddbmm`` and the combine's
expression) and ``torch.compile`` of it; forward only and forward + backward (every input's
gradient, as in the update). Sizes: 1, 64 and 512 members of ``eurusd_dqn``'s update
(``agent.batch_size`` rows, its last hidden width, its 45 actions).

Run: ``python -m bench.ops.bench_member_dueling_head`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile, against_compile_grad, print_table, provider_rows
from bench.ops.training import DEFAULT, training

MEMBERS = (1, 64, 512)


def _layers(x, w_v, b_v, w_a, b_a):
    """The head as the population network's layers run it (module docstring)."""
    from foxdqn.ops.dueling_combine import dueling_combine
    from foxdqn.population.layers import member_linear

    return dueling_combine(member_linear(x, w_v, b_v), member_linear(x, w_a, b_a))


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.member_dueling_head import member_dueling_head, member_dueling_head_reference

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    t = training(DEFAULT, device)
    m, k, a = t.batch_size, int(t.cfg.model.hidden[-1]), t.num_actions
    out = []
    for p in MEMBERS:
        x = torch.randn(p, m, k, device=dev, generator=g)
        w_v = torch.randn(p, k, 1, device=dev, generator=g) / k ** 0.5
        b_v = torch.randn(p, 1, 1, device=dev, generator=g) * 0.1
        w_a = torch.randn(p, k, a, device=dev, generator=g) / k ** 0.5
        b_a = torch.randn(p, 1, a, device=dev, generator=g) * 0.1
        args = (x, w_v, b_v, w_a, b_a)
        size = f"P={p} M={m} K={k} A={a}"
        out += against_compile("bench_member_dueling_head", "member_dueling_head", size, member_dueling_head,
                               member_dueling_head_reference, *args)
        out += provider_rows("bench_member_dueling_head", "member_dueling_head", size, {"layers": lambda: _layers(*args)})
        for t_ in args:
            t_.requires_grad_(True)
        out += against_compile_grad("bench_member_dueling_head", "member_dueling_head+grad", size, member_dueling_head,
                                    member_dueling_head_reference, *args)
        up = torch.randn(p, m, a, device=dev, generator=g)
        out += provider_rows("bench_member_dueling_head", "member_dueling_head+grad", size,
                             {"layers": lambda: torch.autograd.grad(_layers(*args), args, up)})
    return out


if __name__ == "__main__":
    print_table(rows())
