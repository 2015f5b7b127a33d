"""foxdqn.ops.q_forward_epsilon_greedy and foxdqn.step.act: the kernel (TRITON_INTERPRET=1 on CPU)
gives exactly the actions of epsilon_greedy on q_forward's Q (one network and P = 3 members, 1 and
2 hidden layers, dueling and plain heads, odd row counts, TF32 on and off, NaN rows, ε = 0 and 1,
a schedule per member) and the reference's wherever the reference's argmax is clear; a NaN
column and a tie pick as torch.argmax; bad arguments; act() takes the fused op where the network
offers it and the two ops elsewhere (a plain head, G != P); QNetwork's no-gradient forward is its
modules'. GPU (`gpu` marker): eurusd_dqn's 4,096 rows and a population of 8 × 512, one kernel,
capture = eager without host sync, the collect step of eurusd_dqn launching it at 4,096 envs
and not at 64."""
from __future__ import annotations

import pytest
import torch

import foxdqn.nn.qnet as qnet_mod
from foxdqn.nn.heads import DuelingHead, QHead
from foxdqn.nn.mlp import MLPEncoder
from foxdqn.nn.qnet import QNetwork
from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.epsilon_greedy import epsilon_greedy
from foxdqn.ops.member_uniform import randint_from_uniform
from foxdqn.ops.q_forward import q_forward, q_forward_reference
from foxdqn.ops.q_forward_epsilon_greedy import q_forward_epsilon_greedy, q_forward_epsilon_greedy_reference
from foxdqn.step import act as act_mod
from foxdqn.step.act import act

from support import assert_replay_equals_eager, require_compiled_kernels
from test_q_forward import EURUSD, _case

_need_compiled = require_compiled_kernels(INTERPRET)


def _schedule(members, rows, eps=None, seed=0, device="cpu"):
    """step, start, end, duration ([P]: member p decays from 1 to 0.1·p over 100·(p + 1) steps) and
    uniforms [P, 2, M]; ``eps`` fixes ε (start = end) instead."""
    g = torch.Generator().manual_seed(seed)
    p = torch.arange(members, dtype=torch.float32)
    start, end = (torch.full((members,), eps), torch.full((members,), eps)) if eps is not None else \
        (torch.ones(members), 0.1 * p)
    duration = 100.0 * (p + 1)
    u = torch.rand(members, 2, rows, generator=g)
    step = torch.tensor(60, dtype=torch.int64)
    return [t.to(device) for t in (step, start, end, duration, u)]


def _fused(x, ws, bs, dueling, sched, backend="triton"):
    step, start, end, duration, u = sched
    return q_forward_epsilon_greedy(x, ws, bs, dueling=dueling, step=step, start=start, end=end, duration=duration,
                                    u=u, backend=backend)


def _two_ops(x, ws, bs, dueling, sched):
    q = q_forward(x, ws, bs, dueling=dueling, backend="triton")
    return epsilon_greedy(q.reshape(-1, q.shape[-1]), *sched, backend="triton")


# (P, M, [D0, H1, (H2)], A, dueling, population layout)
SHAPES = [
    (1, 1, [3, 5], 2, True, False),
    (1, 37, [13, 20, 24], 5, True, False),
    (1, 33, [162, 64, 64], 45, False, False),
    (1, 9, [7, 3], 1, False, False),  # A = 1: every action 0
    (3, 11, [13, 20, 24], 5, True, True),
    (3, 7, [162, 64], 64, False, True),
]


@pytest.mark.parametrize("tf32", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"P{s[0]}-M{s[1]}-A{s[3]}-{'duel' if s[4] else 'q'}" for s in SHAPES])
def test_equals_epsilon_greedy_of_q_forward(matmul_precision, shape, tf32):
    """Bit for bit the two ops' actions (the same kernel computes Q), also with NaN in some rows."""
    matmul_precision("high" if tf32 else "highest")
    members, rows, dims, actions, dueling, population = shape
    x, ws, bs = _case(members, rows, dims, actions, dueling, population, seed=5)
    x[..., rows // 2, 0] = float("nan")  # a NaN row: Q all NaN there, argmax 0
    sched = _schedule(members, rows)
    got = _fused(x, ws, bs, dueling, sched)
    assert got.dtype == torch.int64 and got.shape == (members * rows,)
    assert torch.equal(got, _two_ops(x, ws, bs, dueling, sched))
    assert ((got >= 0) & (got < actions)).all()


@pytest.mark.parametrize("population", [False, True])
def test_epsilon_extremes(population):
    """ε = 1: every action is the random one of u[:, 1]; ε = 0: every action is Q's argmax."""
    members = 3 if population else 1
    x, ws, bs = _case(members, 21, [9, 16, 16], 7, True, population, seed=6)
    sched = _schedule(members, 21, eps=1.0)
    assert torch.equal(_fused(x, ws, bs, True, sched), randint_from_uniform(sched[4][:, 1], 7).reshape(-1))
    sched = _schedule(members, 21, eps=0.0)
    q = q_forward(x, ws, bs, dueling=True, backend="triton")
    assert torch.equal(_fused(x, ws, bs, True, sched), q.reshape(-1, 7).argmax(dim=1))


def test_schedule_per_member():
    """Member p explores by its own ε: with ε = 1 for member 1 and 0 for the others only member 1's
    rows take the random actions."""
    x, ws, bs = _case(3, 40, [9, 16], 6, True, True, seed=7)
    step, _, _, duration, u = _schedule(3, 40)
    eps = torch.tensor([0.0, 1.0, 0.0])
    got = _fused(x, ws, bs, True, (step, eps, eps, duration, u)).view(3, 40)
    greedy = q_forward(x, ws, bs, dueling=True, backend="triton").argmax(dim=2)
    assert torch.equal(got[1], randint_from_uniform(u[1, 1], 6))
    assert torch.equal(got[[0, 2]], greedy[[0, 2]])


def test_reference_agrees_where_the_argmax_is_clear():
    """The reference (torch Q, then epsilon_greedy_reference) gives the kernel's action on every
    row whose reference Q has a clear best action (gap above float rounding)."""
    x, ws, bs = _case(1, 200, [13, 32, 32], 9, True, False, seed=8)
    sched = _schedule(1, 200)
    got = _fused(x, ws, bs, True, sched)
    want = q_forward_epsilon_greedy_reference(x, ws, bs, dueling=True, step=sched[0], start=sched[1], end=sched[2],
                                              duration=sched[3], u=sched[4])
    top2 = q_forward_reference(x, ws, bs, dueling=True).topk(2, dim=1).values
    clear = (top2[:, 0] - top2[:, 1]) > 1e-4
    assert clear.sum() > 150
    assert torch.equal(got[clear], want[clear])


def test_nan_column_and_ties_follow_argmax():
    """A plain head whose action 3 has a NaN weight row: Q[:, 3] is NaN in every row and the
    greedy action is 3 (NaN largest, torch.argmax); two equal weight rows 1 and 4 dominating the
    rest: the first, 1."""
    x, ws, bs = _case(1, 17, [6, 8], 5, False, False, seed=10)
    sched = _schedule(1, 17, eps=0.0)
    nan_ws = [w.clone() for w in ws]
    nan_ws[-1][3] = float("nan")
    assert torch.equal(_fused(x, nan_ws, bs, False, sched), torch.full((17,), 3))
    tie_ws, tie_bs = [w.clone() for w in ws], [b.clone() for b in bs]
    tie_ws[-1][4] = tie_ws[-1][1]
    tie_bs[-1][1] = tie_bs[-1][4] = 100.0  # actions 1 and 4 equal, above the others
    assert torch.equal(_fused(x, tie_ws, tie_bs, False, sched), torch.full((17,), 1))


BAD = [
    (lambda a: a.update(start=a["start"][:1].clone(), end=a["end"][:1].clone(), duration=a["duration"][:1].clone()),
     r"q_forward_epsilon_greedy: start, end and duration must hold one schedule per member \(G = P = 3\), got G = 1"),
    (lambda a: a.update(u=a["u"][:, :, :-1].contiguous()),
     r"q_forward_epsilon_greedy: u must be a contiguous float32 tensor \[3, 2, 11\]"),
    (lambda a: a.update(step=a["step"].to(torch.int32)), r"q_forward_epsilon_greedy: step must be a 0-d int64 tensor"),
    (lambda a: a.update(start=a["start"].double()), r"q_forward_epsilon_greedy: start must be a contiguous float32"),
    (lambda a: a.update(weights=a["weights"][:1]), r"q_forward_epsilon_greedy: weights must hold 1 or 2 hidden layers"),
    (lambda a: a.update(x=a["x"].requires_grad_(True)),
     r"q_forward_epsilon_greedy: x requires grad with grad mode on"),
]


@pytest.mark.parametrize("change,match", BAD)
def test_bad_arguments(change, match):
    x, ws, bs = _case(3, 11, [13, 20], 5, True, True)
    step, start, end, duration, u = _schedule(3, 11)
    args = dict(x=x, weights=ws, biases=bs, dueling=True, step=step, start=start, end=end, duration=duration, u=u)
    change(args)
    with pytest.raises(ValueError, match=match):
        q_forward_epsilon_greedy(**args, backend="triton")


def _net(head, hidden=(16, 16), actions=5):
    torch.manual_seed(4)
    return QNetwork(MLPEncoder(9, list(hidden)), head(hidden[-1], actions), chain_backend="triton")


@pytest.fixture
def any_rows(monkeypatch):
    """QNetwork offers q_forward from 1 row (the tests' small batches; runs: Q_FORWARD_MIN_ROWS)."""
    monkeypatch.setattr(qnet_mod, "Q_FORWARD_MIN_ROWS", 1)


@pytest.mark.parametrize("head,fused", [(DuelingHead, True), (QHead, False)])
def test_act_takes_the_fused_op_where_offered(monkeypatch, any_rows, head, fused):
    """act() runs q_forward_epsilon_greedy for a dueling QNetwork (q_forward_args) and the network
    plus epsilon_greedy otherwise: the actions of epsilon_greedy on the network's modules' Q
    wherever its argmax is clear; backend="torch" never fuses."""
    calls = []
    real = act_mod.q_forward_epsilon_greedy
    monkeypatch.setattr(act_mod, "q_forward_epsilon_greedy", lambda *a, **k: calls.append(1) or real(*a, **k))
    net = _net(head)
    obs = torch.randn(200, 9)
    step, start, end, duration, u = _schedule(1, 200)
    with torch.no_grad():
        got = act(net, obs, step, start, end, duration, u)
        assert len(calls) == int(fused)
        q = net.head(net.encoder(obs))  # the modules
        want = epsilon_greedy(q, step, start, end, duration, u, backend="torch")
        top2 = q.topk(2, dim=1).values
        clear = (top2[:, 0] - top2[:, 1]) > 1e-4
        assert clear.sum() > 150
        assert torch.equal(got[clear], want[clear])
        assert torch.equal(act(net, obs, step, start, end, duration, u, backend="torch"), want)
    assert len(calls) == int(fused)


def test_act_falls_back_when_the_schedules_are_not_one_per_member(monkeypatch, any_rows):
    """G = 2 schedules for one network's 40 rows: the fused op does not apply (it takes one per
    member); act() runs the network and epsilon_greedy with the two groups."""
    calls = []
    monkeypatch.setattr(act_mod, "q_forward_epsilon_greedy", lambda *a, **k: calls.append(1))
    net = _net(DuelingHead)
    obs = torch.randn(40, 9)
    step, start, end, duration, u = _schedule(2, 20)
    with torch.no_grad():
        got = act(net, obs, step, start, end, duration, u)
        assert not calls
        assert torch.equal(got, epsilon_greedy(net(obs), step, start, end, duration, u, backend="torch"))


def test_qnetwork_forward_without_gradients_is_the_modules(any_rows):
    """A dueling QNetwork's no-gradient forward (q_forward, in the interpreter) equals its modules'."""
    net = _net(DuelingHead, hidden=(24, 17))
    obs = torch.randn(37, 9)
    with torch.no_grad():
        torch.testing.assert_close(net(obs), net.head(net.encoder(obs)), rtol=1e-5, atol=1e-5)
    assert net(obs).requires_grad  # grad mode on, trainable weights: the modules


def test_qnetwork_offers_q_forward_only_where_it_applies(monkeypatch):
    """q_forward_args: None with grad mode on and trainable weights, below Q_FORWARD_MIN_ROWS rows,
    for a 3-layer encoder, for a CPU input under chain_backend="auto"; (weights, biases, True) in
    q_forward's order otherwise."""
    net = _net(DuelingHead)
    monkeypatch.setattr(qnet_mod, "Q_FORWARD_MIN_ROWS", 4)
    obs = torch.randn(4, 9)
    assert net.q_forward_args(obs) is None  # grad mode on, weights require grad
    with torch.no_grad():
        weights, biases, dueling = net.q_forward_args(obs)
        assert dueling and weights == [net.encoder._layers[0][0].weight, net.encoder._layers[1][0].weight,
                                       net.head.value.weight, net.head.advantage.weight]
        assert net.q_forward_args(obs[:3]) is None  # fewer rows than Q_FORWARD_MIN_ROWS
        assert _net(DuelingHead, hidden=(8, 8, 8)).q_forward_args(obs) is None
        net.chain_backend = "auto"
        assert net.q_forward_args(obs) is None


@pytest.mark.gpu
@pytest.mark.parametrize("population", [False, True])
def test_gpu_equals_two_ops_one_kernel_capture(population):
    """CUDA, eurusd_dqn's network, 4,096 rows (one network) or 8 × 512 (members): the two ops'
    actions bit for bit; one kernel launch; a captured replay after the inputs change in place
    equals an eager call, without host sync."""
    from support import cuda_kernels

    members, rows = (8, 512) if population else (1, 4096)
    x, ws, bs = _case(members, rows, EURUSD, 45, True, population, seed=9, device="cuda")
    sched = _schedule(members, rows, device="cuda")
    with torch.no_grad():
        assert torch.equal(_fused(x, ws, bs, True, sched, "auto"), _two_ops(x, ws, bs, True, sched))
        n, names = cuda_kernels(lambda: _fused(x, ws, bs, True, sched, "auto"))
    assert n == 1 and "q_forward" in names[0], names

    def step():
        with torch.no_grad():
            return _fused(x, ws, bs, True, sched, "auto")

    def change():
        x.mul_(-0.5)
        sched[0].add_(40)
        sched[4].copy_(sched[4].flip(2))

    assert_replay_equals_eager(step, change)
