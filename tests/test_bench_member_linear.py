"""bench/ops/bench_member_linear.py on CPU (the op in Triton's interpreter, timing replaced by one call of
each provider): its rows, the hidden layer and C51's head forward and + grad, the heads' widths that
member_linear_preferred leaves to baddbmm forward only at 1 and 64 members; the op's forward equals
the reference's there."""
from __future__ import annotations

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("the op runs in Triton's interpreter here (TRITON_INTERPRET=1)", allow_module_level=True)

import bench.ops.bench_member_linear as bm
from bench.ops import common


def test_rows_time_the_op_beside_baddbmm_at_the_heads_widths(monkeypatch):
    results = []

    def fake_bench_all(fns):
        calls = {name: fn() for name, fn in fns.items() if name != "torch.compile"}  # compiling costs minutes
        results.append(calls)
        return {name: (1e-3, 1e-3, 1e-3, "fake") for name in fns}

    monkeypatch.setattr(common, "bench_all", fake_bench_all)
    monkeypatch.setattr(bm, "MEMBERS", 2)
    monkeypatch.setattr(bm, "HEAD_WIDTHS", (5, 3))
    monkeypatch.setattr(bm, "training", lambda *a, **k: _Small())
    rows = bm.rows("cpu")
    sizes = {(r["op"], r["size"]) for r in rows if r["provider"] == "triton"}
    assert sizes == {("member_linear", "P=2 M=8 K=16 N=16 relu"), ("member_linear+grad", "P=2 M=8 K=16 N=16 relu"),
                     ("member_linear", "P=2 M=8 K=16 N=2295"), ("member_linear+grad", "P=2 M=8 K=16 N=2295"),
                     ("member_linear", "P=1 M=8 K=16 N=5"), ("member_linear", "P=1 M=8 K=16 N=3"),
                     ("member_linear", "P=2 M=8 K=16 N=5"), ("member_linear", "P=2 M=8 K=16 N=3")}, sizes
    assert {r["provider"] for r in rows} == {"triton", "torch", "torch.compile"}
    for calls in results[-4:]:  # the heads' widths: the op's Q against baddbmm's
        torch.testing.assert_close(calls["triton"], calls["torch"], rtol=1e-5, atol=1e-5)


class _Small:
    """What bench_member_linear reads of bench.ops.training's result, at small sizes."""

    batch_size = 4

    class cfg:
        class model:
            hidden = [16]
