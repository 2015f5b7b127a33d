"""The eager step runs for every experiment's feature combination, without a host sync: a single
run's iteration (a population of one, foxdqn.population.train's steps)."""
import pytest
import torch

from foxdqn.step.iteration import make_iteration

from support import EXPERIMENTS, experiment_state, forbid_syncs, step_fns, sync_free_part


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_eager_step_every_experiment(monkeypatch, name):
    s, _ = experiment_state(name)
    host = s.env.on_host
    collect = make_iteration(s, False, updates=0, on_host=host, **step_fns(s))
    full = make_iteration(s, False, on_host=host, **step_fns(s))
    for _ in range(6):
        collect()
    full()  # allocates Adam state
    before = [p.detach().clone() for p in s.online.parameters()]
    for _ in range(3):
        if full is not sync_free_part(full):  # host env (env=gym): its collect syncs by design
            full.collect()
        with monkeypatch.context() as m:
            forbid_syncs(m)
            sync_free_part(full)()
    assert int(s.updates) == 8
    assert s.guard.reason(0) is None
    assert any(not torch.equal(a, b) for a, b in zip(before, s.online.parameters()))  # it learned something
    assert all(torch.isfinite(p).all() for p in s.online.parameters())
    # the target update must not attach the targets to the autograd graph
    assert all(p.is_leaf and p.grad_fn is None for p in s.target.parameters())
