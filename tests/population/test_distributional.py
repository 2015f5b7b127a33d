"""Distributional heads in a population (CPU, eager): C51 and IQN members equal populations of one
(each with its own support, κ and τ draws), a population of one computes the single run's loss,
and a member's weights are a classic network's."""
from __future__ import annotations

import contextlib

import pytest
import torch

from foxdqn.objectives.c51 import C51Objective
from foxdqn.objectives.cql import CQLObjective
from foxdqn.objectives.iqn import IQNObjective
from foxdqn.population import objective as population_objective
from foxdqn.population import step as P
from foxdqn.population.distributional import MemberC51Network, MemberIQNNetwork
from foxdqn.population.ensemble import ensemble_walks
from foxdqn.population.evaluate import MemberGreedy, member_walks
from foxdqn.population.random import MemberRandom
from foxdqn.population.state import build_population
from foxdqn.population.step import population_loss
from foxdqn.replay.buffer import Batch
from foxdqn.step.build import build_network
from support import iterate
from test_population import (CPU, TRADING, assert_fault_stays_in_its_member, assert_fused_loss_equals_torch_ops,
                             assert_member_equal, configs, market_for, member_tensors, run)

C51 = [*TRADING, "head=c51", "head.atoms=11"]
# -3.3, 7.1: not float32 values (the support must still be each member's own, bit for bit)
C51_MEMBERS = [["seed=5"], ["seed=6", "head.v_min=-3.3", "head.v_max=7.1"],
               ["seed=7", "agent.gamma=0.9", "head.v_min=-1", "head.v_max=1", "loss.reward_scale=10"]]

IQN = [*TRADING, "head=iqn", "head.num_quantiles=8", "head.num_target_quantiles=6", "head.num_quantiles_policy=4",
       "head.embedding_dim=8"]
IQN_MEMBERS = [["seed=5"], ["seed=6", "head.kappa=0"], ["seed=7", "agent.gamma=0.9", "head.kappa=0.3"]]
HEADS = {"c51": (C51, C51_MEMBERS, MemberC51Network), "iqn": (IQN, IQN_MEMBERS, MemberIQNNetwork)}


def collected(cfgs, iterations=12):
    """A population after ``iterations`` collect-only iterations (its replay holds transitions)."""
    s = build_population(cfgs, market_for(cfgs[0]), CPU)
    return iterate(s, False, iterations, 0, collect=P.collect_step, update=P.update_step,
                   after_updates=P.publish_guard).s


def classic(s, p, online=True):
    """Member p's classic network (built from its config) with its weights from member_state_dict."""
    net = build_network(s.cfgs[p], s.env, s.action_mode.num_actions)
    net.load_state_dict((s.online if online else s.target).member_state_dict(p))
    return net


def single_run_batch(batch, p, b):
    """Member p's rows of a member-major population batch as a single run's Batch (its importance
    weights: ones with uniform replay)."""
    d = batch.obs.shape[-1]
    rows = slice(p * b, (p + 1) * b)
    return Batch(obs=batch.obs.reshape(-1, d)[rows], action=batch.action[rows], reward=batch.reward[rows],
                 next_obs=batch.next_obs.reshape(-1, d)[rows], discount=batch.discount[rows],
                 weight=batch.weight[rows], index=batch.index[rows])


def next_taus(s, batch_size):
    """The (τ, τ') ``[P, B, N]``, ``[P, B, N']`` the population's next IQN update draws (a copy of
    its generator; its own counter does not move)."""
    redraw = MemberRandom([c.seed for c in s.cfgs], CPU)
    redraw.counter.copy_(s.rng.counter)
    h = s.cfg.head
    return (redraw.uniform(batch_size * h.num_quantiles).view(s.members, batch_size, h.num_quantiles),
            redraw.uniform(batch_size * h.num_target_quantiles).view(s.members, batch_size, h.num_target_quantiles))


def single_objective(s, p, taus=None):
    """Member p's single-run objective (C51Objective or IQNObjective) on its classic networks, with
    CQLObjective around it when its α > 0; IQN draws ``taus`` (member p's τ, τ') in order."""
    h, online = s.cfgs[p].head, classic(s, p)
    if h.name == "c51":
        base = C51Objective(online, classic(s, p, online=False), double=h.double)
    else:
        base = IQNObjective(online, classic(s, p, online=False), h.num_quantiles, h.num_target_quantiles, h.kappa,
                            double=h.double)
        draws = iter([taus[0][p], taus[1][p]])  # what the single run's generator would draw
        base._sample = lambda shape, device: next(draws)
    alpha = s.cfgs[p].objective.cql_alpha
    return (CQLObjective(base, alpha) if alpha > 0 else base), online


# ------------------------------------------------------------------------------------------- C51
def test_c51_support_is_a_member_key_that_changes_training():
    """The same seed on two supports trains to other weights: each member's support reaches its loss."""
    s = run(configs(C51, [["seed=5"], ["seed=5", "head.v_min=-3.3", "head.v_max=7.1"]]))
    a, b = member_tensors(s, 0), member_tensors(s, 1)
    assert any(not torch.equal(a[k], b[k]) for k in a if k.startswith("online"))
    start = member_tensors(build_population(configs(C51, [["seed=5"]]), market_for(s.cfg), CPU), 0)
    assert all(not torch.equal(a[k], start[k]) for k in a if k.startswith("online"))  # it trained


@pytest.mark.parametrize("dueling", [False, True])
def test_c51_member_state_dict_loads_into_the_classic_network_with_the_same_q(dueling):
    s = run(configs([*C51, f"head.dueling={str(dueling).lower()}"], C51_MEMBERS), iterations=3)
    obs = s.obs.view(3, s.cfg.env.num_envs, -1)
    q = s.online(obs)
    for p in range(3):
        net = classic(s, p)
        torch.testing.assert_close(net.support, s.online.support[p].view(-1), rtol=0, atol=0)
        torch.testing.assert_close(net(obs[p]), q[p], rtol=1e-5, atol=1e-6)
    # the flat evaluation wrapper gives the same expected Q per member
    torch.testing.assert_close(MemberGreedy(s.online)(s.obs), q.reshape(-1, q.shape[-1]))


# ------------------------------------------------------------------------------------------- IQN
def test_iqn_taus_are_each_members_own_draws(monkeypatch):
    """Member p's τ and τ' are what a population of one of its seed draws, and differ between seeds."""
    seen = []
    real = population_objective.member_iqn_loss
    monkeypatch.setattr(population_objective, "member_iqn_loss",
                        lambda *a, **k: (seen.append((a[4].clone(), a[5].clone())), real(*a, **k))[1])
    run(configs(IQN, [["seed=5"], ["seed=6"]]), iterations=2)
    together, seen[:] = list(seen), []
    run(configs(IQN, [["seed=6"]]), iterations=2)
    assert len(together) == len(seen) == 2
    for (taus, target_taus), (one_taus, one_target_taus) in zip(together, seen):
        assert taus.shape == (2, 8, 8) and target_taus.shape == (2, 8, 6)
        assert torch.equal(taus[1:], one_taus) and torch.equal(target_taus[1:], one_target_taus)
        assert not torch.equal(taus[0], taus[1])


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_member_taus_are_one_draw_of_the_values_two_draws_per_micro_batch_would_give(micro_batches):
    """member_taus draws τ and τ' of every micro-batch in one launch: the values of a draw of τ then
    one of τ' per micro-batch (the generator is counter-based), the counter advanced as far."""
    one, two = MemberRandom([5, 6, 7], torch.device("cpu")), MemberRandom([5, 6, 7], torch.device("cpu"))
    taus, target_taus = population_objective.member_taus(one, 8, 4, 3, micro_batches)
    rows = 8 // micro_batches
    parts = [(two.uniform(rows * 4).view(3, rows, 4), two.uniform(rows * 3).view(3, rows, 3))
             for _ in range(micro_batches)]
    assert torch.equal(taus, torch.cat([t for t, _ in parts], dim=1))
    assert torch.equal(target_taus, torch.cat([t for _, t in parts], dim=1))
    assert one.counter.item() == two.counter.item() == 8 * 7


def test_iqn_kappa_is_a_member_key_that_changes_training():
    s = run(configs(IQN, [["seed=5"], ["seed=5", "head.kappa=0.05"]]))
    a, b = member_tensors(s, 0), member_tensors(s, 1)
    assert any(not torch.equal(a[k], b[k]) for k in a if k.startswith("online"))


def test_iqn_member_state_dict_loads_into_the_classic_network_with_the_same_q():
    s = run(configs([*IQN, "head.dueling=true"], IQN_MEMBERS), iterations=3)
    obs = s.obs.view(3, s.cfg.env.num_envs, -1)
    q = s.online(obs)
    taus = torch.rand(3, obs.shape[1], 5)
    z = s.online.head(s.online.encoder(obs), taus)
    for p in range(3):
        net = classic(s, p)
        torch.testing.assert_close(net(obs[p]), q[p], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(net.quantiles(obs[p], taus[p]), z[p], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(MemberGreedy(s.online)(s.obs), q.reshape(-1, q.shape[-1]))


# ------------------------------------------------------------------------------------- both heads


@pytest.mark.parametrize("dueling", [False, True])
@pytest.mark.parametrize("head", HEADS)
def test_members_equal_runs_of_one_member(head, dueling):
    """Different seeds (so replay and τ draws), γ, reward scales and the head's member keys (C51's
    support, IQN's κ; 0 is quantile regression): member p of the population is bit for bit a
    population of one. A member reading another's support, κ, τ or rows would break this (they
    differ)."""
    settings, members, network = HEADS[head]
    base = [*settings, f"head.dueling={str(dueling).lower()}"]
    together = run(configs(base, members))
    assert isinstance(together.online, network)
    if head == "c51":
        assert together.online.v_min.tolist() == [-10.0, -3.3, -1.0]
    else:
        assert together.params.kappa.tolist() == pytest.approx([1.0, 0.0, 0.3])
    for p, extra in enumerate(members):
        alone = run(configs(base, [extra]))
        assert_member_equal(together, p, alone, 0)


@pytest.mark.parametrize("replay", ["uniform", "per"])
@pytest.mark.parametrize("double", [True, False])
@pytest.mark.parametrize("head", HEADS)
def test_population_loss_is_each_members_single_run_objective(head, double, replay):
    """Member p's loss, td_abs (the PER priority: CE or ρ) and expected Q equal its single run's
    C51Objective / IQNObjective on the same weights, batch, importance weights and τ (float
    tolerance: baddbmm against addmm)."""
    settings, members, _ = HEADS[head]
    s = run(configs([*settings, f"head.double={str(double).lower()}", f"replay.name={replay}"], members),
            iterations=4)
    with torch.no_grad():  # make the target differ from the online network
        for w in s.target.weights:
            w.add_(0.05 * torch.randn_like(w))
    batch = s.replay.sample_members(8)
    assert (replay == "per") == bool((batch.weight != 1).any())  # PER: importance weights of its own
    taus = next_taus(s, 8) if head == "iqn" else None
    out = population_loss(s, batch)
    assert out.loss.shape == (3,) and out.td_abs.shape == (24,) and out.q_values.shape[:2] == (3, 8)
    for p in range(3):
        objective, _ = single_objective(s, p, taus)
        single = objective(single_run_batch(batch, p, 8))
        torch.testing.assert_close(out.loss[p], single.loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out.td_abs[p * 8:(p + 1) * 8], single.td_abs, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out.q_values[p], single.q_values, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("head", HEADS)
def test_per_members_equal_runs_of_one_member(head):
    """replay.name=per on a distributional head: each member samples by its own priorities (its
    CE or ρ written back), with its own PER α and β₀, bit for bit a population of one."""
    settings, members, _ = HEADS[head]
    members = [[*m, "replay.name=per", *extra] for m, extra in
               zip(members, ([], ["replay.alpha=0.3"], ["replay.beta_start=0.9"]))]
    together = run(configs(settings, members))
    for p, extra in enumerate(members):
        assert_member_equal(together, p, run(configs(settings, [extra])), 0)


@pytest.mark.parametrize("head", HEADS)
def test_members_and_ensembles_evaluate_on_expected_q(head):
    """member_walks (evaluation) and the ensemble walk the members on their expected Q; two
    identical members' ensemble walks as each of them."""
    s = run(configs([*HEADS[head][0], "eval.gate.enabled=false"], [["seed=5"], ["seed=5"]]), iterations=3)  # as trained
    market = market_for(s.cfg)
    walks = member_walks(s, market, "test", ("agent",))
    assert walks[0]["metrics"] == walks[1]["metrics"]
    assert ensemble_walks(s, market, [0, 1], "mean")[0]["metrics"] == walks[0]["metrics"]["agent"]


@pytest.mark.parametrize("head", HEADS)
def test_fault_in_one_member_leaves_the_others_bit_identical(head):
    settings, members, _ = HEADS[head]
    assert_fault_stays_in_its_member(settings, members)


CQL_ALPHAS = (1.0, 0.25, 0.0)


@pytest.mark.parametrize("head", HEADS)
def test_cql_members_equal_runs_of_one_member(head):
    """objective.cql_alpha (a member key, 0 included) on a distributional head: CQL(H) of each
    member's expected Q, bit for bit a population of one."""
    settings, members, _ = HEADS[head]
    members = [[*m, f"objective.cql_alpha={a}"] for m, a in zip(members, CQL_ALPHAS)]
    together = run(configs(settings, members))
    assert together.cql
    for p, extra in enumerate(members):
        assert_member_equal(together, p, run(configs(settings, [extra])), 0)


@pytest.mark.parametrize("head", HEADS)
def test_cql_on_a_distributional_head_is_each_members_single_run_loss(head):
    """Member p's loss and gradients are its single run's CQLObjective(C51Objective | IQNObjective)
    with its α (IQN: with the τ, τ' the member drew), to float rounding."""
    settings, members, _ = HEADS[head]
    cfgs = configs(settings, [[*m, f"objective.cql_alpha={a}"] for m, a in zip(members, CQL_ALPHAS)])
    s = collected(cfgs)
    batch = s.replay.sample_members(8)
    taus = next_taus(s, 8) if head == "iqn" else None
    loss = population_loss(s, batch).loss
    s.optimizer.zero_grad(set_to_none=True)
    loss.sum().backward()
    for p in range(3):
        objective, online = single_objective(s, p, taus)
        out = objective(single_run_batch(batch, p, 8))
        torch.testing.assert_close(loss[p], out.loss, rtol=1e-5, atol=1e-6)
        out.loss.backward()
        grads = {name: w.grad for name, w in online.named_parameters()}
        for prefix, w, b in zip(s.online.prefixes, s.online.weights, s.online.biases):
            torch.testing.assert_close(w.grad[p].t(), grads[f"{prefix}.weight"], rtol=1e-4, atol=1e-6, msg=prefix)
            torch.testing.assert_close(b.grad[p, 0], grads[f"{prefix}.bias"], rtol=1e-4, atol=1e-6, msg=prefix)


@pytest.mark.parametrize("experiment", ["eurusd_c51", "eurusd_rainbowish"])
def test_c51_population_loss_takes_its_fused_op_where_the_kernels_run(experiment):
    """Inside cpu_kernels a C51 population's loss is ops/c51_loss.py's two kernels (selection,
    projection and cross-entropy; its backward), and its losses, |TD| and gradients are those of the
    ops of c51_cross_entropy (outside) to float32 rounding: members with their own supports (plain
    and Rainbow's dueling head, Double DQN). 11 atoms (an odd count, masked in a block of 16; the
    24 rows in two blocks, the second part-filled): the interpreter's cost grows with the atoms, 51
    took 5-10 times longer; ops/test_c51_loss.py checks 51."""
    from bench.cpu_kernels import launches, small_overrides
    from bench.harness import make_population
    from foxdqn.ops import backend as B
    from foxdqn.population.step import collect_step, population_loss

    s = make_population([f"+experiment={experiment}", *small_overrides(experiment), "head.v_min=-3", "head.v_max=4",
                         "head.atoms=11"], 3, "cpu")
    for _ in range(12):
        collect_step(s)
    batch = s.replay.sample_members(s.cfg.agent.batch_size)
    outs = []
    for fused in (False, True):
        s.optimizer.zero_grad(set_to_none=True)
        with B.cpu_kernels() if fused else contextlib.nullcontext():
            out = population_loss(s, batch)
            out.loss.sum().backward()
        outs.append((out, [w.grad.clone() for w in s.optimizer.params]))
    (plain, g_plain), (fused, g_fused) = outs
    torch.testing.assert_close(fused.loss, plain.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused.td_abs, plain.td_abs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused.q_values, plain.q_values, rtol=1e-5, atol=1e-5)
    for a, b in zip(g_fused, g_plain):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    ops = launches(lambda: population_loss(s, batch).loss.sum().backward())
    assert ops.count("triton::_c51_loss_fwd_kernel") == 1 and ops.count("triton::_c51_loss_bwd_kernel") == 1
    assert not {"aten::log_softmax", "aten::softmax", "aten::argmax", "aten::gather", "aten::zeros"} & set(ops), ops


@pytest.mark.parametrize("setting", [[], ["head.double=false"], ["action.switch_margin=3", "replay=per"]],
                         ids=["double", "single-q", "switch-per"])
def test_iqn_loss_kernel_equals_its_torch_ops(setting):
    """Where the fused kernels run (inside cpu_kernels here), an IQN population's loss after its
    heads' forwards is foxdqn/ops/iqn_loss.py's kernel; its loss, td_abs, Q and every online
    parameter's gradient equal those of the torch ops that run elsewhere (the same τ draws: the
    members' generator is rewound between the two)."""
    s = run(configs([*IQN, *setting], [["seed=5"], ["seed=6", "head.kappa=0"], ["seed=7", "head.kappa=2.5"]]),
            iterations=2)
    assert_fused_loss_equals_torch_ops(s, s.replay.sample_members(8), population_objective, "iqn_loss",
                                       rewind=s.rng.counter)
