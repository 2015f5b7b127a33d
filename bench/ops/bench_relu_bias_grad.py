"""Benchmark: relu_bias_grad (the ReLU's backward and the bias gradient, one kernel).

Providers: the Triton op, the torch reference (``threshold_backward`` then ``sum(0)``, what
autograd runs for ``relu(linear(x))``) and ``torch.compile`` of the reference. Training sizes: the
update's stacked [s; s'] (2 × ``agent.batch_size`` rows) through ``eurusd_dqn``'s hidden width
(256; ``cartpole_cleanrl``'s network runs :mod:`foxdqn.ops.mlp_chain` instead); dy random, y a
ReLU output (about half exactly 0).

Run: ``python -m bench.ops.bench_relu_bias_grad`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile, print_table
from bench.ops.training import DEFAULT, training


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.relu_bias_grad import relu_bias_grad, relu_bias_grad_reference

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    t = training(DEFAULT, device)
    m, h = 2 * t.batch_size, int(t.cfg.model.hidden[0])
    dy = torch.randn(m, h, device=dev, generator=g)
    y = torch.relu(torch.randn(m, h, device=dev, generator=g))
    return against_compile("bench_relu_bias_grad", "relu_bias_grad", f"M={m} H={h}", relu_bias_grad,
                           relu_bias_grad_reference, dy, y)


if __name__ == "__main__":
    print_table(rows())
