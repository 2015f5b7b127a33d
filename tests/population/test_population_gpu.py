"""The population path on CUDA: graph = eager per member, no host sync in a captured iteration,
one graph launch per iteration, members of P equal populations of one (to float rounding), the
update's norm, Adam and target update one kernel each whatever P; the same for prioritized replay."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from foxdqn.population import step as P
from foxdqn.population.state import build_population
from foxdqn.step.iteration import WARMUP_ITERATIONS

from test_distributional import C51, IQN
from test_population_attention import ATTENTION
from test_population_actions import BRANCHING
from test_population import CARTPOLE, TRADING, configs, market_for, member_tensors
from support import iterate, no_host_sync

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def cuda_configs(base, members):
    return configs([*base, "device=cuda"], members)


def run(cfgs, graph: bool, iterations=10, collect_first=10):
    full = iterate(build_population(cfgs, market_for(cfgs[0]), CUDA), graph, collect_first, iterations)
    return full.s, full


def assert_members_close(a, b, pairs, atol=1e-5):
    for p, q in pairs:
        ta, tb = member_tensors(a, p), member_tensors(b, q)
        for k in ta:
            torch.testing.assert_close(ta[k], tb[k], atol=atol, rtol=1e-4 if atol else 0.0, msg=k)


@pytest.mark.parametrize("base", [CARTPOLE, TRADING, C51, IQN, [*TRADING, "action=branching", "action.switch_margin=3"]],
                         ids=["cartpole", "trading", "trading_c51", "trading_iqn", "trading_branching"])
def test_graph_equals_eager(base):
    members = [["seed=0"], ["seed=1", "optim.lr=1e-3"], ["seed=2", "agent.gamma=0.9"]]
    eager, _ = run(cuda_configs(base, members), graph=False)
    captured, it = run(cuda_configs(base, members), graph=True)
    assert it.graph is not None
    assert_members_close(captured, eager, [(p, p) for p in range(3)])
    assert torch.equal(captured.rng.counter, eager.rng.counter)


@pytest.mark.parametrize("base", [CARTPOLE, TRADING, IQN], ids=["cartpole", "trading", "trading_iqn"])
def test_collect_beside_update_on_two_streams_equals_its_order_on_one(base):
    """The captured iteration with the collect steps on a second stream (the default) equals, bit for
    bit, the same order on one stream: no race between the branch and the update."""
    members = [["seed=0"], ["seed=1", "optim.lr=1e-3"], ["seed=2", "agent.gamma=0.9"]]

    def run_streams(one: bool):
        cfgs = cuda_configs(base, members)
        s = build_population(cfgs, market_for(cfgs[0]), CUDA)
        steps = P.iteration_steps(s)
        assert steps["beside"] is P.collect_beside_update
        if one:
            steps["beside"] = lambda st, t, branch: P.collect_beside_update(st, t, None)
        return iterate(s, True, 10, 10, **steps)

    two, one = run_streams(False), run_streams(True)
    assert two.graph is not None and one.graph is not None and two.collect_beside
    assert_members_close(two.s, one.s, [(p, p) for p in range(3)], atol=0.0)
    for name in ("env_steps", "updates"):
        assert torch.equal(getattr(two.s, name), getattr(one.s, name)), name
    assert torch.equal(two.s.rng.counter, one.s.rng.counter)
    assert torch.equal(two.s.replay.ptr, one.s.replay.ptr) and torch.equal(two.s.obs, one.s.obs)


@pytest.mark.parametrize("base", [CARTPOLE, TRADING, [*CARTPOLE, "agent.collect_beside_update=false"],
                                  [*TRADING, "objective=cql"], C51, IQN, BRANCHING, [*IQN, "head.double=false"]],
                         ids=["cartpole", "trading", "cartpole_in_turn", "trading_cql", "trading_c51", "trading_iqn",
                              "trading_branching", "trading_iqn_single"])
def test_target_forward_on_its_stream_equals_it_on_the_current_stream(base):
    """The captured iteration with the target network's forward on ``s.target_branch`` beside the
    online forward (the default on CUDA) equals, bit for bit, the same iteration with it on the
    current stream: the online forward and the loss read nothing it writes before the join."""
    members = [["seed=0"], ["seed=1", "optim.lr=1e-3"], ["seed=2", "agent.gamma=0.9"]]

    def run_branch(on: bool):
        cfgs = cuda_configs(base, members)
        s = build_population(cfgs, market_for(cfgs[0]), CUDA)
        assert s.target_branch is not None
        if not on:
            s.target_branch = None
        return iterate(s, True, 10, 10, **P.iteration_steps(s))

    two, one = run_branch(True), run_branch(False)
    assert two.graph is not None and one.graph is not None
    assert_members_close(two.s, one.s, [(p, p) for p in range(3)], atol=0.0)
    assert torch.equal(two.s.rng.counter, one.s.rng.counter) and torch.equal(two.s.updates, one.s.updates)


@pytest.mark.parametrize("objective", [["objective=cql"], ["objective=iql", "objective.cql_alpha=0.5"]],
                         ids=["cql", "iql+cql"])
def test_graph_equals_eager_with_cql_and_iql(objective):
    """CQL(H) and IQL (its value network compared too: member_tensors) captured as eagerly."""
    members = [["seed=0"], ["seed=1", "objective.cql_alpha=2", "objective.iql_expectile=0.9"]]
    eager, _ = run(cuda_configs([*CARTPOLE, *objective], members), graph=False)
    captured, it = run(cuda_configs([*CARTPOLE, *objective], members), graph=True)
    assert it.graph is not None and captured.cql
    assert_members_close(captured, eager, [(p, p) for p in range(2)])


def test_members_equal_populations_of_one_on_cuda():
    """CartPole's layers are Triton kernels that compute each member's rows alone, so a member of P
    equals its population of one on CUDA too (CPU: tests/population, bit for bit, every feature)."""
    members = [["seed=0"], ["seed=1", "optim.lr=1e-3"]]
    together, _ = run(cuda_configs(CARTPOLE, members), graph=True)
    for p, member in enumerate(members):
        alone, _ = run(cuda_configs(CARTPOLE, [member]), graph=True)
        assert_members_close(together, alone, [(p, 0)])


@pytest.mark.parametrize("base,extra", [(TRADING, "optim.lr=1e-3"), (C51, "head.v_max=3.3"), (IQN, "head.kappa=0.3")],
                         ids=["trading", "trading_c51", "trading_iqn"])
def test_members_never_mix_on_cuda(base, extra):
    """A member's weights do not depend on the other members: member 0 of [A, B] equals member 0
    of [A, C], member 1 of [A, B] member 1 of [D, B]. (The trading encoder's batched cuBLAS
    products round otherwise for a batch of one than of two, and Adam turns that rounding of a
    near-zero gradient into a step of about lr, so P = 1 against P = 2 is compared on the CPU,
    where tests/population checks it bit for bit.)"""
    a, b = ["seed=0"], ["seed=1", extra]
    ab, _ = run(cuda_configs(base, [a, b]), graph=True)
    ac, _ = run(cuda_configs(base, [a, ["seed=2", "agent.gamma=0.9"]]), graph=True)
    db, _ = run(cuda_configs(base, [["seed=3", "agent.gamma=0.9"], b]), graph=True)
    assert_members_close(ab, ac, [(0, 0)], atol=0.0)
    assert_members_close(ab, db, [(1, 1)], atol=0.0)


def test_prioritized_replay_graph_equals_eager():
    """replay.name=per on CUDA: the compiled PER kernels with their member axis inside the captured
    iteration give what eager gives, for members with their own α and β₀. (Not against populations
    of one: there a batched matmul of another P may round otherwise, and PER's sampling turns a
    rounding into another slot; CPU checks that bit for bit, test_population_per.py.)"""
    members = [["seed=0", "replay.name=per"], ["seed=1", "replay.name=per", "replay.alpha=0.3",
                                                 "replay.beta_start=0.9"]]
    eager, _ = run(cuda_configs(TRADING, members), graph=False)
    captured, it = run(cuda_configs(TRADING, members), graph=True)
    assert it.graph is not None
    assert_members_close(captured, eager, [(0, 0), (1, 1)])
    torch.testing.assert_close(captured.replay.per.leaves, eager.replay.per.leaves, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("base,replay", [(CARTPOLE, "uniform"), (CARTPOLE, "per"), (C51, "uniform"), (C51, "per"),
                                         (IQN, "uniform"), (ATTENTION, "uniform")],
                         ids=["cartpole", "cartpole_per", "trading_c51", "trading_c51_per", "trading_iqn",
                              "trading_attention"])
def test_captured_iteration_is_sync_free_and_one_launch(base, replay):
    members = [["seed=0", f"replay.name={replay}"], ["seed=1", f"replay.name={replay}", "head.v_min=-3", "head.kappa=0"]]
    s, it = run(cuda_configs(base, members), graph=True, iterations=WARMUP_ITERATIONS + 1)
    assert it.graph is not None
    launches = []
    real = it.graph.replay
    it.graph.replay = lambda: (launches.append(1), real())[1]
    with no_host_sync():
        for _ in range(5):
            it()
    assert len(launches) == 5
    torch.cuda.synchronize()


def test_fault_in_one_member_on_cuda():
    clean, _ = run(cuda_configs(CARTPOLE, [["seed=0"], ["seed=1"]]), graph=True)
    faulty, _ = run(cuda_configs(CARTPOLE, [["seed=0"], ["seed=1", "debug.inject_nan_at_step=5"]]), graph=True)
    assert faulty.guard.halted.tolist() == [0.0, 1.0]
    assert faulty.guard.reason(1).endswith("update 5")  # the pinned host copy, published in the graph
    ta, tb = member_tensors(faulty, 0), member_tensors(clean, 0)
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k


def test_update_runs_norm_adam_and_target_as_one_kernel_each():
    """P = 20 CartPole members of 6 parameter tensors (120 member slices: torch's _foreach_norm
    would take two multi-tensor launches, the per-tensor Adam and lerp six each): per update the
    weight gradients with their norm (ops/member_mlp_chain.py with a ChainGradNorm), Adam and the
    target update are one launch each (ops/adam_step.py, ops/target_lerp.py), no launch of
    ops/grad_norm.py's is left, and no multi-tensor-apply, lerp, per-tensor Adam, clip-coefficient
    or target-weight kernel."""
    from torch.profiler import ProfilerActivity, profile

    s = build_population(cuda_configs(CARTPOLE, [[f"seed={i}"] for i in range(20)]), None, CUDA)
    for _ in range(10):
        P.collect_step(s)
    for _ in range(2):  # compile and make the ops' scratch
        P.update_step(s)
    torch.cuda.synchronize()
    updates = 3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(updates):
            P.update_step(s)
        torch.cuda.synchronize()
    counts = Counter(e.name for e in prof.events() if e.device_type.name == "CUDA" and not e.is_user_annotation)
    for kernel in ("_member_wgrad_kernel", "_adam_step_kernel", "_target_lerp_kernel"):
        assert sum(n for name, n in counts.items() if kernel in name) == updates, (kernel, counts)
    gone = ("multi_tensor_apply", "lpnorm", "_member_adam_kernel", "_grad_norm_kernel")
    stale = [name for name in counts
             if any(x in name for x in gone) or ("lerp" in name and "_target_lerp_kernel" not in name)]
    assert not stale, stale


def test_ensemble_walks_are_captured_on_cuda():
    """The ensemble policy's walk runs in a CUDA graph (its member index on the device) and two
    identical members' ensemble walks as each of them."""
    from foxdqn.population.ensemble import ensemble_walks
    from foxdqn.population.evaluate import member_walks

    cfgs = cuda_configs([*TRADING, "eval.gate.enabled=false"], [["seed=5"], ["seed=5"]])  # as trained: the gate has its own test
    s, _ = run(cfgs, graph=True)
    market = market_for(cfgs[0])
    entry = ensemble_walks(s, market, [0, 1], "mean")[0]
    assert entry["metrics"] == member_walks(s, market, "test", ("agent",))[0]["metrics"]["agent"]


@pytest.mark.parametrize("rule", ["consensus", "lcb"])
def test_ensemble_rules_reading_the_held_exposure_are_captured_on_cuda(rule):
    """consensus and lcb read each walk's held exposure from the eval env inside the captured walk;
    two identical members' ensemble walks as each of them."""
    from foxdqn.population.ensemble import ensemble_walks
    from foxdqn.population.evaluate import member_walks

    cfgs = cuda_configs([*TRADING, f"eval.ensemble={rule}", "eval.gate.enabled=false"], [["seed=5"], ["seed=5"]])
    s, _ = run(cfgs, graph=True)
    market = market_for(cfgs[0])
    entry = ensemble_walks(s, market, [0, 1], rule)[0]
    assert entry["metrics"] == member_walks(s, market, "test", ("agent",))[0]["metrics"]["agent"]


def test_gated_walks_are_captured_on_cuda():
    """The deployment gate's candidate walks (one per member and switch margin, each with its own
    penalty scale) captured in a CUDA graph choose and walk as the same walks run eagerly."""
    from foxdqn.analysis.backtest import POLICIES
    from foxdqn.analysis.gate import gated_agents
    from foxdqn.population.evaluate import MemberGreedy

    cfgs = cuda_configs([*TRADING, "eval.gate.enabled=true"], [["seed=5"], ["seed=6", "loss.reward_scale=10"]])
    s, _ = run(cfgs, graph=True)
    market = market_for(cfgs[0])
    out = {graph: gated_agents(s.cfg, market, MemberGreedy(s.online), CUDA, 2, "test", s.action_mode, POLICIES,
                               reward_scales=[c.loss.reward_scale for c in cfgs], graph=graph) for graph in (True, False)}
    (captured, cgates), (eager, egates) = out[True], out[False]
    for p in range(2):
        assert cgates[p]["chosen"] == egates[p]["chosen"]
        assert [c["val"] for c in cgates[p]["candidates"]] == [c["val"] for c in egates[p]["candidates"]]
        assert [c["test"] for c in cgates[p]["candidates"]] == [c["test"] for c in egates[p]["candidates"]]
        assert captured[p]["metrics"]["agent"]["total_return"] == eager[p]["metrics"]["agent"]["total_return"]


#: shipped experiments of the device envs (pong_dqn and cartpole_gym step host envs: test_population_gym.py)
SHIPPED = [e for e in __import__("support").EXPERIMENTS if e not in ("pong_dqn", "cartpole_gym")]


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_experiment_captures_at_its_own_widths(name):
    """Each shipped experiment as shipped (its widths, atoms, fractions, windows and action modes;
    only the replay and the first collect shortened), two members: the fused kernels compile
    within the GPU's limits, the iteration is captured and replays, the weights stay finite.
    (eurusd_iqn's fused collect once asked for more shared memory than the H200 has; debug=smoke
    caps the widths and missed it.)"""
    from foxdqn.job.check import market_data

    cfgs = cuda_configs([f"+experiment={name}", "log.progress=false", "replay.capacity=4096"],
                        [["seed=0"], ["seed=1", "optim.lr=1e-4"]])
    market = market_data(cfgs[0]) if cfgs[0].env.name == "trading" else None
    full = iterate(build_population(cfgs, market, CUDA), True, 4, WARMUP_ITERATIONS + 2)
    assert full.graph is not None
    assert all(bool(torch.isfinite(t).all()) for t in full.s.online.parameters())


def test_a_pinned_host_copy_equals_a_pageable_one_and_its_reuse_copies_the_new_state():
    """HostCopy into reused page-locked buffers (the periodic checkpoints'): the same values as a
    pageable copy, and a second copy into the same buffers, after more iterations, holds the new
    state (equal to a fresh pageable copy of it), not the old one."""
    from foxdqn.population.checkpoint import HostCopy

    s, full = run(cuda_configs(CARTPOLE, [[f"seed={p}"] for p in range(3)]), graph=True)
    pinned = {}

    def same(a, b) -> bool:
        assert [part[0] for part in a.parts] == [part[0] for part in b.parts]
        copied = [(part[0], part[5], other[5]) for part, other in zip(a.parts, b.parts) if part[5] is not None]
        for path, ha, hb in copied:
            assert torch.equal(ha, hb), path
        return bool(copied)

    def weights(copy):
        return next(part[5] for part in copy.parts if part[0] == "online.weights.0")

    first = HostCopy(s, None, pinned)
    assert pinned and all(t.is_pinned() for t in pinned.values())
    assert same(first, HostCopy(s, None))
    before = weights(first).clone()
    for _ in range(5):
        full()
    second = HostCopy(s, None, pinned)
    assert same(second, HostCopy(s, None)) and second.updates > first.updates
    assert weights(second) is weights(first) and not torch.equal(weights(second), before)  # reused, new weights
