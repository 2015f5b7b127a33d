"""Benchmark: member_linear (P Linear layers with the bias and ReLU in the GEMM's epilogue, one kernel).

Providers: the Triton op, the torch reference (``torch.baddbmm`` then ``torch.relu``: a bias copy,
the batched GEMM and the ReLU, what a population's layer ran before the op) and ``torch.compile``
of the reference, forward only and forward + backward. Sizes: 64 members of the update's stacked
[s; s'] (2 × ``agent.batch_size`` rows) through ``eurusd_dqn``'s hidden width (256 → 256, ReLU), and
``eurusd_c51``'s head (256 → 45 actions × 51 atoms, no ReLU). Forward only, at 1 and 64 members:
the heads' widths that :func:`foxdqn.ops.member_linear.member_linear_preferred` leaves to
``baddbmm`` (:data:`HEAD_WIDTHS`: 45 actions, C51's 51 atoms, the branches' 5 and 3), to see whether that rule
still holds.

Run: ``python -m bench.ops.bench_member_linear`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile, against_compile_grad, print_table
from bench.ops.training import DEFAULT, training

MEMBERS = 64
HEAD_WIDTHS = (45, 51, 5, 3)  #: widths that are not a multiple of 4 (member_linear_preferred: baddbmm)


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.member_linear import member_linear, member_linear_reference

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    t = training(DEFAULT, device)
    m, h = 2 * t.batch_size, int(t.cfg.model.hidden[0])
    out = []
    for n, relu in ((h, True), (45 * 51, False)):
        x = torch.randn(MEMBERS, m, h, device=dev, generator=g)
        w = torch.randn(MEMBERS, h, n, device=dev, generator=g) / h ** 0.5
        b = torch.randn(MEMBERS, 1, n, device=dev, generator=g) * 0.1
        size = f"P={MEMBERS} M={m} K={h} N={n}{' relu' if relu else ''}"
        out += against_compile("bench_member_linear", "member_linear", size, member_linear, member_linear_reference,
                               x, w, b, relu)
        out += against_compile_grad("bench_member_linear", "member_linear+grad", size, member_linear,
                                    member_linear_reference, x.requires_grad_(True), w.requires_grad_(True),
                                    b.requires_grad_(True), relu)
    for p in (1, MEMBERS):
        x = torch.randn(p, m, h, device=dev, generator=g)
        for n in HEAD_WIDTHS:
            w = torch.randn(p, h, n, device=dev, generator=g) / h ** 0.5
            b = torch.randn(p, 1, n, device=dev, generator=g) * 0.1
            out += against_compile("bench_member_linear", "member_linear", f"P={p} M={m} K={h} N={n}", member_linear,
                                   member_linear_reference, x, w, b, False)
    return out


if __name__ == "__main__":
    print_table(rows())
