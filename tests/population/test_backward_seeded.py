"""foxdqn.population.step.backward_seeded: the gradients of loss.backward(seed) bit for bit
(accumulated into existing .grad, a seed of other values than ones, a [P] loss of a shared graph),
without importing sympy (a fresh interpreter: torch's own seeded backward imports it through
torch.fx.experimental.symbolic_shapes, half a second on the first update of a run); a seed of
another shape or dtype is refused."""
from __future__ import annotations

import pytest
import torch
from support import fresh_python

from foxdqn.population.step import backward_seeded


def _graph(seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(3, 5, 4, generator=g).requires_grad_(True)
    b = torch.randn(3, 1, 4, generator=g).requires_grad_(True)
    x = torch.randn(3, 7, 5, generator=g)
    loss = (torch.relu(torch.baddbmm(b, x, w)) ** 2).mean(dim=(1, 2))  # [P] per-member losses
    return w, b, loss


def test_equals_tensor_backward():
    seed = torch.tensor([0.5, 1.0, 0.25])
    w1, b1, loss1 = _graph()
    w1.grad = torch.ones_like(w1)  # accumulated into, as an existing .grad is
    backward_seeded(loss1, seed)
    w2, b2, loss2 = _graph()
    w2.grad = torch.ones_like(w2)
    loss2.backward(seed)
    assert torch.equal(w1.grad, w2.grad) and torch.equal(b1.grad, b2.grad)
    assert not torch.equal(w1.grad, torch.ones_like(w1))


def test_bad_seed():
    _, _, loss = _graph()
    with pytest.raises(ValueError, match=r"backward_seeded: the seed must have the loss's shape and dtype, "
                                         r"got \(2,\) torch.float32 for \(3,\) torch.float32"):
        backward_seeded(loss, torch.ones(2))
    with pytest.raises(ValueError, match="float64"):
        backward_seeded(loss, torch.ones(3, dtype=torch.float64))


def test_does_not_import_sympy():
    code = ("import sys, torch\n"
            "from foxdqn.population.step import backward_seeded\n"
            "w = torch.randn(2, 3, requires_grad=True)\n"
            "backward_seeded((w * w).sum(1), torch.ones(2))\n"
            "assert w.grad is not None\n"
            "print('sympy' in sys.modules)\n")
    assert fresh_python(code) == ["False"]
