"""foxdqn.ops.iqn_loss: the fused IQN loss kernel (TRITON_INTERPRET=1 on CPU) against its torch
reference (the population's ops before it: the gathers, the argmax, the target, the quantile Huber
loss and the weighted mean): loss, ρ and the gradient w.r.t. z, for odd N, N', A and group sizes, one
to three groups with a κ each (κ = 0 among them), the switch penalty, argmax ties, non-uniform
weights, terminal rows; a hand-computed case; a NaN in one group; each group's loss the same bits as
its run alone; bad arguments; an empty batch. GPU (`gpu` marker): kernel = reference on CUDA, a
capture of forward + backward replays as eager, one kernel per forward."""
from __future__ import annotations

import pytest
import torch

from foxdqn.device.scalars import device_vector
from foxdqn.ops import iqn_loss as iqn_module
from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.iqn_loss import iqn_loss, iqn_loss_reference

from support import assert_replays_give, cuda_kernels, require_compiled_kernels

_need_compiled = require_compiled_kernels(INTERPRET)


def _case(groups, bg, n, nt, a, seed=0, device="cpu", penalty=False):
    g = torch.Generator().manual_seed(seed)
    b = groups * bg
    z = torch.randn(groups, bg, n, a, generator=g) * 2
    zt = torch.randn(groups, bg, nt, a, generator=g) * 2
    select = torch.randn(groups, bg, a, generator=g)
    taus = torch.rand(groups, bg, n, generator=g)
    action = torch.randint(0, a, (b,), generator=g)
    reward = torch.randn(b, generator=g)
    discount = torch.where(torch.rand(b, generator=g) < 0.2, 0.0, 0.99)
    weight = torch.rand(b, generator=g) * 2 + 0.05
    kappa = torch.tensor(([1.0, 0.0, 2.5] * groups)[:groups])  # one κ per group, any G
    pen = torch.rand(groups, bg, a, generator=g) if penalty else None
    out = [x.to(device) for x in (z, zt, select, taus, action, reward, discount, weight, kappa)]
    return (*out, None if pen is None else pen.to(device))


def _run(fn, z, zt, select, taus, action, reward, discount, weight, kappa, penalty, upstream):
    leaf = z.detach().clone().requires_grad_(True)
    loss, rho = fn(leaf, zt, select, taus, action, reward, discount, weight, kappa, penalty=penalty)
    (grad,) = torch.autograd.grad((loss * upstream).sum(), [leaf])
    return loss.detach(), rho, grad


def _kernel(*args, **kwargs):
    return iqn_loss(*args, **kwargs, backend="triton")


def _assert_close(got, want):
    torch.testing.assert_close(got[0], want[0], rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(got[1], want[1], rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(got[2], want[2], rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("n,nt,a", [(1, 1, 1), (5, 7, 3), (32, 32, 45), (33, 17, 2)])
@pytest.mark.parametrize("groups,bg", [(1, 1), (1, 9), (3, 5), (2, 17)])
def test_kernel_equals_reference_with_gradients(n, nt, a, groups, bg):
    case = _case(groups, bg, n, nt, a)
    upstream = torch.linspace(0.5, 2.0, groups)
    _assert_close(_run(_kernel, *case, upstream), _run(iqn_loss_reference, *case, upstream))


def test_select_read_with_its_strides_without_a_copy():
    """select as the population passes it, the s' half of a [P, 2B, A] pass over s and s' (a strided
    view): the same bits as a contiguous copy, and no copy launched."""
    from bench.cpu_kernels import launches

    z, zt, select, *rest = _case(3, 5, 4, 6, 7, seed=2)
    both = torch.cat([torch.randn(3, 5, 7), select], dim=1)
    strided = both[:, 5:]
    assert not strided.is_contiguous() and torch.equal(strided, select)
    upstream = torch.ones(3)
    got = _run(_kernel, z, zt, strided, *rest, upstream)
    want = _run(_kernel, z, zt, select, *rest, upstream)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    ops = launches(lambda: _kernel(z, zt, strided, *rest[:-1], penalty=rest[-1]))
    assert ops == ["triton::_iqn_loss_kernel"], ops


def test_taus_read_with_their_group_stride_without_a_copy():
    """τ as the population passes it, each member's slice of one draw of τ and τ' (a [P, B, N] view
    whose rows are contiguous within a member): the same bits as a contiguous copy, no copy launched;
    a τ whose rows are not contiguous (a transposed view) is copied and gives the same bits too."""
    from bench.cpu_kernels import launches

    z, zt, select, taus, *rest = _case(3, 5, 4, 6, 7, seed=3)
    draw = torch.cat([taus.reshape(3, -1), torch.rand(3, 5 * 6)], dim=1)  # τ then τ' of each member
    strided = draw[:, :5 * 4].view(3, 5, 4)
    assert not strided.is_contiguous() and torch.equal(strided, taus)
    transposed = taus.transpose(1, 2).contiguous().transpose(1, 2)
    upstream = torch.ones(3)
    want = _run(_kernel, z, zt, select, taus, *rest, upstream)
    for t in (strided, transposed):
        got = _run(_kernel, z, zt, select, t, *rest, upstream)
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    ops = launches(lambda: _kernel(z, zt, select, strided, *rest[:-1], penalty=rest[-1]))
    assert ops == ["triton::_iqn_loss_kernel"], ops


def test_penalty_moves_the_target_action():
    *case, pen = _case(2, 13, 6, 5, 7, seed=3, penalty=True)
    for penalty in (pen, None, pen * 50):
        args = (*case, penalty, torch.ones(2))
        _assert_close(_run(_kernel, *args), _run(iqn_loss_reference, *args))
    moved = _run(_kernel, *case, pen * 50, torch.ones(2))[0]
    assert not torch.equal(moved, _run(_kernel, *case, None, torch.ones(2))[0])


def test_ties_take_the_first_action():
    *case, _ = _case(1, 6, 4, 4, 5, seed=4)
    case[2] = torch.zeros_like(case[2])  # select: every action ties
    args = (*case, None, torch.ones(1))
    _assert_close(_run(_kernel, *args), _run(iqn_loss_reference, *args))


def test_hand_computed():
    """One row, N = 2, N' = 1, A = 2, κ = 1: every number by hand."""
    z = torch.tensor([[[[0.0, 5.0], [2.0, 5.0]]]])  # θ = Z[·, a = 0] = (0, 2)
    zt = torch.tensor([[[[9.0, 1.0]]]])  # select picks a* = 1: Z' = 1; T = 0.5 + 0.5 · 1 = 1
    select = torch.tensor([[[0.0, 3.0]]])
    taus = torch.tensor([[[0.25, 0.75]]])
    action, reward, discount, weight = torch.tensor([0]), torch.tensor([0.5]), torch.tensor([0.5]), torch.tensor([2.0])
    # δ = (1, −1): weights |0.25 − 0| = 0.25 and |0.75 − 1| = 0.25; L_1(±1)/1 = 0.5: ρ = 0.25
    leaf = z.clone().requires_grad_(True)
    loss, rho = _kernel(leaf, zt, select, taus, action, reward, discount, weight, torch.tensor([1.0]))
    torch.testing.assert_close(rho, torch.tensor([0.25]))
    torch.testing.assert_close(loss, torch.tensor([0.5]))
    loss.sum().backward()
    # ∂/∂θ_i = −w · weight_i · ψ(δ_i) / N' = −2 · 0.25 · (1, −1)
    torch.testing.assert_close(leaf.grad, torch.tensor([[[[-0.5, 0.0], [0.5, 0.0]]]]))


def test_nan_in_one_group_spoils_only_its_loss():
    *case, _ = _case(3, 4, 5, 5, 3)
    case[5] = case[5].clone()
    case[5][5] = float("nan")  # group 1's reward
    loss, rho = _kernel(*case)
    assert torch.isnan(loss[1]) and torch.isfinite(loss[[0, 2]]).all()
    assert torch.isnan(rho[5]) and torch.isfinite(rho[torch.arange(12) != 5]).all()


def test_each_group_is_its_run_alone_bit_for_bit(monkeypatch):
    monkeypatch.setattr(iqn_module, "INTERPRET_MIN_PROGRAMS", 4)
    *case, _ = _case(3, 11, 6, 5, 4, seed=2)
    got = _run(_kernel, *case, None, torch.ones(3))
    z, zt, select, taus, action, reward, discount, weight, kappa = case
    for g in range(3):
        rows = slice(g * 11, (g + 1) * 11)
        alone = _run(_kernel, z[g:g + 1], zt[g:g + 1], select[g:g + 1], taus[g:g + 1], action[rows], reward[rows],
                     discount[rows], weight[rows], kappa[g:g + 1], None, torch.ones(1))
        assert torch.equal(got[0][g], alone[0][0]) and torch.equal(got[1][rows], alone[1])
        assert torch.equal(got[2][g], alone[2][0])


@pytest.mark.parametrize("change,match", [
    (lambda c: {"action": c["action"].float()}, "action must be int64"),
    (lambda c: {"z": c["z"][..., :1, :, :]}, "z must be float32"),
    (lambda c: {"z_target": c["z_target"][..., :2]}, "z_target must be float32"),
    (lambda c: {"select": c["select"][..., :2]}, "select must be float32"),
    (lambda c: {"taus": c["taus"][..., :2]}, "taus must be float32"),
    (lambda c: {"kappa": torch.ones(4)}, "kappa must be float32"),
    (lambda c: {"kappa": 1.0}, "kappa must be float32"),
    (lambda c: {"reward": c["reward"][:-1]}, "reward must be float32"),
])
def test_bad_arguments(change, match):
    names = ("z", "z_target", "select", "taus", "action", "reward", "discount", "weight", "kappa")
    case = dict(zip(names, _case(1, 6, 4, 4, 3)))
    case.update(change(case))
    with pytest.raises(ValueError, match=match):
        iqn_loss(**case, backend="triton")


def test_empty_batch():
    *case, _ = _case(1, 1, 4, 4, 3)
    empty = [x[:, :0] for x in case[:4]] + [x[:0] for x in case[4:8]] + [case[8]]
    loss, rho = _kernel(*empty)
    assert torch.isnan(loss).all() and rho.shape == (0,)


@pytest.mark.parametrize("groups,bg,n,nt,a", [(1, 4, 5, 7, 3), (3, 5, 8, 4, 45), (2, 9, 1, 1, 1)])
def test_biases_added_in_the_kernel_equal_biased_inputs(groups, bg, n, nt, a):
    """z and z_target without their output layers' biases plus ``bias``/``target_bias`` ([G, A]):
    loss, ρ and z's gradient bit for bit those of the biased inputs on the interpreter (the kernel
    adds the same float32 operands), the bias's gradient its group's rows of z's gradient summed,
    and the reference (which adds the biases first) agrees."""
    z, zt, select, taus, action, reward, discount, weight, kappa, pen = _case(groups, bg, n, nt, a, seed=a + n,
                                                                              penalty=True)
    gen = torch.Generator().manual_seed(groups)
    bias, target_bias = torch.randn(groups, a, generator=gen), torch.randn(groups, a, generator=gen)
    up = torch.linspace(0.5, 1.5, groups)
    rest = (taus, action, reward, discount, weight, kappa)

    def run(backend, biased_inputs):
        leaf, b = z.clone().requires_grad_(True), bias.clone().requires_grad_(True)
        if biased_inputs:
            args = (leaf + b[:, None, None, :], zt + target_bias[:, None, None, :], select, *rest)
            loss, rho = iqn_loss(*args, penalty=pen, backend=backend)
        else:
            loss, rho = iqn_loss(leaf, zt, select, *rest, penalty=pen, bias=b, target_bias=target_bias, backend=backend)
        (loss * up).sum().backward()
        return loss.detach(), rho, leaf.grad, b.grad

    kernel, plain, ref = run("triton", False), run("triton", True), run("torch", False)
    for x, y in zip(kernel[:3], plain[:3]):
        assert torch.equal(x, y)
    torch.testing.assert_close(kernel[3], plain[3], rtol=1e-6, atol=1e-7)  # the kernel's sums, another order
    torch.testing.assert_close(kernel[3], kernel[2].view(groups, -1, a).sum(dim=1), rtol=1e-6, atol=1e-7)
    _assert_close(kernel[:3], ref[:3])
    torch.testing.assert_close(kernel[3], ref[3], rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="target_bias must be"):
        iqn_loss(z, zt, select, *rest, bias=bias, backend="triton")
    with pytest.raises(ValueError, match="bias must be"):
        iqn_loss(z, zt, select, *rest, bias=bias[:, :-1] if a > 1 else bias.double(), target_bias=target_bias)


@pytest.mark.parametrize("min_programs", [1, 4, 64])
def test_bias_gradient_summed_by_each_groups_last_program(monkeypatch, min_programs):
    """The bias's gradient from the kernel's parts (one to 17 programs per group: the group's last
    program sums them): the reference's to float rounding, the same bits on a second call (each
    group's ticket back at zero) and each group's the bits of its run alone."""
    monkeypatch.setattr(iqn_module, "INTERPRET_MIN_PROGRAMS", min_programs)
    groups, bg, n, nt, a = 3, 17, 5, 6, 7
    z, zt, select, taus, action, reward, discount, weight, kappa, pen = _case(groups, bg, n, nt, a, seed=5)
    bias, target_bias = torch.randn(groups, a), torch.randn(groups, a)
    up = torch.tensor([0.5, 1.0, 2.0])

    def grads(g=slice(None), backend="triton", upstream=up):
        rows = slice(None) if g == slice(None) else slice(g.start * bg, g.stop * bg)
        b = bias[g].clone().requires_grad_(True)
        loss, _ = iqn_loss(z[g], zt[g], select[g], taus[g], action[rows], reward[rows], discount[rows], weight[rows],
                           kappa[g], bias=b, target_bias=target_bias[g], backend=backend)
        (gb,) = torch.autograd.grad((loss * upstream[g]).sum(), [b])
        return gb

    first, second, ref = grads(), grads(), grads(backend="torch")
    assert torch.equal(first, second)
    torch.testing.assert_close(first, ref, rtol=1e-5, atol=1e-7)
    for g in range(groups):
        assert torch.equal(first[g], grads(slice(g, g + 1))[0])


@pytest.mark.gpu
@pytest.mark.parametrize("groups,bg,n,nt,a", [(1, 256, 32, 32, 45), (8, 256, 32, 32, 45), (3, 101, 17, 9, 5)])
def test_gpu_kernel_equals_reference(groups, bg, n, nt, a):
    case = _case(groups, bg, n, nt, a, device="cuda", penalty=True)
    upstream = torch.linspace(0.5, 2.0, groups, device="cuda")
    _assert_close(_run(_kernel, *case, upstream), _run(iqn_loss_reference, *case, upstream))


@pytest.mark.gpu
def test_gpu_capture_equals_eager_and_one_kernel():
    *case, pen = _case(4, 128, 32, 32, 45, device="cuda", penalty=True)
    leaf = case[0].clone().requires_grad_(True)

    def step():
        loss, rho = iqn_loss(leaf, *case[1:], penalty=pen)
        return [loss.detach(), rho, *torch.autograd.grad(loss.sum(), [leaf])]

    eager = [x.clone() for x in step()]
    for x, y in zip(eager, step()):
        assert torch.equal(x, y)
    assert_replays_give(step, eager)
    _, names = cuda_kernels(lambda: iqn_loss(case[0], *case[1:], penalty=pen))
    assert names == ["_iqn_loss_kernel"], names


@pytest.mark.gpu
def test_gpu_bias_gradient_in_the_forward_kernel():
    """With a bias that needs its gradient: forward + backward replay as eager, the bias gradient
    the reference's to float rounding, and no launch for it in backward (a unit seed: none at all)."""
    *case, pen = _case(4, 128, 32, 32, 45, device="cuda", penalty=True)
    gen = torch.Generator(device="cuda").manual_seed(3)
    bias = torch.randn(4, 45, device="cuda", generator=gen).requires_grad_(True)
    target_bias = torch.randn(4, 45, device="cuda", generator=gen)
    leaf = case[0].clone().requires_grad_(True)

    def step(backend="triton"):
        loss, rho = iqn_loss(leaf, *case[1:], penalty=pen, bias=bias, target_bias=target_bias, backend=backend)
        return [loss.detach(), rho, *torch.autograd.grad(loss.sum(), [leaf, bias])]

    eager = [x.clone() for x in step()]
    for x, y in zip(eager, step()):
        assert torch.equal(x, y)
    torch.testing.assert_close(eager[3], step("torch")[3], rtol=1e-4, atol=1e-6)
    assert_replays_give(step, eager)
    loss, _ = iqn_loss(leaf, *case[1:], penalty=pen, bias=bias, target_bias=target_bias)
    seed = device_vector("cuda", 4, 1.0)
    count, names = cuda_kernels(lambda: torch.autograd.grad(loss, [bias], seed, retain_graph=True))
    assert count == 0, names
