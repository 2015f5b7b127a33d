"""CQL(H) regulariser for discrete actions (Kumar et al. 2020, eq. 4) and its wrapper objective."""
from __future__ import annotations

import math

import pytest
import torch

from foxdqn.nn.c51 import C51Head, C51Network
from foxdqn.nn.iql_value import IQLValueNetwork
from foxdqn.nn.mlp import MLPEncoder
from foxdqn.objectives.base import LossOutput, Objective
from foxdqn.objectives.c51 import C51Objective
from foxdqn.objectives.cql import CQLObjective, cql_term, loss_and_q
from foxdqn.objectives.dqn import DQNObjective
from foxdqn.objectives.iql import IQLObjective
from foxdqn.replay.buffer import Batch

from support import one_hot, table_q


# Q(s0) = [1, 2, 3], Q(s1) = [0, 0, 0]
Q = [[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]


def batch():
    return Batch(obs=one_hot([0, 1]), action=torch.tensor([2, 1]), reward=torch.tensor([0.0, 1.0]),
                 next_obs=one_hot([1, 0]), discount=torch.tensor([0.9, 0.0]),
                 weight=torch.tensor([1.0, 3.0]), index=torch.tensor([0, 1]))


# logsumexp [1, 2, 3] − Q(s0, a2) = ln(e + e² + e³) − 3;  logsumexp [0, 0, 0] − 0 = ln 3
CQL0 = math.log(math.e + math.e ** 2 + math.e ** 3) - 3.0
CQL1 = math.log(3.0)


def test_cql_term_closed_form_and_gradient():
    q = torch.tensor(Q, requires_grad=True)
    c = cql_term(q, torch.tensor([2, 1]))
    torch.testing.assert_close(c, torch.tensor([CQL0, CQL1]))
    c.sum().backward()
    # d/dQ = softmax(Q) − onehot(a_data)
    e = [math.e, math.e ** 2, math.e ** 3]
    sm0 = [x / sum(e) for x in e]
    expected = torch.tensor([[sm0[0], sm0[1], sm0[2] - 1.0], [1 / 3, 1 / 3 - 1.0, 1 / 3]])
    torch.testing.assert_close(q.grad, expected)


def test_cql_wrapping_dqn_adds_weighted_term():
    base = DQNObjective(table_q(Q), table_q(Q), double=True, huber_delta=1.0)
    obj = CQLObjective(base, alpha=0.5)
    out = obj(batch())
    ref = base(batch())
    # α · Σ_b w_b cql_b / B = 0.5 · (1·CQL0 + 3·CQL1) / 2
    torch.testing.assert_close(out.loss - ref.loss, torch.tensor(0.5 * (CQL0 + 3 * CQL1) / 2))
    torch.testing.assert_close(out.td_abs, ref.td_abs)
    torch.testing.assert_close(out.q_values, torch.tensor(Q))


def test_cql_gradient_on_q_table():
    # base DQN with discount 0 and reward = Q(s, a): TD error 0 -> only the CQL term has gradient
    online, target = table_q(Q), table_q(Q)
    b = batch()._replace(reward=torch.tensor([3.0, 0.0]), discount=torch.zeros(2))
    CQLObjective(DQNObjective(online, target), alpha=2.0)(b).loss.backward()
    e = [math.e, math.e ** 2, math.e ** 3]
    sm0 = [x / sum(e) for x in e]
    # dL/dQ(s, ·) = α w_b / B (softmax − onehot): sample 0: 2·1/2 = 1; sample 1: 2·3/2 = 3
    grad_q = torch.tensor([[sm0[0], sm0[1], sm0[2] - 1.0], [1.0, 1.0 - 3.0, 1.0]])  # (S, A)
    torch.testing.assert_close(online.head.q.weight.grad, grad_q.T)
    assert all(p.grad is None for p in target.parameters())


def test_cql_uses_expected_q_of_c51_with_grad():
    # K = 3 support [-1, 0, 1]; logits zero except s0 a1 -> [0, 0, ln 4]: Q(s0) = [0, 0.5, 0]
    logits = torch.zeros(2, 3, 3)
    logits[0, 1, 2] = math.log(4.0)
    net = C51Network(MLPEncoder(2, []), C51Head(2, 3, atoms=3, v_min=-1.0, v_max=1.0))
    with torch.no_grad():
        net.head.logits.weight.copy_(logits.reshape(2, 9).T)
        net.head.logits.bias.zero_()
    base = C51Objective(net, net)
    out = CQLObjective(base, alpha=1.0)(batch())
    cql0 = math.log(2 + math.exp(0.5)) - 0.0  # action 2 at s0: Q = 0
    cql1 = math.log(3.0)
    torch.testing.assert_close(out.loss - base(batch()).loss, torch.tensor((cql0 + 3 * cql1) / 2))


def test_alpha_zero_is_the_base_loss_and_passthroughs():
    online, target = table_q(Q), table_q(Q)
    iql = IQLObjective(online, target, IQLValueNetwork(MLPEncoder(2, [4])), 0.7)
    obj = CQLObjective(iql, alpha=0.0)
    torch.testing.assert_close(obj(batch()).loss, iql(batch()).loss)
    assert obj.extra_parameters() == iql.extra_parameters() and len(obj.extra_parameters()) == 4
    assert obj.polyak_pairs() == []
    assert set(obj.state_dict()) == {f"base.value_net.{k}" for k in iql.value_net.state_dict()}


def test_loss_and_q_fallback_for_objectives_without_forward_with_q():
    class Plain(Objective):
        def forward(self, batch):
            q = self.online(batch.obs)
            return LossOutput(q.sum(), torch.zeros(2), q.detach())

    net = table_q(Q)
    out, q = loss_and_q(Plain(net, net), batch())
    assert q.requires_grad
    torch.testing.assert_close(q, torch.tensor(Q))
    total = CQLObjective(Plain(net, net), alpha=1.0)(batch()).loss
    torch.testing.assert_close(total, torch.tensor(6.0 + (CQL0 + 3 * CQL1) / 2))


@pytest.mark.parametrize("alpha", [-0.1, float("nan"), float("inf"), "1"])
def test_invalid_alpha(alpha):
    with pytest.raises(ValueError, match=r"\balpha must be a finite number >= 0"):
        CQLObjective(DQNObjective(table_q(Q), table_q(Q)), alpha=alpha)
