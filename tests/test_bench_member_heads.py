"""bench/ops/bench_member_heads.py on CPU (the op in Triton's interpreter, timing replaced by one call
of each provider): a row per size for the op, the branching population's layers, the reference and
torch.compile (not called here), forward and forward + backward; the op's and the layers' forwards
give the same outputs, their backwards every input's gradient."""
from __future__ import annotations

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("the op runs in Triton's interpreter here (TRITON_INTERPRET=1)", allow_module_level=True)

import bench.ops.bench_member_heads as bm

from support import call_providers_once


def test_rows_time_the_op_beside_the_layers(monkeypatch):
    results = call_providers_once(monkeypatch)
    monkeypatch.setattr(bm, "MEMBERS", (1, 3))
    rows = bm.rows("cpu")
    got = {(r["op"], r["size"].split()[0], r["size"].split()[1], r["provider"]) for r in rows}
    want = {(op, size, m, provider) for op in ("member_heads", "member_heads+grad") for size in ("P=1", "P=3")
            for m in ("M=256", "M=128") for provider in ("triton", "torch", "torch.compile", "layers")}
    assert got == want, got ^ want
    assert len(results["triton"]) == len(results["layers"]) == 8  # two sizes × two row counts, forward and + grad
    for kernel, layers in zip(results["triton"], results["layers"]):
        assert len(kernel) == len(layers)
        for a, b in zip(kernel, layers):  # forward: the 4 outputs; + grad: x's, 4 weights', 4 biases' gradients
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert len(results["triton"][1]) == 9
