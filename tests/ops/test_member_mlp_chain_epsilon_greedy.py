"""foxdqn.ops.member_mlp_chain_epsilon_greedy and its place in foxdqn.step.act: the kernel
(TRITON_INTERPRET=1 on CPU) gives exactly the actions of epsilon_greedy on member_mlp_chain's Q with
one schedule per member (depths 1 to 4, odd row counts, one action, cartpole_cleanrl's network at
the collect step's 10 envs, rows past a block, NaN rows, the chunked layers 2 and 3 at widths not a
multiple of the chunk); members never mix; ε = 0 and 1 per member; the reference's actions wherever
its argmax is clear; no rows; bad arguments; act() takes it for a population's plain head and not
for G = 1 schedules of P = 3 members or backend="torch"; a plain head wider than 128 acts through
its layers and epsilon_greedy. GPU (`gpu` marker): the two ops' actions bit for bit in TF32 and in
full float32, one kernel, capture = eager."""
from __future__ import annotations

import pytest
import torch

from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.epsilon_greedy import epsilon_greedy
from foxdqn.ops.member_mlp_chain import member_mlp_chain, member_mlp_chain_reference
from foxdqn.ops.member_mlp_chain_epsilon_greedy import (member_mlp_chain_epsilon_greedy,
                                                        member_mlp_chain_epsilon_greedy_reference)
from foxdqn.ops.member_uniform import randint_from_uniform

from support import assert_replay_equals_eager, require_compiled_kernels
from test_member_mlp_chain import CARTPOLE, _case

_need_compiled = require_compiled_kernels(INTERPRET)


def _schedule(members, rows, eps=None, seed=0, device="cpu"):
    """Per member: step 60 of a decay from 1 to 0.1 over 100 steps, member p's end ε 0.1 + 0.2 p
    (ε = 0.46, 0.54, ...: about half the rows explore), or ε fixed at ``eps[p]``; uniforms [P, 2, rows]."""
    g = torch.Generator().manual_seed(seed)
    if eps is not None:
        start = end = torch.tensor(eps, dtype=torch.float32)
    else:
        start, end = torch.ones(members), 0.1 + 0.2 * torch.arange(members, dtype=torch.float32)
    duration = torch.full((members,), 100.0)
    u = torch.rand(members, 2, rows, generator=g)
    step = torch.tensor(60, dtype=torch.int64)
    return [t.to(device) for t in (step, start, end, duration, u)]


def _fused(x, ws, bs, sched, backend="triton"):
    step, start, end, duration, u = sched
    return member_mlp_chain_epsilon_greedy(x, ws, bs, step=step, start=start, end=end, duration=duration, u=u,
                                           backend=backend)


def _q(x, ws, bs):
    with torch.no_grad():
        return member_mlp_chain(x, ws, bs, backend="triton")


def _two_ops(x, ws, bs, sched):
    q = _q(x, ws, bs)
    return epsilon_greedy(q.reshape(-1, q.shape[-1]), *sched, backend="triton")


SHAPES = [
    (1, 1, [4, 2]),  # one member, one layer, one row
    (3, 9, [7, 3, 1]),  # A = 1: every action 0
    (3, 10, CARTPOLE),  # cartpole_cleanrl's collect step: layers 2 and 3 chunked (84 = 2 chunks + 20)
    (2, 37, [9, 4, 1, 7]),  # a width 1 in the middle (one chunk of layer 2)
    (3, 41, [4, 2, 4, 7, 5]),  # depth 4
    (2, 300, [9, 16, 7, 3]),  # rows past a block
    (2, 19, [9, 128, 120, 84, 128]),  # the widest tiles, 128 actions
]


@pytest.mark.parametrize("members,rows,dims", SHAPES,
                         ids=[f"P{p}-B{b}-{'x'.join(map(str, d))}" for p, b, d in SHAPES])
def test_equals_epsilon_greedy_of_member_mlp_chain(members, rows, dims):
    """Bit for bit the two ops' actions (the same kernel computes Q), with a NaN row in the last
    member (Q all NaN there, argmax 0); each member's explored rows take its own random action."""
    x, ws, bs, _ = _case(members, rows, dims, seed=rows + len(dims))
    x[-1, rows // 2, 0] = float("nan")
    sched = _schedule(members, rows, seed=rows)
    got = _fused(x, ws, bs, sched)
    want = _two_ops(x, ws, bs, sched)
    assert got.dtype == torch.int64 and got.shape == (members * rows,)
    assert torch.equal(got, want)
    assert ((got >= 0) & (got < dims[-1])).all()
    eps = 1.0 - (1.0 - sched[2]) * 0.6  # ε_p at step 60
    explored = (sched[4][:, 0] < eps[:, None]).reshape(-1)
    assert torch.equal(got[explored], randint_from_uniform(sched[4][:, 1].reshape(-1), dims[-1])[explored])
    if rows >= 37 and dims[-1] > 1:  # both branches taken, and an explored row off the greedy action
        greedy = _q(x, ws, bs).argmax(dim=2).reshape(-1)
        assert 0 < explored.sum() < members * rows and (got[explored] != greedy[explored]).any()


@pytest.mark.parametrize("dims", [CARTPOLE, [9, 16, 70, 16, 7]], ids=["cartpole", "depth4"])
def test_chunked_equals_epsilon_greedy_of_member_mlp_chain(monkeypatch, dims):
    """On a grid of at least MIN_PROGRAMS programs (1 here: P = 512 on the GPU) the chunked layers
    2 and 3 compute Q in both launches: the actions the same bits as epsilon_greedy's of that Q."""
    import foxdqn.ops.member_mlp_chain as mod

    monkeypatch.setattr(mod, "MIN_PROGRAMS", 1)
    x, ws, bs, _ = _case(3, 10, dims, seed=21)
    sched = _schedule(3, 10, seed=21)
    assert torch.equal(_fused(x, ws, bs, sched), _two_ops(x, ws, bs, sched))


def test_members_never_mix():
    """Member 1's rows, weights and uniforms changed (a NaN weight included): member 0's actions
    stay bit for bit."""
    x, ws, bs, _ = _case(2, 45, CARTPOLE, seed=5)
    sched = _schedule(2, 45, seed=5)
    before = _fused(x, ws, bs, sched)[:45]
    x[1].mul_(-3.0)
    ws[1][1, 0, 0] = float("nan")
    sched[4][1].copy_(sched[4][1].flip(1))
    assert torch.equal(_fused(x, ws, bs, sched)[:45], before)


def test_epsilon_extremes_per_member():
    """ε = 1 for member 0: every action the random one of u[0, 1]; ε = 0 for member 1: Q's argmax."""
    x, ws, bs, _ = _case(2, 53, [9, 16, 40, 16, 7], seed=6)
    sched = _schedule(2, 53, eps=[1.0, 0.0])
    got = _fused(x, ws, bs, sched).view(2, 53)
    assert torch.equal(got[0], randint_from_uniform(sched[4][0, 1], 7))
    assert torch.equal(got[1], _q(x, ws, bs)[1].argmax(dim=1))


def test_reference_agrees_where_the_argmax_is_clear():
    """The reference (baddbmm Q, then epsilon_greedy_reference) gives the kernel's action on every
    row whose reference Q has a clear best action (gap above float rounding)."""
    x, ws, bs, _ = _case(3, 90, [13, 32, 50, 9], seed=8)
    sched = _schedule(3, 90)
    got = _fused(x, ws, bs, sched)
    want = member_mlp_chain_epsilon_greedy_reference(x, ws, bs, step=sched[0], start=sched[1], end=sched[2],
                                                     duration=sched[3], u=sched[4])
    assert torch.equal(_fused(x, ws, bs, sched, backend="torch"), want)
    top2 = member_mlp_chain_reference(x, ws, bs).reshape(-1, 9).topk(2, dim=1).values
    clear = (top2[:, 0] - top2[:, 1]) > 1e-4
    assert clear.sum() > 200
    assert torch.equal(got[clear], want[clear])
    assert not torch.equal(got, torch.zeros_like(got))


def test_no_rows():
    x, ws, bs, _ = _case(2, 0, [4, 8, 2])
    got = _fused(x, ws, bs, _schedule(2, 0))
    assert got.dtype == torch.int64 and got.shape == (0,)


BAD = [
    (lambda a: a.update(start=a["start"][:1], end=a["end"][:1], duration=a["duration"][:1]),
     r"member_mlp_chain_epsilon_greedy: start, end and duration must hold one schedule per member \(G = P = 2\), "
     r"got G = 1"),
    (lambda a: a.update(u=a["u"][:, :, :-1].contiguous()),
     r"member_mlp_chain_epsilon_greedy: u must be a contiguous float32 tensor \[2, 2, 11\]"),
    (lambda a: a.update(step=a["step"].to(torch.int32)),
     r"member_mlp_chain_epsilon_greedy: step must be a 0-d int64 tensor"),
    (lambda a: a.update(weights=a["weights"] * 3),
     r"member_mlp_chain_epsilon_greedy: weights must hold 1 to 4 layers and biases one per layer, got 6 weights"),
    (lambda a: a.update(x=a["x"].double()), r"member_mlp_chain_epsilon_greedy: x must be a float32 \[P, B, D0\]"),
]


@pytest.mark.parametrize("change,match", BAD)
def test_bad_arguments(change, match):
    x, ws, bs, _ = _case(2, 11, [4, 8, 3])
    step, start, end, duration, u = _schedule(2, 11)
    args = dict(x=x, weights=ws, biases=bs, step=step, start=start, end=end, duration=duration, u=u)
    change(args)
    for backend in ("triton", "torch"):
        with pytest.raises(ValueError, match=match):
            member_mlp_chain_epsilon_greedy(**args, backend=backend)


GPU_SHAPES = [(512, 10, CARTPOLE), (3, 4096, CARTPOLE), (2, 1000, [9, 128, 120, 84, 45])]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["high", "highest"])
@pytest.mark.parametrize("members,rows,dims", GPU_SHAPES)
def test_gpu_equals_two_ops_one_kernel_capture(matmul_precision, precision, members, rows, dims):
    """CUDA, TF32 and full float32: the two ops' actions bit for bit; one kernel launch; a captured
    replay after the inputs change in place equals an eager call, without host sync."""
    from support import cuda_kernels

    matmul_precision(precision)
    x, ws, bs, _ = _case(members, rows, dims, seed=9, device="cuda")
    sched = _schedule(members, rows, device="cuda")
    with torch.no_grad():
        assert torch.equal(_fused(x, ws, bs, sched, "auto"), _two_ops(x, ws, bs, sched))
        n, names = cuda_kernels(lambda: _fused(x, ws, bs, sched, "auto"))
    assert n == 1 and "member_forward" in names[0], names

    def step():
        with torch.no_grad():
            return _fused(x, ws, bs, sched, "auto")

    def change():
        x.mul_(-0.5)
        sched[0].add_(30)
        sched[4].copy_(sched[4].flip(2))

    assert_replay_equals_eager(step, change)
