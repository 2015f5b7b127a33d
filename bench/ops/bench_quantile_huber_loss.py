"""Benchmark of ``foxdqn.ops.quantile_huber_loss`` (IQN / QR-DQN quantile Huber loss).

Two ops are timed: ``quantile_huber_loss`` (forward only) and ``quantile_huber_loss_fwd_bwd``
(forward + gradient w.r.t. the quantiles through ``torch.autograd.grad``). Providers: the Triton
op (forward and backward kernels), the plain-torch reference (autograd over the [B, N, N']
pairwise tensor), and ``torch.compile`` of the reference. Sizes: IQN (N = N' = 64, also 32),
QR-DQN (N = N' = 200) at training batches and at large batches. ``gbps`` is the effective
bandwidth (inputs read + outputs written, divided by time); the loss is O(B N N') arithmetic,
so this is a throughput figure, not a roofline.

Run: ``python -m bench.ops.bench_quantile_huber_loss`` (needs CUDA). Nothing runs at import time.
"""
from __future__ import annotations

from bench.ops.common import print_table, provider_rows

KAPPA = 1.0
# (B, N, N')
SIZES = [(32, 64, 64), (256, 32, 32), (1024, 64, 64), (32, 200, 200), (4096, 64, 64), (4096, 200, 200)]


def _inputs(num_rows: int, n: int, n_target: int, device: str):
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(num_rows, n, device=device, generator=g).requires_grad_(True)
    t = torch.randn(num_rows, n_target, device=device, generator=g)
    tau = torch.rand(num_rows, n, device=device, generator=g)
    return q, t, tau


def rows(device: str = "cuda") -> list[dict]:
    """One row per (op, size, provider): ms (median per call, bench.ops.common.bench_all: in-graph, providers interleaved), p20_ms, p80_ms, gbps."""
    import torch

    from foxdqn.ops.quantile_huber_loss import quantile_huber_loss, quantile_huber_loss_reference

    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        raise RuntimeError("bench_quantile_huber_loss needs a CUDA device (the Triton kernels run on CUDA tensors)")
    out = []
    for num_rows, n, n_target in SIZES:
        q, t, tau = _inputs(num_rows, n, n_target, device)
        torch._dynamo.reset()  # one compiled graph per size, no recompile limit
        compiled = torch.compile(quantile_huber_loss_reference, dynamic=False)
        losses = {
            "triton": lambda: quantile_huber_loss(q, t, tau, KAPPA, backend="triton"),
            "torch": lambda: quantile_huber_loss_reference(q, t, tau, KAPPA),
            "torch.compile": lambda: compiled(q, t, tau, KAPPA),
        }
        fwd_bytes = 4 * (2 * num_rows * n + num_rows * n_target + num_rows)
        bwd_bytes = 4 * (num_rows + 2 * num_rows * n + num_rows * n_target + num_rows * n)
        fwd, fwd_bwd = {}, {}
        for provider, loss_fn in losses.items():
            def forward(loss_fn=loss_fn):
                with torch.no_grad():
                    return loss_fn()

            def forward_backward(loss_fn=loss_fn):
                return torch.autograd.grad(loss_fn().sum(), q)

            fwd[provider], fwd_bwd[provider] = forward, forward_backward
        size = f"B={num_rows},N={n},N'={n_target}"
        out += provider_rows("bench_quantile_huber_loss", "quantile_huber_loss", size, fwd, nbytes=fwd_bytes)
        out += provider_rows("bench_quantile_huber_loss", "quantile_huber_loss_fwd_bwd", size, fwd_bwd,
                             nbytes=fwd_bytes + bwd_bytes)
    return out


if __name__ == "__main__":
    print_table(rows())
