"""model.encoder=attention in a population (CPU, eager): members equal populations of one bit for
bit (every head, IQL's value network too), a member starts from its single run's weights and its
weights load into the classic network with the same Q, a population's loss and gradients are each
member's single-run objective's, and MemberAttentionEncoder is P AttentionEncoders (odd shapes)."""
from __future__ import annotations

import pytest
import torch

from foxdqn.nn.attention import AttentionEncoder
from foxdqn.objectives.dqn import DQNObjective
from foxdqn.population.attention import MemberAttentionEncoder
from foxdqn.population.state import build_population
from foxdqn.population.step import population_loss
from test_distributional import C51, IQN, classic, collected, single_run_batch
from test_population import (CPU, TRADING, assert_fault_stays_in_its_member, assert_member_equal,
                             assert_member_grads_match, assert_members_equal_runs_of_one, configs, market_for,
                             member_grads, member_tensors, perturb_target, run)

SMALL = ["model=attention", "model.width=8", "model.heads=2", "model.layers=2"]
ATTENTION = [*TRADING, *SMALL]
MEMBERS = [["seed=5"], ["seed=6", "optim.lr=3e-4"], ["seed=7", "agent.gamma=0.9", "loss.reward_scale=10"]]
SETTINGS = {
    "dueling-mean": ATTENTION,
    "q-last": [*ATTENTION, "head=q", "model.pooling=last"],
    "c51": [*C51, *SMALL],
    "iqn": [*IQN, *SMALL, "head.dueling=true"],
    "iql": [*ATTENTION, "objective=iql"],
}


@pytest.mark.parametrize("name", SETTINGS)
def test_attention_members_equal_runs_of_one_member(name):
    """Different seeds, lr, γ and reward scales: member p of the population is bit for bit a
    population of one (weights of the online, target and IQL value networks)."""
    together = assert_members_equal_runs_of_one(SETTINGS[name], MEMBERS)
    nets = [together.online, together.target] + ([together.value] if name == "iql" else [])
    assert all(isinstance(net.member_encoder, MemberAttentionEncoder) for net in nets)
    assert any(k.startswith("online.encoder.blocks.1.qkv.") for k in member_tensors(together, 0))


def test_attention_members_equal_runs_of_one_member_in_the_fused_kernels(monkeypatch):
    """Inside cpu_kernels (the CUDA path's kernels in Triton's interpreter) the encoder trains
    through ops/member_attention_block.py (the first block with the embedding inside, the second
    plain): member p still equals the population of one of its seed, bit for bit (online and target
    weights after two updates)."""
    from foxdqn.ops.backend import cpu_kernels
    from foxdqn.population import attention

    base = [*TRADING, "model=attention", "model.width=16", "model.heads=1", "model.layers=2"]
    calls = []
    real = attention.block_op.member_attention_block
    monkeypatch.setattr(attention.block_op, "member_attention_block",
                        lambda *a, **k: calls.append(k.get("embed") is not None) or real(*a, **k))
    with cpu_kernels():
        together = run(configs(base, MEMBERS[:2]), iterations=2, collect_first=1)
        assert True in calls and False in calls, calls  # the embedded first block and the second
        for p, extra in enumerate(MEMBERS[:2]):
            assert_member_equal(together, p, run(configs(base, [extra]), iterations=2, collect_first=1), 0)


def test_fault_in_one_attention_member_leaves_the_others_bit_identical():
    assert_fault_stays_in_its_member(ATTENTION, MEMBERS)


def test_attention_member_starts_as_a_single_run_of_its_seed():
    """Member p's initial online network is bit for bit the one a single run (a population of one)
    of its seed builds."""
    cfgs = configs(ATTENTION, MEMBERS)
    s = build_population(cfgs, market_for(cfgs[0]), CPU)
    for p, cfg in enumerate(cfgs):
        single = build_population([cfg], market_for(cfg), CPU).online.member_state_dict(0)
        mine = s.online.member_state_dict(p)
        assert mine.keys() == single.keys()
        for k, w in single.items():
            assert torch.equal(mine[k], w), k


@pytest.mark.parametrize("name", ["dueling-mean", "q-last", "c51", "iqn"])
def test_attention_member_state_dict_loads_into_the_classic_network_with_the_same_q(name):
    s = run(configs(SETTINGS[name], MEMBERS), iterations=3)
    obs = s.obs.view(3, s.cfg.env.num_envs, -1)
    q = s.online(obs)
    for p in range(3):
        net = classic(s, p)  # load_state_dict is strict: every key of the classic network, no other
        assert isinstance(net.encoder, AttentionEncoder)
        torch.testing.assert_close(net(obs[p]), q[p], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("double", [True, False])
def test_population_loss_is_each_members_single_run_objective(double):
    """Member p's loss, td_abs, Q and gradients are its single run's DQNObjective on the same
    weights and rows (float tolerance: baddbmm against addmm)."""
    s = collected(configs([*ATTENTION, f"head.double={str(double).lower()}"], MEMBERS))

    def objective(p, online, target):
        return DQNObjective(online, target, double=double, huber_delta=s.cfgs[p].loss.huber_delta)

    assert_loss_is_each_members_single_run_objective(s, objective)


def assert_loss_is_each_members_single_run_objective(s, objective, b=8):
    """A batch of ``b`` rows per member against a perturbed target: member p's loss, td_abs, Q and
    gradients equal those of ``objective(p, online, target)`` (its single run's objective on its
    classic networks) on its rows (float tolerance: baddbmm against addmm). Returns the batch."""
    perturb_target(s)
    batch = s.replay.sample_members(b)
    out = population_loss(s, batch)
    s.optimizer.zero_grad(set_to_none=True)
    out.loss.sum().backward()
    for p in range(s.members):
        online = classic(s, p)
        single = objective(p, online, classic(s, p, online=False))(single_run_batch(batch, p, b))
        torch.testing.assert_close(out.loss[p], single.loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out.td_abs[p * b:(p + 1) * b], single.td_abs, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out.q_values[p], single.q_values, rtol=1e-5, atol=1e-6)
        single.loss.backward()
        assert_member_grads_match(s.online, p, online)
    return batch


# --------------------------------------------------------------------------- the encoder alone
W, F, C, HEADS = 7, 3, 12, 3  # odd sizes: 7 tokens of 3 features, 3 heads of 4


def encoders(p, pooling="mean", activation="gelu", seeds=None):
    out = []
    for seed in seeds or range(p):
        torch.manual_seed(seed)
        out.append(AttentionEncoder(W * F + 2, W, F, C, HEADS, 2, pooling=pooling, activation=activation))
    return out


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_member_attention_encoder_is_p_attention_encoders(pooling):
    """Forward and backward of each member equal its AttentionEncoder's (float tolerance), and the
    classic state_dict comes back (same keys, same values)."""
    classic_encoders = encoders(3, pooling)
    net = MemberAttentionEncoder.stack(classic_encoders)
    g = torch.Generator().manual_seed(1)
    obs = torch.randn(3, 5, W * F + 2, generator=g, requires_grad=True)
    grad_out = torch.randn(3, 5, C, generator=g)
    h = net(obs)
    assert h.shape == (3, 5, C)
    h.backward(grad_out)
    grads = member_grads(net, 0), member_grads(net, 1), member_grads(net, 2)
    for p, enc in enumerate(classic_encoders):
        state = net.member_state_dict(p)
        assert state.keys() == enc.state_dict().keys()
        assert all(torch.equal(state[k], v) for k, v in enc.state_dict().items())
        x = obs.detach()[p].clone().requires_grad_(True)
        mine = enc(x)
        torch.testing.assert_close(h[p], mine, rtol=1e-5, atol=1e-6)
        mine.backward(grad_out[p])
        torch.testing.assert_close(obs.grad[p], x.grad, rtol=1e-4, atol=1e-6)
        for k, w in enc.named_parameters():
            torch.testing.assert_close(grads[p][k], w.grad, rtol=1e-4, atol=1e-6, msg=k)


def test_member_attention_encoder_does_not_depend_on_the_population_size():
    """Member 2 of P = 3 and a population of one of its weights: the same bits forward and backward."""
    g = torch.Generator().manual_seed(2)
    obs, grad_out = torch.randn(3, 5, W * F + 2, generator=g), torch.randn(3, 5, C, generator=g)
    results = []
    for seeds in ([0, 1, 2], [2]):
        net = MemberAttentionEncoder.stack(encoders(len(seeds), seeds=seeds))
        x = obs[3 - len(seeds):].clone().requires_grad_(True)
        h = net(x)
        h.backward(grad_out[3 - len(seeds):])
        results.append([h.detach()[-1], x.grad[-1], *(w.grad[-1] for w in net.parameters())])
    for together, alone in zip(*results):
        assert torch.equal(together, alone)


def test_member_attention_encoder_refuses_what_it_cannot_stack():
    with pytest.raises(ValueError, match="one architecture"):
        MemberAttentionEncoder.stack([*encoders(1), *encoders(1, pooling="last")])
    dropped = encoders(2)
    dropped[1].dropout = 0.1
    with pytest.raises(ValueError, match="dropout"):
        MemberAttentionEncoder.stack(dropped)


PRUNE = ["prune.enabled=true", "prune.initial_sparsity=0.2", "prune.final_sparsity=0.6", "prune.start_update=1",
         "prune.end_update=7", "prune.frequency=2", "debug.fit_prune_schedule=false"]


def test_member_attention_masks_are_the_single_runs_for_the_same_weights():
    """prune.enabled prunes the attention encoder's matrices (embedding, positions, each block's
    qkv, proj, fc1, fc2, output) as a single run's MagnitudePruner does (every parameter of 2 or more
    dimensions), each member its own: on the same weights (rounded: many ties, broken by position
    in the classic layout) the masks are the classic pruner's; a skipped member keeps its masks."""
    from foxdqn.step.pruning import MagnitudePruner
    from test_distributional import classic

    cfgs = configs([*ATTENTION, *PRUNE], MEMBERS)
    pop = build_population(cfgs, market_for(cfgs[0]), CPU)
    with torch.no_grad():
        for w in pop.pruner.params:
            w.copy_((w * 10).round() / 10)
    t = torch.tensor(3)
    pop.pruner.step(t, torch.tensor([0.0, 1.0, 0.0]))
    for p in range(3):
        net = classic(pop, p)
        single = MagnitudePruner(net, classic(pop, p, online=False), 0.2, 0.6, 1, 7, 2, CPU)
        single.step(t, torch.tensor(0.0))
        names = [n for n, w in net.named_parameters() if w.dim() >= 2]
        assert len(names) == len(pop.pruner.masks) == 3 + 4 * 2 + len(pop.online.weights) and "encoder.pos" in names
        for name, mask, single_mask in zip(names, pop.pruner.masks, single.masks):
            if p == 1:  # its update was skipped: nothing pruned yet
                assert bool((mask[p] == 1).all()), name
                continue
            classic_mask = mask[p] if name == "encoder.pos" else mask[p].t()
            assert torch.equal(classic_mask, single_mask), (p, name)
            assert int((mask[p] == 0).sum()) > 0, name


def test_pruned_attention_members_equal_runs_of_one_member():
    together = assert_members_equal_runs_of_one([*ATTENTION, *PRUNE], MEMBERS)
    qkv = together.online.member_encoder.blocks[0].qkv.weight
    for p in range(3):
        assert int((qkv[p] == 0).sum()) == int(0.6 * qkv[p].numel())
