"""DQNObjective (fused TD loss, one stacked online forward) against the arithmetic it replaced:
two online forwards, double_dqn_target, F.huber_loss and the weighted mean; loss, |TD|, Q values
and parameter gradients, for the replay's stacked batch, a plain batch and micro-batch chunks;
stack_double=False (two online forwards; the Nature CNN's choice) against the stacked forward, for
one run and for a population's member_dqn_loss (each member against its own single run).
GPU (`gpu` marker): update_step of eurusd_dqn, kernels per update from the profiler."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from foxdqn.nn.heads import DuelingHead
from foxdqn.nn.qnet import QNetwork
from foxdqn.objectives.base import weighted_mean
from foxdqn.objectives.dqn import DQNObjective, double_dqn_target
from foxdqn.ops.replay_gather import replay_gather, stacked_pair
from foxdqn.replay.buffer import Batch

from support import q_pair


def _stacked_batch(b=13, d=6, seed=0):
    """A batch from replay_gather(stacked=True) over a random ring (n = 3, episode ends)."""
    g = torch.Generator().manual_seed(seed)
    rows, envs = 9, 4
    ended = (torch.rand(rows, envs, generator=g) < 0.3).float()
    res = replay_gather(torch.randn(rows, envs, d, generator=g), torch.randn(rows, envs, d, generator=g),
                        torch.randint(0, 3, (rows, envs), generator=g), torch.randn(rows, envs, generator=g),
                        ended * (torch.rand(rows, envs, generator=g) < 0.5).float(), ended,
                        torch.tensor(4), torch.tensor(13), torch.tensor([[1.0, 0.9, 0.81, 0.729]]), 3,
                        uniforms=torch.rand(2, b, generator=g), stacked=True)
    weight = torch.rand(b, generator=g) + 0.5
    return Batch(res.obs, res.action, res.reward, res.next_obs, res.discount, weight, res.index)


def _old(online, target, batch, double, delta):
    """DQNObjective's arithmetic before the fused op."""
    q_all = online(batch.obs)
    q_sa = q_all.gather(1, batch.action[:, None]).squeeze(1)
    y = double_dqn_target(online, target, batch.next_obs, batch.reward, batch.discount, double)
    per_sample = F.huber_loss(q_sa, y, reduction="none", delta=delta)
    return weighted_mean(per_sample, batch.weight), (q_sa - y).detach().abs(), q_all.detach()


def _grads(online, loss):
    online.zero_grad(set_to_none=True)
    loss.backward()
    return [p.grad.clone() for p in online.parameters()]


@pytest.mark.parametrize("double", [True, False])
@pytest.mark.parametrize("layout", ["stacked", "plain", "chunk"])
def test_objective_equals_the_old_arithmetic(double, layout):
    online, target = q_pair()
    batch = _stacked_batch()
    if layout == "plain":
        batch = Batch(*(f.clone() for f in batch[:7]))
    elif layout == "chunk":  # a micro-batch: views into the pair that are not its halves
        batch = Batch(*(f[:7] for f in batch[:7]))
    assert (stacked_pair(batch.obs, batch.next_obs) is not None) == (layout == "stacked")
    out = DQNObjective(online, target, double=double, huber_delta=0.8)(batch)
    new_grads = _grads(online, out.loss)
    loss, td, q = _old(online, target, batch, double, 0.8)
    old_grads = _grads(online, loss)
    torch.testing.assert_close(out.loss, loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(out.td_abs, td, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out.q_values, q, rtol=1e-6, atol=1e-6)
    assert out.q_values.shape == (batch.action.shape[0], 3)
    for a, b in zip(new_grads, old_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------ stack_double
def _count_rows(net):
    """A list that collects the row count of every forward of ``net`` (a forward pre-hook)."""
    rows = []
    net.register_forward_pre_hook(lambda _m, args: rows.append(args[0].shape[0]))
    return rows


def _image_nets(seed=0):
    from foxdqn.nn.nature_cnn import NatureCNNEncoder

    torch.manual_seed(seed)
    online = QNetwork(NatureCNNEncoder((2, 36, 36), hidden=[16]), DuelingHead(16, 3))
    target = copy.deepcopy(online).requires_grad_(False)
    with torch.no_grad():
        for p in target.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return online, target


def _image_batch(b=5, seed=0):
    """Flattened uint8 frames [B, 2·36·36], as the replay stores them."""
    g = torch.Generator().manual_seed(seed)
    frames = torch.randint(0, 256, (2 * b, 2 * 36 * 36), generator=g, dtype=torch.uint8)
    return Batch(frames[:b], torch.randint(0, 3, (b,), generator=g), torch.randn(b, generator=g), frames[b:],
                 (torch.rand(b, generator=g) < 0.8).float() * 0.99, torch.rand(b, generator=g) + 0.5,
                 torch.arange(b))


@pytest.mark.parametrize("net, layout", [("mlp", "stacked"), ("mlp", "plain"), ("mlp", "chunk"),
                                         ("nature_cnn", "plain")])
def test_stack_double_false_gives_the_same_loss_and_gradients_in_two_forwards(net, layout):
    if net == "nature_cnn":
        online, target = _image_nets()
        batch = _image_batch()
    else:
        online, target = q_pair()
        batch = _stacked_batch()
        if layout == "plain":
            batch = Batch(*(f.clone() for f in batch[:7]))
        elif layout == "chunk":
            batch = Batch(*(f[:7] for f in batch[:7]))
    b = batch.action.shape[0]
    rows = _count_rows(online)
    results = {}
    for stack in (True, False):
        rows.clear()
        out = DQNObjective(online, target, double=True, huber_delta=0.8, stack_double=stack)(batch)
        results[stack] = (out, _grads(online, out.loss))
        assert rows == ([2 * b] if stack else [b, b])  # one stacked forward, or s then s'
    (a, ga), (c, gc) = results[True], results[False]
    torch.testing.assert_close(a.loss, c.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a.td_abs, c.td_abs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.q_values, c.q_values, rtol=1e-5, atol=1e-5)
    for x, y in zip(ga, gc):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)
    loss, _, _ = _old(online, target, batch, True, 0.8)  # today's two-forward Double DQN arithmetic
    torch.testing.assert_close(c.loss, loss, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("layout", ["stacked", "plain"])
def test_member_dqn_loss_stack_choice_and_members_match_single_runs(layout, weighted):
    """Member m's loss, |TD| and Q are the single run's DQNObjective on its rows with its δ; with
    ``weighted`` (a population's PER) its rows' importance weights are applied as the single run
    applies them, without it the batch's weights are not read (uniform replay's ones)."""
    from foxdqn.population.network import MemberQNetwork
    from foxdqn.population.objective import member_dqn_loss

    p, b, d = 2, 6, 6
    pairs = [q_pair(seed=s) for s in range(p)]
    online = MemberQNetwork.from_networks([o for o, _ in pairs], "relu")
    target = MemberQNetwork.from_networks([t for _, t in pairs], "relu").requires_grad_(False)
    g = torch.Generator().manual_seed(3)
    pair = torch.randn(p, 2, b, d, generator=g)
    obs, next_obs = (pair[:, 0], pair[:, 1]) if layout == "stacked" else (pair[:, 0].clone(), pair[:, 1].clone())
    assert (stacked_pair(obs, next_obs) is not None) == (layout == "stacked")
    weight = torch.rand(p * b, generator=g) + 0.1
    batch = Batch(obs, torch.randint(0, 3, (p * b,), generator=g), torch.randn(p * b, generator=g), next_obs,
                  torch.full((p * b,), 0.9), weight, torch.arange(p * b))
    delta = torch.tensor([0.5, 1.5])
    out = {}
    for stack in (True, False):
        loss, td_abs, q = member_dqn_loss(online, target, batch, p, delta, True, stack_double=stack, weighted=weighted)
        online.zero_grad(set_to_none=True)
        loss.sum().backward()
        out[stack] = (loss.detach(), q, [w.grad.clone() for w in online.parameters()], td_abs)
    for x, y in zip(out[True][2], out[False][2]):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-7)
    for m in range(p):  # member m's loss is the single run's loss on its rows with its δ
        rows = slice(m * b, (m + 1) * b)
        single = Batch(obs[m], batch.action[rows], batch.reward[rows], next_obs[m], batch.discount[rows],
                       weight[rows] if weighted else torch.ones(b), batch.index[rows])
        ref = DQNObjective(*pairs[m], double=True, huber_delta=float(delta[m]))(single)
        for stack in (True, False):
            torch.testing.assert_close(out[stack][0][m], ref.loss.detach(), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(out[stack][1][m], ref.q_values, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(out[stack][3][rows], ref.td_abs, rtol=1e-5, atol=1e-6)
