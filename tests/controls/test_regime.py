"""regime.*: loss weights from the sampled state's volatility regime; priorities stay unweighted |TD|."""
import math

import pytest
import torch

from foxdqn.errors import ConfigError
from foxdqn.objectives.dqn import DQNObjective
from foxdqn.replay import PrioritizedReplayBuffer, ReplayBuffer
from foxdqn.replay.buffer import replay_bytes
from foxdqn.replay.regime import RegimeWeights, volatility_ratio
from foxdqn.step.iteration import Iteration
from foxdqn.config.compose import load_config

from support import experiment_state, step_fns, table_q

W = [0.5, 1.0, 2.0]


def _regime():
    return RegimeWeights(0.5, 1.5, W, torch.device("cpu"))


def test_regime_thresholds_follow_the_routing_rule():
    r = torch.tensor([0.2, 0.5, 1.0, 1.5, 1.6, float("nan")])
    # strict comparisons, as the urgency rule of route_exposure_to_factored: 0.5 and 1.5 are normal
    assert _regime().index(r).tolist() == [0, 1, 1, 1, 2, 1]
    assert _regime()(r).tolist() == [0.5, 1.0, 1.0, 1.0, 2.0, 1.0]
    v = torch.tensor([1.0, 3.0], dtype=torch.float64)
    assert volatility_ratio(v, 2.0).tolist() == [0.5, 1.5]
    assert volatility_ratio(v, 0.0).tolist() == [1.0, 1.0]  # no median: normal regime


def _filled(replay, ratios):
    """Two envs, 4 rows: env 0 always in the low regime, env 1 in the high one; equal transitions."""
    obs = torch.eye(2)  # env e observes one-hot state e
    for _ in range(4):
        replay.add(obs, torch.zeros(2, dtype=torch.int64), torch.ones(2), obs, torch.zeros(2, dtype=torch.bool),
                   torch.zeros(2, dtype=torch.bool), vol_ratio=torch.tensor(ratios))
    return replay


@pytest.mark.parametrize("per", [False, True])
def test_sampled_weight_is_importance_weight_times_regime_weight(per):
    kw = dict(updates=torch.zeros((), dtype=torch.int64)) if per else {}
    cls = PrioritizedReplayBuffer if per else ReplayBuffer
    replay = cls(8, 2, 2, torch.device("cpu"), **kw)
    replay.set_regime(_regime())
    _filled(replay, [0.3, 1.7])
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    index, w_is = replay.sample_index(16, g1)
    batch = replay.sample(16, g2)
    assert torch.equal(batch.index, index)
    expected = w_is * torch.where(index % 2 == 0, 0.5, 2.0)
    torch.testing.assert_close(batch.weight, expected)
    assert {0, 1} <= set((index % 2).tolist())


def test_equal_td_equal_priorities_different_loss_contributions():
    """The rule: priorities use the unweighted |TD|; the regime weight scales only the loss."""
    replay = PrioritizedReplayBuffer(8, 2, 2, torch.device("cpu"), updates=torch.zeros((), dtype=torch.int64),
                                     alpha=1.0)
    replay.set_regime(_regime())
    _filled(replay, [0.3, 1.7])
    # Q(s, a) equal for both states, so equal TD errors; each state has its own weights (one-hot input)
    online, target = table_q([[0.2, 0.0], [0.2, 0.0]]), table_q([[0.2, 0.0], [0.2, 0.0]])
    objective = DQNObjective(online, target, double=False)
    index = torch.tensor([0, 1])  # row 0: env 0 (low regime), env 1 (high regime)
    weight = replay.regime(replay.vol_ratio.view(-1)[index])
    batch = replay.gather(index, weight)
    out = objective(batch)
    assert out.td_abs[0] == out.td_abs[1] > 0
    out.loss.backward()
    grad = online.head.q.weight.grad[0]  # d loss / d Q(s_e, a=0) for e = 0, 1
    assert grad[1] == pytest.approx(4.0 * grad[0])  # w_high / w_low = 2.0 / 0.5
    replay.update_priorities(batch.index, out.td_abs, torch.zeros(()))
    leaves = replay.per.leaves[:2]
    assert leaves[0] == leaves[1]
    assert leaves[0] == pytest.approx(float(out.td_abs[0]) + 1e-6)


def test_collect_stores_the_state_volatility_ratio():
    s, _ = experiment_state("eurusd_dqn", extra=["regime.enabled=true"])
    env = s.env
    expected = volatility_ratio(env.market_state()[1], env.median_volatility)
    Iteration(s, False, updates=0, collect_steps=1, **step_fns(s))()
    assert torch.equal(s.replay.vol_ratio[0], expected)
    assert not torch.equal(s.replay.vol_ratio[0], torch.ones_like(expected))
    full = Iteration(s, False, **step_fns(s))
    for _ in range(3):
        Iteration(s, False, updates=0, **step_fns(s))()
    full()
    assert int(s.updates) == 2


def test_replay_bytes_counts_the_regime_column():
    assert replay_bytes(100, 10, regime=True) - replay_bytes(100, 10) == 100 * 4


@pytest.mark.parametrize("bad", [
    ["+experiment=cartpole_dqn", "regime.enabled=true"],
    ["regime.enabled=true", "regime.low_threshold=2.0"],
    ["regime.enabled=true", "regime.weights=[1.0,2.0]"],
    ["regime.enabled=true", "regime.weights=[0.0,0.0,0.0]"],
])
def test_regime_config_errors(bad):
    with pytest.raises(ConfigError, match="regime."):
        load_config(bad)
