"""Benchmark: member_linear_grads (a population's Linear backward, dx, dW and db, in one kernel).

Providers: the Triton op and ``layer``, what :func:`foxdqn.ops.member_linear.member_linear`'s
backward runs without it (the ReLU mask with the bias sum, or torch's bias sum, then torch's two
batched GEMMs). Sizes: ``eurusd_attention``'s Linears at one member (the update's [s; s'] pair: 2 ×
``agent.batch_size`` observations × ``env.window`` tokens; qkv 64 → 192, proj 64 → 64, fc1 64 → 256,
fc2 256 → 64), and ``eurusd_dqn``'s hidden layer (256 → 256, ReLU) at 1 and 64 members of
2 × ``agent.batch_size`` rows. The op is off in training (:data:`foxdqn.ops.member_linear.FUSED_BACKWARD`)
until these rows show it no slower.

Run: ``python -m bench.ops.bench_member_linear_grads`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import print_table, provider_rows
from bench.ops.training import DEFAULT, training

ATTENTION = "eurusd_attention"
#: (K, N, relu) of the attention block's Linears (width 64: conf/model/attention.yaml)
ATTENTION_LAYERS = ((64, 192, False), (64, 64, False), (64, 256, False), (256, 64, False))
MEMBERS = (1, 64)


def _layer_backward(x, w, dy, y):
    """member_linear's backward without the op: (dx, dW, db)."""
    import torch

    from foxdqn.ops.member_linear import member_batched
    from foxdqn.ops.relu_bias_grad import relu_bias_grad

    dz, db = relu_bias_grad(dy, y) if y is not None else (dy, dy.sum(1, keepdim=True))
    return member_batched(torch.bmm, dz, w.transpose(1, 2)), member_batched(torch.bmm, x.transpose(1, 2), dz), db


def _rows_at(size: str, x, w, dy, y) -> list[dict]:
    from foxdqn.ops.member_linear_grads import member_linear_grads

    return provider_rows("bench_member_linear_grads", "member_linear_grads", size, {
        "triton": lambda: member_linear_grads(x, w, dy, y, backend="triton"),
        "layer": lambda: _layer_backward(x, w, dy, y)})


def rows(device: str = "cuda") -> list[dict]:
    import torch

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    out = []
    att = training(ATTENTION, device).cfg
    tokens = 2 * att.agent.batch_size * att.env.window
    for k, n, relu in ATTENTION_LAYERS:
        x = torch.randn(1, tokens, k, device=dev, generator=g)
        w = torch.randn(1, k, n, device=dev, generator=g) / k ** 0.5
        dy = torch.randn(1, tokens, n, device=dev, generator=g)
        out += _rows_at(f"P=1 M={tokens} K={k} N={n}", x, w, dy, None)
    t = training(DEFAULT, device)
    m, h = 2 * t.batch_size, int(t.cfg.model.hidden[0])
    for p in MEMBERS:
        x = torch.randn(p, m, h, device=dev, generator=g)
        w = torch.randn(p, h, h, device=dev, generator=g) / h ** 0.5
        dy = torch.randn(p, m, h, device=dev, generator=g)
        y = torch.relu(torch.randn(p, m, h, device=dev, generator=g))
        out += _rows_at(f"P={p} M={m} K={h} N={h} relu", x, w, dy, y)
    return out


if __name__ == "__main__":
    print_table(rows())
