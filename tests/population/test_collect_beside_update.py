"""agent.collect_beside_update: the update samples the replay as it stood before the iteration's
collect steps, which act with the weights before the update (docs/design/hot_loop.md#the-collect-beside-the-update);
off, or with prioritized replay or several updates per iteration, the collect steps come first (CPU;
the second stream on CUDA: test_population_gpu.py)."""
from __future__ import annotations

import pytest
import torch

from foxdqn.config.compose import load_config
from foxdqn.population import step as P
from foxdqn.population.state import build_population
from foxdqn.step.iteration import Iteration

from test_population import CARTPOLE, CPU, TRADING, configs, market_for
from support import iterate


def state(base, extra=(), members=2):
    cfgs = configs([*base, *extra], [[f"seed={p}"] for p in range(members)])
    return build_population(cfgs, market_for(cfgs[0]), CPU)


def ptr_at_sample(s, monkeypatch) -> list[int]:
    """The replay's write position each time an update samples (recorded, then sampled as before)."""
    seen = []
    sample = s.replay.sample_members

    def recording(batch_size):
        seen.append(int(s.replay.ptr))
        return sample(batch_size)

    monkeypatch.setattr(s.replay, "sample_members", recording)
    return seen


@pytest.mark.parametrize("base,extra", [(CARTPOLE, ()), (TRADING, ("agent.steps_per_iter=2",))],
                         ids=["cartpole_one_step", "trading_two_steps"])
def test_the_update_samples_the_replay_from_before_the_collect_steps(base, extra, monkeypatch):
    s = state(base, extra)
    iterate(s, False, 12, 0)  # collect-only iterations: the replay holds transitions
    full = Iteration(s, False, **P.iteration_steps(s))
    seen = ptr_at_sample(s, monkeypatch)
    for _ in range(3):
        before = int(s.replay.ptr)
        full()
        assert seen[-1] == before  # the sample came before this iteration's inserts
        assert int(s.replay.ptr) == (before + full.collect_steps) % s.replay.rows  # ... which then ran


@pytest.mark.parametrize("extra", [("agent.collect_beside_update=false",), ("replay.name=per",),
                                   ("agent.updates_per_iter=2",)], ids=["off", "per", "two_updates"])
def test_the_collect_steps_come_first_elsewhere(extra, monkeypatch):
    s = state(CARTPOLE, extra)
    iterate(s, False, 12, 0)
    full = Iteration(s, False, **P.iteration_steps(s))
    seen = ptr_at_sample(s, monkeypatch)
    before = int(s.replay.ptr)
    full()
    assert seen[0] == (before + 1) % s.replay.rows  # the sample saw this iteration's insert


def test_iteration_steps_choose_the_order():
    assert P.iteration_steps(state(CARTPOLE))["beside"] is P.collect_beside_update
    assert P.iteration_steps(state(TRADING))["beside"] is P.collect_beside_update  # T = 4
    for extra in (["agent.collect_beside_update=false"], ["replay.name=per"], ["agent.updates_per_iter=2"]):
        assert P.iteration_steps(state(CARTPOLE, extra))["beside"] is None, extra
    assert not P.collects_beside(load_config(["+experiment=cartpole_gym"]))  # a host env


def test_the_collect_steps_act_with_the_weights_before_the_update(monkeypatch):
    """The collect step's forward reads the online weights as they were before this iteration's Adam."""
    s = state(CARTPOLE)
    iterate(s, False, 12, 0)
    full = Iteration(s, False, **P.iteration_steps(s))
    full()  # Adam's state exists
    weights = []
    collect = P.collect_step

    def recording(st):
        weights.append([w.detach().clone() for w in st.online.parameters()])
        collect(st)

    monkeypatch.setattr(P, "collect_step", recording)
    before = [w.detach().clone() for w in s.online.parameters()]
    full()
    assert all(torch.equal(a, b) for a, b in zip(weights[-1], before))
    assert not all(torch.equal(a, b) for a, b in zip(before, s.online.parameters()))  # the update then stepped


def test_iqn_draws_its_fractions_before_the_collect_steps(monkeypatch):
    """IQN's τ come with the batch, ahead of the collect steps' draws: one fixed order of the shared
    generator's counter, whatever the streams (the values equal the update's own draw)."""
    s = state(TRADING, ["head=iqn", "head.num_quantiles=4", "head.num_target_quantiles=4"])
    iterate(s, False, 12, 0)
    order = []
    draw = P.draw_taus

    def recording(st, rows, micro_batches=1):
        order.append(("taus", int(st.rng.counter)))
        return draw(st, rows, micro_batches)

    collect = P.collect_step

    def collecting(st):
        order.append(("collect", int(st.rng.counter)))
        collect(st)

    monkeypatch.setattr(P, "draw_taus", recording)
    monkeypatch.setattr(P, "collect_step", collecting)
    full = Iteration(s, False, **P.iteration_steps(s))
    full()
    assert [k for k, _ in order] == ["taus"] + ["collect"] * full.collect_steps
    assert order[1][1] > order[0][1]  # the first collect step drew after the fractions


def test_a_join_without_the_draws_made_ahead_is_refused():
    s = state(CARTPOLE)
    iterate(s, False, 12, 0)
    with pytest.raises(ValueError, match="a join needs the update's draws"):
        P.update_step(s, None, join=lambda: None)
