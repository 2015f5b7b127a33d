"""foxdqn.step.adam.Adam: torch.optim.Adam's state and state_dict format, stepped by the adam_step op."""
from __future__ import annotations

import pytest
import torch

from foxdqn.step.adam import Adam


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*shape, generator=g)) for shape in ((3, 5), (5,), (1,))]


def _grads(params, step):
    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


def test_steps_like_torch_adam_and_round_trips_its_state_dict():
    ours, theirs = _params(), _params()
    opt = Adam(ours, torch.tensor(0.01), eps=1e-7)
    ref = torch.optim.Adam(theirs, lr=0.01, eps=1e-7, foreach=False)
    for step in range(3):
        _grads(ours, step), _grads(theirs, step)
        opt.step()
        ref.step()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-6, atol=1e-7)
    sd = opt.state_dict()
    assert sorted(sd["state"]) == [0, 1, 2] and sd["param_groups"][0]["params"] == [0, 1, 2]
    assert float(sd["state"][0]["step"]) == 3.0
    # our state_dict loads into torch's Adam, and torch's into ours: both go on identically
    ref2 = torch.optim.Adam([torch.nn.Parameter(p.detach().clone()) for p in ours], lr=0.5)
    ref2.load_state_dict(sd)
    assert ref2.param_groups[0]["eps"] == 1e-7 and float(ref2.param_groups[0]["lr"]) == pytest.approx(0.01)
    lr = torch.tensor(0.5)
    opt2 = Adam([torch.nn.Parameter(p.detach().clone()) for p in theirs], lr)
    opt2.load_state_dict(ref.state_dict())
    assert opt2.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(0.01)  # copied into, not rebound
    assert all(st["step"].dtype == torch.float32 and st["step"].dim() == 0 for st in opt2.state.values())
    ps2 = opt2.params
    _grads(ps2, 9), _grads(theirs, 9)
    opt2.step()
    ref.step()
    for a, b in zip(ps2, theirs):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-6, atol=1e-7)


def test_load_copies_so_the_saved_tensors_stay_untouched():
    ps = _params()
    opt = Adam(ps, torch.tensor(0.01))
    _grads(ps, 0)
    opt.step()
    sd = {"state": {i: {k: v.clone() for k, v in st.items()} for i, st in opt.state_dict()["state"].items()},
          "param_groups": opt.state_dict()["param_groups"]}
    other = Adam(_params(1), torch.tensor(0.01))
    other.load_state_dict(sd)
    _grads(other.params, 1)
    other.step()
    assert float(sd["state"][0]["step"]) == 1.0 and float(other.state[other.params[0]]["step"]) == 2.0


def test_zero_grad():
    ps = _params()
    opt = Adam(ps, torch.tensor(0.01))
    _grads(ps, 0)
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in ps)
    opt.zero_grad()
    assert all(p.grad is None for p in ps)


def test_refuses_what_it_cannot_hold():
    with pytest.raises(ValueError, match="betas"):
        Adam(_params(), torch.tensor(0.01), betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="eps"):
        Adam(_params(), torch.tensor(0.01), eps=0.0)
    opt = Adam(_params(), torch.tensor(0.01))
    sd = Adam(_params()[:2], torch.tensor(0.01)).state_dict()
    with pytest.raises(ValueError, match="one parameter group of 3 parameters"):
        opt.load_state_dict(sd)
    wrong = [torch.nn.Parameter(torch.zeros(3, 4)), torch.nn.Parameter(torch.zeros(5)), torch.nn.Parameter(torch.zeros(1))]
    src = Adam(wrong, torch.tensor(0.01))
    for p in wrong:
        p.grad = torch.ones_like(p)
    src.step()
    with pytest.raises(ValueError, match=r"parameter 0 is \[3, 5\]"):
        opt.load_state_dict(src.state_dict())
    amsgrad = torch.optim.Adam(_params(), lr=0.1, amsgrad=True).state_dict()
    with pytest.raises(ValueError, match="amsgrad"):
        opt.load_state_dict(amsgrad)


def test_a_refused_load_changes_nothing():
    lr = torch.tensor(0.01)
    opt = Adam(_params(), lr)
    good = Adam(_params(), torch.tensor(0.5))
    ps = good.params
    for p in ps:
        p.grad = torch.ones_like(p)
    good.step()
    sd = good.state_dict()
    sd["state"][2]["step"] = torch.zeros(2)  # the last state is bad: nothing before it may be applied
    with pytest.raises(ValueError, match="step must be one number"):
        opt.load_state_dict(sd)
    del sd["param_groups"][0]["eps"]
    with pytest.raises(ValueError, match="lr, betas and eps"):
        opt.load_state_dict(sd)
    assert float(lr) == pytest.approx(0.01) and not opt.state and opt.param_groups[0]["betas"] == (0.9, 0.999)
