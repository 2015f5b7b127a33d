"""bench/ops/bench_member_iqn_embedding.py on CPU (the op in Triton's interpreter, timing replaced by one
call of each provider): a row per size for the op, the IQN population's layers, the reference and
torch.compile (not called here), forward and forward + backward; the op's and the layers' forwards
give the same x, their backwards h's, W's and b's gradients."""
from __future__ import annotations

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("the op runs in Triton's interpreter here (TRITON_INTERPRET=1)", allow_module_level=True)

import bench.ops.bench_member_iqn_embedding as bm

from support import call_providers_once


def test_rows_time_the_op_beside_the_layers(monkeypatch):
    results = call_providers_once(monkeypatch)
    monkeypatch.setattr(bm, "MEMBERS", (1, 2))
    rows = bm.rows("cpu")
    got = {(r["op"], r["size"].split()[0], r["provider"]) for r in rows}
    want = {(op, size, provider) for op in ("member_iqn_embedding", "member_iqn_embedding+grad")
            for size in ("P=1", "P=2") for provider in ("triton", "torch", "torch.compile", "layers")}
    assert got == want, got ^ want
    assert len(results["triton"]) == len(results["layers"]) == 4  # two sizes, forward and + grad
    for kernel, layers in zip(results["triton"], results["layers"]):
        if isinstance(kernel, torch.Tensor):  # forward: the same x
            torch.testing.assert_close(kernel, layers, rtol=1e-4, atol=1e-4)
        else:  # + grad: h's, W's and b's gradients
            assert len(kernel) == len(layers) == 3
            for a, b in zip(kernel, layers):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
