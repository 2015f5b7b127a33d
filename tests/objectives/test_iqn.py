"""IQN objective (Dabney et al. 2018, eq. 3) on hand-computed quantile losses.

The networks are real :class:`IQNNetwork` s around a stub head whose quantile function is
Z_τ(s, a) = base[s, a] + τ (one-hot observations, identity encoder), so every quantile, target
and loss below is written out by hand.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from foxdqn.nn.iqn import IQNHead, IQNNetwork
from foxdqn.nn.mlp import MLPEncoder
from foxdqn.objectives.iqn import IQNObjective
from foxdqn.replay.buffer import Batch

from support import one_hot


class LinearTauHead(nn.Module):
    """Z_τ(s, a) = (h @ base)[a] + τ: h [B, S] one-hot, taus [B, N] -> [B, N, A]."""

    def __init__(self, base):
        super().__init__()
        self.base = nn.Parameter(torch.tensor(base, dtype=torch.float32))  # (S, A)
        self.num_actions = self.base.shape[1]

    def forward(self, h, taus):
        return (h @ self.base)[:, None, :] + taus[..., None]


def stub_net(base) -> IQNNetwork:
    # K = 2 midpoints τ = [0.25, 0.75] -> expected Q = base + 0.5
    return IQNNetwork(MLPEncoder(2, []), LinearTauHead(base), num_quantiles_policy=2)


# online: s0 [0, 1], s1 [2, 0]  -> Q(s1) = [2.5, 0.5], online argmax at s1: a0
# target: s0 [0, 0], s1 [0, 3]  -> Q(s1) = [0.5, 3.5], target argmax at s1: a1
ONLINE, TARGET = [[0.0, 1.0], [2.0, 0.0]], [[0.0, 0.0], [0.0, 3.0]]
TAUS = torch.tensor([[0.2, 0.6], [0.2, 0.6]])  # (B, N=2)
TARGET_TAUS = torch.tensor([[0.0, 0.4], [0.0, 0.4]])  # (B, N'=2)


def batch():
    # sample 0: s0, a1, R = 1, discount 0.5, s' = s1, weight 1
    # sample 1: s1, a0, R = -1, terminal, s' = s0, weight 0.5
    return Batch(obs=one_hot([0, 1]), action=torch.tensor([1, 0]), reward=torch.tensor([1.0, -1.0]),
                 next_obs=one_hot([1, 0]), discount=torch.tensor([0.5, 0.0]),
                 weight=torch.tensor([1.0, 0.5]), index=torch.tensor([0, 1]))


def make(double=True, kappa=1.0, generator=None):
    return IQNObjective(stub_net(ONLINE), stub_net(TARGET), num_quantiles=2, num_target_quantiles=2,
                        kappa=kappa, generator=generator, double=double)


# Sample 0: θ = Z_τ(s0, a1) = 1 + τ = [1.2, 1.6].
#   double: a* = a0, Z' = 0 + τ' = [0, 0.4] -> T = 1 + 0.5 Z' = [1.0, 1.2]
#     i=0 (τ .2): δ = [-0.2, 0.0]: weights [0.8, 0.2], Huber [0.02, 0]  -> mean_j 0.008
#     i=1 (τ .6): δ = [-0.6, -0.4]: weights 0.4, Huber [0.18, 0.08]     -> mean_j 0.052   loss 0.06
#   not double: a* = a1, Z' = 3 + τ' = [3, 3.4] -> T = [2.5, 2.7]
#     i=0: δ = [1.3, 1.5] (> κ): weight 0.2, Huber |δ| - 0.5 = [0.8, 1.0]  -> 0.18
#     i=1: δ = [0.9, 1.1]: weight 0.6, Huber [0.405, 0.6]                 -> 0.3015  loss 0.4815
# Sample 1: θ = Z_τ(s1, a0) = 2 + τ = [2.2, 2.6]; terminal: T = [-1, -1]
#     i=0: δ = -3.2: weight 0.8, Huber 2.7 -> 2.16;  i=1: δ = -3.6: weight 0.4, Huber 3.1 -> 1.24; loss 3.4
@pytest.mark.parametrize("double, loss0", [(True, 0.06), (False, 0.4815)])
def test_quantile_huber_hand_computed(double, loss0):
    obj = make(double=double)
    out, q_all = obj.forward_with_q(batch(), taus=TAUS, target_taus=TARGET_TAUS)
    torch.testing.assert_close(out.td_abs, torch.tensor([loss0, 3.4]))
    torch.testing.assert_close(out.loss, torch.tensor((1.0 * loss0 + 0.5 * 3.4) / 2))
    # expected Q at s over the midpoints: s0 -> [0.5, 1.5], s1 -> [2.5, 0.5]
    torch.testing.assert_close(out.q_values, torch.tensor([[0.5, 1.5], [2.5, 0.5]]))
    assert q_all.requires_grad and not out.td_abs.requires_grad
    plain = obj(batch(), taus=TAUS, target_taus=TARGET_TAUS)
    torch.testing.assert_close(plain.loss, out.loss)


def test_kappa_zero_is_quantile_regression():
    # double, sample 0: ρ = weight·|δ|: i=0: [0.8·0.2, 0.2·0] -> 0.08; i=1: 0.4·[0.6, 0.4] -> 0.2; sum 0.28
    # sample 1: i=0: 0.8·3.2 = 2.56; i=1: 0.4·3.6 = 1.44; sum 4.0
    out = make(kappa=0.0)(batch(), taus=TAUS, target_taus=TARGET_TAUS)
    torch.testing.assert_close(out.td_abs, torch.tensor([0.28, 4.0]))


def test_gradients_online_only():
    obj = make()
    obj(batch(), taus=TAUS, target_taus=TARGET_TAUS).loss.backward()
    assert obj.target.head.base.grad is None
    # dρ/dθ_i = -(1/N') Σ_j |τ_i - 1{δ<0}| ψ(δ_ij), ψ = clamp(δ/κ, -1, 1); scaled by w_b / B
    # sample 0 (s0, a1): i=0: -(0.8·(-0.2) + 0.2·0)/2 = 0.08; i=1: -(0.4·(-0.6) + 0.4·(-0.4))/2 = 0.2
    #   -> d/dbase[0, 1] = (1/2)(0.08 + 0.2) = 0.14
    # sample 1 (s1, a0): i=0: -(0.8·(-1)·2)/2 = 0.8; i=1: -(0.4·(-1)·2)/2 = 0.4 -> (0.5/2)(1.2) = 0.3
    torch.testing.assert_close(obj.online.head.base.grad, torch.tensor([[0.0, 0.14], [0.3, 0.0]]))


def test_q_monitor_branch_has_no_grad_in_forward():
    obj = make()
    out = obj(batch(), taus=TAUS, target_taus=TARGET_TAUS)
    assert not out.q_values.requires_grad and out.loss.requires_grad


def test_generator_draws_tau_then_tau_prime():
    g = torch.Generator().manual_seed(123)
    obj = make(generator=g)
    out = obj(batch())
    ref = torch.Generator().manual_seed(123)
    taus = torch.rand((2, 2), generator=ref)
    target_taus = torch.rand((2, 2), generator=ref)
    torch.testing.assert_close(out.loss, make()(batch(), taus=taus, target_taus=target_taus).loss)
    assert torch.equal(g.get_state(), ref.get_state())


def test_real_iqn_network_runs_and_needs_generator():
    torch.manual_seed(0)
    nets = [IQNNetwork(MLPEncoder(3, [8]), IQNHead(8, 2, embedding_dim=4, dueling=d), 3) for d in (False, True)]
    b = Batch(obs=torch.randn(5, 3), action=torch.tensor([0, 1, 1, 0, 1]), reward=torch.randn(5),
              next_obs=torch.randn(5, 3), discount=torch.full((5,), 0.9), weight=torch.ones(5),
              index=torch.arange(5))
    for net in nets:
        tgt = IQNNetwork(MLPEncoder(3, [8]), IQNHead(8, 2, embedding_dim=4, dueling=net.head.dueling), 3)
        out = IQNObjective(net, tgt, 4, 3, 1.0, torch.Generator().manual_seed(0))(b)
        assert out.loss.shape == () and out.td_abs.shape == (5,) and out.q_values.shape == (5, 2)
        out.loss.backward()
        assert all(p.grad is None for p in tgt.parameters())
        assert net.head.embedding.linear.weight.grad is not None
    with pytest.raises(ValueError, match="Generator"):
        IQNObjective(nets[0], nets[0], 4, 3, 1.0, None)(b)


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(num_quantiles=0), r"\bnum_quantiles must be an int >= 1, got 0"),
    (dict(num_target_quantiles=0), r"\bnum_target_quantiles must be an int >= 1, got 0"),
    (dict(kappa=-0.5), r"\bkappa must be a finite number >= 0, got -0\.5"),
    (dict(kappa=float("inf")), r"\bkappa must be a finite number >= 0, got inf"),
])
def test_invalid_settings(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        IQNObjective(stub_net(ONLINE), stub_net(TARGET), **kwargs)
