"""Implicit Q-Learning (Kostrikov, Nair & Levine 2021, eqs. 5–6) on lookup-table networks."""
from __future__ import annotations

import pytest
import torch

from foxdqn.nn.iql_value import IQLValueNetwork
from foxdqn.nn.mlp import MLPEncoder
from foxdqn.objectives.iql import IQLObjective, expectile_loss
from foxdqn.replay.buffer import Batch

from support import one_hot, table_q


def table_v(v) -> IQLValueNetwork:
    net = IQLValueNetwork(MLPEncoder(len(v), []))
    with torch.no_grad():
        net.value.weight.copy_(torch.tensor([v]))
        net.value.bias.zero_()
    return net


# online Q: s0 [1, 2], s1 [0.5, -1];  target Q: s0 [1.5, 3], s1 [0, 0];  V: s0 2, s1 1
ONLINE, TARGET, V = [[1.0, 2.0], [0.5, -1.0]], [[1.5, 3.0], [0.0, 0.0]], [2.0, 1.0]


def batch():
    # sample 0: s0, a1, R = 0.5, discount 0.9, s' = s1, weight 1
    # sample 1: s1, a0, R = -1, terminal, s' = s0, weight 2
    return Batch(obs=one_hot([0, 1]), action=torch.tensor([1, 0]), reward=torch.tensor([0.5, -1.0]),
                 next_obs=one_hot([1, 0]), discount=torch.tensor([0.9, 0.0]),
                 weight=torch.tensor([1.0, 2.0]), index=torch.tensor([0, 1]))


# u = [-2, -0.5, 0, 1.5]: L = [(1−τ)·4, (1−τ)·0.25, 0, τ·2.25]
@pytest.mark.parametrize("tau, expected", [
    (0.5, [2.0, 0.125, 0.0, 1.125]),
    (0.7, [1.2, 0.075, 0.0, 1.575]),
    (0.9, [0.4, 0.025, 0.0, 2.025]),
])
def test_expectile_loss_formula(tau, expected):
    u = torch.tensor([-2.0, -0.5, 0.0, 1.5])
    torch.testing.assert_close(expectile_loss(u, tau), torch.tensor(expected))


def test_iql_losses_hand_computed():
    # L_V: u0 = Q̂(s0, a1) − V(s0) = 3 − 2 = 1 -> 0.7;  u1 = Q̂(s1, a0) − V(s1) = 0 − 1 = −1 -> 0.3
    # L_Q: y0 = 0.5 + 0.9·V(s1) = 1.4, Q(s0, a1) = 2 -> 0.36;  y1 = −1, Q(s1, a0) = 0.5 -> 2.25
    # loss = (1·(0.36 + 0.7) + 2·(2.25 + 0.3)) / 2 = 3.08
    obj = IQLObjective(table_q(ONLINE), table_q(TARGET), table_v(V), expectile_tau=0.7)
    out, q_all = obj.forward_with_q(batch())
    torch.testing.assert_close(out.loss, torch.tensor(3.08))
    torch.testing.assert_close(out.td_abs, torch.tensor([0.6, 1.5]))
    torch.testing.assert_close(out.q_values, torch.tensor(ONLINE))
    assert q_all.requires_grad and not out.q_values.requires_grad


def test_iql_gradients_flow_only_where_they_should():
    online, target, value = table_q(ONLINE), table_q(TARGET), table_v(V)
    obj = IQLObjective(online, target, value, expectile_tau=0.7)
    obj(batch()).loss.backward()
    assert all(p.grad is None for p in target.parameters())
    # V: only L_V. dL/dV(s) = (w/B)·(−2 |τ − 1{u<0}| u):
    #   s0: 0.5·(−2·0.7·1) = −0.7;  s1: 1·(−2·0.3·(−1)) = 0.6
    # (a gradient through V(s') in L_Q would add 0.5·2·(1.4 − 2)·0.9 = −0.54 to s1)
    torch.testing.assert_close(value.value.weight.grad, torch.tensor([[-0.7, 0.6]]))
    # Q: only L_Q. dL/dQ(s, a) = (w/B)·2(Q − y): (s0, a1): 0.5·2·0.6 = 0.6; (s1, a0): 1·2·1.5 = 3
    torch.testing.assert_close(online.head.q.weight.grad, torch.tensor([[0.0, 3.0], [0.6, 0.0]]))


def test_extra_parameters_are_the_value_net():
    value = table_v(V)
    obj = IQLObjective(table_q(ONLINE), table_q(TARGET), value, 0.9)
    assert obj.extra_parameters() == list(value.parameters())
    assert obj.polyak_pairs() == []
    assert not any(p is q for p in obj.extra_parameters() for q in obj.online.parameters())


@pytest.mark.parametrize("tau", [0.0, 1.0, 1.5, -0.2, float("nan"), True])
def test_invalid_expectile(tau):
    with pytest.raises(ValueError, match=r"\bexpectile_tau must be in \(0, 1\)"):
        IQLObjective(table_q(ONLINE), table_q(TARGET), table_v(V), expectile_tau=tau)
