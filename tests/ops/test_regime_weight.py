"""foxdqn.ops.regime_weight: the kernel (TRITON_INTERPRET=1 on CPU) gives the same bits as its torch
reference and as :class:`foxdqn.replay.regime.RegimeWeights` (the rule it replaces) for ratios below,
at and above both thresholds, NaN and inf ratios, repeated and unsorted rows, more rows than a block,
an empty batch; bad arguments are refused naming the argument. GPU (``gpu``): the same, captured."""
from __future__ import annotations

import pytest
import torch

from foxdqn.ops.regime_weight import regime_weight, regime_weight_reference
from foxdqn.replay.regime import RegimeWeights

from support import assert_replays_give


def _case(rows, b, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    ratio = torch.rand(rows, generator=g) * 2.5
    ratio[:6] = torch.tensor([0.5, 1.5, float("nan"), float("inf"), 0.0, 1.0])  # at the thresholds, NaN, inf
    index = torch.randint(0, rows, (b,), generator=g)
    index[:6] = torch.arange(min(6, b))
    weight = torch.rand(b, generator=g) + 0.1
    rw = RegimeWeights(0.5, 1.5, [0.5, 1.0, 2.0], torch.device(device))
    return ratio.to(device), index.to(device), weight.to(device), rw


@pytest.mark.parametrize("rows,b", [(7, 6), (300, 1030), (50, 2053)])
def test_kernel_equals_reference_and_the_rule(rows, b):
    ratio, index, weight, rw = _case(rows, b)
    got = regime_weight(ratio, index, weight, rw.low, rw.high, rw.weights, backend="triton")
    want = regime_weight_reference(ratio, index, weight, rw.low, rw.high, rw.weights)
    assert torch.equal(got, want)
    assert torch.equal(want, weight * rw(ratio[index]))  # the rule it replaces
    assert torch.equal(got[:6] / weight[:6], torch.tensor([1.0, 1.0, 1.0, 2.0, 0.5, 1.0]))


def test_empty_batch():
    ratio, _, _, rw = _case(6, 6)
    out = regime_weight(ratio, torch.zeros(0, dtype=torch.int64), torch.zeros(0), rw.low, rw.high, rw.weights,
                        backend="triton")
    assert out.shape == (0,)


@pytest.mark.parametrize("change,match", [
    (dict(ratio=torch.zeros(4, 2)), "ratio must be contiguous float32"),
    (dict(index=torch.zeros(3)), "index must be int64"),
    (dict(weight=torch.zeros(4)), "weight must be float32"),
    (dict(low=torch.zeros(1)), "low must be float32"),
    (dict(weights=torch.zeros(2)), "weights must be float32"),
])
def test_bad_arguments(change, match):
    ratio, index, weight, rw = _case(8, 6)
    args = dict(ratio=ratio, index=index[:3], weight=weight[:3], low=rw.low, high=rw.high, weights=rw.weights)
    with pytest.raises(ValueError, match=match):
        regime_weight(**{**args, **change}, backend="triton")


@pytest.mark.gpu
def test_gpu_kernel_equals_reference_and_capture():
    ratio, index, weight, rw = _case(4096, 32 * 256, device="cuda")
    want = regime_weight_reference(ratio, index, weight, rw.low, rw.high, rw.weights)
    assert torch.equal(regime_weight(ratio, index, weight, rw.low, rw.high, rw.weights), want)
    assert_replays_give(lambda: [regime_weight(ratio, index, weight, rw.low, rw.high, rw.weights)], [want])
