"""foxdqn.ops.member_mlp_chain with a ChainGradNorm: the weight-gradient kernel also leaves each
member's gradient norm and clip coefficient (TRITON_INTERPRET=1 on CPU). Against
grad_norm_coefficient's reference of the same gradients: P = 1 and 3, odd widths, depths 1 to 4,
the split and the whole op, chunked layers, a clip that binds and one that does not; the gradients
bit for bit those without the norm; members never mix (a NaN stays in its member); the same bits on
every call; the count of backward passes; the reference path writes nothing; bad arguments. GPU
(`gpu` marker): 512 members of cartpole_cleanrl's network, still three launches, captured = eager."""
from __future__ import annotations

import pytest
import torch

import foxdqn.ops.member_mlp_chain as mod
from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.grad_norm import grad_norm_coefficient_reference
from foxdqn.ops.member_mlp_chain import ChainGradNorm, member_mlp_chain, member_mlp_chain_split

from support import capture_graph, no_host_sync, require_compiled_kernels
from test_member_mlp_chain import _case

_need_compiled = require_compiled_kernels(INTERPRET)

CARTPOLE = [4, 120, 84, 2]
SHAPES = [
    (1, 1, [4, 2]),  # one member, one layer, one row: one weight-gradient program
    (3, 17, [7, 1]),
    (3, 9, [4, 7, 2]),
    (1, 130, [4, 120, 1, 7]),  # a width 1 in the middle
    (3, 17, [9, 7, 128, 120, 2]),  # depth 4, the widest tiles
    (3, 130, CARTPOLE),
]
IDS = [f"P{p}-B{b}-{'x'.join(map(str, d))}" for p, b, d in SHAPES]


def _grads(x, ws, bs, up, norm=None, split=None, backend="triton"):
    """The gradients (W_1 .. W_n, b_1 .. b_n) of Σ y · up (rows < split with a split)."""
    ws = [w.detach().clone().requires_grad_(True) for w in ws]
    bs = [b.detach().clone().requires_grad_(True) for b in bs]
    if split is None:
        y = member_mlp_chain(x, ws, bs, norm=norm, backend=backend)
        return list(torch.autograd.grad(y, ws + bs, up))
    y, _ = member_mlp_chain_split(x, ws, bs, split, norm=norm, backend=backend)
    return list(torch.autograd.grad(y, ws + bs, up[:, :split]))


def _bound(members, value, device="cpu"):
    return torch.full((members,), value, dtype=torch.float32, device=device)


def _assert_norm(norm, grads, members):
    """norm's total and coef are grad_norm_coefficient's reference of ``grads`` to a few ulps."""
    total, coef = torch.empty_like(norm.max_norm), torch.empty_like(norm.max_norm)
    grad_norm_coefficient_reference(grads, norm.max_norm, total, coef, members=members)
    torch.testing.assert_close(norm.total, total, rtol=4e-7, atol=0)
    torch.testing.assert_close(norm.coef, coef, rtol=4e-7, atol=0)


@pytest.mark.parametrize("split", [None, "half"])
@pytest.mark.parametrize("members,rows,dims", SHAPES, ids=IDS)
def test_norm_is_grad_norm_of_the_gradients_and_leaves_them_bit_for_bit(members, rows, dims, split):
    """total and coef equal grad_norm_coefficient's reference of the gradients this backward
    returns (a few float32 ulps: another order of the sum); those gradients are the bits of the
    same backward without a norm. A bound below every member's norm (coef < 1) and one above (1)."""
    x, ws, bs, up = _case(members, rows, dims, seed=rows + len(dims))
    s = None if split is None else max(rows // 2, 1)
    plain = _grads(x, ws, bs, up, split=s)
    for bound in (1e-3, 1e6):
        norm = ChainGradNorm(_bound(members, bound), members)
        got = _grads(x, ws, bs, up, norm=norm, split=s)
        for a, e in zip(got, plain):
            assert torch.equal(a, e)
        _assert_norm(norm, got, members)
        assert norm.backwards == 1
        assert bool((norm.coef < 1).all()) if bound < 1 else bool((norm.coef == 1).all())


@pytest.mark.parametrize("members,rows,dims", [(2, 37, [5, 33, 70, 9]), (3, 130, CARTPOLE)])
def test_norm_with_chunked_layers(monkeypatch, members, rows, dims):
    """As a wide grid runs them (MIN_PROGRAMS 1 here: chunked layers, 32-unit weight-gradient tiles)."""
    monkeypatch.setattr(mod, "MIN_PROGRAMS", 1)
    x, ws, bs, up = _case(members, rows, dims, seed=5)
    norm = ChainGradNorm(_bound(members, 0.5), members)
    got = _grads(x, ws, bs, up, norm=norm, split=rows // 2)
    _assert_norm(norm, got, members)


def test_norm_members_never_mix_and_nan_stays_in_its_member():
    """A NaN in member 1's rows makes its total and coef NaN; members 0 and 2 keep their bits."""
    x, ws, bs, up = _case(3, 17, [4, 7, 2], seed=3)
    norm = ChainGradNorm(_bound(3, 1.0), 3)
    _grads(x, ws, bs, up, norm=norm)
    before = norm.total.clone(), norm.coef.clone()
    x[1, 4, 2] = float("nan")
    _grads(x, ws, bs, up, norm=norm)
    assert torch.isnan(norm.total[1]) and torch.isnan(norm.coef[1])
    for t, b in zip((norm.total, norm.coef), before):
        assert torch.equal(t[[0, 2]], b[[0, 2]])


def test_norm_same_bits_every_call_and_counts_backwards():
    x, ws, bs, up = _case(3, 33, CARTPOLE, seed=7)
    norm = ChainGradNorm(_bound(3, 2.0), 3)
    _grads(x, ws, bs, up, norm=norm)
    first = norm.total.clone(), norm.coef.clone()
    _grads(x, ws, bs, up, norm=norm)
    assert torch.equal(norm.total, first[0]) and torch.equal(norm.coef, first[1])
    assert norm.backwards == 2


def test_the_reference_path_and_no_gradient_write_nothing():
    """backend="torch" (the reference, autograd's layers) and a forward under no_grad leave the norm
    as it was and its count at 0: a caller then computes the norm itself."""
    x, ws, bs, up = _case(3, 9, [4, 7, 2], seed=1)
    norm = ChainGradNorm(_bound(3, 1.0), 3)
    norm.total.fill_(-1.0)
    _grads(x, ws, bs, up, norm=norm, backend="torch")
    _grads(x, ws, bs, up, norm=norm, split=4, backend="torch")
    with torch.no_grad():
        member_mlp_chain(x, ws, bs, norm=norm, backend="triton")
    assert norm.backwards == 0 and bool((norm.total == -1.0).all())


@pytest.mark.parametrize("make,match", [
    (lambda: ChainGradNorm(torch.ones(3, dtype=torch.float64), 3), "max_norm"),
    (lambda: ChainGradNorm(torch.ones(2), 3), "max_norm"),
])
def test_bad_norm(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_norm_of_another_member_count_is_refused():
    x, ws, bs, _ = _case(3, 9, [4, 7, 2])
    norm = ChainGradNorm(_bound(2, 1.0), 2)
    with pytest.raises(ValueError, match=r"norm.max_norm must be .*\[P\] = \[3\]"):
        member_mlp_chain(x, ws, bs, norm=norm, backend="triton")
    with pytest.raises(ValueError, match=r"norm.max_norm"):
        member_mlp_chain_split(x, ws, bs, 4, norm=norm, backend="triton")


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("members,rows", [(1, 256), (512, 256), (3, 4098)])
def test_gpu_norm_is_grad_norm_in_three_launches_and_captures(members, rows):
    """On CUDA (TF32 as configured): the split with a norm gives the gradients of the split without
    one bit for bit and grad_norm's reference norm of them; forward + backward stay three launches;
    a captured forward + backward replays to the eager norm with no host sync."""
    from support import cuda_kernels

    x, ws, bs, up = _case(members, rows, CARTPOLE, seed=rows, device="cuda")
    s = rows // 2
    norm = ChainGradNorm(_bound(members, 0.5, "cuda"), members)
    plain = _grads(x, ws, bs, up, split=s)
    got = _grads(x, ws, bs, up, norm=norm, split=s)
    for a, e in zip(got, plain):
        assert torch.equal(a, e)
    _assert_norm(norm, got, members)
    eager = norm.total.clone(), norm.coef.clone()
    params = [p.clone().requires_grad_(True) for p in ws + bs]
    dy = up[:, :s].contiguous()

    def step():
        return torch.autograd.grad(member_mlp_chain_split(x, params[:3], params[3:], s, norm=norm)[0], params, dy)

    n, names = cuda_kernels(step)
    assert n == 3, names
    norm.total.zero_()
    graph, _ = capture_graph(step)
    norm.total.zero_()
    with no_host_sync():
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(norm.total, eager[0]) and torch.equal(norm.coef, eager[1])
