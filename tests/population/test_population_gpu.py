"""The population path on CUDA: graph = eager per member, no host sync in a captured iteration,
one graph launch per iteration, members of P equal populations of one (to float rounding)."""
from __future__ import annotations

import pytest
import torch

from foxdqn.population import step as P
from foxdqn.population.state import build_population
from foxdqn.step.iteration import WARMUP_ITERATIONS

from test_population import CARTPOLE, TRADING, configs, market_for, member_tensors
from support import iterate, no_host_sync

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
FNS = dict(collect=P.collect_step, update=P.update_step, after_updates=P.publish_guard)


def cuda_configs(base, members):
    return configs([*base, "device=cuda"], members)


def run(cfgs, graph: bool, iterations=10, collect_first=10):
    full = iterate(build_population(cfgs, market_for(cfgs[0]), CUDA), graph, collect_first, iterations, **FNS)
    return full.s, full


def assert_members_close(a, b, pairs, atol=1e-5):
    for p, q in pairs:
        ta, tb = member_tensors(a, p), member_tensors(b, q)
        for k in ta:
            torch.testing.assert_close(ta[k], tb[k], atol=atol, rtol=1e-4, msg=k)


@pytest.mark.parametrize("base", [CARTPOLE, TRADING], ids=["cartpole", "trading"])
def test_graph_equals_eager(base):
    members = [["seed=0"], ["seed=1", "optim.lr=1e-3"], ["seed=2", "agent.gamma=0.9"]]
    eager, _ = run(cuda_configs(base, members), graph=False)
    captured, it = run(cuda_configs(base, members), graph=True)
    assert it.graph is not None
    assert_members_close(captured, eager, [(p, p) for p in range(3)])
    assert torch.equal(captured.rng.counter, eager.rng.counter)


def test_members_equal_populations_of_one_on_cuda():
    members = [["seed=0"], ["seed=1", "optim.lr=1e-3"]]
    together, _ = run(cuda_configs(CARTPOLE, members), graph=True)
    for p, extra in enumerate(members):
        alone, _ = run(cuda_configs(CARTPOLE, [extra]), graph=True)
        assert_members_close(together, alone, [(p, 0)])


def test_captured_iteration_is_sync_free_and_one_launch():
    s, it = run(cuda_configs(CARTPOLE, [["seed=0"], ["seed=1"]]), graph=True,
                    iterations=WARMUP_ITERATIONS + 1)
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
