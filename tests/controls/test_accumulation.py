"""optim.accumulate: M micro-batches give the update of one batch of B rows (docs/design/update.md#accumulation),
for a single run (a population of one: foxdqn.population.step), in M passes or in one."""
import pytest
import torch

from foxdqn.errors import ConfigError
from foxdqn.population.stats import LOSS_SUM, UPDATES
from foxdqn.population.step import accumulate_member_gradients, member_micro_batches
from foxdqn.step.iteration import Iteration
from foxdqn.config.compose import load_config

from support import experiment_state, step_fns

# every objective whose loss is a weighted mean of per-sample terms (IQN draws τ per micro-batch)
OBJECTIVES = ["eurusd_dqn", "eurusd_c51", "eurusd_iql", "eurusd_cql", "eurusd_branching"]


def _pair(name, m, extra=(), first=1):
    """Two identical states (same seed, same collected replay): accumulate=``first`` in one pass
    and accumulate=m in m passes (optim.accumulate_one_pass=false)."""
    states = []
    for acc, one_pass in ((first, "true"), (m, "false")):
        s, _ = experiment_state(name, extra=[f"optim.accumulate={acc}", f"optim.accumulate_one_pass={one_pass}",
                                             *extra])
        collect = Iteration(s, False, updates=0, **step_fns(s))
        for _ in range(4):
            collect()
        states.append(s)
    return states


@pytest.mark.parametrize("name", OBJECTIVES)
def test_accumulated_gradients_equal_one_batch(name):
    s1, s4 = _pair(name, 4)
    batch = s1.replay.sample_members(s1.cfg.agent.batch_size)
    loss1, td1, q1 = accumulate_member_gradients(s1, batch)
    loss4, td4, q4 = accumulate_member_gradients(s4, batch)
    torch.testing.assert_close(loss4, loss1, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(td4, td1, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(q4, q1, rtol=1e-5, atol=1e-7)
    grads1 = [p.grad for p in s1.optimizer.params]
    grads4 = [p.grad for p in s4.optimizer.params]
    assert any(g.abs().sum() > 0 for g in grads1)
    for g4, g1 in zip(grads4, grads1):
        torch.testing.assert_close(g4, g1, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["eurusd_dqn", "eurusd_rainbowish"])  # uniform; PER + C51 + 3-step
def test_accumulated_updates_equal_one_batch_updates(name):
    """Whole iterations (clip, guard, Adam, target, priorities): same parameters, guard sums."""
    s1, s2 = _pair(name, 2)
    for s in (s1, s2):
        full = Iteration(s, False, **step_fns(s))
        for _ in range(3):
            full()
    for a, b in zip(s2.online.parameters(), s1.online.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    for a, b in zip(s2.target.parameters(), s1.target.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # the guard saw one check per update with the whole batch's loss and gradient norm
    sums1, sums2 = s1.stats.acc[:, LOSS_SUM:], s2.stats.acc[:, LOSS_SUM:]
    torch.testing.assert_close(sums2, sums1, rtol=1e-4, atol=1e-6)
    assert s2.stats.acc[0, UPDATES] == s1.stats.acc[0, UPDATES] == 6
    if hasattr(s1.replay, "per"):
        torch.testing.assert_close(s2.replay.per.leaves, s1.replay.per.leaves, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("name", [*OBJECTIVES, "eurusd_iqn", "eurusd_controls"])
def test_one_pass_equals_the_micro_batches_passes(name):
    """optim.accumulate_one_pass (the default): the M micro-batches in one forward and backward give
    the loss, |td|, Q and gradients of M passes to float rounding; IQN reads the same τ draws, and
    both leave its generator at the same counter."""
    one, passes = _pair(name, 4, first=4)
    assert one.cfg.optim.accumulate_one_pass and not passes.cfg.optim.accumulate_one_pass
    batch = one.replay.sample_members(one.cfg.agent.batch_size)
    assert torch.equal(passes.replay.sample_members(one.cfg.agent.batch_size).index, batch.index)
    loss1, td1, q1 = accumulate_member_gradients(one, batch)
    loss4, td4, q4 = accumulate_member_gradients(passes, batch)
    torch.testing.assert_close(loss1, loss4, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(td1, td4, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(q1, q4, rtol=1e-5, atol=1e-7)
    assert any(p.grad.abs().sum() > 0 for p in one.optimizer.params)
    for g1, g4 in zip([p.grad for p in one.optimizer.params], [p.grad for p in passes.optimizer.params]):
        torch.testing.assert_close(g1, g4, rtol=1e-4, atol=1e-6)
    assert torch.equal(one.rng.uniform(3), passes.rng.uniform(3))


def test_micro_batches_are_consecutive_views():
    s, _ = experiment_state("eurusd_dqn")
    for _ in range(3):
        Iteration(s, False, updates=0, **step_fns(s))()
    batch = s.replay.sample_members(32)
    parts = member_micro_batches(batch, 1, 4)
    assert len(parts) == 4 and all(p.obs.shape[0] == 8 for p in parts)
    for f, name in enumerate(batch._fields):
        if batch[f] is not None:
            assert torch.equal(torch.cat([p[f] for p in parts]), batch[f]), name
    assert member_micro_batches(batch, 1, 1)[0] is batch


@pytest.mark.parametrize("bad", ["optim.accumulate=3", "optim.accumulate=0"])
def test_accumulate_must_divide_the_batch(bad):
    with pytest.raises(ConfigError, match="optim.accumulate"):
        load_config(["agent.batch_size=64", bad])


def test_a_capped_batch_stays_a_multiple_of_the_micro_batches():
    """debug=smoke caps the batch at 64: 96 rows in 3 micro-batches become 63, not 64 (which 3 does not divide)."""
    cfg = load_config(["debug=smoke", "agent.batch_size=96", "optim.accumulate=3"])
    assert cfg.debug.max_batch_size == 64 and cfg.agent.batch_size == 63
    assert load_config(["debug=smoke", "agent.batch_size=96", "optim.accumulate=4"]).agent.batch_size == 64
    assert load_config(["debug=smoke", "agent.batch_size=32", "optim.accumulate=4"]).agent.batch_size == 32


def test_iqn_accumulates_with_its_own_draws_per_micro_batch():
    """IQN: the same update in distribution (τ drawn per micro-batch), not the same draws."""
    s1, s4 = _pair("eurusd_iqn", 4)
    batch = s1.replay.sample_members(s1.cfg.agent.batch_size)
    loss1, _, _ = accumulate_member_gradients(s1, batch)
    loss4, _, _ = accumulate_member_gradients(s4, batch)
    assert torch.isfinite(loss4).all() and all(torch.isfinite(p.grad).all() for p in s4.optimizer.params)
    assert abs(float(loss4) - float(loss1)) < 0.5 * abs(float(loss1)) + 1e-3  # same loss, other τ samples


def test_guard_sees_a_nan_in_one_micro_batch_and_skips_the_whole_update():
    s, _ = experiment_state("eurusd_dqn", extra=["optim.accumulate=4", "debug.inject_nan_at_step=2",
                                                 "prune.enabled=true", "prune.start_update=0",
                                                 "prune.end_update=4", "prune.frequency=1"])
    collect, full = Iteration(s, False, updates=0, **step_fns(s)), Iteration(s, False, **step_fns(s))
    for _ in range(4):
        collect()
    full()  # updates 0, 1
    before = [p.detach().clone() for p in s.online.parameters()]
    masks = [m.clone() for m in s.pruner.masks]
    full()  # update 2 poisoned: skipped (and latched), so nothing changes, masks included
    assert s.guard.reason(0) == "non-finite loss or gradient norm (NaN/Inf) at update 2"
    assert all(torch.equal(a, b) for a, b in zip(before, s.online.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(masks, s.pruner.masks))
