"""The update's gradient norm from the online MLP chain's weight-gradient kernel
(population/state.py chain_grad_norm, population/step.py update_step): which populations get it,
that an update with it clips and steps as with ops/grad_norm.py's launch (its norm and coefficient
to a few float32 ulps, Adam's step to float rounding), and the fallback to that launch where the
chain's backward did not write it (the torch layers, outside cpu_kernels)."""
from __future__ import annotations

import pytest
import torch

from foxdqn.ops.backend import cpu_kernels
from foxdqn.ops.grad_norm import grad_norm_coefficient_reference
from foxdqn.population import step as P
from foxdqn.population.state import build_population

from test_population import CARTPOLE, TRADING, configs, market_for

SEEDS = [["seed=0"], ["seed=1"], ["seed=2"]]


def _population(base, extra=(), members=SEEDS):
    cfgs = configs([*base, *extra], members)
    s = build_population(cfgs, market_for(cfgs[0]), torch.device("cpu"))
    for _ in range(12):
        P.collect_step(s)
    return s


@pytest.mark.parametrize("base,extra,has", [
    (CARTPOLE, (), True),
    (CARTPOLE, ("model.activation=tanh",), False),  # not the chain's ReLUs
    (CARTPOLE, ("head=dueling",), False),
    (CARTPOLE, ("prune.enabled=true",), False),  # masks between the gradients and their norm
    (CARTPOLE, ("optim.accumulate=2", "optim.accumulate_one_pass=false"), False),  # two backwards
    (CARTPOLE, ("optim.accumulate=2",), True),  # one pass
    (TRADING, ("head=c51",), False),
    (TRADING, ("objective.iql=true",), False),  # IQL's V trained by the same Adam
])
def test_which_populations_take_the_norm_from_the_chain(base, extra, has):
    s = _population(base, extra)
    assert (s.chain_norm is not None) == has
    assert s.online.grad_norm is s.chain_norm
    assert s.target.grad_norm is None  # the target network is never back-propagated


def _update_with(s, chain: bool):
    """One update inside cpu_kernels (the kernels a CUDA update launches), with the norm from the
    chain's backward or (chain False) from grad_norm_coefficient's launch; returns (the norm that
    the update used, its coefficient, the .grad tensors, the params after the step)."""
    saved = s.online.grad_norm
    if not chain:
        s.online.grad_norm = None  # the op gets no norm: grad_norm's launch
    seen = {}
    real = P.grad_norm_coefficient

    def spy(grads, max_norm, members):
        seen["launched"] = True
        return real(grads, max_norm, members=members)

    guard_check = s.guard.check

    def check(loss, grad_norm, *a, **k):
        seen["norm"] = grad_norm.clone()
        return guard_check(loss, grad_norm, *a, **k)

    P.grad_norm_coefficient, s.guard.check = spy, check
    try:
        with cpu_kernels():
            P.update_step(s)
    finally:
        P.grad_norm_coefficient = real
        del s.guard.check
        s.online.grad_norm = saved
    grads = [w.grad.clone() for w in s.optimizer.params]
    return seen, grads, [w.detach().clone() for w in s.optimizer.params]


def test_an_update_with_the_chains_norm_steps_as_with_grad_norms_launch():
    """Two copies of one population, one update each: the chain's norm equals grad_norm's reference
    of the same .grad to a few ulps and no grad_norm launch runs; with a bound that binds (the clip
    coefficient < 1) the params after Adam agree with the launch's to float rounding."""
    base = [*CARTPOLE, "optim.grad_clip=0.05"]
    a, b = _population(base), _population(base)
    seen_a, grads_a, after_a = _update_with(a, chain=True)
    seen_b, grads_b, after_b = _update_with(b, chain=False)
    assert "launched" not in seen_a and seen_b.get("launched")
    assert a.chain_norm.backwards == 1
    for x, y in zip(grads_a, grads_b):
        assert torch.equal(x, y)  # the same backward: the norm is read beside it, not from it
    total, coef = torch.empty(3), torch.empty(3)
    grad_norm_coefficient_reference(grads_a, a.params.grad_clip, total, coef, members=3)
    torch.testing.assert_close(seen_a["norm"], total, rtol=4e-7, atol=0)
    torch.testing.assert_close(a.chain_norm.coef, coef, rtol=4e-7, atol=0)
    assert bool((a.chain_norm.coef < 1).all())
    for x, y in zip(after_a, after_b):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_without_the_chains_kernels_the_update_launches_grad_norm():
    """Outside cpu_kernels the CPU runs the torch layers, whose backward writes no norm: the count
    stays 0 and the update computes the norm with grad_norm_coefficient, as before."""
    s = _population(CARTPOLE)
    seen = {}
    real = P.grad_norm_coefficient

    def spy(grads, max_norm, members):
        seen["launched"] = True
        return real(grads, max_norm, members=members)

    P.grad_norm_coefficient = spy
    try:
        P.update_step(s)
    finally:
        P.grad_norm_coefficient = real
    assert seen.get("launched") and s.chain_norm.backwards == 0


BITFLIP = ["+experiment=bitflip_her", "debug=smoke", "device=cpu", "log.progress=false", "env.num_envs=4",
           "env.n_bits=6", "replay.capacity=512", "agent.batch_size=16", "model.hidden=[16]",
           "agent.learning_starts=32"]
FEATURES = [
    (CARTPOLE, ("objective.cql_alpha=0.5",)),  # CQL's term inside the TD loss: through Q only
    (CARTPOLE, ("optim.accumulate=2",)),  # two micro-batches in one pass
    (CARTPOLE, ("guard.max_weight=100",)),  # the trial step reads the clip coefficient
    (CARTPOLE, ("debug.inject_nan_at_step=0",)),  # a poisoned loss, finite gradients
    (CARTPOLE, ("head.double=false",)),
    (TRADING, ("head=q",)),
    (TRADING, ("head=q", "action.switch_margin=3")),  # the switch penalty: two online forwards, one with grad
    (TRADING, ("head=q", "action.switch_margin=3", "head.double=false")),
    (TRADING, ("head=q", "replay=per")),
    (BITFLIP, ()),  # HER's relabelled batch
]


@pytest.mark.parametrize("base,extra", FEATURES, ids=[" ".join(e) or b[0] for b, e in FEATURES])
def test_the_chains_norm_is_the_norm_of_every_final_grad(base, extra):
    """With each feature that changes the loss or the batch of a plain Q head, the norm the update
    hands the guard is grad_norm's reference of every optimizer parameter's .grad after the update
    (one backward wrote it)."""
    s = _population(base, extra)
    assert s.chain_norm is not None
    seen, _, _ = _update_with(s, chain=True)
    assert s.chain_norm.backwards == 1 and "launched" not in seen
    total, coef = torch.empty(3), torch.empty(3)
    grad_norm_coefficient_reference([w.grad for w in s.optimizer.params], s.params.grad_clip, total, coef, members=3)
    torch.testing.assert_close(seen["norm"], total, rtol=4e-7, atol=0)
