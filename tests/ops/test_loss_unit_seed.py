"""The losses' backward under a population's seed of ones (foxdqn.device.scalars.device_vector(..., 1.0),
which foxdqn.population.step.update back-propagates the members' losses with): dqn_td_loss and iql_loss
return their saved gradients without a multiply, the same bits as a seed of plain ones; any other seed
(another value, a copy of the ones) is multiplied as before. branching_loss and iqn_loss take the same
path (their launches: tests/population/test_population_kernels.py)."""
from __future__ import annotations

import pytest
import torch

from foxdqn.device.scalars import device_vector
from foxdqn.ops.dqn_td_loss import dqn_td_loss
from foxdqn.ops.iql_loss import iql_loss

if torch.cuda.is_available():
    pytest.skip("launches are counted on the CPU (TRITON_INTERPRET=1)", allow_module_level=True)

from bench.cpu_kernels import launches  # noqa: E402

G, BG, A = 3, 7, 4


def _dqn(seed):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(G * BG, A, generator=g).requires_grad_(True)
    qt, qo = torch.randn(G * BG, A, generator=g), torch.randn(G * BG, A, generator=g)
    action = torch.randint(0, A, (G * BG,), generator=g)
    reward, discount = torch.randn(G * BG, generator=g), torch.full((G * BG,), 0.99)
    delta = torch.tensor([0.5, 1.0, 2.0])
    loss, _ = dqn_td_loss(q, qt, action, reward, discount, None, q_next_online=qo, huber_delta=delta, backend="triton")
    out = {}
    ops = launches(lambda: out.setdefault("g", torch.autograd.grad(loss, (q,), seed, retain_graph=True)), warmup=0)
    return out["g"], ops


def _iql(seed):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(G, BG, A, generator=g).requires_grad_(True)
    qt = torch.randn(G, BG, A, generator=g)
    v = torch.randn(G, BG, generator=g).requires_grad_(True)
    vn = torch.randn(G, BG, generator=g)
    action = torch.randint(0, A, (G * BG,), generator=g)
    reward, discount, weight = torch.randn(G * BG, generator=g), torch.full((G * BG,), 0.99), torch.ones(G * BG)
    loss, _ = iql_loss(q, qt, v, vn, action, reward, discount, weight, torch.full((G,), 0.7), backend="triton")
    out = {}
    ops = launches(lambda: out.setdefault("g", torch.autograd.grad(loss, (q, v), seed, retain_graph=True)), warmup=0)
    return out["g"], ops


@pytest.mark.parametrize("run", [_dqn, _iql], ids=["dqn_td_loss", "iql_loss"])
def test_unit_seed_skips_the_multiply_with_the_same_bits(run):
    unit, unit_ops = run(device_vector("cpu", G, 1.0))
    plain, plain_ops = run(torch.ones(G))
    half, _ = run(device_vector("cpu", G, 0.5))
    assert all(torch.equal(a, b) for a, b in zip(unit, plain))
    assert all(torch.equal(a * 0.5, b) for a, b in zip(unit, half))
    assert "aten::mul" not in unit_ops and "aten::mul" in plain_ops, (unit_ops, plain_ops)
