"""BDQ (Tavakoli et al. 2018): factor/compose, joint-Q layout and argmax, the dueling head (eq. 1),
the mean-operator target (eq. 6) and branch-averaged Huber loss on a hand-computed batch, no sync."""
import copy

import pytest
import torch
from torch import nn

from foxdqn.execution.orders import factor
from foxdqn.nn.attention import AttentionEncoder
from foxdqn.nn.branching import (BranchingHead, BranchingNetwork, combine_branches, compose_branches,
                                 factor_branches)
from foxdqn.nn.mlp import MLPEncoder
from foxdqn.objectives.base import LossOutput
from foxdqn.objectives.branching import BranchingObjective, branching_target
from foxdqn.replay.buffer import Batch

from support import forbid_syncs


def make_batch(obs, action, reward, next_obs, discount, weight):
    B = len(action)
    return Batch(obs=torch.tensor(obs), action=torch.tensor(action), reward=torch.tensor(reward),
                 next_obs=torch.tensor(next_obs), discount=torch.tensor(discount), weight=torch.tensor(weight),
                 index=torch.arange(B))


# ---------------------------------------------------------------- factor / compose / combine

def test_factor_compose_match_the_trading_action_layout():
    a = torch.arange(45)
    parts = factor_branches(a, (5, 3, 3))
    for got, want in zip(parts, factor(a)):
        assert torch.equal(got, want)
    assert torch.equal(compose_branches(parts, (5, 3, 3)), a)
    # another layout: (2, 4) → a = a_1·4 + a_2
    a = torch.arange(8)
    a1, a2 = factor_branches(a, (2, 4))
    assert a1.tolist() == [0, 0, 0, 0, 1, 1, 1, 1] and a2.tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert torch.equal(compose_branches([a1, a2], (2, 4)), a)


def test_combine_layout_is_mean_over_branches():
    g = torch.Generator().manual_seed(0)
    qs = [torch.randn(4, n, generator=g) for n in (5, 3, 3)]
    q = combine_branches(qs)
    assert q.shape == (4, 45)
    for e in range(5):
        for o in range(3):
            for u in range(3):
                want = (qs[0][:, e] + qs[1][:, o] + qs[2][:, u]) / 3
                torch.testing.assert_close(q[:, e * 9 + o * 3 + u], want)


def test_combine_with_leading_axes_is_each_rows_combine():
    """A population's [P, B, n_d] branches (foxdqn.population.branching): each member's joint Q is
    its own [B, n_d] combine, bit for bit."""
    g = torch.Generator().manual_seed(1)
    qs = [torch.randn(3, 4, n, generator=g) for n in (5, 3, 3)]
    q = combine_branches(qs)
    assert q.shape == (3, 4, 45)
    for p in range(3):
        assert torch.equal(q[p], combine_branches([b[p] for b in qs]))


def test_joint_argmax_is_the_per_branch_argmaxes():
    g = torch.Generator().manual_seed(1)
    qs = [torch.randn(2000, n, generator=g) for n in (5, 3, 3)]
    joint = combine_branches(qs).argmax(dim=1)
    per_branch = compose_branches([q.argmax(dim=1) for q in qs], (5, 3, 3))
    assert torch.equal(joint, per_branch)
    # ties: the first maximiser of each branch (torch.argmax's rule) is the first joint maximiser
    tied = [torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0]]), torch.tensor([[2.0, 2.0, 1.0]]), torch.tensor([[0.0, 0.0, 0.5]])]
    assert combine_branches(tied).argmax(dim=1).tolist() == [1 * 9 + 0 * 3 + 2]


def test_network_forward_greedy_and_shapes():
    torch.manual_seed(0)
    net = BranchingNetwork(MLPEncoder(6, [32]), BranchingHead(32))
    obs = torch.randn(300, 6)
    with torch.no_grad():
        q = net(obs)
        assert q.shape == (300, 45) and net.num_actions == 45
        assert [t.shape for t in net.branch_q(obs)] == [(300, 5), (300, 3), (300, 3)]
        assert torch.equal(q.argmax(dim=1), net.greedy(obs))


# ---------------------------------------------------------------- head (eq. 1)

def test_dueling_head_eq1_by_hand():
    head = BranchingHead(2, (2, 3), dueling=True)
    with torch.no_grad():
        head.value.weight.copy_(torch.tensor([[1.0, 1.0]]))
        head.value.bias.zero_()
        head.branches[0].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
        head.branches[0].bias.zero_()
        head.branches[1].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, -1.0]]))
        head.branches[1].bias.zero_()
        q1, q2 = head(torch.tensor([[1.0, 2.0]]))
    # V = 3; A_1 = [1, 2] (mean 1.5); A_2 = [1, 0, -2] (mean -1/3)
    torch.testing.assert_close(q1, torch.tensor([[2.5, 3.5]]))
    torch.testing.assert_close(q2, torch.tensor([[13 / 3, 10 / 3, 4 / 3]]))
    plain = BranchingHead(2, (2, 3), dueling=False)
    with torch.no_grad():
        plain.branches[0].load_state_dict(head.branches[0].state_dict())
        q1p, _ = plain(torch.tensor([[1.0, 2.0]]))
    torch.testing.assert_close(q1p, torch.tensor([[1.0, 2.0]]))
    assert plain.value is None


def test_head_with_branch_hidden_layers():
    head = BranchingHead(4, (5, 3, 3), branch_hidden=8)
    qs = head(torch.randn(3, 4))
    assert [q.shape for q in qs] == [(3, 5), (3, 3), (3, 3)]


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(branch_sizes=()), r"\bbranch_sizes must be a non-empty list of ints >= 1, got \(\)"),
    (dict(branch_sizes=(5, 0, 3)), r"\bbranch_sizes must be a non-empty list of ints >= 1, got \(5, 0, 3\)"),
    (dict(branch_hidden=-1), r"\bbranch_hidden must be an int >= 0, got -1"),
])
def test_head_validation(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        BranchingHead(4, **kwargs)


# ---------------------------------------------------------------- objective on a hand-computed batch

class TableNet(nn.Module):
    """Branches (2, 3); Q_1 = w·sign·obs[:, :2], Q_2 = w·sign·obs[:, 2:5] (w trainable, = 1)."""

    branch_sizes = (2, 3)

    def __init__(self, sign):
        super().__init__()
        self.sign = sign
        self.w = nn.Parameter(torch.tensor(1.0))

    def branch_q(self, obs):
        return [self.w * self.sign * obs[:, :2], self.w * self.sign * obs[:, 2:5]]

    def forward(self, obs):
        return combine_branches(self.branch_q(obs))


HAND_BATCH = dict(
    obs=[[1.0, 3.0, 0.0, 2.0, -1.0], [0.2, -0.1, 0.3, 0.0, 0.1]],
    action=[4, 0],                       # (a_1, a_2) = (1, 1) and (0, 0): Q_sa = (3, 2) and (0.2, 0.3)
    reward=[0.5, -0.1],
    next_obs=[[2.0, 0.0, 1.0, 5.0, 4.0], [1.0, 1.0, 1.0, 1.0, 1.0]],
    discount=[0.9, 0.0],                 # sample 1 terminated: y = r
    weight=[1.0, 2.0],
)


@pytest.mark.parametrize("double, delta, y0, loss, td_abs, grad_w", [
    # double: online argmax at s' = (0, 1); target (= −obs) there: (−2, −5), mean −3.5
    #   y0 = 0.5 + 0.9·(−3.5) = −2.65; errors (5.65, 4.65) → Huber_1 (5.15, 4.15), mean 4.65
    #   sample 1: errors (0.3, 0.4) → (0.045, 0.08), mean 0.0625; loss = (4.65·1 + 0.0625·2)/2
    #   dL/dw = (0.25·3 + 0.25·2) + (2·0.3/4·0.2 + 2·0.4/4·0.3) = 1.25 + 0.09
    (True, 1.0, -2.65, 2.3875, [5.15, 0.35], 1.34),
    # δ = 2: Huber_2 (2·(5.65−1), 2·(4.65−1)) = (9.3, 7.3), mean 8.3; loss = (8.3 + 0.125)/2
    #   dL/dw = (0.5·3 + 0.5·2) + 0.09
    (True, 2.0, -2.65, 4.2125, [5.15, 0.35], 2.59),
    # no double: max of target per branch (0, −1), mean −0.5; y0 = 0.5 − 0.45 = 0.05
    #   errors (2.95, 1.95) → (2.45, 1.45), mean 1.95; loss = (1.95 + 0.125)/2
    (False, 1.0, 0.05, 1.0375, [2.45, 0.35], 1.34),
])
def test_objective_hand_computed(double, delta, y0, loss, td_abs, grad_w):
    online, target = TableNet(1.0), TableNet(-1.0)
    obj = BranchingObjective(online, target, double=double, huber_delta=delta)
    batch = make_batch(**HAND_BATCH)
    y = branching_target(online, target, batch.next_obs, batch.reward, batch.discount, double=double)
    torch.testing.assert_close(y, torch.tensor([y0, -0.1]))
    out = obj(batch)
    assert isinstance(out, LossOutput)
    torch.testing.assert_close(out.loss, torch.tensor(loss))
    torch.testing.assert_close(out.td_abs, torch.tensor(td_abs))
    assert not out.td_abs.requires_grad and not out.q_values.requires_grad
    # q_values: joint Q of the sampled states; sample 0: (Q_1[i] + Q_2[j]) / 2
    torch.testing.assert_close(out.q_values[0], torch.tensor([0.5, 1.5, 0.0, 1.5, 2.5, 1.0]))
    torch.testing.assert_close(out.q_values, online(torch.tensor(HAND_BATCH["obs"])).detach())
    out.loss.backward()
    torch.testing.assert_close(online.w.grad, torch.tensor(grad_w))
    assert target.w.grad is None  # the target gets no gradient


def test_objective_validation():
    with pytest.raises(ValueError, match=r"\bhuber_delta must be a finite number > 0, got 0\.0"):
        BranchingObjective(TableNet(1.0), TableNet(1.0), huber_delta=0.0)


@pytest.mark.parametrize("encoder", ["mlp", "attention"])
def test_objective_forward_backward_never_syncs(monkeypatch, encoder):
    torch.manual_seed(0)
    W, Fn = 4, 3
    D = W * Fn + 2
    enc = MLPEncoder(D, [32]) if encoder == "mlp" else AttentionEncoder(D, W, Fn, 16, 2, 1)
    online = BranchingNetwork(enc, BranchingHead(enc.out_dim, (5, 3, 3)))
    target = copy.deepcopy(online)
    obj = BranchingObjective(online, target)
    g = torch.Generator().manual_seed(0)
    B = 9
    batch = Batch(obs=torch.randn(B, D, generator=g), action=torch.randint(0, 45, (B,), generator=g),
                  reward=torch.randn(B, generator=g), next_obs=torch.randn(B, D, generator=g),
                  discount=torch.full((B,), 0.99), weight=torch.rand(B, generator=g), index=torch.arange(B))
    with monkeypatch.context() as m:
        forbid_syncs(m)
        out = obj(batch)
        out.loss.backward()
    assert out.q_values.shape == (B, 45) and out.td_abs.shape == (B,) and out.loss.dim() == 0
    assert all(p.grad is not None for p in online.parameters())
