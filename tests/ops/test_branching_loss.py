"""foxdqn.ops.branching_loss: the fused BDQ loss kernel (TRITON_INTERPRET=1 on CPU) against its
torch reference (loss, |td|, the joint Q, and the gradients w.r.t. every branch's A_d and V against
autograd of the reference), against a hand-computed case and against the single run's classic
objective (foxdqn.objectives.branching.BranchingObjective); one to three branches of odd sizes,
with and without dueling, Double DQN or the target's own argmax, the exposure penalty, one to three
groups of odd sizes with a δ each (transition at |x| = δ), non-uniform weights, argmax ties, a NaN
in one group, bad arguments, each group's loss the same bits as its run alone, an empty batch. GPU
(`gpu` marker): kernel = reference on CUDA, a capture of forward + backward replays as eager."""
from __future__ import annotations

import pytest
import torch

from foxdqn.ops import branching_loss as bl_module
from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.branching_loss import branching_loss, branching_loss_reference

from support import assert_replays_give, cuda_kernels, require_compiled_kernels

_need_compiled = require_compiled_kernels(INTERPRET)


def _case(groups, bg, sizes, dueling=True, seed=0, device="cpu", penalty=False):
    """(online, target, select, action, reward, discount, weight, δ [G], penalty): heads as
    ``(advantages [G, B_g, n_d], value [G, B_g, 1] or None)``."""
    g = torch.Generator().manual_seed(seed)
    b = groups * bg

    def head():
        adv = [torch.randn(groups, bg, n, generator=g) * 2 for n in sizes]
        return adv, (torch.randn(groups, bg, 1, generator=g) if dueling else None)

    online, target, select = head(), head(), head()
    joint = 1
    for n in sizes:
        joint *= n
    action = torch.randint(0, joint, (b,), generator=g)
    reward = torch.randn(b, generator=g) * 3
    discount = torch.where(torch.rand(b, generator=g) < 0.2, 0.0, 0.99)
    weight = torch.rand(b, generator=g) * 2 + 0.05
    delta = torch.tensor(([1.0, 0.25, 4.0] * groups)[:groups])  # one δ per group, any G
    pen = torch.rand(b, sizes[0], generator=g) * 0.5 if penalty else None

    def to(h):
        return [a.to(device) for a in h[0]], (None if h[1] is None else h[1].to(device))
    return (to(online), to(target), to(select), *(x.to(device) for x in (action, reward, discount, weight, delta)),
            None if pen is None else pen.to(device))


def _run(fn, online, target, select, action, reward, discount, weight, delta, penalty, upstream):
    """loss, td, joint Q and ∂(Σ upstream · loss)/∂ of each online tensor (A_0 .. A_{D-1}, V)."""
    adv = [a.detach().clone().requires_grad_(True) for a in online[0]]
    v = None if online[1] is None else online[1].detach().clone().requires_grad_(True)
    leaves = adv + ([v] if v is not None else [])
    loss, td, joint = fn((adv, v), target, select, action, reward, discount, weight, delta, penalty=penalty)
    grads = torch.autograd.grad((loss * upstream).sum(), leaves)
    return loss.detach(), td, joint, grads


def _kernel(*args, **kwargs):
    return branching_loss(*args, **kwargs, backend="triton")


def _assert_close(got, want):
    torch.testing.assert_close(got[0], want[0], rtol=2e-6, atol=1e-7)  # the sum's order: rounding only
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got[2], want[2], rtol=1e-6, atol=1e-6)
    assert len(got[3]) == len(want[3])
    for a, b in zip(got[3], want[3]):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("sizes", [(5, 3, 3), (2,), (4, 7), (1, 3, 2)])
@pytest.mark.parametrize("dueling", [True, False], ids=["dueling", "plain"])
@pytest.mark.parametrize("groups,bg", [(1, 1), (1, 9), (3, 5), (2, 33)])
def test_kernel_equals_reference_with_gradients(sizes, dueling, groups, bg):
    case = _case(groups, bg, sizes, dueling)
    upstream = torch.linspace(0.5, 2.0, groups)
    _assert_close(_run(_kernel, *case, upstream), _run(branching_loss_reference, *case, upstream))


@pytest.mark.parametrize("double", [True, False])
def test_penalty_and_target_selection(double):
    """The exposure penalty moves branch 0's argmax only; without Double DQN the target selects."""
    online, target, select, *rest, pen = _case(2, 11, (5, 3, 3), penalty=True, seed=3)
    select = select if double else target
    for penalty in (pen, None):
        args = (online, target, select, *rest, penalty, torch.ones(2))
        _assert_close(_run(_kernel, *args), _run(branching_loss_reference, *args))
    with_pen = _run(_kernel, online, target, select, *rest, pen * 10, torch.ones(2))
    without = _run(_kernel, online, target, select, *rest, None, torch.ones(2))
    assert not torch.equal(with_pen[0], without[0])


@pytest.mark.parametrize("groups,bg,sizes", [(1, 7, (5, 3, 3)), (3, 5, (4, 7)), (2, 9, (2,))])
def test_stacked_online_rows_equal_a_separate_selection(groups, bg, sizes):
    """``stacked``: one online tensor of each group's s rows then its s' rows gives the loss, |td|,
    joint Q and s rows' gradient of the s rows with the s' rows as ``select``; the s' rows' gradient
    is zero; the reference agrees."""
    online, target, select, action, reward, discount, weight, delta, pen = _case(groups, bg, sizes, penalty=True,
                                                                              seed=4)

    def stack(a, b):
        return torch.stack([a, b], dim=1).reshape(groups, 2 * bg, a.shape[-1])
    both = ([stack(a, b) for a, b in zip(online[0], select[0])], stack(online[1], select[1]))
    leaves = [t.detach().clone().requires_grad_(True) for t in (*both[0], both[1])]
    upstream = torch.linspace(0.5, 2.0, groups)
    rest = (action, reward, discount, weight, delta)
    for fn in (_kernel, branching_loss_reference):
        loss, td, joint = fn((leaves[:-1], leaves[-1]), target, None, *rest, penalty=pen, stacked=True)
        grads = torch.autograd.grad((loss * upstream).sum(), leaves)
        want = _run(_kernel, online, target, select, *rest, pen, upstream)
        _assert_close((loss.detach(), td, joint, [g.reshape(groups, 2, bg, -1)[:, 0].reshape(w.shape)
                                                  for g, w in zip(grads, want[3])]), want)
        assert all(torch.equal(g.reshape(groups, 2, bg, -1)[:, 1], torch.zeros(groups, bg, g.shape[-1]))
                   for g in grads)
    with pytest.raises(ValueError, match="stacked: select must be None"):
        branching_loss((leaves[:-1], leaves[-1]), target, select, *rest, stacked=True, backend="triton")


def test_hand_computed():
    """One row, two branches of 2 and 3, dueling: every number by hand."""
    adv0, adv1 = torch.tensor([[[1.0, 3.0]]]), torch.tensor([[[0.0, 3.0, 6.0]]])  # means 2 and 3
    v = torch.tensor([[[0.5]]])
    online = ([adv0, adv1], v)  # Q_0 = [-0.5, 1.5], Q_1 = [-2.5, 0.5, 3.5]
    target = ([torch.tensor([[[2.0, 0.0]]]), torch.tensor([[[1.0, 1.0, 4.0]]])], torch.tensor([[[1.0]]]))
    # target Q_0 = [2, 0], Q_1 = [0, 0, 3]; select = online: argmax Q_0 = 1, Q_1 = 2 → q_next 0 and 3, mean 1.5
    action = torch.tensor([1 * 3 + 0])  # a_0 = 1, a_1 = 0: Q_0 = 1.5, Q_1 = -2.5
    reward, discount, weight = torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([2.0])
    delta = torch.tensor([1.0])  # y = 1 + 0.5 · 1.5 = 1.75; x = (-0.25, -4.25)
    adv = [a.clone().requires_grad_(True) for a in online[0]]
    vv = v.clone().requires_grad_(True)
    loss, td, joint = _kernel((adv, vv), target, online, action, reward, discount, weight, delta)
    huber = (0.5 * 0.25 ** 2 + 1.0 * (4.25 - 0.5)) / 2  # (0.03125 + 3.75) / 2
    torch.testing.assert_close(loss, torch.tensor([2.0 * huber]))
    torch.testing.assert_close(td, torch.tensor([(0.25 + 4.25) / 2]))
    want_joint = torch.tensor([[(q0 + q1) / 2 for q0 in (-0.5, 1.5) for q1 in (-2.5, 0.5, 3.5)]])
    torch.testing.assert_close(joint, want_joint)
    loss.sum().backward()
    c0, c1 = 2.0 / 2 * -0.25, 2.0 / 2 * -1.0  # w/(D·B) · Huber'(x): x and −δ
    torch.testing.assert_close(adv[0].grad, torch.tensor([[[-c0 / 2, c0 - c0 / 2]]]))
    torch.testing.assert_close(adv[1].grad, torch.tensor([[[c1 - c1 / 3, -c1 / 3, -c1 / 3]]]))
    torch.testing.assert_close(vv.grad, torch.tensor([[[c0 + c1]]]))


def test_equals_the_single_runs_objective():
    """A BranchingNetwork's loss by BranchingObjective (the classic single run) equals the op's on its
    heads' raw outputs (one group)."""
    from foxdqn.nn.branching import BranchingHead, BranchingNetwork
    from foxdqn.nn.mlp import MLPEncoder
    from foxdqn.objectives.branching import BranchingObjective
    from foxdqn.replay.buffer import Batch

    torch.manual_seed(0)
    nets = [BranchingNetwork(MLPEncoder(6, [16]), BranchingHead(16, (5, 3, 3), dueling=True)) for _ in range(2)]
    b = 13
    g = torch.Generator().manual_seed(1)
    obs, next_obs = torch.randn(b, 6, generator=g), torch.randn(b, 6, generator=g)
    batch = Batch(obs=obs, action=torch.randint(0, 45, (b,), generator=g), reward=torch.randn(b, generator=g),
                  next_obs=next_obs, discount=torch.full((b,), 0.9), weight=torch.rand(b, generator=g) + 0.5,
                  index=torch.arange(b))
    want = BranchingObjective(nets[0], nets[1], double=True, huber_delta=1.0)(batch)

    def raw(net, x):
        h = net.encoder(x)
        return [branch(h) for branch in net.head.branches], net.head.value(h)

    loss, td, joint = _kernel(raw(nets[0], obs), raw(nets[1], next_obs), raw(nets[0], next_obs), batch.action,
                              batch.reward, batch.discount, batch.weight, torch.tensor([1.0]))
    torch.testing.assert_close(loss[0], want.loss, rtol=2e-6, atol=1e-7)
    torch.testing.assert_close(td, want.td_abs, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(joint, want.q_values, rtol=1e-6, atol=1e-6)


def test_ties_take_the_first_index():
    """Equal Q at s' in the selecting network: the first sub-action's target value, as torch's argmax."""
    online, target, select, *rest = _case(1, 4, (3, 2), dueling=False, seed=5)
    select = ([torch.zeros_like(a) for a in select[0]], None)
    args = (online, target, select, *rest[:-1], None, torch.ones(1))
    _assert_close(_run(_kernel, *args), _run(branching_loss_reference, *args))


def test_nan_in_one_group_spoils_only_its_loss():
    online, target, select, action, reward, discount, weight, delta, _ = _case(3, 6, (5, 3, 3))
    reward = reward.clone()
    reward[7] = float("nan")  # group 1
    loss, td, _ = _kernel(online, target, select, action, reward, discount, weight, delta)
    assert torch.isnan(loss[1]) and torch.isfinite(loss[[0, 2]]).all()
    assert torch.isnan(td[7]) and torch.isfinite(td[torch.arange(18) != 7]).all()


def test_each_group_is_its_run_alone_bit_for_bit(monkeypatch):
    """Group g's loss, |td| and gradient in a call of 3 groups equal a call of group g alone."""
    monkeypatch.setattr(bl_module, "INTERPRET_MIN_PROGRAMS", 4)  # several row blocks per group
    case = _case(3, 21, (5, 3, 3), seed=2)
    got = _run(_kernel, *case, torch.ones(3))
    online, target, select, action, reward, discount, weight, delta, _ = case
    for g in range(3):
        rows = slice(g * 21, (g + 1) * 21)

        def part(h):
            return [a[g:g + 1] for a in h[0]], h[1][g:g + 1]
        alone = _run(_kernel, part(online), part(target), part(select), action[rows], reward[rows], discount[rows],
                     weight[rows], delta[g:g + 1], None, torch.ones(1))
        assert torch.equal(got[0][g], alone[0][0]) and torch.equal(got[1][rows], alone[1])
        for a, b in zip(got[3], alone[3]):
            assert torch.equal(a.reshape(3, 21, -1)[g], b.reshape(21, -1))


def test_only_the_online_tensors_get_a_gradient():
    online, target, select, *rest, _ = _case(1, 5, (5, 3, 3))
    adv = [a.clone().requires_grad_(i == 1) for i, a in enumerate(online[0])]
    loss, _, _ = _kernel((adv, online[1]), target, select, *rest)
    (grad,) = torch.autograd.grad(loss.sum(), [adv[1]])
    assert grad.shape == adv[1].shape and grad.abs().sum() > 0


@pytest.mark.parametrize("change,match", [
    (lambda c: {"online": ([], c["online"][1])}, "1 to 3 branches"),
    (lambda c: {"online": (c["online"][0] * 2, c["online"][1])}, "1 to 3 branches"),
    (lambda c: {"target": (c["target"][0][:2], c["target"][1])}, "target's advantages"),
    (lambda c: {"select": (c["select"][0], None)}, "select's value must be float32"),
    (lambda c: {"action": c["action"].float()}, "action must be int64"),
    (lambda c: {"reward": c["reward"][:-1]}, "reward must be float32"),
    (lambda c: {"huber_delta": torch.ones(4)}, "huber_delta must be"),
    (lambda c: {"penalty": torch.zeros(c["action"].shape[0], 3)}, "penalty must be float32"),
    (lambda c: {"online": "x"}, "online must be"),
])
def test_bad_arguments(change, match):
    names = ("online", "target", "select", "action", "reward", "discount", "weight", "huber_delta")
    case = dict(zip(names, _case(1, 6, (5, 3, 3))))
    case.update(change(case))
    with pytest.raises(ValueError, match=match):
        branching_loss(**case, backend="triton")


def test_empty_batch():
    case = _case(1, 1, (5, 3, 3))

    def empty(h):
        return [a[:, :0] for a in h[0]], h[1][:, :0]
    loss, td, joint = _kernel(empty(case[0]), empty(case[1]), empty(case[2]), *(x[:0] for x in case[3:7]), case[7])
    assert torch.isnan(loss).all() and td.shape == (0,) and joint.shape == (0, 45)


@pytest.mark.gpu
@pytest.mark.parametrize("groups,bg,sizes", [(1, 256, (5, 3, 3)), (8, 256, (5, 3, 3)), (3, 1001, (4, 7))])
def test_gpu_kernel_equals_reference(groups, bg, sizes):
    case = _case(groups, bg, sizes, device="cuda", penalty=True)
    upstream = torch.linspace(0.5, 2.0, groups, device="cuda")
    _assert_close(_run(_kernel, *case, upstream), _run(branching_loss_reference, *case, upstream))


@pytest.mark.gpu
def test_gpu_capture_equals_eager():
    """Forward + backward captured in a CUDA graph: replays equal an eager call bit for bit, with no
    host sync; two eager calls give the same bits."""
    online, target, select, *rest, pen = _case(4, 128, (5, 3, 3), device="cuda", penalty=True)
    leaves = [a.clone().requires_grad_(True) for a in online[0]] + [online[1].clone().requires_grad_(True)]

    def step():  # autograd.grad, not backward: no AccumulateGrad node tied to the stream that made the leaves
        loss, td, joint = branching_loss((leaves[:-1], leaves[-1]), target, select, *rest, penalty=pen)
        return [loss.detach(), td, joint, *torch.autograd.grad(loss.sum(), leaves)]

    eager = [x.clone() for x in step()]
    for x, y in zip(eager, step()):
        assert torch.equal(x, y)
    assert_replays_give(step, eager)


@pytest.mark.gpu
def test_gpu_forward_is_one_kernel():
    online, target, select, *rest, pen = _case(8, 256, (5, 3, 3), device="cuda", penalty=True)
    _, names = cuda_kernels(lambda: branching_loss(online, target, select, *rest, penalty=pen))
    assert names == ["_branching_loss_kernel"], names
