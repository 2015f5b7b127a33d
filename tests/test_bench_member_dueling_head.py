"""bench/ops/bench_member_dueling_head.py on CPU (the op in Triton's interpreter, timing replaced by one
call of each provider): a row per size for the op, the population's layers, the reference and
torch.compile (not called here), forward and forward + backward; the op's and the layers' forwards
give the same Q, their backwards every input's gradient."""
from __future__ import annotations

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("the op runs in Triton's interpreter here (TRITON_INTERPRET=1)", allow_module_level=True)

import bench.ops.bench_member_dueling_head as bm

from support import call_providers_once


def test_rows_time_the_op_beside_the_layers(monkeypatch):
    results = call_providers_once(monkeypatch)
    monkeypatch.setattr(bm, "MEMBERS", (1, 3))
    rows = bm.rows("cpu")
    got = {(r["op"], r["size"].split()[0], r["provider"]) for r in rows}
    want = {(op, size, provider) for op in ("member_dueling_head", "member_dueling_head+grad")
            for size in ("P=1", "P=3") for provider in ("triton", "torch", "torch.compile", "layers")}
    assert got == want, got ^ want
    assert len(results["triton"]) == len(results["layers"]) == 4  # two sizes, forward and + grad
    for kernel, layers in zip(results["triton"], results["layers"]):
        if isinstance(kernel, torch.Tensor):  # forward: the same Q
            torch.testing.assert_close(kernel, layers, rtol=1e-4, atol=1e-4)
        else:  # + grad (each with its own upstream gradient): the five inputs' gradients
            assert [g.shape for g in kernel] == [g.shape for g in layers] and len(kernel) == 5
