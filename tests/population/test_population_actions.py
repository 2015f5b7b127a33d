"""The trading env's action modes in a population (CPU, eager): action.mode=exposure_routed (a head
over the 5 exposures, order type and urgency routed per env) and branching (BDQ: a branch per
action dimension): members equal populations of one bit for bit (with a switch margin, PER and CQL
too), a routed member routes with its single run's medians, a member loads into the classic network
with the same Q, and a branching member's loss, |TD|, Q and gradients are its single run's
BranchingObjective's."""
from __future__ import annotations

import pytest
import torch

from foxdqn.actions.modes import ExposureRoutedMode
from foxdqn.actions.switch import NextStatePenalty, SwitchPenalty
from foxdqn.objectives.branching import BranchingObjective
from foxdqn.objectives.cql import CQLObjective
from foxdqn.population.branching import MemberBranchingNetwork
from foxdqn.population.state import build_population
from foxdqn.population.step import population_loss
from test_distributional import classic, single_run_batch
from test_population import (CPU, TRADING, assert_fault_stays_in_its_member, assert_fused_loss_equals_torch_ops,
                             assert_members_equal_runs_of_one, configs, market_for, run)
from test_population_attention import SMALL, assert_loss_is_each_members_single_run_objective

ROUTED = [*TRADING, "action=exposure_routed"]
MEMBERS = [["seed=5"], ["seed=6", "optim.lr=3e-4"], ["seed=7", "agent.gamma=0.9", "loss.reward_scale=10"]]


def test_routed_members_equal_runs_of_one_member():
    together = assert_members_equal_runs_of_one(ROUTED, MEMBERS)
    assert isinstance(together.action_mode, ExposureRoutedMode) and together.online.weights[-1].shape[-1] == 5


def test_routed_members_with_a_switch_margin_equal_runs_of_one_member():
    """The penalty of the 5 exposures themselves (switch.action_exposures), each member's reward scale."""
    together = assert_members_equal_runs_of_one([*ROUTED, "action.switch_margin=3"], MEMBERS)
    assert together.switch is not None


def test_routed_member_routes_and_acts_as_its_single_run():
    """The population routes with the single run's training-split medians (the action mode
    foxdqn.step.build builds for the training env, as python -m foxdqn.evaluate does), and member p's
    weights load into its single run's network (5 actions) with the same Q."""
    from foxdqn.step.build import build_action_mode, build_env

    cfgs = configs(ROUTED, MEMBERS)
    single = build_action_mode(cfgs[0], build_env(cfgs[0], market_for(cfgs[0]), "train", CPU, torch.Generator()))
    mode = build_population(cfgs, market_for(cfgs[0]), CPU).action_mode
    assert torch.equal(mode.median_spread, single.median_spread)
    assert torch.equal(mode.median_volatility, single.median_volatility)
    s = run(cfgs, iterations=3)
    obs = s.obs.view(3, s.cfg.env.num_envs, -1)
    q = s.online(obs)
    assert q.shape[-1] == 5
    for p in range(3):
        torch.testing.assert_close(classic(s, p)(obs[p]), q[p], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------- branching
BRANCHING = [*TRADING, "action=branching"]
BRANCHING_MEMBERS = [["seed=5"], ["seed=6", "optim.lr=3e-4", "loss.huber_delta=0.5"],
                     ["seed=7", "agent.gamma=0.9", "loss.reward_scale=10"]]
BRANCHING_SETTINGS = {
    "plain": BRANCHING,
    "single-q": [*BRANCHING, "head.double=false"],
    "switch-per-cql": [*BRANCHING, "action.switch_margin=3", "replay=per", "objective.cql_alpha=0.5"],
    "attention": [*BRANCHING, *SMALL],
}


@pytest.mark.parametrize("name", BRANCHING_SETTINGS)
def test_branching_members_equal_runs_of_one_member(name):
    """Different seeds, lr, Huber δ, γ and reward scales: member p is bit for bit a population of one
    (with Double DQN or not; with a switch margin paid by the exposure branch, prioritized replay and
    CQL; with the attention encoder)."""
    together = assert_members_equal_runs_of_one(BRANCHING_SETTINGS[name], BRANCHING_MEMBERS)
    assert isinstance(together.online, MemberBranchingNetwork)
    assert together.online.prefixes[-4:] == ["head.branches.0", "head.branches.1", "head.branches.2", "head.value"]


def test_fault_in_one_branching_member_leaves_the_others_bit_identical():
    assert_fault_stays_in_its_member(BRANCHING, BRANCHING_MEMBERS)


def test_branching_member_loads_into_the_classic_network_with_the_same_q():
    s = run(configs(BRANCHING, BRANCHING_MEMBERS), iterations=3)
    obs = s.obs.view(3, s.cfg.env.num_envs, -1)
    q, branches = s.online(obs), s.online.branch_q(obs)
    assert q.shape[-1] == 45 and [b.shape[-1] for b in branches] == [5, 3, 3]
    for p in range(3):
        net = classic(s, p)
        torch.testing.assert_close(net(obs[p]), q[p], rtol=1e-5, atol=1e-6)
        for mine, theirs in zip(branches, net.branch_q(obs[p])):
            torch.testing.assert_close(theirs, mine[p], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("replay", ["uniform", "per"])
@pytest.mark.parametrize("double", [True, False])
def test_branching_loss_is_each_members_single_run_objective(double, replay):
    """Member p's loss, td_abs, joint Q and gradients are its single run's BranchingObjective (in
    CQLObjective with its α) with its δ on the same weights, rows and importance weights (float
    tolerance: baddbmm against addmm)."""
    members = [[*m, f"objective.cql_alpha={a}"] for m, a in zip(BRANCHING_MEMBERS, (0.0, 0.5, 2.0))]
    s = run(configs([*BRANCHING, f"head.double={str(double).lower()}", f"replay.name={replay}"], members),
            iterations=4)  # PER: its priorities written back by updates

    def objective(p, online, target):
        cfg = s.cfgs[p]
        base = BranchingObjective(online, target, double=double, huber_delta=cfg.loss.huber_delta)
        return CQLObjective(base, cfg.objective.cql_alpha) if cfg.objective.cql_alpha > 0 else base

    batch = assert_loss_is_each_members_single_run_objective(s, objective)
    assert (replay == "per") == bool((batch.weight != 1).any())  # PER: importance weights of its own


def test_branching_switch_penalty_is_each_members_single_run_target():
    """action.switch_margin with branching: member p's target picks the exposure of s' paying its
    penalty with its own reward scale, as its single run's BranchingObjective with a NextStatePenalty
    does (a margin large enough to change the targets: the loss differs from a margin-free one)."""
    members = [["seed=5"], ["seed=6", "loss.reward_scale=10"]]
    s = run(configs([*BRANCHING, "action.switch_margin=50"], members), iterations=3)
    batch = s.replay.sample_members(8)
    assert batch.next_code is not None
    out = population_loss(s, batch)
    switch, s.switch = s.switch, None
    assert not torch.equal(population_loss(s, batch).loss, out.loss)  # the penalty moved the targets
    s.switch = switch
    for p, cfg in enumerate(s.cfgs):
        penalty = NextStatePenalty(SwitchPenalty(50.0, cfg.loss.reward_scale, "branching", CPU), s.env)
        objective = BranchingObjective(classic(s, p), classic(s, p, online=False), huber_delta=cfg.loss.huber_delta,
                                       switch=penalty)
        rows = slice(p * 8, (p + 1) * 8)
        single = objective(single_run_batch(batch, p, 8)._replace(next_code=batch.next_code[rows]))
        torch.testing.assert_close(out.loss[p], single.loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out.td_abs[rows], single.td_abs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("setting", [[], ["head.double=false"], ["action.switch_margin=3", "replay=per"]],
                         ids=["double", "single-q", "switch-per"])
def test_branching_loss_kernel_equals_its_torch_ops(setting):
    """Where the fused kernels run (inside cpu_kernels here), a branching population's loss is
    foxdqn/ops/branching_loss.py's kernel; its loss, td_abs, joint Q and every online parameter's
    gradient equal those of the torch ops that run elsewhere (float tolerance: the mean of A_d and
    the loss's sum in the kernel's order); with Double DQN the online rows of s and s' come from one
    forward of the replay's stacked pair."""
    from foxdqn.population import objective as obj

    from foxdqn.ops import backend as B

    s = run(configs([*BRANCHING, *setting], BRANCHING_MEMBERS), iterations=2)
    with B.cpu_kernels():  # the replay's kernel gathers s and s' as the halves of one stacked pair
        batch = s.replay.sample_members(8)
    kwargs = assert_fused_loss_equals_torch_ops(s, batch, obj, "branching_loss")
    assert kwargs["stacked"] == ("head.double=false" not in setting)


def test_branching_forward_takes_the_joint_q_kernel_without_gradient():
    """MemberBranchingNetwork's forward (acting, evaluation, monitors): inside cpu_kernels without
    gradient foxdqn/ops/branching_joint_q.py's kernel (its Q to float rounding); outside, or with a
    gradient, the torch ops."""
    from foxdqn.ops import backend as B
    from foxdqn.population import branching as member_branching

    cfgs = configs(BRANCHING, [["seed=0"], ["seed=1"]])
    s = build_population(cfgs, market_for(cfgs[0]), CPU)
    obs = torch.randn(2, 5, s.online.weights[0].shape[1])
    calls = []
    real = member_branching.branching_joint_q
    member_branching.branching_joint_q = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        with torch.no_grad():
            want = s.online(obs)
            with B.cpu_kernels():
                got = s.online(obs)
        assert calls == [1]
        with B.cpu_kernels():
            s.online(obs)  # grad mode: the torch ops
        assert calls == [1]
    finally:
        member_branching.branching_joint_q = real
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
