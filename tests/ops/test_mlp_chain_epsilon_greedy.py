"""foxdqn.ops.mlp_chain_epsilon_greedy and its place in foxdqn.step.act: the kernel
(TRITON_INTERPRET=1 on CPU) gives exactly the actions of epsilon_greedy on mlp_chain's Q (depths 1
to 4, odd row counts, one action, the collect step's 10 envs of cartpole_cleanrl's network, rows
past a block, NaN rows); ε = 0 and 1; the reference's actions wherever its argmax is clear; a NaN
column and a tie pick as torch.argmax; no rows; bad arguments; act() takes it for a plain-head ReLU
QNetwork with one schedule and not for G = 2 schedules, a tanh MLP or backend="torch". GPU (`gpu`
marker): the two ops' actions bit for bit in TF32 and in full float32, one kernel, capture = eager
without host sync, cartpole_cleanrl's collect step launching no epsilon_greedy kernel."""
from __future__ import annotations

import pytest
import torch

from foxdqn.nn.heads import QHead
from foxdqn.nn.mlp import MLPEncoder
from foxdqn.nn.qnet import QNetwork
from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.epsilon_greedy import epsilon_greedy
from foxdqn.ops.member_uniform import randint_from_uniform
from foxdqn.ops.mlp_chain import mlp_chain, mlp_chain_reference
from foxdqn.ops.mlp_chain_epsilon_greedy import mlp_chain_epsilon_greedy, mlp_chain_epsilon_greedy_reference
from foxdqn.step import act as act_mod
from foxdqn.step.act import act

from support import assert_replay_equals_eager, require_compiled_kernels
from test_mlp_chain import CARTPOLE, _case

_need_compiled = require_compiled_kernels(INTERPRET)


def _schedule(rows, eps=None, seed=0, device="cpu", groups=1):
    """step 60 of a decay from 1 to 0.1 over 100 steps (ε = 0.46: about half the rows explore), or
    ε fixed at ``eps``; uniforms [G, 2, rows // G]."""
    g = torch.Generator().manual_seed(seed)
    start, end = (torch.full((groups,), eps), torch.full((groups,), eps)) if eps is not None else \
        (torch.ones(groups), torch.full((groups,), 0.1))
    duration = torch.full((groups,), 100.0)
    u = torch.rand(groups, 2, rows // groups, generator=g)
    step = torch.tensor(60, dtype=torch.int64)
    return [t.to(device) for t in (step, start, end, duration, u)]


def _fused(x, ws, bs, sched, backend="triton"):
    step, start, end, duration, u = sched
    return mlp_chain_epsilon_greedy(x, ws, bs, step=step, start=start, end=end, duration=duration, u=u,
                                    backend=backend)


def _two_ops(x, ws, bs, sched):
    return epsilon_greedy(mlp_chain(x, ws, bs, backend="triton"), *sched, backend="triton")


SHAPES = [
    (1, [4, 2]),  # one layer, one row
    (9, [7, 3, 1]),  # A = 1: every action 0
    (10, CARTPOLE),  # cartpole_cleanrl's collect step
    (37, [9, 4, 1, 7]),  # a width 1 in the middle
    (41, [4, 2, 4, 7, 5]),  # depth 4
    (300, [9, 16, 7, 3]),  # rows past a block
    (19, [9, 128, 120, 84, 128]),  # the widest tiles, 128 actions
]


@pytest.mark.parametrize("rows,dims", SHAPES, ids=[f"B{b}-{'x'.join(map(str, d))}" for b, d in SHAPES])
def test_equals_epsilon_greedy_of_mlp_chain(rows, dims):
    """Bit for bit the two ops' actions (the same kernel computes Q), with a NaN row (Q all NaN
    there, argmax 0)."""
    x, ws, bs, _ = _case(rows, dims, seed=rows + len(dims))
    x[rows // 2, 0] = float("nan")
    sched = _schedule(rows, seed=rows)
    with torch.no_grad():
        got = _fused(x, ws, bs, sched)
        want = _two_ops(x, ws, bs, sched)
    assert got.dtype == torch.int64 and got.shape == (rows,)
    assert torch.equal(got, want)
    assert ((got >= 0) & (got < dims[-1])).all()
    explored = sched[4][0, 0] < 0.46  # ε at step 60: 1 - 0.9 · 0.6
    assert torch.equal(got[explored], randint_from_uniform(sched[4][0, 1], dims[-1])[explored])
    if rows >= 37 and dims[-1] > 1:  # both branches taken, and an explored row off the greedy action
        greedy = mlp_chain(x, ws, bs, backend="triton").argmax(dim=1)
        assert 0 < explored.sum() < rows and (got[explored] != greedy[explored]).any()


def test_epsilon_extremes():
    """ε = 1: every action is the random one of u[0, 1]; ε = 0: every action is Q's argmax."""
    x, ws, bs, _ = _case(53, [9, 16, 16, 7], seed=6)
    sched = _schedule(53, eps=1.0)
    assert torch.equal(_fused(x, ws, bs, sched), randint_from_uniform(sched[4][0, 1], 7))
    sched = _schedule(53, eps=0.0)
    assert torch.equal(_fused(x, ws, bs, sched), mlp_chain(x, ws, bs, backend="triton").argmax(dim=1))


def test_reference_agrees_where_the_argmax_is_clear():
    """The reference (torch Q, then epsilon_greedy_reference) gives the kernel's action on every row
    whose reference Q has a clear best action (gap above float rounding)."""
    x, ws, bs, _ = _case(200, [13, 32, 32, 9], seed=8)
    sched = _schedule(200)
    got = _fused(x, ws, bs, sched)
    want = mlp_chain_epsilon_greedy_reference(x, ws, bs, step=sched[0], start=sched[1], end=sched[2],
                                              duration=sched[3], u=sched[4])
    assert torch.equal(_fused(x, ws, bs, sched, backend="torch"), want)
    top2 = mlp_chain_reference(x, ws, bs).detach().topk(2, dim=1).values
    clear = (top2[:, 0] - top2[:, 1]) > 1e-4
    assert clear.sum() > 150
    assert torch.equal(got[clear], want[clear])
    assert not torch.equal(got, torch.zeros_like(got))


def test_nan_column_and_ties_follow_argmax():
    """Action 3's weight row NaN: Q[:, 3] NaN in every row, the greedy action 3 (NaN largest,
    torch.argmax); equal weight rows 1 and 4 dominating the rest: the first, 1."""
    x, ws, bs, _ = _case(17, [6, 8, 5], seed=10)
    sched = _schedule(17, eps=0.0)
    nan_ws = [w.clone() for w in ws]
    nan_ws[-1][3] = float("nan")
    assert torch.equal(_fused(x, nan_ws, bs, sched), torch.full((17,), 3))
    tie_ws, tie_bs = [w.clone() for w in ws], [b.clone() for b in bs]
    tie_ws[-1][4] = tie_ws[-1][1]
    tie_bs[-1][1] = tie_bs[-1][4] = 100.0
    assert torch.equal(_fused(x, tie_ws, tie_bs, sched), torch.full((17,), 1))


def test_no_rows_and_trainable_weights():
    """B = 0 gives an empty int64 result; weights that require grad, grad mode on: actions all the
    same (nothing saved, nothing to differentiate)."""
    x, ws, bs, _ = _case(0, [4, 8, 2])
    got = _fused(x, ws, bs, _schedule(0))
    assert got.dtype == torch.int64 and got.shape == (0,)
    x, ws, bs, _ = _case(23, [4, 8, 2], seed=3)
    sched = _schedule(23)
    want = _fused(x, ws, bs, sched)
    trainable = [w.clone().requires_grad_(True) for w in ws]
    got = _fused(x, trainable, bs, sched)
    assert not got.requires_grad and torch.equal(got, want)


BAD = [
    (lambda a: a.update(start=a["start"].repeat(2), end=a["end"].repeat(2), duration=a["duration"].repeat(2)),
     r"mlp_chain_epsilon_greedy: start, end and duration must hold one schedule \(G = 1, one network\), got G = 2"),
    (lambda a: a.update(u=a["u"][:, :, :-1].contiguous()),
     r"mlp_chain_epsilon_greedy: u must be a contiguous float32 tensor \[1, 2, 11\]"),
    (lambda a: a.update(step=a["step"].to(torch.int32)), r"mlp_chain_epsilon_greedy: step must be a 0-d int64 tensor"),
    (lambda a: a.update(end=a["end"].double()), r"mlp_chain_epsilon_greedy: end must be a contiguous float32"),
    (lambda a: a.update(weights=a["weights"] * 3),
     r"mlp_chain_epsilon_greedy: weights must hold 1 to 4 layers and biases one per layer, got 6 weights"),
    (lambda a: a.update(x=a["x"].double()), r"mlp_chain_epsilon_greedy: x must be a contiguous float32 \[B, D0\]"),
]


@pytest.mark.parametrize("change,match", BAD)
def test_bad_arguments(change, match):
    x, ws, bs, _ = _case(11, [4, 8, 3])
    step, start, end, duration, u = _schedule(11)
    args = dict(x=x, weights=ws, biases=bs, step=step, start=start, end=end, duration=duration, u=u)
    change(args)
    for backend in ("triton", "torch"):
        with pytest.raises(ValueError, match=match):
            mlp_chain_epsilon_greedy(**args, backend=backend)


def _net(activation="relu"):
    torch.manual_seed(4)
    return QNetwork(MLPEncoder(9, [16, 16], activation=activation), QHead(16, 5), chain_backend="triton")


@pytest.fixture
def calls(monkeypatch):
    """The calls act() makes of mlp_chain_epsilon_greedy (then the real op)."""
    made = []
    real = act_mod.mlp_chain_epsilon_greedy
    monkeypatch.setattr(act_mod, "mlp_chain_epsilon_greedy", lambda *a, **k: made.append(1) or real(*a, **k))
    return made


def test_act_takes_the_fused_op_for_a_plain_head(calls):
    """A plain-head ReLU QNetwork with one schedule: act() runs mlp_chain_epsilon_greedy, the
    actions of epsilon_greedy on the network's modules' Q wherever its argmax is clear;
    backend="torch" runs the modules and the reference."""
    net = _net()
    obs = torch.randn(200, 9)
    sched = _schedule(200)
    with torch.no_grad():
        got = act(net, obs, *sched)
        assert len(calls) == 1
        assert torch.equal(got, _two_ops(obs, *net.fused_chain(obs), sched))  # the same Q, the same actions
        q = net.head(net.encoder(obs))
        want = epsilon_greedy(q, *sched, backend="torch")
        top2 = q.topk(2, dim=1).values
        clear = (top2[:, 0] - top2[:, 1]) > 1e-4
        assert clear.sum() > 150
        assert torch.equal(got[clear], want[clear])
        assert torch.equal(act(net, obs, *sched, backend="torch"), want)
    assert len(calls) == 1


def test_act_falls_back_for_two_schedules_or_another_activation(calls):
    """G = 2 schedules for one network's 40 rows, or a tanh MLP (mlp_chain does not apply): the
    network, then epsilon_greedy."""
    obs = torch.randn(40, 9)
    with torch.no_grad():
        net = _net()
        sched = _schedule(40, groups=2)
        assert torch.equal(act(net, obs, *sched), epsilon_greedy(net(obs), *sched, backend="torch"))
        net = _net("tanh")
        sched = _schedule(40)
        assert torch.equal(act(net, obs, *sched), epsilon_greedy(net(obs), *sched, backend="torch"))
    assert not calls


GPU_SHAPES = [(10, CARTPOLE), (4096, CARTPOLE), (1000, [9, 128, 120, 84, 45])]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["high", "highest"])
@pytest.mark.parametrize("rows,dims", GPU_SHAPES)
def test_gpu_equals_two_ops_one_kernel_capture(matmul_precision, precision, rows, dims):
    """CUDA, TF32 and full float32: the two ops' actions bit for bit; one kernel launch; a captured
    replay after the inputs change in place equals an eager call, without host sync."""
    from support import cuda_kernels

    matmul_precision(precision)
    x, ws, bs, _ = _case(rows, dims, seed=9, device="cuda")
    sched = _schedule(rows, device="cuda")
    with torch.no_grad():
        assert torch.equal(_fused(x, ws, bs, sched, "auto"), _two_ops(x, ws, bs, sched))
        n, names = cuda_kernels(lambda: _fused(x, ws, bs, sched, "auto"))
    assert n == 1 and "mlp_forward" in names[0], names

    def step():
        with torch.no_grad():
            return _fused(x, ws, bs, sched, "auto")

    def change():
        x.mul_(-0.5)
        sched[0].add_(30)
        sched[4].copy_(sched[4].flip(2))

    assert_replay_equals_eager(step, change)
