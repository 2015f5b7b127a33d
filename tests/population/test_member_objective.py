"""foxdqn.population.objective against the single-run objectives: member p's loss (and gradient)
is its own run's CQLObjective(DQNObjective) loss with its α (CQL(H), Kumar et al. 2020 eq. 4), its
IQLObjective loss with its expectile τ and value network (Kostrikov et al. 2021, eqs. 5–6), or
CQLObjective(IQLObjective), a population of one included, with uniform replay's ones or prioritized
replay's importance weights (``weighted``), and its |TD| is its run's ``td_abs``; no member's loss
reads another member's rows, weights or hyperparameters."""
from __future__ import annotations

import pytest
import torch

from foxdqn.nn.iql_value import IQLValueNetwork
from foxdqn.nn.mlp import MLPEncoder
from foxdqn.objectives.cql import CQLObjective
from foxdqn.objectives.dqn import DQNObjective
from foxdqn.objectives.iql import IQLObjective
from foxdqn.population.network import MemberQNetwork, MemberValueNetwork
from foxdqn.population.objective import member_loss
from foxdqn.replay.buffer import Batch

from support import q_pair

D, A, B = 5, 3, 7


def members(p):
    """P seeded classic (online, target, value) triples and their member networks."""
    triples = []
    for seed in range(p):
        online, target = q_pair(D, A, seed, hidden=(16, 8))
        triples.append((online, target, IQLValueNetwork(MLPEncoder(D, [16, 8]))))
    nets = [MemberQNetwork.from_networks([t[i] for t in triples], "relu") for i in (0, 1)]
    return triples, nets[0], nets[1].requires_grad_(False), MemberValueNetwork.from_networks([t[2] for t in triples],
                                                                                              "relu")


def member_batch(p, seed=3, weighted=False):
    """A member-major batch of P·B rows (obs [P, B, D]); weights are ones (uniform replay) or, with
    ``weighted``, importance weights in (0, 1] (prioritized replay)."""
    g = torch.Generator().manual_seed(seed)
    n = p * B
    weight = torch.rand(n, generator=g) * 0.9 + 0.1 if weighted else torch.ones(n)
    return Batch(torch.randn(p, B, D, generator=g), torch.randint(0, A, (n,), generator=g),
                 torch.randn(n, generator=g), torch.randn(p, B, D, generator=g),
                 torch.full((n,), 0.9) * (torch.rand(n, generator=g) > 0.2), weight, torch.arange(n))


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


@pytest.mark.parametrize("weighted", [False, True], ids=["uniform", "per"])
@pytest.mark.parametrize("alphas", [[0.7], [1.0, 0.25, 0.0]], ids=["P=1", "P=3"])
def test_member_cql_loss_is_each_members_single_run_loss(alphas, weighted):
    p = len(alphas)
    pairs = [q_pair(D, A, seed, hidden=(16, 8)) for seed in range(p)]
    online = MemberQNetwork.from_networks([o for o, _ in pairs], "relu")
    target = MemberQNetwork.from_networks([t for _, t in pairs], "relu").requires_grad_(False)
    batch = member_batch(p, weighted=weighted)
    delta, alpha = torch.linspace(0.5, 1.5, p), torch.tensor(alphas)
    loss, td_abs, q = member_loss(online, target, batch, p, delta, True, cql_alpha=alpha, weighted=weighted)
    assert loss.shape == (p,) and q.shape == (p, B, A) and not q.requires_grad
    assert td_abs.shape == (p * B,) and not td_abs.requires_grad
    online.zero_grad(set_to_none=True)
    loss.sum().backward()
    plain = member_loss(online, target, batch, p, delta, True, weighted=weighted).loss
    for m in range(p):
        single_online, single_target = pairs[m]
        objective = CQLObjective(DQNObjective(single_online, single_target, double=True, huber_delta=float(delta[m])),
                                 alphas[m])
        ref = objective(member_rows(batch, m, p))
        torch.testing.assert_close(loss[m], ref.loss.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(q[m], ref.q_values, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(td_abs[m * B:(m + 1) * B], ref.td_abs, rtol=1e-5, atol=1e-6)
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
    loss = member_loss(online, target, batch, p, delta, True, cql_alpha=alpha).loss
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
    changed = member_loss(online, target, mixed, p, delta, True, cql_alpha=torch.tensor([1.0, 9.0, 2.0])).loss
    assert torch.equal(changed[[0, 2]], loss[[0, 2]].detach()) and changed[1] != loss[1]


@pytest.mark.parametrize("taus,alphas", [([0.7], None), ([0.7, 0.9, 0.5], None), ([0.8], [0.5]),
                                         ([0.7, 0.9, 0.5], [1.0, 0.0, 0.25])],
                         ids=["P=1", "P=3", "P=1-cql", "P=3-cql"])
@pytest.mark.parametrize("weighted", [False, True], ids=["uniform", "per"])
def test_member_iql_loss_is_each_members_single_run_loss(taus, alphas, weighted):
    p = len(taus)
    triples, online, target, value = members(p)
    batch = member_batch(p, weighted=weighted)
    tau = torch.tensor(taus)
    alpha = None if alphas is None else torch.tensor(alphas)
    loss, td_abs, q = member_loss(online, target, batch, p, torch.ones(p), True, value=value, expectile=tau,
                                  cql_alpha=alpha, weighted=weighted)
    assert loss.shape == (p,) and q.shape == (p, B, A) and not q.requires_grad and td_abs.shape == (p * B,)
    online.zero_grad(set_to_none=True)
    value.zero_grad(set_to_none=True)
    loss.sum().backward()
    for m, (single_online, single_target, single_value) in enumerate(triples):
        objective = IQLObjective(single_online, single_target, single_value, taus[m])
        if alphas is not None:
            objective = CQLObjective(objective, alphas[m])
        ref = objective(member_rows(batch, m, p))
        torch.testing.assert_close(loss[m], ref.loss.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(q[m], ref.q_values, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(td_abs[m * B:(m + 1) * B], ref.td_abs, rtol=1e-5, atol=1e-6)
        single_online.zero_grad(set_to_none=True)
        single_value.zero_grad(set_to_none=True)
        ref.loss.backward()
        assert_grads_match(online, m, single_online)
        assert_grads_match(value, m, single_value)  # V is trained, from its own expectile loss


def test_member_value_network_is_the_classic_one():
    triples, _, _, value = members(2)
    obs = torch.randn(2, B, D)
    v = value(obs)
    assert v.shape == (2, B)
    for m, (_, _, single) in enumerate(triples):
        torch.testing.assert_close(v[m], single(obs[m]), rtol=1e-6, atol=1e-6)
        state = value.member_state_dict(m)
        assert state.keys() == single.state_dict().keys()
        assert all(torch.equal(state[k], w) for k, w in single.state_dict().items())


def test_member_iql_loss_does_not_mix_members():
    """Member 0's IQL loss reaches only member 0's Q and V weights, and another τ or other rows of
    member 1 change only member 1's loss."""
    p = 3
    _, online, target, value = members(p)
    batch = member_batch(p)
    tau = torch.tensor([0.7, 0.9, 0.5])
    loss = member_loss(online, target, batch, p, torch.ones(p), True, value=value, expectile=tau).loss
    loss[0].backward()
    for w in [*online.parameters(), *value.parameters()]:
        assert w.grad[0].abs().sum() > 0 and torch.count_nonzero(w.grad[1:]) == 0
    other = member_batch(p, seed=4)
    mixed = Batch(batch.obs.clone(), batch.action, batch.reward, batch.next_obs.clone(), batch.discount,
                  batch.weight, batch.index)
    mixed.obs[1], mixed.next_obs[1] = other.obs[1], other.next_obs[1]
    changed = member_loss(online, target, mixed, p, torch.ones(p), True, value=value,
                          expectile=torch.tensor([0.7, 0.1, 0.5])).loss
    assert torch.equal(changed[[0, 2]], loss[[0, 2]].detach()) and changed[1] != loss[1]
    with pytest.raises(ValueError, match="expectile"):
        member_loss(online, target, batch, p, torch.ones(p), True, value=value)
