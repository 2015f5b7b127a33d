"""The training controls inside the captured iteration: graph == eager, no host sync, targets reached."""
import math

import pytest
import torch

from foxdqn.population.stats import LOSS_SUM, UPDATES
from foxdqn.step.iteration import WARMUP_ITERATIONS

from support import captured_iteration, experiment_state, iterate, no_host_sync

pytestmark = pytest.mark.gpu

# eurusd_controls (accumulate=4, pruning, regime weights, PER) with a schedule that ends inside the test
SHORT = ["prune.start_update=4", "prune.end_update=40", "prune.frequency=6", "prune.final_sparsity=0.5"]
CASES = {
    "all": [],
    "accumulate": ["prune.enabled=false", "regime.enabled=false"],
    "prune": ["optim.accumulate=1", "regime.enabled=false"],
    "regime": ["optim.accumulate=1", "prune.enabled=false"],
}


def _run(use_graph: bool, extra, iters: int = 30):
    s, _ = experiment_state("eurusd_controls", device="cuda", extra=[*SHORT, *extra])
    return iterate(s, use_graph, 6, iters).s


@pytest.mark.parametrize("case", sorted(CASES))
def test_controls_graph_equals_eager(case):
    torch.backends.cudnn.deterministic = True
    se, sg = _run(False, CASES[case]), _run(True, CASES[case])
    assert sg.stats.acc[0, UPDATES].item() == se.stats.acc[0, UPDATES].item() == 60
    torch.testing.assert_close(sg.stats.acc[:, LOSS_SUM:], se.stats.acc[:, LOSS_SUM:], rtol=1e-5, atol=1e-6)
    for a, b in zip(sg.online.parameters(), se.online.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(sg.target.parameters(), se.target.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sg.replay.per.leaves, se.replay.per.leaves, rtol=1e-5, atol=1e-6)
    if sg.pruner is not None:  # 60 updates > end_update: the final sparsity is reached in the graph
        for mg, me, p in zip(sg.pruner.masks, se.pruner.masks, sg.pruner.params):
            assert torch.equal(mg, me)
            assert abs(int((p == 0).sum()) - math.floor(0.5 * p.numel())) <= 1
        assert sg.pruner.log_values(sg.updates)[0, 0].item() == pytest.approx(0.5, abs=0.01)
    if sg.replay.regime is not None:
        assert torch.equal(sg.replay.vol_ratio, se.replay.vol_ratio)


def test_controls_steady_state_never_syncs():
    s, _ = experiment_state("eurusd_controls", device="cuda", extra=SHORT)
    full = captured_iteration(s)
    with no_host_sync():
        for _ in range(25):  # passes mask updates (every 6 updates, 2 updates per iteration)
            full()
    torch.cuda.synchronize()
    assert int(s.updates) == 2 * (WARMUP_ITERATIONS + 2 + 25)
