"""Benchmark: linear_relu (relu(x Wᵀ + b) as one cuBLASLt GEMM with the bias + ReLU epilogue).

Not a Triton kernel: its provider is ``fused`` (``torch._addmm_activation``, backend "fused"),
against the reference ``relu(F.linear(x, W, b))`` (``nn.Linear`` + ``nn.ReLU``, GEMM then a ReLU
kernel) and ``torch.compile`` of the reference. Two ops: ``linear_relu`` (forward, as the collect
step's no-grad forward) and ``linear_relu_fwd_bwd`` (forward, then ``torch.autograd.grad`` w.r.t.
x, W and b, as an update). Training sizes: the two hidden layers of ``eurusd_dqn``'s MLP
(162 → 256, 256 → 256, the network's own parameters) at the collect step's 4,096 rows, and the
second layer (all three gradients) at the update's stacked [s; s'] (2 × ``agent.batch_size`` rows).

Run: ``python -m bench.ops.bench_linear_relu`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile, against_compile_grad, print_table
from bench.ops.training import DEFAULT, training


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.linear_relu import linear_relu, linear_relu_reference

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    t = training(DEFAULT, device)
    hidden = [m for m in t.net.modules() if isinstance(m, torch.nn.Linear)][: len(t.cfg.model.hidden)]
    out: list[dict] = []
    for layer in hidden:  # collect step: no-grad forward of N rows
        w, b = layer.weight.detach(), layer.bias.detach()
        x = torch.randn(t.num_envs, w.shape[1], device=dev, generator=g)
        out += against_compile("bench_linear_relu", "linear_relu", f"M={t.num_envs} {w.shape[1]}->{w.shape[0]}",
                               linear_relu, linear_relu_reference, x, w, b, kernel_backend="fused")
    w = hidden[-1].weight.detach().clone().requires_grad_(True)  # its input is a hidden layer's: dx too
    b = hidden[-1].bias.detach().clone().requires_grad_(True)
    r = 2 * t.batch_size
    x = torch.randn(r, w.shape[1], device=dev, generator=g).requires_grad_(True)
    out += against_compile_grad("bench_linear_relu", "linear_relu_fwd_bwd", f"M={r} {w.shape[1]}->{w.shape[0]}",
                                linear_relu, linear_relu_reference, x, w, b, kernel_backend="fused")
    return out


if __name__ == "__main__":
    print_table(rows())
