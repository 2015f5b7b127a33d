"""Benchmark: clip_coefficient (global gradient-norm clipping's total norm and coefficient from the
per-tensor norms, one kernel).

Providers: the Triton op, the torch reference (``clip_grad_norm_``'s expressions: about six
launches), ``torch.compile`` of the reference. Training sizes: one norm per parameter tensor of
``eurusd_dqn``'s network (8) with ``optim.grad_clip`` as the bound, for a single run (``[n]``
norms, 0-d bound) and a population of 64 members (``[64, n]``, one bound per member, one launch).
The reference is called as the op calls it on CPU (new ``total`` and ``coef`` each call).

Run: ``python -m bench.ops.bench_clip_coefficient`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile, print_table
from bench.ops.training import DEFAULT, training


def reference(norms, max_norm):
    """:func:`foxdqn.ops.clip_coefficient.clip_coefficient_reference` with the op's calling
    convention: ``(norms [n] or [G, n], max_norm 0-d or [G]) -> (total, coef)``."""
    import torch

    from foxdqn.ops.clip_coefficient import clip_coefficient_reference

    total = torch.empty(norms.shape[:-1], dtype=torch.float32, device=norms.device)
    coef = torch.empty_like(total)
    clip_coefficient_reference(norms.reshape(-1, norms.shape[-1]), max_norm.reshape(-1), total.view(-1),
                               coef.view(-1))
    return total, coef


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.clip_coefficient import clip_coefficient

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    t = training(DEFAULT, device)
    n, bound = len(t.param_shapes), float(t.cfg.optim.grad_clip)
    out: list[dict] = []
    for members in (None, 64):
        lead = () if members is None else (members,)
        norms = 5.0 * torch.rand(*lead, n, device=dev, generator=g)
        max_norm = torch.full(lead, bound, device=dev)
        size = f"n={n}" if members is None else f"G={members} n={n}"
        out += against_compile("bench_clip_coefficient", "clip_coefficient", size, clip_coefficient, reference,
                               norms, max_norm)
    return out


if __name__ == "__main__":
    print_table(rows())
