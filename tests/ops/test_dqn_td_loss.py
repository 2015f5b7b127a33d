"""foxdqn.ops.dqn_td_loss: the fused kernel (TRITON_INTERPRET=1 on CPU) against the torch reference
(loss, |TD| and the gradient of q against autograd of the reference), against today's DQNObjective
arithmetic and a hand-computed case; odd batch sizes, A = 1, argmax ties, NaN rows, weights, a δ
per group, stacked Q (s and s' rows in one tensor), bad arguments; the grid of row blocks (many
blocks, B_g not a multiple of BLOCK_R, several groups, NaN/Inf rows in one group, the same bits on
two calls, the ticket back at zero, the cached scratch reused, an empty batch). GPU (`gpu`
marker): kernel = reference on CUDA, CUDA-graph capture of forward + backward (replay = eager,
bit for bit; no host sync), one kernel per forward, determinism at training sizes."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import triton

from foxdqn.ops import dqn_td_loss as td_module
from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.dqn_td_loss import dqn_td_loss, dqn_td_loss_reference

from support import assert_replays_give, capture_graph, cuda_kernels, no_host_sync, require_compiled_kernels

_need_compiled = require_compiled_kernels(INTERPRET)


def _case(b, a, seed=0, device="cpu", ties=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, a, generator=g) * 2
    qo = torch.randn(b, a, generator=g)
    if ties:  # whole-number values: many rows with a tied maximum
        qo = torch.randint(0, 2, (b, a), generator=g).float()
    qt = torch.randn(b, a, generator=g)
    action = torch.randint(0, a, (b,), generator=g)
    reward = torch.randn(b, generator=g) * 3  # some |x| beyond δ, some within
    discount = torch.where(torch.rand(b, generator=g) < 0.2, 0.0, 0.99)
    weight = torch.rand(b, generator=g) + 0.1
    upstream = torch.rand((), generator=g) + 0.5
    return [x.to(device) for x in (q, qo, qt, action, reward, discount, weight, upstream)]


def _run(fn, q, qo, qt, action, reward, discount, weight, upstream, *, stacked, **kw):
    """loss, td_abs, dloss/dq (of s rows), dloss/dq (of s' rows, stacked only)."""
    b = action.shape[0]
    if stacked:
        groups = kw["huber_delta"].shape[0] if isinstance(kw.get("huber_delta"), torch.Tensor) else 1
        a = q.shape[1]
        q_in = torch.stack([q.view(groups, -1, a), qo.view(groups, -1, a)], dim=1).reshape(2 * b, a)
        q_in = q_in.detach().requires_grad_(True)
        loss, td = fn(q_in, qt, action, reward, discount, weight, **kw)
    else:
        q_in = q.detach().clone().requires_grad_(True)
        if kw.get("double", True):
            kw = {**kw, "q_next_online": qo}
        loss, td = fn(q_in, qt, action, reward, discount, weight, **kw)
    (grad,) = torch.autograd.grad((loss * upstream).sum(), q_in)
    if stacked:
        g4 = grad.view(groups, 2, -1, q.shape[1])
        return loss.detach(), td, g4[:, 0].reshape(b, -1), g4[:, 1].reshape(b, -1)
    return loss.detach(), td, grad, None


def _kernel(*args, **kw):
    return dqn_td_loss(*args, **kw, backend="triton")


@pytest.mark.parametrize("b,a", [(1, 1), (37, 3), (130, 1), (257, 5)])
@pytest.mark.parametrize("double", [True, False])
@pytest.mark.parametrize("weighted", [True, False])
def test_kernel_equals_reference_with_gradient(b, a, double, weighted):
    q, qo, qt, action, reward, discount, weight, up = _case(b, a, seed=b + a)
    w = weight if weighted else None
    for delta in (1.0, 0.7):
        got = _run(_kernel, q, qo, qt, action, reward, discount, w, up, stacked=False, double=double,
                   huber_delta=delta)
        want = _run(dqn_td_loss_reference, q, qo, qt, action, reward, discount, w, up, stacked=False,
                    double=double, huber_delta=delta)
        assert got[0].shape == () and got[1].shape == (b,)
        torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
        torch.testing.assert_close(got[2], want[2], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("b,a", [(37, 3), (2, 1)])
def test_stacked_equals_separate_and_next_rows_get_no_gradient(b, a):
    q, qo, qt, action, reward, discount, weight, up = _case(b, a, seed=7)
    sep = _run(_kernel, q, qo, qt, action, reward, discount, weight, up, stacked=False, huber_delta=1.0)
    for fn in (_kernel, dqn_td_loss_reference):
        st = _run(fn, q, qo, qt, action, reward, discount, weight, up, stacked=True, huber_delta=1.0)
        torch.testing.assert_close(st[0], sep[0], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(st[1], sep[1], rtol=0, atol=0)
        torch.testing.assert_close(st[2], sep[2], rtol=1e-6, atol=1e-9)
        assert torch.equal(st[3], torch.zeros_like(st[3]))


@pytest.mark.parametrize("stacked", [False, True])
def test_delta_per_group(stacked):
    groups, bg, a = 3, 11, 4
    q, qo, qt, action, reward, discount, weight, _ = _case(groups * bg, a, seed=3)
    delta = torch.tensor([0.3, 1.0, 2.5])
    up = torch.tensor([1.0, 0.5, 2.0])  # a different upstream gradient per group
    got = _run(_kernel, q, qo, qt, action, reward, discount, None, up, stacked=stacked, huber_delta=delta)
    want = _run(dqn_td_loss_reference, q, qo, qt, action, reward, discount, None, up, stacked=stacked,
                huber_delta=delta)
    assert got[0].shape == (groups,)
    for x, y in zip(got, want):
        if x is not None:
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-8)
    # each group is the single-δ loss of its own rows
    for g in range(groups):
        rows = slice(g * bg, (g + 1) * bg)
        one = _run(_kernel, q[rows], qo[rows], qt[rows], action[rows], reward[rows], discount[rows], None,
                   torch.tensor(1.0), stacked=False, huber_delta=float(delta[g]))
        torch.testing.assert_close(got[0][g], one[0], rtol=1e-6, atol=1e-8)


def test_today_dqn_objective_arithmetic():
    """The reference is DQNObjective's old code (double_dqn_target + F.huber_loss + weighted_mean)."""
    q, qo, qt, action, reward, discount, weight, _ = _case(29, 3, seed=11)
    q_sa = q.gather(1, action[:, None]).squeeze(1)
    y = reward + discount * qt.gather(1, qo.argmax(dim=1, keepdim=True)).squeeze(1)
    want = (F.huber_loss(q_sa, y, reduction="none", delta=1.0) * weight).mean()
    for backend in ("torch", "triton"):
        loss, td = dqn_td_loss(q, qt, action, reward, discount, weight, q_next_online=qo, backend=backend)
        torch.testing.assert_close(loss, want, rtol=1e-6, atol=0)
        assert torch.equal(td, (q_sa - y).abs())


def test_hand_computed():
    # B=2, A=2, δ=1: row 0: a=0, Q=1, online s' [1, 1] (tie → a*=0), target s' [2, 5], r=0.5, γ=0.5:
    #   y = 0.5 + 0.5·2 = 1.5, x = −0.5, ℓ = 0.125, grad = −0.5 · w/B = −0.5 · 2/2 = −0.5
    # row 1: a=1, Q=4, online s' [0, 3] (a*=1), target s' [1, -2], r=1, γ=0:   y = 1, x = 3, ℓ = 2.5, grad = 1·1/2
    q = torch.tensor([[1.0, 7.0], [9.0, 4.0]], requires_grad=True)
    qo = torch.tensor([[1.0, 1.0], [0.0, 3.0]])
    qt = torch.tensor([[2.0, 5.0], [1.0, -2.0]])
    args = (qt, torch.tensor([0, 1]), torch.tensor([0.5, 1.0]), torch.tensor([0.5, 0.0]), torch.tensor([2.0, 1.0]))
    for backend in ("torch", "triton"):
        q.grad = None
        loss, td = dqn_td_loss(q, *args, q_next_online=qo, backend=backend)
        loss.backward()
        assert loss.item() == (0.125 * 2 + 2.5 * 1) / 2 and td.tolist() == [0.5, 3.0]
        assert q.grad.tolist() == [[-0.5, 0.0], [0.0, 0.5]]


def test_nan_rows_argmax_like_torch():
    q, qo, qt, action, reward, discount, _, _ = _case(6, 4, seed=2)
    qo[1, 2] = float("nan")  # torch.argmax picks the NaN: the target there is finite
    qo[3] = float("-inf")  # all −inf: index 0
    qt[4, 1] = float("nan")
    for double in (True, False):
        kw = dict(q_next_online=qo) if double else {}
        got = dqn_td_loss(q, qt, action, reward, discount, double=double, backend="triton", **kw)[1]
        want = dqn_td_loss_reference(q, qt, action, reward, discount, double=double, **kw)[1]
        torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)


def test_ties_pick_the_first_maximum():
    q, qo, qt, action, reward, discount, weight, up = _case(64, 5, seed=4, ties=True)
    got = _run(_kernel, q, qo, qt, action, reward, discount, weight, up, stacked=False, huber_delta=1.0)
    want = _run(dqn_td_loss_reference, q, qo, qt, action, reward, discount, weight, up, stacked=False,
                huber_delta=1.0)
    assert torch.equal(got[1], want[1])


@pytest.mark.parametrize("kw,match", [
    (dict(huber_delta=0.0), "huber_delta must be a finite number > 0"),
    (dict(huber_delta=torch.ones(3)), r"float32 \[G\] tensor with G dividing B=4"),
    (dict(q_next_online=None), "double=True needs q_next_online"),
    (dict(double=False), "q_next_online is for double=True only"),
    (dict(q=torch.zeros(5, 3)), "B=4 or 2B=8 rows"),
    (dict(q=torch.zeros(8, 3), q_next_online=None, double=False), "stacked q .* Double DQN only"),
    (dict(q=torch.zeros(8, 3)), "not both"),
    (dict(reward=torch.zeros(4, dtype=torch.float64)), r"reward must be float32 \[4\]"),
    (dict(q=torch.zeros(4, 3, dtype=torch.float64)), "q must be float32"),
])
def test_bad_arguments(kw, match):
    args = dict(q=torch.zeros(4, 3), q_next_target=torch.zeros(4, 3), action=torch.zeros(4, dtype=torch.int64),
                reward=torch.zeros(4), discount=torch.zeros(4), q_next_online=torch.zeros(4, 3))
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        dqn_td_loss(**args)


# ------------------------------------------------------------------------------ grid of row blocks
def _programs(groups, bg, a, min_programs):
    block_r = td_module._blocks(groups, bg, a, min_programs)[0]
    return block_r, groups * triton.cdiv(bg, block_r)


@pytest.mark.parametrize("b,a", [(256, 45), (4096, 45), (1000, 7)])
def test_training_batches_get_dozens_of_programs(b, a):
    block_r, block_a, sum_g, sum_r = td_module._blocks(1, b, a)
    programs = triton.cdiv(b, block_r)
    assert block_a == triton.next_power_of_2(a) and block_r * block_a <= td_module.TILE
    assert td_module.MIN_PROGRAMS <= programs <= b  # dozens to hundreds, never one program per batch
    assert sum_g == 1 and sum_r == min(triton.next_power_of_2(programs), td_module.SUM_ROWS)
    # a population of 8 members of 256 rows: every member its own blocks, the last program sums
    # the 8 members' partials in one [8, SUM_R] tile
    block_r8, _, sum_g8, sum_r8 = td_module._blocks(8, 256, a)
    assert 8 * triton.cdiv(256, block_r8) >= td_module.MIN_PROGRAMS
    assert sum_g8 == 8 and sum_r8 == triton.next_power_of_2(triton.cdiv(256, block_r8))


def _grid_case(monkeypatch, groups, bg, a, min_programs, seed):
    """Inputs of ``groups`` groups of ``bg`` rows, the interpreter forced to many row blocks."""
    monkeypatch.setattr(td_module, "INTERPRET_MIN_PROGRAMS", min_programs)
    block_r, programs = _programs(groups, bg, a, min_programs)
    assert programs >= 3 * groups and bg % block_r  # many blocks, the last one of each group partial
    return _case(groups * bg, a, seed=seed)


@pytest.mark.parametrize("groups,bg,a,stacked,weighted", [
    (1, 67, 5, False, True),  # BLOCK_R 4: 17 blocks, the last of 3 rows
    (1, 45, 3, True, False),
    (3, 13, 4, False, False),  # BLOCK_R 4 per group: blocks of 4, 4, 4 and 1 rows
    (3, 13, 4, True, True),
])
def test_many_row_blocks_equal_reference(monkeypatch, groups, bg, a, stacked, weighted):
    q, qo, qt, action, reward, discount, weight, _ = _grid_case(monkeypatch, groups, bg, a, 12, seed=bg + groups)
    w = weight if weighted else None
    if groups > 1:
        delta = torch.tensor([0.3, 1.0, 2.5])
        up = torch.tensor([1.0, 0.5, 2.0])
    else:
        delta, up = 0.8, torch.tensor(1.5)
    got = _run(_kernel, q, qo, qt, action, reward, discount, w, up, stacked=stacked, huber_delta=delta)
    want = _run(dqn_td_loss_reference, q, qo, qt, action, reward, discount, w, up, stacked=stacked,
                huber_delta=delta)
    assert got[0].shape == (() if groups == 1 else (groups,))
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)  # sum order: rounding only
    assert torch.equal(got[1], want[1])
    torch.testing.assert_close(got[2], want[2], rtol=1e-6, atol=1e-9)
    if stacked:
        assert torch.equal(got[3], torch.zeros_like(got[3]))


def test_last_program_loops_over_groups_and_partial_strides(monkeypatch):
    """SUM_R = 2 partials per iteration and one group per tile: the last program's two loops run
    several times (at training sizes: B = 4,096 has 256 partials, a population more groups than a tile)."""
    monkeypatch.setattr(td_module, "SUM_ROWS", 2)
    monkeypatch.setattr(td_module, "SUM_TILE", 2)
    groups, bg, a = 3, 13, 4
    q, qo, qt, action, reward, discount, weight, _ = _grid_case(monkeypatch, groups, bg, a, 12, seed=21)
    assert td_module._blocks(groups, bg, a, 12)[2:] == (1, 2)
    delta = torch.tensor([0.3, 1.0, 2.5])
    up = torch.tensor([1.0, 0.5, 2.0])
    got = _run(_kernel, q, qo, qt, action, reward, discount, weight, up, stacked=True, huber_delta=delta)
    want = _run(dqn_td_loss_reference, q, qo, qt, action, reward, discount, weight, up, stacked=True,
                huber_delta=delta)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got[2], want[2], rtol=1e-6, atol=1e-9)


def test_nan_and_inf_rows_spoil_only_their_group(monkeypatch):
    groups, bg, a = 3, 13, 4
    q, qo, qt, action, reward, discount, _, _ = _grid_case(monkeypatch, groups, bg, a, 12, seed=9)
    qt[bg + 6, 0] = float("nan")  # group 1, a middle block: the selection picks the NaN column 0 of
    qo[bg + 6, 0] = float("nan")  # the online Q, its target Q is NaN, so y is NaN
    reward[2 * bg + 12] = float("inf")  # group 2, its last (one-row) block: x = −inf, ℓ = inf
    delta = torch.tensor([0.5, 1.0, 2.0])
    loss, td = dqn_td_loss(q, qt, action, reward, discount, q_next_online=qo, huber_delta=delta, backend="triton")
    want_loss, want_td = dqn_td_loss_reference(q, qt, action, reward, discount, q_next_online=qo, huber_delta=delta)
    assert torch.isnan(loss[1]) and loss[2] == float("inf") and torch.isfinite(loss[0])
    torch.testing.assert_close(loss, want_loss, rtol=1e-6, atol=1e-7, equal_nan=True)
    torch.testing.assert_close(td, want_td, rtol=0, atol=0, equal_nan=True)
    assert td.isnan().sum() == 1 and td.isinf().sum() == 1


def test_same_bits_on_two_calls_and_ticket_reset(monkeypatch):
    groups, bg, a = 3, 13, 4
    q, qo, qt, action, reward, discount, weight, _ = _grid_case(monkeypatch, groups, bg, a, 12, seed=5)
    delta = torch.tensor([0.3, 1.0, 2.5])
    up = torch.tensor([1.0, 0.5, 2.0])
    _, programs = _programs(groups, bg, a, 12)
    first = _run(_kernel, q, qo, qt, action, reward, discount, weight, up, stacked=True, huber_delta=delta)
    partials, ticket = td_module._SCRATCH[(q.device, programs)]
    assert ticket.item() == 0  # the last program zeroed it for the next launch
    second = _run(_kernel, q, qo, qt, action, reward, discount, weight, up, stacked=True, huber_delta=delta)
    for x, y in zip(first, second):
        assert torch.equal(x, y)
    assert td_module._SCRATCH[(q.device, programs)][0] is partials  # one scratch per size, reused
    # new values in the same scratch: the last program of the third launch still writes every loss
    reward2 = reward.flip(0) * 0.5
    got = _run(_kernel, q, qo, qt, action, reward2, discount, weight, up, stacked=True, huber_delta=delta)
    want = _run(dqn_td_loss_reference, q, qo, qt, action, reward2, discount, weight, up, stacked=True,
                huber_delta=delta)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)
    assert not torch.equal(got[0], first[0])


def test_empty_batch():
    q = torch.zeros(0, 3, requires_grad=True)
    loss, td = dqn_td_loss(q, torch.zeros(0, 3), torch.zeros(0, dtype=torch.int64), torch.zeros(0), torch.zeros(0),
                           q_next_online=torch.zeros(0, 3), backend="triton")
    want, _ = dqn_td_loss_reference(q, torch.zeros(0, 3), torch.zeros(0, dtype=torch.int64), torch.zeros(0),
                                    torch.zeros(0), q_next_online=torch.zeros(0, 3))
    assert torch.isnan(loss) and torch.isnan(want) and td.shape == (0,)
    loss.backward()
    assert q.grad.shape == (0, 3)


@pytest.mark.parametrize("groups,bg,a,stacked,weighted,double", [
    (1, 37, 3, False, True, True),
    (3, 13, 45, True, True, True),  # eurusd_cql's layout: stacked [s; s'], 45 actions (BLOCK_A 64)
    (3, 13, 4, False, False, False),
    (2, 13, 1, True, False, True),  # one action: CQL(H)'s term is exactly 0
])
def test_cql_term_equals_reference(monkeypatch, groups, bg, a, stacked, weighted, double):
    """cql_alpha adds each group's α · CQL(H) (α = 0 in one group) to its loss and gradient in the same
    kernel: the reference (foxdqn.objectives.cql's arithmetic) to float rounding; the s' rows still get
    no gradient; a one-action head adds nothing (logsumexp of one value is that value)."""
    q, qo, qt, action, reward, discount, weight, _ = _grid_case(monkeypatch, groups, bg, a, 12, seed=bg + a)
    w = weight if weighted else None
    delta = torch.linspace(0.5, 2.0, groups)
    alpha = torch.tensor([1.0, 0.0, 3.0][:groups]) if groups > 1 else torch.tensor([2.0])
    up = torch.linspace(1.0, 2.0, groups)
    kw = dict(stacked=stacked, huber_delta=delta, double=double)
    got = _run(_kernel, q, qo, qt, action, reward, discount, w, up, cql_alpha=alpha, **kw)
    want = _run(dqn_td_loss_reference, q, qo, qt, action, reward, discount, w, up, cql_alpha=alpha, **kw)
    plain = _run(_kernel, q, qo, qt, action, reward, discount, w, up, **kw)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    assert torch.equal(got[1], want[1]) and torch.equal(got[1], plain[1])  # |TD| is the TD loss's alone
    torch.testing.assert_close(got[2], want[2], rtol=1e-5, atol=1e-7)
    if stacked:
        assert torch.equal(got[3], torch.zeros_like(got[3]))
    if a == 1:
        torch.testing.assert_close(got[0], plain[0], rtol=0, atol=1e-6)
    else:
        assert (got[0] > plain[0])[alpha > 0].all()  # c_b > 0 for A > 1: the term adds
        zero = alpha == 0
        torch.testing.assert_close(got[0][zero], plain[0][zero], rtol=0, atol=0)


def test_cql_alpha_needs_one_per_group():
    q, qo, qt, action, reward, discount, weight, _ = _case(6, 3)
    with pytest.raises(ValueError, match="cql_alpha must be float32 \\[2\\]"):
        dqn_td_loss(q, qt, action, reward, discount, weight, q_next_online=qo, huber_delta=torch.ones(2),
                    cql_alpha=torch.ones(3))
    with pytest.raises(ValueError, match="cql_alpha must be float32 \\[G\\] with a \\[G\\] huber_delta"):
        dqn_td_loss(q, qt, action, reward, discount, weight, q_next_online=qo, cql_alpha=torch.ones(1))


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("stacked", [False, True])
def test_gpu_kernel_equals_reference(stacked):
    q, qo, qt, action, reward, discount, weight, up = _case(4096, 3, seed=1, device="cuda")
    got = _run(dqn_td_loss, q, qo, qt, action, reward, discount, weight, up, stacked=stacked, huber_delta=1.0)
    want = _run(dqn_td_loss_reference, q, qo, qt, action, reward, discount, weight, up, stacked=stacked,
                huber_delta=1.0)
    for x, y in zip(got, want):
        if x is not None:
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)  # sum order and fused multiply-adds


@pytest.mark.gpu
def test_gpu_cql_term_equals_reference():
    """eurusd_cql's sizes on CUDA: 8 members of 256 stacked rows, 45 actions, importance weights."""
    q, qo, qt, action, reward, discount, weight, _ = _case(8 * 256, 45, seed=2, device="cuda")
    kw = dict(stacked=True, huber_delta=torch.ones(8, device="cuda"),
              cql_alpha=torch.linspace(0.0, 2.0, 8, device="cuda"))
    up = torch.ones(8, device="cuda")
    got = _run(dqn_td_loss, q, qo, qt, action, reward, discount, weight, up, **kw)
    want = _run(dqn_td_loss_reference, q, qo, qt, action, reward, discount, weight, up, **kw)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_gpu_capture_forward_backward():
    q, qo, qt, action, reward, discount, weight, _ = _case(128, 3, seed=5, device="cuda")
    p = q.clone().requires_grad_(True)

    def step():
        p.grad = None
        loss, td = dqn_td_loss(p, qt, action, reward, discount, weight, q_next_online=qo)
        loss.backward()
        return loss, td, p.grad

    graph, (loss, td, grad) = capture_graph(step)
    with no_host_sync():
        graph.replay()
    want = _run(dqn_td_loss_reference, q, qo, qt, action, reward, discount, weight, torch.tensor(1.0, device="cuda"),
                stacked=False, huber_delta=1.0)
    torch.testing.assert_close(loss, want[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, want[2], rtol=1e-5, atol=1e-7)


def _graph_case(b, a, groups, stacked):
    q, qo, qt, action, reward, discount, weight, _ = _case(b, a, seed=b + groups, device="cuda")
    delta = torch.linspace(0.5, 2.0, groups, device="cuda") if groups > 1 else 1.0
    if stacked:
        q_in = torch.stack([q.view(groups, -1, a), qo.view(groups, -1, a)], dim=1).reshape(2 * b, a)
        kw = dict(huber_delta=delta)
    else:
        q_in, kw = q, dict(q_next_online=qo, huber_delta=delta)
    return q_in, (qt, action, reward, discount, weight), kw


@pytest.mark.gpu
@pytest.mark.parametrize("b,a,groups,stacked", [(4096, 45, 1, True), (256, 45, 1, False), (8 * 256, 45, 8, True),
                                                (3 * 1001, 7, 3, False)])
def test_gpu_grid_capture_equals_eager_sync_free_deterministic(b, a, groups, stacked):
    q_in, args, kw = _graph_case(b, a, groups, stacked)
    p = q_in.clone().requires_grad_(True)

    def step():  # autograd.grad, not backward: no AccumulateGrad node tied to the stream that made p
        loss, td = dqn_td_loss(p, *args, **kw)
        (grad,) = torch.autograd.grad(loss.sum(), p)
        return loss.detach(), td, grad  # detached: the test overwrites them in place

    eager = [x.clone() for x in step()]
    again = step()
    for x, y in zip(eager, again):
        assert torch.equal(x, y)  # the same bits from call to call
    want_loss, want_td = dqn_td_loss_reference(q_in, *args, **kw)
    torch.testing.assert_close(eager[0], want_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(eager[1], want_td, rtol=1e-5, atol=1e-6)  # fused multiply-adds
    assert_replays_give(step, eager)


@pytest.mark.gpu
def test_gpu_forward_is_one_kernel():
    q_in, args, kw = _graph_case(4096, 45, 1, True)
    n, names = cuda_kernels(lambda: dqn_td_loss(q_in, *args, **kw))
    assert n == 1 and len(names) == 1 and "dqn_td_loss" in names[0]


@pytest.mark.gpu
def test_gpu_capture_without_cached_scratch():
    """A capture that finds no cached scratch of its size (no eager call since the cache was
    emptied) uses a graph-pool scratch, not cached, that the graph zeroes at each replay."""
    q_in, args, kw = _graph_case(512, 45, 1, True)
    eager = [x.clone() for x in dqn_td_loss(q_in, *args, **kw)]  # compiles the kernel
    td_module._SCRATCH.clear()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = [x.detach() for x in dqn_td_loss(q_in, *args, **kw)]
    assert not td_module._SCRATCH  # the capture's scratch is the graph's, not the cache's
    for _ in range(3):
        for x in out:
            x.fill_(float("nan"))
        with no_host_sync():
            graph.replay()
        torch.cuda.synchronize()
        for x, y in zip(out, eager):
            assert torch.equal(x, y)
    for x, y in zip(dqn_td_loss(q_in, *args, **kw), eager):  # eager again: a new cached scratch
        assert torch.equal(x, y)
