"""The head ops' bench modules on CPU (the ops in Triton's interpreter, timing replaced by one call of
each provider: support.call_providers_once): bench/ops/bench_member_heads.py,
bench_member_dueling_head.py and bench_member_iqn_embedding.py each give a row per size for the op,
the population's layers, the reference and torch.compile (not called here), forward and forward +
backward; the op's and the layers' forwards give the same outputs (the BDQ heads' 4, the dueling
head's Q, IQN's x), their backwards the inputs' gradients (the BDQ head: x's and every weight's and
bias's; the dueling head: the five inputs' shapes, each with its own upstream gradient; IQN: h's,
W's and b's)."""
from __future__ import annotations

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("the ops run in Triton's interpreter here (TRITON_INTERPRET=1)", allow_module_level=True)

import bench.ops.bench_member_dueling_head as dueling_bench
import bench.ops.bench_member_heads as heads_bench
import bench.ops.bench_member_iqn_embedding as iqn_bench

from support import call_providers_once

PROVIDERS = ("triton", "torch", "torch.compile", "layers")


def _rows_of(monkeypatch, bench, members: tuple[int, ...]):
    """(the providers' results, the bench module's rows at ``members``): the op's rows on CPU."""
    results = call_providers_once(monkeypatch)
    monkeypatch.setattr(bench, "MEMBERS", members)
    return results, bench.rows("cpu")


def _assert_a_row_per_size_and_provider(rows, op: str, members: tuple[int, ...]) -> None:
    """A row per (op, op+grad) × member count × provider, and no other."""
    got = {(r["op"], r["size"].split()[0], r["provider"]) for r in rows}
    want = {(o, f"P={p}", provider) for o in (op, op + "+grad") for p in members for provider in PROVIDERS}
    assert got == want, got ^ want


def test_member_heads_rows_time_the_op_beside_the_layers(monkeypatch):
    results, rows = _rows_of(monkeypatch, heads_bench, (1, 3))
    got = {(r["op"], r["size"].split()[0], r["size"].split()[1], r["provider"]) for r in rows}
    want = {(op, size, m, provider) for op in ("member_heads", "member_heads+grad") for size in ("P=1", "P=3")
            for m in ("M=256", "M=128") for provider in PROVIDERS}
    assert got == want, got ^ want
    assert len(results["triton"]) == len(results["layers"]) == 8  # two sizes × two row counts, forward and + grad
    for kernel, layers in zip(results["triton"], results["layers"]):
        assert len(kernel) == len(layers)
        for a, b in zip(kernel, layers):  # forward: the 4 outputs; + grad: x's, 4 weights', 4 biases' gradients
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert len(results["triton"][1]) == 9


def test_member_dueling_head_rows_time_the_op_beside_the_layers(monkeypatch):
    results, rows = _rows_of(monkeypatch, dueling_bench, (1, 3))
    _assert_a_row_per_size_and_provider(rows, "member_dueling_head", (1, 3))
    assert len(results["triton"]) == len(results["layers"]) == 4  # two sizes, forward and + grad
    for kernel, layers in zip(results["triton"], results["layers"]):
        if isinstance(kernel, torch.Tensor):  # forward: the same Q
            torch.testing.assert_close(kernel, layers, rtol=1e-4, atol=1e-4)
        else:  # + grad (each with its own upstream gradient): the five inputs' gradients
            assert [g.shape for g in kernel] == [g.shape for g in layers] and len(kernel) == 5


def test_member_iqn_embedding_rows_time_the_op_beside_the_layers(monkeypatch):
    results, rows = _rows_of(monkeypatch, iqn_bench, (1, 2))
    _assert_a_row_per_size_and_provider(rows, "member_iqn_embedding", (1, 2))
    assert len(results["triton"]) == len(results["layers"]) == 4  # two sizes, forward and + grad
    for kernel, layers in zip(results["triton"], results["layers"]):
        if isinstance(kernel, torch.Tensor):  # forward: the same x
            torch.testing.assert_close(kernel, layers, rtol=1e-4, atol=1e-4)
        else:  # + grad: h's, W's and b's gradients
            assert len(kernel) == len(layers) == 3
            for a, b in zip(kernel, layers):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
