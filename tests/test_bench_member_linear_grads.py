"""bench/ops/bench_member_linear_grads.py on CPU (the op in Triton's interpreter, timing replaced by
one call of each provider): a row per size and provider (the attention block's Linears at one member,
the hidden layer with its ReLU at 1 and 64 members), and the op's dx, dW and db equal the layer's
backward at every size."""
from __future__ import annotations

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("the op runs in Triton's interpreter here (TRITON_INTERPRET=1)", allow_module_level=True)

import bench.ops.bench_member_linear_grads as bm
from bench.ops import common


class _Cfg:
    """What the bench reads of bench.ops.training's result, at small sizes."""

    batch_size = 2

    class cfg:
        class agent:
            batch_size = 2

        class env:
            window = 3

        class model:
            hidden = [16]


def test_rows_time_the_op_beside_the_layers_backward(monkeypatch):
    results = []

    def fake_bench_all(fns):
        results.append({name: fn() for name, fn in fns.items()})
        return {name: (1e-3, 1e-3, 1e-3, "fake") for name in fns}

    monkeypatch.setattr(common, "bench_all", fake_bench_all)
    monkeypatch.setattr(bm, "training", lambda *a, **k: _Cfg())
    monkeypatch.setattr(bm, "ATTENTION_LAYERS", ((16, 48, False), (64, 16, False)))
    monkeypatch.setattr(bm, "MEMBERS", (1, 3))
    rows = bm.rows("cpu")
    sizes = [r["size"] for r in rows if r["provider"] == "triton"]
    assert sizes == ["P=1 M=12 K=16 N=48", "P=1 M=12 K=64 N=16", "P=1 M=4 K=16 N=16 relu",
                     "P=3 M=4 K=16 N=16 relu"], sizes
    assert {r["provider"] for r in rows} == {"triton", "layer"}
    for calls in results:
        for a, e in zip(calls["triton"], calls["layer"]):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
