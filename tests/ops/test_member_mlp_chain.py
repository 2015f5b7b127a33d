"""foxdqn.ops.member_mlp_chain: the kernels (TRITON_INTERPRET=1 on CPU) against the baddbmm + relu
reference, y and the gradients of every weight and bias: P = 1 and 3, B = 1, 17 and 130, widths 1,
7, 120 and 128, depths 1 to 4; an x that is a half of a stacked pair (a member stride of its own);
NaN propagation; members never mix (member 1's inputs and weights changed, NaN included, leave
member 0's y and gradients bit for bit); the same bits on every call; no gradient / frozen weights;
an input that needs a gradient; B = 0; the TF32 path against a float64 emulation; the tile choice;
bad arguments. The split (member_mlp_chain_split: the rows of a Double DQN pair, a gradient for the
first S rows only): the same bits as the whole op's y and its gradients with dy 0 beyond S, the
reference's values, S = 0 and S = B, a stacked pair's member stride, bad S. GPU (`gpu` marker): kernel = reference on CUDA, three launches forward + backward,
CUDA-graph capture = eager."""
from __future__ import annotations

import pytest
import torch

import foxdqn.ops.member_mlp_chain as mod
from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.member_mlp_chain import (member_mlp_chain, member_mlp_chain_reference, member_mlp_chain_split,
                                         member_mlp_chain_supported)

from support import assert_close_ulps, capture_graph, no_host_sync, require_compiled_kernels, round_tf32

_need_compiled = require_compiled_kernels(INTERPRET)

CARTPOLE = [4, 120, 84, 2]


def _case(members, rows, dims, seed=0, device="cpu"):
    """x [P, B, D0], weights [P, in, out] and biases [P, 1, out] (1/sqrt(fan-in) scale: about half
    the pre-activations negative), the upstream gradient dy [P, B, Dn]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(members, rows, dims[0], generator=g)
    ws = [torch.randn(members, i, o, generator=g) / i ** 0.5 for i, o in zip(dims[:-1], dims[1:])]
    bs = [torch.randn(members, 1, o, generator=g) * 0.2 for o in dims[1:]]
    up = torch.randn(members, rows, dims[-1], generator=g)
    return x.to(device), [w.to(device) for w in ws], [b.to(device) for b in bs], up.to(device)


def _run(fn, x, ws, bs, up, **kw):
    """y and the gradients (W_1 .. W_n, b_1 .. b_n) of Σ y · up."""
    ws = [w.detach().clone().requires_grad_(True) for w in ws]
    bs = [b.detach().clone().requires_grad_(True) for b in bs]
    y = fn(x, ws, bs, **kw)
    return [y.detach(), *torch.autograd.grad(y, ws + bs, up)]


def _kernel(x, ws, bs):
    return member_mlp_chain(x, ws, bs, backend="triton")


def _names(n):
    return ["y", *(f"dW{i + 1}" for i in range(n)), *(f"db{i + 1}" for i in range(n))]


SHAPES = [
    (1, 1, [4, 2]),  # one member, one layer, one row
    (3, 17, [7, 1]),  # one output
    (3, 1, [4, 7, 2]),  # one row per member
    (1, 130, [4, 120, 1, 7]),  # a width 1 in the middle, rows past a block
    (3, 17, [9, 7, 128, 120, 2]),  # depth 4, the widest tiles
    (3, 130, CARTPOLE),  # cartpole_cleanrl's network, rows past two blocks
    (3, 17, [128, 1, 7, 3]),  # D0 = 128
]


@pytest.mark.parametrize("members,rows,dims", SHAPES,
                         ids=[f"P{p}-B{b}-{'x'.join(map(str, d))}" for p, b, d in SHAPES])
def test_kernel_equals_reference_with_gradients(members, rows, dims):
    x, ws, bs, up = _case(members, rows, dims, seed=rows + len(dims))
    got = _run(_kernel, x, ws, bs, up)
    want = _run(member_mlp_chain_reference, x, ws, bs, up)
    assert got[0].shape == (members, rows, dims[-1]) and got[0].is_contiguous()
    for a, e, name in zip(got, want, _names(len(ws))):
        assert a.shape == e.shape, name
        torch.testing.assert_close(a, e, rtol=1e-5, atol=2e-5, msg=name)  # float32 sums in another order
    if len(dims) > 2 and rows >= 17:  # both sides of the first ReLU are exercised
        z1 = torch.baddbmm(bs[0], x, ws[0])
        assert (z1 > 0).any() and (z1 < 0).any()


CHUNKED = [s for s in SHAPES if len(s[2]) >= 4] + [(2, 37, [5, 33, 70, 9]), (2, 9, [3, 7, 1, 5])]


@pytest.mark.parametrize("members,rows,dims", CHUNKED,
                         ids=[f"P{p}-B{b}-{'x'.join(map(str, d))}" for p, b, d in CHUNKED])
def test_chunked_layers_equal_reference_with_gradients(monkeypatch, members, rows, dims):
    """Layers 2 and 3 by chunks of CHUNK_N units (forward) and CHUNK_N_DZ (dz), as a grid of at
    least MIN_PROGRAMS programs takes them (MIN_PROGRAMS 1 here): y and every gradient equal the
    reference to float rounding, through the split too (widths 70 and 7: a partial last chunk, one
    chunk; a width 1 between)."""
    chunks = []
    real = mod._chunk
    monkeypatch.setattr(mod, "MIN_PROGRAMS", 1)
    monkeypatch.setattr(mod, "_chunk", lambda *a: chunks.append(real(*a)) or chunks[-1])
    x, ws, bs, up = _case(members, rows, dims, seed=rows + 3 * len(dims))
    got = _run(_kernel, x, ws, bs, up)
    want = _run(member_mlp_chain_reference, x, ws, bs, up)
    for a, e, name in zip(got, want, _names(len(ws))):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=2e-5, msg=name)
    assert chunks == [mod.CHUNK_N, mod.CHUNK_N_DZ]
    half = rows // 2
    got = _run(lambda *a: member_mlp_chain_split(*a, half, backend="triton")[0], x, ws, bs, up[:, :half])
    want = _run(lambda *a: member_mlp_chain_reference(*a)[:, :half], x, ws, bs, up[:, :half])
    for a, e, name in zip(got, want, _names(len(ws))):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=2e-5, msg=f"split {name}")


def test_chunks_only_on_a_wide_grid():
    """Whole layers for fewer than 3 layers or a grid of fewer than MIN_PROGRAMS programs (at P = 1
    the chunks measured slower on the H200), chunks otherwise."""
    assert mod._chunk(32, 3, (2, 512)) == 32 and mod._chunk(32, 4, (mod.MIN_PROGRAMS, 1)) == 32
    assert mod._chunk(32, 3, (16, 1)) == 0 and mod._chunk(32, 2, (2, 512)) == 0
    assert mod._chunk(32, 3, (1, mod.MIN_PROGRAMS - 1)) == 0


def test_reference_is_the_member_layers():
    """member_mlp_chain_reference is member_linear + relu as MemberQNetwork stacks them, and each
    member's y is its classic network's (nn.Linear of the transposed weight)."""
    from foxdqn.population.layers import member_linear

    x, ws, bs, _ = _case(3, 11, [4, 7, 5, 3], seed=1)
    h = x
    for i, (w, b) in enumerate(zip(ws, bs)):
        h = member_linear(h, w, b)
        h = torch.relu(h) if i < 2 else h
    got = member_mlp_chain_reference(x, ws, bs)
    torch.testing.assert_close(got, h, rtol=0, atol=0)
    for p in range(3):
        z = x[p]
        for i, (w, b) in enumerate(zip(ws, bs)):
            z = torch.nn.functional.linear(z, w[p].t(), b[p, 0])
            z = torch.relu(z) if i < 2 else z
        torch.testing.assert_close(got[p], z, rtol=1e-6, atol=1e-6)


def test_stacked_pair_half_at_a_member_stride():
    """x = pair[:, 1] of a [P, 2, B, D] pair (the target network's s'): not contiguous, its
    members at stride 2·B·D; the kernels read it in place, forward and weight gradients."""
    pair = torch.randn(3, 2, 17, 4, generator=torch.Generator().manual_seed(2))
    _, ws, bs, up = _case(3, 17, CARTPOLE, seed=3)
    x = pair[:, 1]
    assert not x.is_contiguous() and member_mlp_chain_supported(x, ws, bs)
    got = _run(_kernel, x, ws, bs, up)
    want = _run(member_mlp_chain_reference, x.contiguous(), ws, bs, up)
    for a, e, name in zip(got, want, _names(3)):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=2e-5, msg=name)


def test_members_never_mix():
    """Member 1's rows, weights and biases replaced (a NaN and an inf among them): member 0's and
    member 2's y and gradients are the same bits; member 1's change (all but db3 = Σ dy)."""
    x, ws, bs, up = _case(3, 40, [4, 24, 17, 3], seed=4)
    first = _run(_kernel, x, ws, bs, up)
    x2, ws2, bs2 = x.clone(), [w.clone() for w in ws], [b.clone() for b in bs]
    x2[1] = torch.randn(40, 4)
    x2[1, 3, 0] = float("nan")
    ws2[1][1] *= -2.0
    ws2[1][1][0, 5] = float("inf")
    bs2[2][1] += 1.0
    second = _run(_kernel, x2, ws2, bs2, up)
    for a, e, name in zip(first, second, _names(3)):
        for p in (0, 2):
            assert torch.equal(a[p], e[p]), (name, p)
        if name != "db3":
            assert not torch.equal(a[1].nan_to_num(), e[1].nan_to_num()), name


def test_nan_propagates_as_torch():
    """A NaN in member 0's row 3 of x: that row's y is NaN and no other row's; relu keeps NaN and
    its gradient passes where h is NaN (threshold_backward), so the NaN reaches member 0's weight
    gradients as in autograd (compared NaN for NaN with the reference); member 1 is untouched."""
    x, ws, bs, up = _case(2, 9, [4, 6, 5, 2], seed=5)
    x[0, 3, 1] = float("nan")
    got = _run(_kernel, x, ws, bs, up)
    want = _run(member_mlp_chain_reference, x, ws, bs, up)
    y = got[0]
    assert y[0, 3].isnan().all() and not y[0, [0, 1, 2, 4, 5, 6, 7, 8]].isnan().any()
    assert not any(g[1].isnan().any() for g in got)
    for a, e, name in zip(got, want, _names(3)):
        assert torch.equal(a.isnan(), e.isnan()), name
        torch.testing.assert_close(a, e, rtol=1e-5, atol=2e-5, equal_nan=True, msg=name)


def test_pre_activations_exactly_zero():
    """A unit with zero weights and bias (pre-activation exactly 0 on every row) and all-zero rows
    with zero biases: relu'(0) = 0 as in autograd, so they pass no gradient down."""
    x, ws, bs, up = _case(2, 12, [4, 8, 6, 3], seed=6)
    ws[0][:, :, 0] = 0.0
    bs[0].zero_()
    x[:, [0, 5]] = 0.0
    got = _run(_kernel, x, ws, bs, up)
    want = _run(member_mlp_chain_reference, x, ws, bs, up)
    for a, e, name in zip(got, want, _names(3)):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6, msg=name)
    dw1, dw2 = got[1], got[2]
    assert torch.equal(dw1[:, :, 0], torch.zeros(2, 4)) and torch.equal(dw2[:, 0], torch.zeros(2, 6))
    assert dw1.abs().sum() > 0 and dw2.abs().sum() > 0


def test_same_bits_every_call():
    x, ws, bs, up = _case(2, 130, [9, 128, 84, 2], seed=7)
    first, second = _run(_kernel, x, ws, bs, up), _run(_kernel, x, ws, bs, up)
    for a, e, name in zip(first, second, _names(3)):
        assert torch.equal(a, e), name


def test_no_grad_and_frozen_weights(monkeypatch):
    """Under no_grad, and with weights that need no gradient (the target network), the forward
    alone runs and saves nothing: same y, nothing to differentiate."""
    x, ws, bs, _ = _case(2, 37, CARTPOLE, seed=8)
    saves = []
    real = mod._forward
    monkeypatch.setattr(mod, "_forward", lambda *a, **k: saves.append(k["save"]) or real(*a, **k))
    want = member_mlp_chain_reference(x, ws, bs)
    y = _kernel(x, ws, bs)
    assert not y.requires_grad
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)
    trained = [w.clone().requires_grad_(True) for w in ws]
    with torch.no_grad():
        y = _kernel(x, trained, bs)
    assert not y.requires_grad and y.grad_fn is None
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)
    assert saves == [False, False]


def test_only_the_parameters_that_need_a_gradient():
    x, ws, bs, up = _case(2, 20, [4, 6, 2], seed=9)
    w1 = ws[0].clone().requires_grad_(True)
    b2 = bs[1].clone().requires_grad_(True)
    y = _kernel(x, [w1, ws[1]], [bs[0], b2])
    gw1, gb2 = torch.autograd.grad(y, (w1, b2), up)
    w1r, b2r = w1.detach().clone().requires_grad_(True), b2.detach().clone().requires_grad_(True)
    want = torch.autograd.grad(member_mlp_chain_reference(x, [w1r, ws[1]], [bs[0], b2r]), (w1r, b2r), up)
    torch.testing.assert_close(gw1, want[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gb2, want[1], rtol=1e-5, atol=1e-6)


def test_input_that_needs_a_gradient_runs_the_reference():
    x, ws, bs, up = _case(2, 9, [4, 6, 2], seed=10)
    xg = x.clone().requires_grad_(True)
    (dx,) = torch.autograd.grad(_kernel(xg, ws, bs), xg, up)
    xr = x.clone().requires_grad_(True)
    (dx_ref,) = torch.autograd.grad(member_mlp_chain_reference(xr, ws, bs), xr, up)
    torch.testing.assert_close(dx, dx_ref, rtol=0, atol=0)


def test_empty_batch():
    x, ws, bs, up = _case(3, 0, [4, 6, 2])
    got = _run(_kernel, x, ws, bs, up)
    assert got[0].shape == (3, 0, 2)
    for g, p in zip(got[1:], ws + bs):
        assert torch.equal(g, torch.zeros_like(p))


def test_tiles_grow_with_members():
    """Few members: mlp_chain's 16-row and 16-unit tiles (enough programs for the GPU); many
    members: up to MAX_BLOCK_M rows (the dz kernel MAX_BLOCK_M_DZ) and MAX_BLOCK_N units, never
    more than B or a width needs."""
    assert mod._block_m(256, 1) == 16 and mod._block_m(256, 512) == mod.MAX_BLOCK_M == 128
    assert mod._block_m(256, 512, mod.MAX_BLOCK_M_DZ) == mod.MAX_BLOCK_M_DZ == 64
    assert mod._block_m(128, 128) == 32 and mod._block_m(100, 512) == 128
    assert mod._block_m(256, 64) == 32 and mod._block_m(256, 16) == 16 and mod._block_m(20, 512) == 32
    dims = CARTPOLE
    meta = mod._layout(dims)
    assert [mod._units(dims, 1, meta)[f"N{i}"] for i in (1, 2, 3, 4)] == [16, 16, 16, 16]
    assert [mod._units(dims, 512, meta)[f"N{i}"] for i in (1, 2, 3, 4)] == [32, 32, 16, 16]



def test_a_forward_that_saves_nothing_takes_at_least_32_rows(monkeypatch):
    """The target network's forward (no activations saved) never launches the 16-row tile, which
    Triton 3.6 compiles for 20 s on the H200 (docs/bench.md#start-up); the saving forward of the
    same batch still does, and both give the reference's y."""
    assert mod.MIN_BLOCK_M_NO_SAVE == 32
    assert mod._block_m(128, 1, least=mod.MIN_BLOCK_M_NO_SAVE) == 32 and mod._block_m(10, 1, least=32) == 32
    assert mod._block_m(256, 512, least=32) == 128  # many members: the usual larger tiles
    tiles = []
    real = mod._member_forward_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **meta):
                tiles.append((meta["SAVE"], meta["BLOCK_M"]))
                return real[grid](*args, **meta)
            return launch

    monkeypatch.setattr(mod, "_member_forward_kernel", Spy())
    x, ws, bs, up = _case(1, 40, CARTPOLE, seed=12)
    want = member_mlp_chain_reference(x, ws, bs)
    torch.testing.assert_close(_kernel(x, ws, bs), want, rtol=1e-5, atol=1e-6)  # frozen weights: no save
    trained = [w.clone().requires_grad_(True) for w in ws]
    torch.testing.assert_close(_kernel(x, trained, bs).detach(), want, rtol=1e-5, atol=1e-6)
    assert tiles == [(False, 32), (True, 16)]


# ------------------------------------------------------------------------------ TF32
def test_tf32_path_rounds_operands(monkeypatch):
    """With TF32 chosen (as on CUDA under matmul precision "high") every product's operands are
    rounded to TF32: y and the weight gradients equal a float64 emulation of that arithmetic,
    layer by layer from the kernel's own activations, and differ from the IEEE run by TF32's
    error."""
    x, ws, bs, up = _case(2, 130, [9, 24, 3], seed=11)
    ieee = _run(_kernel, x, ws, bs, up)
    monkeypatch.setattr(mod, "_prec", lambda t: "tf32")
    wg = [w.clone().requires_grad_(True) for w in ws]
    bg = [b.clone().requires_grad_(True) for b in bs]
    y = _kernel(x, wg, bg)
    h1 = y.grad_fn.saved_tensors[3].detach()  # x, W_1, W_2, h_1
    got = [y.detach(), h1, *torch.autograd.grad(y, wg + bg, up)]

    def r(t):
        return round_tf32(t.float()).double()

    z1 = r(x) @ r(ws[0]) + bs[0].double()
    want_y = r(h1) @ r(ws[1]) + bs[1].double()
    dz1 = torch.where(h1 <= 0, 0.0, r(up) @ r(ws[1]).transpose(1, 2))
    want = [want_y, torch.where(z1 < 0, 0.0, z1), r(x).transpose(1, 2) @ r(dz1),
            r(h1).transpose(1, 2) @ r(up), dz1.sum(1, keepdim=True), up.double().sum(1, keepdim=True)]
    for a, e, name in zip(got, want, ["y", "h1", "dW1", "dW2", "db1", "db2"]):
        assert_close_ulps(a, e, rtol=1e-5, ulps=2**10, name=name)
    for a, i, name in zip([got[0], got[2], got[3]], ieee[:3], ["y", "dW1", "dW2"]):
        assert (a - i).abs().max() > 1e-4 * i.abs().max(), name  # TF32 did round


# ------------------------------------------------------------------------------ arguments
def _good():
    x, ws, bs, _ = _case(2, 5, [4, 6, 2])
    return dict(x=x, weights=ws, biases=bs)


@pytest.mark.parametrize("change,match", [
    (lambda a: a.update(x=torch.zeros(2, 5, 129), weights=[torch.zeros(2, 129, 6)] + a["weights"][1:]),
     r"width must be 1 to 128, got D0 = 129 \(x\)"),
    (lambda a: a.update(weights=[torch.zeros(2, 4, 129), torch.zeros(2, 129, 2)],
                        biases=[torch.zeros(2, 1, 129), a["biases"][1]]), r"got D1 = 129 \(weights\[0\]\)"),
    (lambda a: a.update(weights=[torch.zeros(2, 4, 4)] * 5, biases=[torch.zeros(2, 1, 4)] * 5),
     r"1 to 4 layers.*got 5 weights"),
    (lambda a: a.update(weights=[], biases=[]), r"1 to 4 layers.*got 0 weights"),
    (lambda a: a.update(biases=a["biases"][:1]), r"got 2 weights and 1 biases"),
    (lambda a: a.update(x=a["x"].double()), r"x must be a float32 \[P, B, D0\] tensor .*float64"),
    (lambda a: a.update(x=torch.zeros(2, 4, 5).transpose(1, 2)), r"x must be .*\(not contiguous\)"),
    (lambda a: a.update(x=torch.zeros(5, 4)), r"x must be a float32 \[P, B, D0\] tensor.*\[5, 4\]"),
    (lambda a: a.update(x=torch.zeros(0, 5, 4)), r"1 <= P <= 65535"),
    (lambda a: a.update(x=torch.zeros(3, 5, 4)), r"weights\[0\] must be a contiguous float32 \[3, 4, D1\]"),
    (lambda a: a["weights"].__setitem__(1, torch.zeros(2, 5, 2)), r"weights\[1\] must be .*\[2, 6, D2\]"),
    (lambda a: a["weights"].__setitem__(1, torch.zeros(2, 2, 6).transpose(1, 2)),
     r"weights\[1\] must be .*\(not contiguous\)"),
    (lambda a: a["weights"].__setitem__(0, a["weights"][0].half()), r"weights\[0\] must be .*float16"),
    (lambda a: a["biases"].__setitem__(0, torch.zeros(2, 6)), r"biases\[0\] must be a contiguous float32 \[2, 1, 6\]"),
    (lambda a: a["biases"].__setitem__(1, None), r"biases\[1\] must be .* got NoneType"),
    (lambda a: a.update(x=[[0.0] * 4]), r"x must be a tensor, got list"),
    (lambda a: a.update(backend="cuda"), "backend must be"),
])
def test_bad_arguments(change, match):
    args = _good()
    change(args)
    backend = args.pop("backend", "auto")
    with pytest.raises(ValueError, match=match):
        member_mlp_chain(args["x"], args["weights"], args["biases"], backend=backend)
    if backend == "auto":
        assert not member_mlp_chain_supported(args["x"], args["weights"], args["biases"])


def test_supported_limits():
    x, ws, bs, _ = _case(2, 3, [128, 128, 128, 128, 1])
    assert member_mlp_chain_supported(x, ws, bs) and member_mlp_chain_supported(**_good())
    assert not member_mlp_chain_supported(x, ws, bs[:3])


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("members,rows", [(1, 256), (64, 256), (512, 256), (3, 4097)])
def test_gpu_kernel_equals_reference_highest(matmul_precision, members, rows):
    """Matmul precision "highest": y equals baddbmm's to float32 sums; the weight gradients too at
    an upstream gradient of zeros but one row per member (no ReLU-boundary row can move a dz)."""
    matmul_precision("highest")
    x, ws, bs, up = _case(members, rows, CARTPOLE, seed=rows, device="cuda")
    up[:, 1:] = 0.0
    got = _run(_kernel, x, ws, bs, up)
    want = _run(member_mlp_chain_reference, x, ws, bs, up)
    for a, e, name in zip(got, want, _names(3)):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("members,rows", [(1, 256), (512, 256), (3, 4098)])
def test_gpu_split_is_the_whole_op_with_no_gradient_past_s(members, rows):
    """On CUDA: member_mlp_chain_split at S = B/2 (the Double DQN pair) gives the whole op's y bit
    for bit and its gradients for dy zeroed beyond S, in three launches."""
    from support import cuda_kernels

    x, ws, bs, up = _case(members, rows, CARTPOLE, seed=rows, device="cuda")
    y, y2, grads = _split_run(x, ws, bs, up, rows // 2)
    up[:, rows // 2:] = 0.0
    whole = _run(_kernel, x, ws, bs, up)
    assert torch.equal(torch.cat([y, y2], 1), whole[0])
    for a, e, name in zip(grads, whole[1:], _names(3)[1:]):
        assert torch.equal(a, e), name
    params = [p.clone().requires_grad_(True) for p in ws + bs]
    dy = up[:, :rows // 2].contiguous()  # as the loss gives it (a slice of P > 1 members would add a copy)
    n, names = cuda_kernels(lambda: torch.autograd.grad(
        member_mlp_chain_split(x, params[:3], params[3:], rows // 2)[0], params, dy))
    assert n == 3, names


@pytest.mark.gpu
def test_gpu_kernel_counts_and_capture():
    """cartpole_cleanrl's network at 64 members: forward one kernel without a gradient, forward +
    backward three; a captured forward + backward + SGD step replays to the eager bits with no
    host sync."""
    from support import cuda_kernels

    x, ws, bs, up = _case(64, 256, CARTPOLE, device="cuda")
    params = [p.clone().requires_grad_(True) for p in ws + bs]
    with torch.no_grad():
        n_fwd, names = cuda_kernels(lambda: member_mlp_chain(x, ws, bs))
    assert n_fwd == 1, names
    n_fb, names = cuda_kernels(lambda: torch.autograd.grad(member_mlp_chain(x, params[:3], params[3:]), params, up))
    assert n_fb == 3, names
    start = [p.detach().clone() for p in params]

    def step():
        for p in params:
            p.grad = None
        member_mlp_chain(x, params[:3], params[3:]).backward(up)
        with torch.no_grad():
            for p in params:
                p.sub_(1e-2 * p.grad)

    def reset():
        with torch.no_grad():
            for p, s in zip(params, start):
                p.copy_(s)

    graph, _ = capture_graph(step)
    reset()
    with no_host_sync():
        for _ in range(3):
            graph.replay()
    replayed = [p.detach().clone() for p in params]
    reset()
    for _ in range(3):
        step()
    for a, e in zip(replayed, params):
        assert torch.equal(a, e)


# ------------------------------------------------------------------------------ MemberQNetwork
def _members(hidden=(7, 5), activation="relu", head="q", actions=3, members=3, seed=0):
    from foxdqn.nn.heads import DuelingHead, QHead
    from foxdqn.nn.mlp import MLPEncoder
    from foxdqn.nn.qnet import QNetwork
    from foxdqn.population.network import MemberQNetwork

    torch.manual_seed(seed)
    width = hidden[-1] if hidden else 4
    nets = [QNetwork(MLPEncoder(4, list(hidden), activation), (QHead if head == "q" else DuelingHead)(width, actions))
            for _ in range(members)]
    return MemberQNetwork.from_networks(nets, activation)


@pytest.mark.parametrize("make,fused", [
    (lambda: _members(), True),
    (lambda: _members(hidden=()), True),  # the head alone
    (lambda: _members(hidden=(8, 8, 8)), True),  # 4 layers
    (lambda: _members(hidden=(8, 8, 8, 8)), False),  # 5 layers
    (lambda: _members(hidden=(129, 5)), False),  # too wide
    (lambda: _members(activation="tanh"), False),
    (lambda: _members(head="dueling"), False),
])
def test_member_network_uses_the_op_only_when_eligible(monkeypatch, make, fused):
    """MemberQNetwork.forward runs member_mlp_chain for a plain head's ReLU MLP where the fused
    forwards run (here cpu_kernels), with or without a gradient to come; never on the CPU
    outside cpu_kernels, for an obs that needs a gradient, or with a forward hook."""
    import foxdqn.population.network as net_mod
    from foxdqn.ops.backend import cpu_kernels

    net = make()
    obs = torch.randn(3, 6, 4)
    calls = []
    monkeypatch.setattr(net_mod, "member_mlp_chain", lambda *a, **k: calls.append(1) or member_mlp_chain(*a, **k))
    net(obs)
    assert net.chain_args(obs) is None and not calls
    with cpu_kernels():
        net(obs)
        with torch.no_grad():
            net(obs)
        assert (net.chain_args(obs) is not None) == fused and len(calls) == 2 * int(fused)
        calls.clear()
        net(obs.clone().requires_grad_(True))
        handle = net.register_forward_hook(lambda m, i, o: None)
        net(obs)
        handle.remove()
        assert not calls


def test_member_network_fused_equals_layers_with_gradients():
    """cartpole_cleanrl's network, 3 members, a stacked [s; s'] batch: Q and every parameter's
    gradient of the fused path equal the layers' (baddbmm) to float32 rounding; the target (a copy
    without gradients) runs the forward kernel on its own weights."""
    import copy

    from foxdqn.ops.backend import cpu_kernels

    net = _members(hidden=(120, 84), actions=2, seed=3)
    target = copy.deepcopy(net).requires_grad_(False)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.01)
    obs, up = torch.randn(3, 40, 4), torch.randn(3, 40, 2)

    def run():
        net.zero_grad(set_to_none=True)
        q = net(obs)
        q.backward(up)
        with torch.no_grad():
            q_target = target(obs[:, 20:])
        return [q.detach(), q_target, *(p.grad.clone() for p in net.parameters())]

    with cpu_kernels():
        got = run()
    want = run()
    assert (got[0] - got[1].repeat(1, 2, 1)).abs().max() > 1e-3  # the target's own weights
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=2e-5)


SPLITS = [
    (1, 2, [4, 2], 1),  # one member, one layer, one row of each
    (3, 34, CARTPOLE, 17),  # the Double DQN pair of 17 rows
    (3, 260, CARTPOLE, 130),  # rows past two blocks on both sides
    (2, 21, [9, 7, 128, 120, 2], 5),  # depth 4, a split inside a block
    (3, 17, [4, 7, 2], 0),  # no row with a gradient
    (3, 17, [4, 7, 2], 17),  # every row with a gradient
]


def _split_run(x, ws, bs, up, split, backend="triton"):
    """y, y2 and the gradients of Σ y · up[:, :S] through member_mlp_chain_split."""
    ws = [w.detach().clone().requires_grad_(True) for w in ws]
    bs = [b.detach().clone().requires_grad_(True) for b in bs]
    y, y2 = member_mlp_chain_split(x, ws, bs, split, backend=backend)
    assert not y2.requires_grad
    grads = torch.autograd.grad(y, ws + bs, up[:, :split]) if y.requires_grad else [torch.zeros_like(t) for t in ws + bs]
    return y.detach(), y2, list(grads)


@pytest.mark.parametrize("members,rows,dims,split", SPLITS,
                         ids=[f"P{p}-B{b}-{'x'.join(map(str, d))}-S{s}" for p, b, d, s in SPLITS])
def test_split_is_the_whole_op_with_no_gradient_past_s(members, rows, dims, split):
    """y and y2 are the rows of member_mlp_chain's y bit for bit; the weight gradients are its
    gradients for dy with rows >= S zeroed, bit for bit (the backward skips rows whose gradient is 0);
    all equal the reference (its rows >= S detached) to float rounding."""
    x, ws, bs, up = _case(members, rows, dims, seed=rows + split)
    y, y2, grads = _split_run(x, ws, bs, up, split)
    assert y.shape == (members, split, dims[-1]) and y2.shape == (members, rows - split, dims[-1])
    masked = up.clone()
    masked[:, split:] = 0
    whole = _run(_kernel, x, ws, bs, masked)
    assert torch.equal(y, whole[0][:, :split]) and torch.equal(y2, whole[0][:, split:])
    for a, e, name in zip(grads, whole[1:], _names(len(ws))[1:]):
        assert torch.equal(a, e), name
    ref_y, ref_y2, ref_grads = _split_run(x, ws, bs, up, split, backend="torch")
    torch.testing.assert_close(torch.cat([y, y2], 1), torch.cat([ref_y, ref_y2], 1), rtol=1e-5, atol=2e-5)
    for a, e, name in zip(grads, ref_grads, _names(len(ws))[1:]):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=2e-5, msg=name)


def test_split_of_a_stacked_pair_at_a_member_stride_and_without_gradient():
    """x = the [P, 2B, D] view of a [P, 2, B, D] pair: the kernels read it in place; under no_grad
    the split is the whole op's rows, nothing saved."""
    pair = torch.randn(3, 2, 17, 4, generator=torch.Generator().manual_seed(5))
    _, ws, bs, up = _case(3, 34, CARTPOLE, seed=6)
    x = pair.view(3, 34, 4)
    y, y2, grads = _split_run(x, ws, bs, up, 17)
    want = _run(_kernel, x, ws, bs, torch.cat([up[:, :17], torch.zeros_like(up[:, 17:])], 1))
    assert torch.equal(torch.cat([y, y2], 1), want[0])
    assert all(torch.equal(a, e) for a, e in zip(grads, want[1:]))
    with torch.no_grad():
        a, b = member_mlp_chain_split(x, ws, bs, 17, backend="triton")
        whole = member_mlp_chain(x, ws, bs, backend="triton")  # no-save tiles, as the split's here
    assert torch.equal(torch.cat([a, b], 1), whole) and not a.requires_grad
    torch.testing.assert_close(whole, want[0], rtol=1e-5, atol=2e-5)  # the saving forward's tiles: rounding


@pytest.mark.parametrize("split", [-1, 18, 1.5, True])
def test_split_bad_rows(split):
    x, ws, bs, _ = _case(2, 17, [4, 7, 2])
    with pytest.raises(ValueError, match="grad_rows must be an integer in \\[0, B\\] = \\[0, 17\\]"):
        member_mlp_chain_split(x, ws, bs, split, backend="triton")


def test_member_dqn_loss_with_the_split_equals_the_stacked_forward(monkeypatch):
    """cartpole_cleanrl's network, 3 members, a Double DQN batch from a stacked [P, 2, B, D] pair
    (cpu_kernels): member_dqn_loss through MemberQNetwork.forward_split (one launch, the backward
    over the s rows) gives the loss, |TD|, Q of s and every gradient of the stacked forward (the
    s' rows through autograd with zero gradient) bit for bit."""
    import copy

    import foxdqn.population.network as net_mod
    from foxdqn.ops.backend import cpu_kernels
    from foxdqn.population.objective import member_dqn_loss
    from foxdqn.replay.buffer import Batch

    net = _members(hidden=(120, 84), actions=2, seed=4)
    target = copy.deepcopy(net).requires_grad_(False)
    g = torch.Generator().manual_seed(7)
    pair = torch.randn(3, 2, 16, 4, generator=g)
    batch = Batch(obs=pair[:, 0], action=torch.randint(0, 2, (48,), generator=g), reward=torch.randn(48, generator=g),
                  next_obs=pair[:, 1], discount=torch.full((48,), 0.99), weight=torch.ones(48),
                  index=torch.arange(48))
    calls = []
    real = net_mod.member_mlp_chain_split

    def run():
        net.zero_grad(set_to_none=True)
        loss, td, q = member_dqn_loss(net, target, batch, 3, torch.full((3,), 1.0), True)
        loss.sum().backward()
        return [loss.detach(), td, q.detach(), *(p.grad.clone() for p in net.parameters())]

    monkeypatch.setattr(net_mod, "member_mlp_chain_split", lambda *a, **k: calls.append(1) or real(*a, **k))
    with cpu_kernels():
        got = run()
        assert calls == [1]
        monkeypatch.setattr(net_mod.MemberQNetwork, "forward_split", lambda self, obs, rows: None)
        want = run()
    assert got[0].shape == (3,) and (got[3] != 0).any()
    for a, e in zip(got, want):
        assert torch.equal(a, e)
