"""foxdqn.ops.iql_loss: the fused kernel (TRITON_INTERPRET=1 on CPU) against the torch reference
(loss, |td| and the gradients w.r.t. q and v against autograd of the reference), against a
hand-computed case; odd group sizes and action counts, one to three groups, τ near 0 and 1 and one
per group, u exactly 0, non-uniform weights, a NaN in one group's rows, a strided q, bad
arguments; the grid of row blocks (many blocks, the last partial, each group's loss the same bits
as its run alone, the same bits on two calls, the ticket back at zero, an empty batch). GPU (`gpu`
marker): kernel = reference on CUDA, CUDA-graph capture of forward + backward (replay = eager, bit
for bit; no host sync), one kernel per forward."""
from __future__ import annotations

import pytest
import torch

import triton

from foxdqn.ops import dqn_td_loss as td_module
from foxdqn.ops import iql_loss as iql_module
from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.iql_loss import iql_loss, iql_loss_reference

from support import assert_replays_give, cuda_kernels, require_compiled_kernels

_need_compiled = require_compiled_kernels(INTERPRET)


def _case(groups, bg, a, seed=0, device="cpu"):
    """q, q_target [G, B_g, A]; v, v_next [G, B_g]; action, reward, discount, weight [G·B_g]."""
    g = torch.Generator().manual_seed(seed)
    b = groups * bg
    q = torch.randn(groups, bg, a, generator=g) * 2
    qt = torch.randn(groups, bg, a, generator=g) * 2
    v = torch.randn(groups, bg, generator=g)
    vn = torch.randn(groups, bg, generator=g)
    action = torch.randint(0, a, (b,), generator=g)
    reward = torch.randn(b, generator=g) * 3
    discount = torch.where(torch.rand(b, generator=g) < 0.2, 0.0, 0.99)
    weight = torch.rand(b, generator=g) * 2 + 0.05  # non-uniform importance weights
    return [x.to(device) for x in (q, qt, v, vn, action, reward, discount, weight)]


def _taus(groups, device="cpu"):
    """A different τ per group, near 0, near 1 and between (float32 [G])."""
    return torch.tensor([1e-3, 0.999, 0.7][:groups], device=device)


def _run(fn, q, qt, v, vn, action, reward, discount, weight, tau, upstream):
    """loss, td, ∂(Σ upstream · loss)/∂q, ∂/∂v."""
    q_in = q.detach().clone().requires_grad_(True)
    v_in = v.detach().clone().requires_grad_(True)
    loss, td = fn(q_in, qt, v_in, vn, action, reward, discount, weight, tau)
    grad_q, grad_v = torch.autograd.grad((loss * upstream).sum(), (q_in, v_in))
    return loss.detach(), td, grad_q, grad_v


def _kernel(*args):
    return iql_loss(*args, backend="triton")


def _upstream(groups, per_group):
    return torch.linspace(0.5, 2.0, groups) if per_group else torch.tensor(1.5)


def _assert_close(got, want):
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)  # sum order: rounding only
    assert torch.equal(got[1], want[1])  # td: per row, the same operations
    torch.testing.assert_close(got[2], want[2], rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(got[3], want[3], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("bg", [1, 7, 33])
@pytest.mark.parametrize("a", [1, 3, 45])
@pytest.mark.parametrize("groups", [1, 2, 3])
def test_kernel_equals_reference_with_gradients(groups, bg, a):
    q, qt, v, vn, action, reward, discount, weight = _case(groups, bg, a, seed=100 * groups + 10 * bg + a)
    taus = [_taus(groups)] + ([0.7] if groups == 1 else [])  # one run's float τ too
    for tau in taus:
        per_group = isinstance(tau, torch.Tensor)
        up = _upstream(groups, per_group)
        got = _run(_kernel, q, qt, v, vn, action, reward, discount, weight, tau, up)
        want = _run(iql_loss_reference, q, qt, v, vn, action, reward, discount, weight, tau, up)
        assert got[0].shape == ((groups,) if per_group else ()) and got[1].shape == (groups * bg,)
        _assert_close(got, want)
        # ∂/∂q is zero off the taken actions
        taken = torch.nn.functional.one_hot(action, a).view(groups, bg, a).bool()
        assert torch.equal(got[2][~taken], torch.zeros_like(got[2][~taken]))


def test_flat_inputs_equal_member_major():
    """q [G·B_g, A] and v [G·B_g] are the same as [G, B_g, A] and [G, B_g]."""
    q, qt, v, vn, action, reward, discount, weight = _case(3, 7, 3, seed=4)
    tau, up = _taus(3), _upstream(3, True)
    got = _run(_kernel, q.view(21, 3), qt.view(21, 3), v.view(21), vn.view(21), action, reward, discount,
               weight, tau, up)
    want = _run(_kernel, q, qt, v, vn, action, reward, discount, weight, tau, up)
    for x, y in zip(got, want):
        assert torch.equal(x.reshape(y.shape), y)


def test_strided_q_is_read_in_place():
    """A non-contiguous q and q_target (every other column of a wider tensor, and a transposed one)."""
    q, qt, v, vn, action, reward, discount, weight = _case(2, 7, 3, seed=5)
    tau, up = _taus(2), _upstream(2, True)
    wide = torch.randn(2, 7, 6)
    wide[..., ::2] = q
    q_view = wide[..., ::2]
    qt_view = qt.transpose(1, 2).contiguous().transpose(1, 2)
    assert not q_view.is_contiguous() and not qt_view.is_contiguous()
    q_in = q_view.detach().requires_grad_(True)  # a leaf with q_view's strides
    assert q_in.stride() == q_view.stride()
    v_in = v.clone().requires_grad_(True)
    loss, td = _kernel(q_in, qt_view, v_in, vn, action, reward, discount, weight, tau)
    grad_q, grad_v = torch.autograd.grad((loss * up).sum(), (q_in, v_in))
    want = _run(iql_loss_reference, q, qt, v, vn, action, reward, discount, weight, tau, up)
    _assert_close((loss.detach(), td, grad_q, grad_v), want)


def test_expectile_near_the_ends_and_u_exactly_zero():
    """τ = 1e-3 and 0.999, u = 0 in some rows (L_V = 0, ∂/∂V = 0 there), u of both signs."""
    groups, bg, a = 2, 7, 3
    q, qt, v, vn, action, reward, discount, weight = _case(groups, bg, a, seed=6)
    q_target_sa = qt.view(-1, a).gather(1, action[:, None]).view(groups, bg)
    v = v.clone()
    zero_u = torch.tensor([0, 3, 6])
    v[:, zero_u] = q_target_sa[:, zero_u]  # u exactly 0
    u = q_target_sa - v
    assert (u == 0).sum() == 6 and (u < 0).any() and (u > 0).any()
    tau, up = _taus(groups), _upstream(groups, True)
    got = _run(_kernel, q, qt, v, vn, action, reward, discount, weight, tau, up)
    want = _run(iql_loss_reference, q, qt, v, vn, action, reward, discount, weight, tau, up)
    _assert_close(got, want)
    assert torch.equal(got[3][:, zero_u], torch.zeros(groups, 3))
    # the expectile's weights: 1 − τ where u < 0, τ where u ≥ 0 (group 0: τ = 1e-3, group 1: τ = 0.999)
    k = torch.where(u < 0, 1.0 - tau[:, None], tau[:, None])
    w = weight.view(groups, bg)
    expected_dv = -((w / bg * up[:, None]) * k) * (2.0 * u)
    torch.testing.assert_close(got[3], expected_dv, rtol=1e-6, atol=1e-9)


def test_hand_computed():
    # the case of tests/objectives/test_iql.py: τ = 0.7, B = 2, A = 2
    #   row 0: a = 1, Q(s0) = [1, 2], Q̂(s0) = [1.5, 3], V(s0) = 2, V(s1) = 1, R = 0.5, γ = 0.9, w = 1:
    #     u = 1 (weight 0.7, L_V = 0.7), td = 0.5 + 0.9 − 2 = −0.6 (L_Q = 0.36)
    #   row 1: a = 0, Q(s1) = [0.5, −1], Q̂(s1) = [0, 0], V(s1) = 1, V(s0) = 2, R = −1, γ = 0, w = 2:
    #     u = −1 (weight 0.3, L_V = 0.3), td = −1 − 0.5 = −1.5 (L_Q = 2.25)
    #   loss = (1·(0.36 + 0.7) + 2·(2.25 + 0.3)) / 2 = 3.08
    #   ∂/∂Q(s0, 1) = −2·(−0.6)·1/2 = 0.6, ∂/∂Q(s1, 0) = −2·(−1.5)·2/2 = 3
    #   ∂/∂V(s0) = −2·0.7·1·1/2 = −0.7, ∂/∂V(s1) = −2·0.3·(−1)·2/2 = 0.6
    args = (torch.tensor([[1.5, 3.0], [0.0, 0.0]]),)
    rest = (torch.tensor([1.0, 2.0]), torch.tensor([1, 0]), torch.tensor([0.5, -1.0]), torch.tensor([0.9, 0.0]),
            torch.tensor([1.0, 2.0]), 0.7)
    for backend in ("torch", "triton"):
        q = torch.tensor([[1.0, 2.0], [0.5, -1.0]], requires_grad=True)
        v = torch.tensor([2.0, 1.0], requires_grad=True)
        loss, td = iql_loss(q, *args, v, *rest, backend=backend)
        loss.backward()
        torch.testing.assert_close(loss, torch.tensor(3.08))
        torch.testing.assert_close(td, torch.tensor([0.6, 1.5]))  # |td|
        torch.testing.assert_close(q.grad, torch.tensor([[0.0, 0.6], [3.0, 0.0]]))
        torch.testing.assert_close(v.grad, torch.tensor([-0.7, 0.6]))
        assert not td.requires_grad


@pytest.mark.parametrize("where", ["q", "q_target", "v_next", "reward"])
def test_nan_in_one_group_spoils_only_its_loss(where):
    groups, bg, a = 3, 7, 3
    q, qt, v, vn, action, reward, discount, weight = _case(groups, bg, a, seed=8)
    row = bg + 4  # group 1
    if where in ("q", "q_target"):
        (q if where == "q" else qt).view(-1, a)[row, action[row]] = float("nan")
    elif where == "v_next":
        vn.view(-1)[row] = float("nan")
    else:
        reward[row] = float("nan")
    tau, up = _taus(groups), _upstream(groups, True)
    got = _run(_kernel, q, qt, v, vn, action, reward, discount, weight, tau, up)
    want = _run(iql_loss_reference, q, qt, v, vn, action, reward, discount, weight, tau, up)
    assert torch.isnan(got[0][1]) and torch.isfinite(got[0][[0, 2]]).all()
    assert torch.isfinite(got[2][[0, 2]]).all() and torch.isfinite(got[3][[0, 2]]).all()
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7, equal_nan=True)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(got[2], want[2], rtol=1e-6, atol=1e-9, equal_nan=True)
    torch.testing.assert_close(got[3], want[3], rtol=1e-6, atol=1e-9, equal_nan=True)


def test_only_the_inputs_that_need_it_get_a_gradient():
    q, qt, v, vn, action, reward, discount, weight = _case(1, 7, 3, seed=9)
    v_in = v.view(-1).clone().requires_grad_(True)
    loss, _ = _kernel(q.view(7, 3), qt.view(7, 3), v_in, vn, action, reward, discount, weight, 0.7)
    (grad_v,) = torch.autograd.grad(loss, v_in)  # q without grad: only ∂/∂V
    want = _run(iql_loss_reference, q, qt, v, vn, action, reward, discount, weight, 0.7, torch.tensor(1.0))
    torch.testing.assert_close(grad_v, want[3].view(-1), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("kw,match", [
    (dict(expectile=0.0), r"expectile must be a number in \(0, 1\)"),
    (dict(expectile=1.0), r"expectile must be a number in \(0, 1\)"),
    (dict(expectile=True), r"expectile must be a number in \(0, 1\)"),
    (dict(expectile=torch.ones(3)), r"float32 \[G\] tensor with G dividing B=4"),
    (dict(expectile=torch.ones(2, dtype=torch.float64)), r"float32 \[G\] tensor"),
    (dict(q=torch.zeros(2, 2, 3), q_target=torch.zeros(2, 2, 3)), "must have G=1 groups"),
    (dict(q=torch.zeros(5, 3)), "B=4 rows of A actions"),
    (dict(q_target=torch.zeros(4, 2)), r"q_target must be float32 of q's shape \[4, 3\]"),
    (dict(v=torch.zeros(5)), r"v must be float32 \[4\]"),
    (dict(weight=torch.zeros(4, dtype=torch.float64)), r"weight must be float32 \[4\]"),
    (dict(action=torch.zeros(4, dtype=torch.int32)), "action must be int64"),
    (dict(q=torch.zeros(4, 3, dtype=torch.float64)), "q must be float32"),
    (dict(backend="gpu"), "backend must be"),
])
def test_bad_arguments(kw, match):
    args = dict(q=torch.zeros(4, 3), q_target=torch.zeros(4, 3), v=torch.zeros(4), v_next=torch.zeros(4),
                action=torch.zeros(4, dtype=torch.int64), reward=torch.zeros(4), discount=torch.zeros(4),
                weight=torch.ones(4), expectile=0.7)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        iql_loss(**args)


# ------------------------------------------------------------------------------ grid of row blocks
def test_blocks_do_not_depend_on_the_number_of_groups():
    """A member's row blocks (hence its partial sums and their order) are those of its run alone,
    at the GPU's MIN_PROGRAMS too; a training batch still gets dozens of programs."""
    for bg, a in ((256, 45), (4096, 45), (1001, 7), (7, 1)):
        one = iql_module._blocks(1, bg, a)
        for groups in (2, 8, 64):
            many = iql_module._blocks(groups, bg, a)
            assert many[:2] == one[:2] and many[3] == one[3]
        block_r = one[0]
        assert one[1] == triton.next_power_of_2(a) and block_r * one[1] <= td_module.TILE
        assert triton.cdiv(bg, block_r) >= min(iql_module.MIN_PROGRAMS, bg)


def _grid_case(monkeypatch, groups, bg, a, min_programs, seed):
    """Inputs of ``groups`` groups of ``bg`` rows, the interpreter forced to many row blocks."""
    monkeypatch.setattr(iql_module, "INTERPRET_MIN_PROGRAMS", min_programs)
    block_r = iql_module._blocks(groups, bg, a, min_programs)[0]
    assert triton.cdiv(bg, block_r) >= 3 and bg % block_r  # many blocks, the last one of each group partial
    return _case(groups, bg, a, seed=seed)


@pytest.mark.parametrize("groups,bg,a", [(1, 67, 5), (3, 13, 4), (2, 33, 45)])
def test_many_row_blocks_equal_reference(monkeypatch, groups, bg, a):
    q, qt, v, vn, action, reward, discount, weight = _grid_case(monkeypatch, groups, bg, a, 4, seed=bg + groups)
    tau = _taus(groups) if groups > 1 else 0.9
    up = _upstream(groups, groups > 1)
    got = _run(_kernel, q, qt, v, vn, action, reward, discount, weight, tau, up)
    want = _run(iql_loss_reference, q, qt, v, vn, action, reward, discount, weight, tau, up)
    _assert_close(got, want)


def test_each_group_is_its_run_alone_bit_for_bit(monkeypatch):
    """Group g's loss, td and gradients in a launch of 3 groups are the bits of a launch of group g
    alone (a [1] τ): what makes a population member equal its run of one member."""
    groups, bg, a = 3, 13, 4
    q, qt, v, vn, action, reward, discount, weight = _grid_case(monkeypatch, groups, bg, a, 4, seed=31)
    tau = _taus(groups)
    up = torch.ones(groups)
    together = _run(_kernel, q, qt, v, vn, action, reward, discount, weight, tau, up)
    for g in range(groups):
        rows = slice(g * bg, (g + 1) * bg)
        alone = _run(_kernel, q[g:g + 1], qt[g:g + 1], v[g:g + 1], vn[g:g + 1], action[rows], reward[rows],
                     discount[rows], weight[rows], tau[g:g + 1], torch.ones(1))
        assert torch.equal(together[0][g:g + 1], alone[0])
        assert torch.equal(together[1][rows], alone[1])
        assert torch.equal(together[2][g:g + 1], alone[2]) and torch.equal(together[3][g:g + 1], alone[3])


def test_last_program_loops_over_groups_and_partial_strides(monkeypatch):
    """SUM_R = 2 partials per iteration and one group per tile: the last program's two loops run
    several times."""
    monkeypatch.setattr(td_module, "SUM_ROWS", 2)
    monkeypatch.setattr(td_module, "SUM_TILE", 2)
    groups, bg, a = 3, 13, 4
    q, qt, v, vn, action, reward, discount, weight = _grid_case(monkeypatch, groups, bg, a, 4, seed=21)
    assert iql_module._blocks(groups, bg, a, 4)[2:] == (1, 2)
    tau, up = _taus(groups), _upstream(groups, True)
    got = _run(_kernel, q, qt, v, vn, action, reward, discount, weight, tau, up)
    want = _run(iql_loss_reference, q, qt, v, vn, action, reward, discount, weight, tau, up)
    _assert_close(got, want)


def test_same_bits_on_two_calls_and_ticket_reset(monkeypatch):
    groups, bg, a = 3, 13, 4
    q, qt, v, vn, action, reward, discount, weight = _grid_case(monkeypatch, groups, bg, a, 4, seed=5)
    tau, up = _taus(groups), _upstream(groups, True)
    programs = groups * triton.cdiv(bg, iql_module._blocks(groups, bg, a, 4)[0])
    first = _run(_kernel, q, qt, v, vn, action, reward, discount, weight, tau, up)
    partials, ticket = td_module._SCRATCH[(q.device, programs)]
    assert ticket.item() == 0  # the last program zeroed it for the next launch
    second = _run(_kernel, q, qt, v, vn, action, reward, discount, weight, tau, up)
    for x, y in zip(first, second):
        assert torch.equal(x, y)
    assert td_module._SCRATCH[(q.device, programs)][0] is partials  # one scratch per size, reused
    reward2 = reward.flip(0) * 0.5  # new values in the same scratch: every loss written again
    got = _run(_kernel, q, qt, v, vn, action, reward2, discount, weight, tau, up)
    want = _run(iql_loss_reference, q, qt, v, vn, action, reward2, discount, weight, tau, up)
    _assert_close(got, want)
    assert not torch.equal(got[0], first[0])


def test_empty_batch():
    q = torch.zeros(0, 3, requires_grad=True)
    v = torch.zeros(0, requires_grad=True)
    args = (torch.zeros(0, 3), v, torch.zeros(0), torch.zeros(0, dtype=torch.int64), torch.zeros(0), torch.zeros(0),
            torch.zeros(0), 0.7)
    loss, td = iql_loss(q, *args, backend="triton")
    want, _ = iql_loss_reference(q, *args)
    assert torch.isnan(loss) and torch.isnan(want) and td.shape == (0,)
    loss.backward()
    assert q.grad.shape == (0, 3) and v.grad.shape == (0,)


# ------------------------------------------------------------------------------ GPU
def _gpu_case(groups, bg, a, seed):
    q, qt, v, vn, action, reward, discount, weight = _case(groups, bg, a, seed=seed, device="cuda")
    tau = torch.linspace(0.1, 0.9, groups, device="cuda") if groups > 1 else 0.7
    return (q, qt, v, vn, action, reward, discount, weight, tau)


@pytest.mark.gpu
@pytest.mark.parametrize("groups,bg,a", [(1, 4096, 45), (8, 256, 45), (3, 1001, 7)])
def test_gpu_kernel_equals_reference(groups, bg, a):
    args = _gpu_case(groups, bg, a, seed=1)
    up = torch.linspace(0.5, 2.0, groups, device="cuda") if groups > 1 else torch.tensor(1.5, device="cuda")
    got = _run(iql_loss, *args, up)
    want = _run(iql_loss_reference, *args, up)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)  # sum order and fused multiply-adds


@pytest.mark.gpu
@pytest.mark.parametrize("groups,bg,a", [(1, 256, 45), (8, 256, 45)])
def test_gpu_capture_equals_eager_sync_free_deterministic(groups, bg, a):
    q, qt, v, vn, action, reward, discount, weight, tau = _gpu_case(groups, bg, a, seed=2)
    pq, pv = q.clone().requires_grad_(True), v.clone().requires_grad_(True)

    def step():  # autograd.grad, not backward: no AccumulateGrad node tied to the stream that made p
        loss, td = iql_loss(pq, qt, pv, vn, action, reward, discount, weight, tau)
        grad_q, grad_v = torch.autograd.grad(loss.sum(), (pq, pv))
        return loss.detach(), td, grad_q, grad_v

    eager = [x.clone() for x in step()]
    for x, y in zip(eager, step()):
        assert torch.equal(x, y)  # the same bits from call to call
    assert_replays_give(step, eager)


@pytest.mark.gpu
def test_gpu_forward_is_one_kernel():
    args = _gpu_case(8, 256, 45, seed=3)
    n, names = cuda_kernels(lambda: iql_loss(*args))
    assert n == 1 and len(names) == 1 and "iql_loss" in names[0]
