"""foxdqn.population.objective against the single-run objectives: member p's loss (and gradient)
is its own run's CQLObjective(DQNObjective) loss with its α (CQL(H), Kumar et al. 2020 eq. 4),
a population of one included, and no member's loss reads another member's rows or weights."""
from __future__ import annotations

import pytest
import torch

from foxdqn.objectives.cql import CQLObjective
from foxdqn.objectives.dqn import DQNObjective
from foxdqn.population.network import MemberQNetwork
from foxdqn.population.objective import member_loss
from foxdqn.replay.buffer import Batch

from support import q_pair

D, A, B = 5, 3, 7


def member_batch(p, seed=3):
    """A member-major batch of P·B rows (obs [P, B, D]; uniform replay: weights are ones)."""
    g = torch.Generator().manual_seed(seed)
    n = p * B
    return Batch(torch.randn(p, B, D, generator=g), torch.randint(0, A, (n,), generator=g),
                 torch.randn(n, generator=g), torch.randn(p, B, D, generator=g),
                 torch.full((n,), 0.9) * (torch.rand(n, generator=g) > 0.2), torch.ones(n), torch.arange(n))


def member_rows(batch, m, p):
    """Member m's rows of a member-major batch, as a single run's batch of B rows."""
    rows = slice(m * B, (m + 1) * B)
    return Batch(batch.obs.view(p, B, D)[m], batch.action[rows], batch.reward[rows], batch.next_obs.view(p, B, D)[m],
                 batch.discount[rows], batch.weight[rows], batch.index[rows])


def member_grads(net: MemberQNetwork, m: int) -> dict[str, torch.Tensor]:
    """Member m's parameter gradients in the classic network's state_dict layout."""
    out = {}
    for prefix, w, b in zip(net.prefixes, net.weights, net.biases):
        out[f"{prefix}.weight"], out[f"{prefix}.bias"] = w.grad[m].t(), b.grad[m, 0]
    return out


def assert_grads_match(net: MemberQNetwork, m: int, single: torch.nn.Module) -> None:
    got = member_grads(net, m)
    for name, w in single.named_parameters():
        torch.testing.assert_close(got[name], w.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("alphas", [[0.7], [1.0, 0.25, 0.0]], ids=["P=1", "P=3"])
def test_member_cql_loss_is_each_members_single_run_loss(alphas):
    p = len(alphas)
    pairs = [q_pair(D, A, seed, hidden=(16, 8)) for seed in range(p)]
    online = MemberQNetwork.from_networks([o for o, _ in pairs], "relu")
    target = MemberQNetwork.from_networks([t for _, t in pairs], "relu").requires_grad_(False)
    batch = member_batch(p)
    delta, alpha = torch.linspace(0.5, 1.5, p), torch.tensor(alphas)
    loss, q = member_loss(online, target, batch, p, delta, True, cql_alpha=alpha)
    assert loss.shape == (p,) and q.shape == (p, B, A) and not q.requires_grad
    online.zero_grad(set_to_none=True)
    loss.sum().backward()
    plain, _ = member_loss(online, target, batch, p, delta, True)
    for m in range(p):
        single_online, single_target = pairs[m]
        objective = CQLObjective(DQNObjective(single_online, single_target, double=True, huber_delta=float(delta[m])),
                                 alphas[m])
        ref = objective(member_rows(batch, m, p))
        torch.testing.assert_close(loss[m], ref.loss.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(q[m], ref.q_values, rtol=1e-5, atol=1e-6)
        single_online.zero_grad(set_to_none=True)
        ref.loss.backward()
        assert_grads_match(online, m, single_online)
        if alphas[m] == 0:
            assert torch.equal(loss[m], plain[m])  # α = 0 adds exactly nothing
        else:
            assert loss[m] > plain[m]  # the CQL(H) term is > 0 here


def test_member_cql_loss_does_not_mix_members():
    """Member 0's loss reaches only member 0's weights, and changing member 1's rows or α changes
    only member 1's loss (a mean over all P·B rows, or a reduction across members, would fail)."""
    p = 3
    pairs = [q_pair(D, A, seed, hidden=(16, 8)) for seed in range(p)]
    online = MemberQNetwork.from_networks([o for o, _ in pairs], "relu")
    target = MemberQNetwork.from_networks([t for _, t in pairs], "relu").requires_grad_(False)
    delta, alpha = torch.ones(p), torch.tensor([1.0, 0.5, 2.0])
    batch = member_batch(p)
    loss, _ = member_loss(online, target, batch, p, delta, True, cql_alpha=alpha)
    online.zero_grad(set_to_none=True)
    loss[0].backward()
    for w in online.parameters():
        assert w.grad[0].abs().sum() > 0 and torch.count_nonzero(w.grad[1:]) == 0
    other = member_batch(p, seed=4)
    rows = slice(B, 2 * B)
    mixed = Batch(batch.obs.clone(), batch.action.clone(), batch.reward.clone(), batch.next_obs.clone(),
                  batch.discount, batch.weight, batch.index)
    mixed.obs[1], mixed.next_obs[1] = other.obs[1], other.next_obs[1]
    mixed.action[rows], mixed.reward[rows] = other.action[rows], other.reward[rows]
    changed, _ = member_loss(online, target, mixed, p, delta, True, cql_alpha=torch.tensor([1.0, 9.0, 2.0]))
    assert torch.equal(changed[[0, 2]], loss[[0, 2]].detach()) and changed[1] != loss[1]
