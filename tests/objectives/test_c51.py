"""C51 head, network and objective (Bellemare, Dabney & Munos 2017, Algorithm 1).

Networks here are lookup tables: the observation is a one-hot state index, the encoder is the
identity (``MLPEncoder(D, [])``) and the head's Linear holds the logits of every (state, action)
in its weight (bias 0), so every number below is written out by hand.
"""
from __future__ import annotations

import math

import pytest
import torch

from foxdqn.nn.c51 import C51Head, C51Network
from foxdqn.nn.mlp import MLPEncoder
from foxdqn.objectives.c51 import C51Objective
from foxdqn.replay.buffer import Batch

from support import one_hot

LN2, LN3 = math.log(2.0), math.log(3.0)


def table_c51(logits, v_min=-1.0, v_max=1.0) -> C51Network:
    """C51 network whose logits at one-hot state s are logits[s] ([S][A][K] nested lists)."""
    t = torch.tensor(logits, dtype=torch.float32)  # (S, A, K)
    S, A, K = t.shape
    net = C51Network(MLPEncoder(S, []), C51Head(S, A, atoms=K, v_min=v_min, v_max=v_max))
    with torch.no_grad():
        net.head.logits.weight.copy_(t.reshape(S, A * K).T)
        net.head.logits.bias.zero_()
    return net


# Support z = [-1, 0, 1] (K = 3, Δz = 1). Two states s0, s1; two actions.
#   online  s0: a0 logits [0, 0, 0]            -> p = [1/3, 1/3, 1/3], Q = 0
#               a1 logits [0, ln2, ln5]        -> p = [1/8, 2/8, 5/8], Q = 0.5
#           s1: a0 logits [0, 0, ln4]          -> p = [1/6, 1/6, 4/6], Q = 0.5   (online argmax: a0)
#               a1 logits [0, 0, 0]            -> Q = 0
#   target  s1: a0 logits [ln2, 0, 0]          -> p = [0.5, 0.25, 0.25], Q = -0.25
#               a1 logits [0, 0, ln2]          -> p = [0.25, 0.25, 0.5], Q = +0.25 (target argmax: a1)
ONLINE = [[[0.0, 0.0, 0.0], [0.0, LN2, math.log(5.0)]],
          [[0.0, 0.0, math.log(4.0)], [0.0, 0.0, 0.0]]]
TARGET = [[[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
          [[LN2, 0.0, 0.0], [0.0, 0.0, LN2]]]


def batch():
    # sample 0: s0, a1, R = 0.5, discount 0.5, s' = s1, weight 0.5
    # sample 1: s0, a0, R = -3 (clipped to v_min), terminal, s' = s1, weight 2
    return Batch(obs=one_hot([0, 0]), action=torch.tensor([1, 0]), reward=torch.tensor([0.5, -3.0]),
                 next_obs=one_hot([1, 1]), discount=torch.tensor([0.5, 0.0]),
                 weight=torch.tensor([0.5, 2.0]), index=torch.tensor([0, 1]))


def test_network_expected_q_and_support():
    net = table_c51(ONLINE)
    torch.testing.assert_close(net.support, torch.tensor([-1.0, 0.0, 1.0]))
    q = net(one_hot([0, 1]))
    torch.testing.assert_close(q, torch.tensor([[0.0, 0.5], [0.5, 0.0]]))
    assert net.logits(one_hot([0])).shape == (1, 2, 3)


@pytest.mark.parametrize("double", [True, False])
def test_c51_loss_hand_computed(double):
    # Sample 0: Tz = 0.5 + 0.5 z = [0, 0.5, 1] -> b = [1, 1.5, 2].
    #   double (a* = online argmax = a0), p' = [0.5, 0.25, 0.25]:
    #       m = [0, 0.5 + 0.125, 0.125 + 0.25] = [0, 0.625, 0.375]
    #   not double (a* = target argmax = a1), p' = [0.25, 0.25, 0.5]:
    #       m = [0, 0.25 + 0.125, 0.125 + 0.5] = [0, 0.375, 0.625]
    #   CE = -(m1 ln(1/4) + m2 ln(5/8)) with p(s0, a1) = [1/8, 1/4, 5/8]
    # Sample 1: terminal, R = -3 -> all mass on z0 = -1: m = [1, 0, 0]; CE = -ln(1/3) = ln 3.
    m1, m2 = (0.625, 0.375) if double else (0.375, 0.625)
    ce0 = -(m1 * math.log(0.25) + m2 * math.log(5 / 8))
    ce1 = LN3
    obj = C51Objective(table_c51(ONLINE), table_c51(TARGET), double=double)
    out, q_all = obj.forward_with_q(batch())
    torch.testing.assert_close(out.td_abs, torch.tensor([ce0, ce1]))
    torch.testing.assert_close(out.loss, torch.tensor((0.5 * ce0 + 2.0 * ce1) / 2))
    torch.testing.assert_close(out.q_values, torch.tensor([[0.0, 0.5], [0.0, 0.5]]))
    assert q_all.requires_grad and not out.q_values.requires_grad and not out.td_abs.requires_grad
    assert obj(batch()).loss.item() == pytest.approx(out.loss.item(), abs=1e-6)


def test_c51_gradients_reach_online_only():
    online, target = table_c51(ONLINE), table_c51(TARGET)
    out = C51Objective(online, target)(batch())
    out.loss.backward()
    assert all(p.grad is None for p in target.parameters())
    g = online.head.logits.weight.grad  # (A*K, S)
    # d CE / d logits = w/B (p - m); sample 0 (s0, a1): p = [1/8, 1/4, 5/8], m = [0, .625, .375], w/B = 0.25
    torch.testing.assert_close(g[3:6, 0], 0.25 * torch.tensor([1 / 8, 0.25 - 0.625, 5 / 8 - 0.375]))
    # sample 1 (s0, a0): p = [1/3]*3, m = [1, 0, 0], w/B = 1
    torch.testing.assert_close(g[0:3, 0], torch.tensor([1 / 3 - 1, 1 / 3, 1 / 3]))
    assert torch.count_nonzero(g[:, 1]) == 0  # s1 only appears as s' (no gradient through targets)


def test_dueling_logits_formula():
    # h = [1]; value v = [1, 2]; advantages a0 = [0, 2], a1 = [4, -2]; mean_a = [2, 0]
    # logits a0 = [1 + 0 - 2, 2 + 2 - 0] = [-1, 4]; a1 = [1 + 4 - 2, 2 - 2 - 0] = [3, 0]
    head = C51Head(1, 2, atoms=2, v_min=0.0, v_max=1.0, dueling=True)
    with torch.no_grad():
        head.value.weight.copy_(torch.tensor([[1.0], [2.0]]))
        head.value.bias.zero_()
        head.advantage.weight.copy_(torch.tensor([[0.0], [2.0], [4.0], [-2.0]]))
        head.advantage.bias.zero_()
    torch.testing.assert_close(head(torch.ones(1, 1)), torch.tensor([[[-1.0, 4.0], [3.0, 0.0]]]))


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(atoms=1), r"\batoms must be an int >= 2, got 1"),
    (dict(atoms=2.5), r"\batoms must be an int >= 2, got 2\.5"),
    (dict(v_min=1.0, v_max=1.0), r"\bv_min must be < v_max"),
    (dict(v_min=2.0, v_max=1.0), r"\bv_min must be < v_max"),
    (dict(v_min=float("nan")), r"\bv_min must be a finite number"),
    (dict(v_max=float("inf")), r"\bv_max must be a finite number"),
])
def test_invalid_head_settings(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        C51Head(4, 2, **kwargs)
