"""foxdqn.ops.mlp_chain: the kernels (TRITON_INTERPRET=1 on CPU) against the torch reference, y and
the gradients of every weight and bias: odd row counts, depths 1 to 4, widths 1 to 128, D0 = 4 and 9;
pre-activations exactly 0; dy zero on the s' rows of a stacked [s; s'] batch; B = 0; the same bits
on every call; the TF32 path (operands rounded to TF32) against a float64 emulation; an input that
needs a gradient; bad arguments. QNetwork (foxdqn/nn/qnet.py) runs the op only for a ReLU MLP with a
plain Q head, and a deepcopy (the target network) runs it on its own weights. GPU (`gpu` marker):
kernel = reference on CUDA in TF32 and in full float32, one kernel forward and two backward,
CUDA-graph capture = eager, no host sync."""
from __future__ import annotations

import copy

import pytest
import torch

import foxdqn.nn.qnet as qnet_mod
import foxdqn.ops.mlp_chain as chain_mod
from foxdqn.nn.heads import DuelingHead, QHead
from foxdqn.nn.mlp import MLPEncoder
from foxdqn.nn.qnet import QNetwork
from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.mlp_chain import mlp_chain, mlp_chain_reference, mlp_chain_supported, tf32_enabled

from support import assert_close_ulps, capture_graph, no_host_sync, require_compiled_kernels, round_tf32

_need_compiled = require_compiled_kernels(INTERPRET)

CARTPOLE = [4, 120, 84, 2]  # cartpole_cleanrl: obs 4 → 120 → 84 → 2 actions


def _case(rows, dims, seed=0, device="cpu"):
    """x [rows, D0], weights and biases of the chain ``dims`` (1/sqrt(fan-in) scale: about half the
    pre-activations negative), the upstream gradient dy [rows, Dn]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dims[0], generator=g)
    ws = [torch.randn(o, i, generator=g) / i ** 0.5 for i, o in zip(dims[:-1], dims[1:])]
    bs = [torch.randn(o, generator=g) * 0.2 for o in dims[1:]]
    up = torch.randn(rows, dims[-1], generator=g)
    return x.to(device), [w.to(device) for w in ws], [b.to(device) for b in bs], up.to(device)


def _run(fn, x, ws, bs, up, **kw):
    """y and the gradients (W_1 .. W_n, b_1 .. b_n) of Σ y · up."""
    ws = [w.detach().clone().requires_grad_(True) for w in ws]
    bs = [b.detach().clone().requires_grad_(True) for b in bs]
    y = fn(x, ws, bs, **kw)
    return [y.detach(), *torch.autograd.grad(y, ws + bs, up)]


def _kernel(x, ws, bs):
    return mlp_chain(x, ws, bs, backend="triton")


def _names(n):
    return ["y", *(f"dW{i + 1}" for i in range(n)), *(f"db{i + 1}" for i in range(n))]


SHAPES = [
    (1, [4, 2]),  # one layer, one row
    (3, [9, 1]),  # one output
    (10, [4, 7, 2]),  # the collect step's 10 envs
    (37, [9, 4, 1, 7]),  # a width 1 in the middle
    (37, [4, 2, 4, 7, 2]),  # depth 4
    (300, [9, 16, 1, 7, 3]),  # depth 4, rows past a block
    (256, CARTPOLE),  # the update's stacked [s; s'] of batch 128
    (37, [9, 128, 120, 84, 4]),  # the widest tiles
]


@pytest.mark.parametrize("rows,dims", SHAPES, ids=[f"B{b}-{'x'.join(map(str, d))}" for b, d in SHAPES])
def test_kernel_equals_reference_with_gradients(rows, dims):
    x, ws, bs, up = _case(rows, dims, seed=rows + len(dims))
    got = _run(_kernel, x, ws, bs, up)
    want = _run(mlp_chain_reference, x, ws, bs, up)
    assert got[0].shape == (rows, dims[-1])
    for a, e, name in zip(got, want, _names(len(ws))):
        assert a.shape == e.shape, name
        torch.testing.assert_close(a, e, rtol=1e-5, atol=2e-5, msg=name)  # float32 sums in another order
    if len(dims) > 2 and rows >= 10:  # both sides of the first ReLU are exercised
        z1 = torch.nn.functional.linear(x, ws[0], bs[0])
        assert (z1 > 0).any() and (z1 < 0).any()


def test_reference_is_the_modules():
    """mlp_chain_reference is nn.Linear + nn.ReLU as MLPEncoder + QHead stack them."""
    torch.manual_seed(1)
    net = QNetwork(MLPEncoder(4, [7, 5]), QHead(5, 3))
    x = torch.randn(11, 4)
    layers = [net.encoder.net[0], net.encoder.net[2], net.head.q]
    got = mlp_chain_reference(x, [m.weight for m in layers], [m.bias for m in layers])
    torch.testing.assert_close(got, net.head(net.encoder(x)), rtol=0, atol=0)


def test_pre_activations_exactly_zero():
    """Unit 0 of layer 1 has zero weights and bias (pre-activation exactly 0 on every row) and rows 0
    and 5 are all-zero observations with b_1 = 0 on every unit: relu'(0) = 0 as in autograd, so
    those units and rows pass no gradient down."""
    x, ws, bs, up = _case(12, [4, 8, 6, 3], seed=5)
    ws[0][0] = 0.0
    bs[0].zero_()
    x[[0, 5]] = 0.0
    got = _run(_kernel, x, ws, bs, up)
    want = _run(mlp_chain_reference, x, ws, bs, up)
    for a, e, name in zip(got, want, _names(3)):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6, msg=name)
    dw1, dw2 = got[1], got[2]
    assert torch.equal(dw1[0], torch.zeros(4)) and torch.equal(dw2[:, 0], torch.zeros(6))
    assert dw1.abs().sum() > 0 and dw2.abs().sum() > 0


def test_stacked_batch_with_zero_gradient_rows():
    """The Double DQN stacked forward: y of [s; s'] (256 rows), the loss's gradient zero on the s'
    rows. The s rows' y and every gradient are those of the 128 s rows alone, bit for bit (the
    extra rows add exact zeros), and equal the reference."""
    x, ws, bs, up = _case(256, CARTPOLE, seed=7)
    up[128:] = 0.0
    both = _run(_kernel, x, ws, bs, up)
    alone = _run(_kernel, x[:128].contiguous(), ws, bs, up[:128].contiguous())
    assert torch.equal(both[0][:128], alone[0])
    for a, e, name in zip(both[1:], alone[1:], _names(3)[1:]):
        assert torch.equal(a, e), name
    want = _run(mlp_chain_reference, x, ws, bs, up)
    for a, e, name in zip(both, want, _names(3)):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=2e-5, msg=name)


def test_same_bits_every_call():
    x, ws, bs, up = _case(300, [9, 128, 84, 2], seed=8)
    first, second = _run(_kernel, x, ws, bs, up), _run(_kernel, x, ws, bs, up)
    for a, e, name in zip(first, second, _names(3)):
        assert torch.equal(a, e), name


def test_no_grad_and_frozen_weights():
    """Under no_grad, and with weights that need no gradient (the target network), the forward alone
    runs: same y, nothing to differentiate."""
    x, ws, bs, _ = _case(37, CARTPOLE, seed=9)
    want = mlp_chain_reference(x, ws, bs)
    y = _kernel(x, ws, bs)  # no tensor requires grad
    assert not y.requires_grad
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)
    trained = [w.clone().requires_grad_(True) for w in ws]
    with torch.no_grad():
        y = _kernel(x, trained, bs)
    assert not y.requires_grad and y.grad_fn is None
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)


def test_only_the_parameters_that_need_a_gradient():
    x, ws, bs, up = _case(20, [4, 6, 2], seed=10)
    w1 = ws[0].clone().requires_grad_(True)
    b2 = bs[1].clone().requires_grad_(True)
    y = _kernel(x, [w1, ws[1]], [bs[0], b2])
    gw1, gb2 = torch.autograd.grad(y, (w1, b2), up)
    w1r, b2r = w1.detach().clone().requires_grad_(True), b2.detach().clone().requires_grad_(True)
    yr = mlp_chain_reference(x, [w1r, ws[1]], [bs[0], b2r])
    want = torch.autograd.grad(yr, (w1r, b2r), up)
    torch.testing.assert_close(gw1, want[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gb2, want[1], rtol=1e-5, atol=1e-6)


def test_input_that_needs_a_gradient_runs_the_reference():
    x, ws, bs, up = _case(9, [4, 6, 2], seed=11)
    xg = x.clone().requires_grad_(True)
    y = _kernel(xg, ws, bs)
    (dx,) = torch.autograd.grad(y, xg, up)
    xr = x.clone().requires_grad_(True)
    (dx_ref,) = torch.autograd.grad(mlp_chain_reference(xr, ws, bs), xr, up)
    torch.testing.assert_close(dx, dx_ref, rtol=0, atol=0)


def test_empty_batch():
    x, ws, bs, up = _case(0, [4, 6, 2])
    got = _run(_kernel, x, ws, bs, up)
    assert got[0].shape == (0, 2)
    for g, p in zip(got[1:], ws + bs):
        assert torch.equal(g, torch.zeros_like(p))


# ------------------------------------------------------------------------------ TF32
def _run_layers(x, ws, bs, up, tf32):
    """The kernels (on x's device) and a float64 emulation of their arithmetic (``tf32``: products
    of operands rounded to TF32), layer by layer: ``(got, want, names)``. Each emulated layer
    starts from the kernel's own float32 activations (saved for the backward), so the ReLU masks
    are the kernel's, and an activation that float32 summation puts across 0 (or across a TF32
    rounding boundary) does not carry its difference down the chain. Compared: y, h_1 .. h_{n-1},
    the dW and db."""
    def r(t):
        return round_tf32(t.float()).double() if tf32 else t.double()

    ws = [w.detach().clone().requires_grad_(True) for w in ws]
    bs = [b.detach().clone().requires_grad_(True) for b in bs]
    y = mlp_chain(x, ws, bs, backend="triton")
    hs = [t.detach().cpu() for t in y.grad_fn.saved_tensors[1 + len(ws):]]  # x, W_1 .. W_n, h_1 ..
    grads = torch.autograd.grad(y, ws + bs, up)
    n = len(ws)
    x, up = x.cpu(), up.cpu()
    w64, b64 = [w.detach().cpu() for w in ws], [b.detach().cpu().double() for b in bs]
    inputs = [x, *hs]  # each layer's input, as the kernel held it
    want = [r(h) @ r(w).T + b for h, w, b in zip(inputs, w64, b64)]  # z_1 .. z_n
    want = [want[-1]] + [torch.where(z < 0, 0.0, z) for z in want[:-1]]  # y, h_1 .. h_{n-1}
    g, dws, dbs = up.double(), [], []
    for i in reversed(range(n)):
        dws.insert(0, r(g).T @ r(inputs[i]))
        dbs.insert(0, g.sum(0))
        if i:
            g = torch.where(inputs[i] <= 0, 0.0, r(g) @ r(w64[i]))
    got = [y.detach(), *hs, *grads]
    names = ["y", *(f"h{i + 1}" for i in range(n - 1)), *_names(n)[1:]]
    return got, [*want, *dws, *dbs], names


def test_round_tf32_is_round_to_nearest():
    v = torch.tensor([1.0 + 2.0**-11, 1.0 + 2.0**-10 + 2.0**-11, -(1.0 + 3 * 2.0**-12), 1.0 + 2.0**-12,
                      float("nan"), float("inf")])
    got = round_tf32(v)
    want = torch.tensor([1.0 + 2.0**-10, 1.0 + 2.0**-9, -(1.0 + 2.0**-10), 1.0, float("nan"), float("inf")])
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def _check_layers(got, want, names, tf32):
    """Activations to float32 sums of at most 128 terms (their inputs are the kernel's); gradients
    to float32 sums over the rows (256 ulps of max |e|), with ``tf32`` also to a dz that float32
    put across a TF32 rounding boundary (2**-11 of one term: 2**-13 of max |e|)."""
    for a, e, name in zip(got, want, names):
        ulps = 64 if name[0] in "yh" else 2**10 if tf32 else 256
        assert_close_ulps(a, e, rtol=1e-5, ulps=ulps, name=name)


def test_tf32_path_rounds_operands(monkeypatch):
    """With TF32 chosen (as on CUDA under matmul precision "high") every product's operands are
    rounded to TF32, to nearest; the interpreter's dot then multiplies them in float32: the kernel
    equals the float64 emulation layer by layer, and differs from the full-float32 run by TF32's
    error (all but db3 = Σ dy, which has no product)."""
    x, ws, bs, up = _case(300, [9, 24, 17, 3], seed=12)
    ieee = _run(_kernel, x, ws, bs, up)
    monkeypatch.setattr(chain_mod, "_prec", lambda t: "tf32")
    got, want, names = _run_layers(x, ws, bs, up, tf32=True)
    _check_layers(got, want, names, tf32=True)
    for a, i, name in zip([got[0], *got[-6:]], ieee, _names(3)):
        if name != "db3":  # db3 = Σ dy: no product
            assert (a - i).abs().max() > 1e-4 * i.abs().max(), name  # TF32 did round (about 1e-3 relative)


def test_tf32_enabled_follows_matmul_precision():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert tf32_enabled()
        torch.set_float32_matmul_precision("highest")
        assert not tf32_enabled()
    finally:
        torch.set_float32_matmul_precision(before)


# ------------------------------------------------------------------------------ arguments
def _good():
    x, ws, bs, _ = _case(5, [4, 6, 2])
    return dict(x=x, weights=ws, biases=bs)


@pytest.mark.parametrize("change,match", [
    (lambda a: a.update(x=torch.zeros(5, 129), weights=[torch.zeros(6, 129)] + a["weights"][1:]),
     r"width must be 1 to 128, got D0 = 129 \(x\)"),
    (lambda a: a.update(weights=[torch.zeros(129, 4), torch.zeros(2, 129)], biases=[torch.zeros(129), a["biases"][1]]),
     r"got D1 = 129 \(weights\[0\]\)"),
    (lambda a: a.update(weights=[torch.zeros(4, 4)] * 4 + [torch.zeros(2, 4)],
                        biases=[torch.zeros(4)] * 4 + [torch.zeros(2)]),
     r"weights must hold 1 to 4 layers.*got 5 weights"),
    (lambda a: a.update(weights=[], biases=[]), r"1 to 4 layers.*got 0 weights"),
    (lambda a: a.update(biases=a["biases"][:1]), r"got 2 weights and 1 biases"),
    (lambda a: a.update(x=a["x"].double()), r"x must be a contiguous float32 \[B, D0\] tensor, got torch.float64"),
    (lambda a: a.update(x=torch.zeros(4, 5).t()), r"x must be .*\(not contiguous\)"),
    (lambda a: a.update(x=torch.zeros(5, 4, 1)), r"x must be a contiguous float32 \[B, D0\] tensor, got .*\[5, 4, 1\]"),
    (lambda a: a.update(x=torch.zeros(5, 3)), r"weights\[0\] must be a contiguous float32 \[D1, 3\] tensor"),
    (lambda a: a["weights"].__setitem__(1, torch.zeros(2, 5)), r"weights\[1\] must be .*\[D2, 6\]"),
    (lambda a: a["weights"].__setitem__(1, torch.zeros(6, 2).t()), r"weights\[1\] must be .*\(not contiguous\)"),
    (lambda a: a["weights"].__setitem__(0, a["weights"][0].half()), r"weights\[0\] must be .*float16"),
    (lambda a: a["biases"].__setitem__(0, torch.zeros(5)), r"biases\[0\] must be a contiguous float32 \[6\] tensor"),
    (lambda a: a["biases"].__setitem__(1, None), r"biases\[1\] must be .* got NoneType"),
    (lambda a: a.update(x=[[0.0] * 4]), r"x must be a tensor, got list"),
    (lambda a: a.update(backend="cuda"), "backend must be"),
])
def test_bad_arguments(change, match):
    args = _good()
    change(args)
    backend = args.pop("backend", "auto")
    with pytest.raises(ValueError, match=match):
        mlp_chain(args["x"], args["weights"], args["biases"], backend=backend)
    if backend == "auto":
        assert not mlp_chain_supported(args["x"], args["weights"], args["biases"])


def test_supported_limits():
    x, ws, bs, _ = _case(3, [128, 128, 128, 128, 1])
    assert mlp_chain_supported(x, ws, bs) and mlp_chain_supported(**_good())
    assert not mlp_chain_supported(x, ws, bs[:3])


# ------------------------------------------------------------------------------ QNetwork
def _net(hidden=(7, 5), activation="relu", head=QHead, obs_dim=4, actions=3, seed=0):
    torch.manual_seed(seed)
    net = QNetwork(MLPEncoder(obs_dim, list(hidden), activation), head(hidden[-1] if hidden else obs_dim, actions))
    net.chain_backend = "triton"  # the fused op on CPU, in the interpreter
    return net


@pytest.mark.parametrize("make,obs,fused", [
    (lambda: _net(), torch.randn(6, 4), True),
    (lambda: _net(hidden=()), torch.randn(6, 4), True),  # the head alone
    (lambda: _net(hidden=(8, 8, 8)), torch.randn(6, 4), True),  # 4 layers
    (lambda: _net(hidden=(8, 8, 8, 8)), torch.randn(6, 4), False),  # 5 layers
    (lambda: _net(hidden=(129, 5)), torch.randn(6, 4), False),  # too wide
    (lambda: _net(activation="tanh"), torch.randn(6, 4), False),
    (lambda: _net(head=DuelingHead), torch.randn(6, 4), False),
    (lambda: _net().double(), torch.randn(6, 4).double(), False),
    (lambda: _net(), torch.randn(2, 6, 4), False),
    (lambda: _net(), torch.randn(4, 6).t(), False),  # not contiguous
    (lambda: _net(), torch.randn(6, 4).requires_grad_(True), False),
])
def test_qnetwork_uses_the_op_only_when_eligible(monkeypatch, make, obs, fused):
    net = make()
    calls = []

    def spy(*args, **kwargs):
        calls.append(1)
        return chain_mod.mlp_chain(*args, **kwargs)

    monkeypatch.setattr(qnet_mod, "mlp_chain", spy)
    net(obs)
    assert (net.fused_chain(obs) is not None) == fused and len(calls) == int(fused)
    net.chain_backend = "torch"
    net(obs)
    net.chain_backend = "auto"  # CPU input: never fused
    net(obs)
    assert net.fused_chain(obs) is None and len(calls) == int(fused)


def test_qnetwork_with_a_forward_hook_runs_its_modules():
    net, obs = _net(), torch.randn(6, 4)
    seen = []
    handle = net.encoder.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    assert net.fused_chain(obs) is None
    net(obs)
    assert seen == [torch.Size([6, 5])]
    handle.remove()
    assert net.fused_chain(obs) is not None


def test_qnetwork_fused_equals_modules_with_gradients():
    net = _net(hidden=(120, 84), actions=2, seed=3)
    obs, up = torch.randn(37, 4), torch.randn(37, 2)

    def run():
        net.zero_grad(set_to_none=True)
        q = net(obs)
        q.backward(up)
        return [q.detach(), *(p.grad.clone() for p in net.parameters())]

    got = run()
    net.chain_backend = "torch"
    want = run()
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=2e-5)


def test_qnetwork_deepcopy_runs_on_its_own_weights():
    online = _net(seed=4)
    target = copy.deepcopy(online).requires_grad_(False)
    obs = torch.randn(10, 4)
    weights, _ = target.fused_chain(obs)
    assert weights[0] is target.encoder.net[0].weight and weights[-1] is target.head.q.weight
    with torch.no_grad():
        for p in online.parameters():
            p.add_(0.5)
        q_target, q_online = target(obs), online(obs)
        target.chain_backend = online.chain_backend = "torch"
        torch.testing.assert_close(q_target, target(obs), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(q_online, online(obs), rtol=1e-5, atol=1e-6)
    assert (q_target - q_online).abs().max() > 0.1
    assert list(online.state_dict()) == ["encoder.net.0.weight", "encoder.net.0.bias", "encoder.net.2.weight",
                                         "encoder.net.2.bias", "head.q.weight", "head.q.bias"]


def test_qnetwork_bad_chain_backend():
    with pytest.raises(ValueError, match=r"chain_backend must be one of auto, triton, torch, got 'cuda'"):
        QNetwork(MLPEncoder(4, [5]), QHead(5, 2), chain_backend="cuda")


# ------------------------------------------------------------------------------ GPU
GPU_SHAPES = [(1, [4, 2]), (10, CARTPOLE), (128, CARTPOLE), (256, CARTPOLE), (4097, [9, 128, 120, 84, 4])]


@pytest.mark.gpu
@pytest.mark.parametrize("rows,dims", GPU_SHAPES)
def test_gpu_kernel_equals_reference_highest(matmul_precision, rows, dims):
    """Matmul precision "highest": IEEE float32 products. The kernels equal float64 layer by layer
    (each layer from the kernel's own activations), and y equals torch's to float32 sums (cuBLAS
    sums in another order). Gradients are not compared with torch's at these row counts: a
    pre-activation within float32 rounding of 0 takes the other side of the ReLU in one of the
    two, and changes that row's dz (about 0.2 such values expected among the 4,097 rows' 1.4M)."""
    matmul_precision("highest")
    assert not tf32_enabled()
    x, ws, bs, up = _case(rows, dims, seed=rows, device="cuda")
    got, want, names = _run_layers(x, ws, bs, up, tf32=False)
    _check_layers(got, want, names, tf32=False)
    assert_close_ulps(got[0], mlp_chain_reference(x, ws, bs), rtol=1e-5, ulps=64, name="y vs torch")


@pytest.mark.gpu
@pytest.mark.parametrize("rows,dims", GPU_SHAPES)
def test_gpu_kernel_tf32_equals_emulation(matmul_precision, rows, dims):
    """Matmul precision "high" (the run's default): the kernels' TF32 products (operands rounded to
    nearest, then the tensor cores) equal the float64 emulation layer by layer, as in the
    interpreter test; y is within TF32's error of torch's own TF32 path (cuBLAS; one-row products
    are float32 GEMVs). Gradients are not compared with torch's: TF32 roundings move
    pre-activations near 0 across the ReLU, which changes whole rows of dz."""
    matmul_precision("high")
    assert tf32_enabled()
    x, ws, bs, up = _case(rows, dims, seed=rows + 1, device="cuda")
    got, want, names = _run_layers(x, ws, bs, up, tf32=True)
    _check_layers(got, want, names, tf32=True)
    assert_close_ulps(got[0], mlp_chain_reference(x, ws, bs), rtol=1e-2, ulps=2**15, name="y vs torch")  # 2**-8 of max |y|


@pytest.mark.gpu
def test_gpu_kernel_counts():
    """cartpole_cleanrl's network: forward one kernel (no gradient to come: the collect step and
    the target network), forward + backward three (the update's stacked 256 rows), for the op and
    for QNetwork."""
    from support import cuda_kernels

    x, ws, bs, up = _case(256, CARTPOLE, device="cuda")
    wg = [w.clone().requires_grad_(True) for w in ws]
    bg = [b.clone().requires_grad_(True) for b in bs]
    with torch.no_grad():
        n_fwd, names = cuda_kernels(lambda: mlp_chain(x, ws, bs))
    assert n_fwd == 1, names
    n_fb, names = cuda_kernels(lambda: torch.autograd.grad(mlp_chain(x, wg, bg), wg + bg, up))
    assert n_fb == 3, names
    net = QNetwork(MLPEncoder(4, [120, 84]), QHead(84, 2)).cuda()
    with torch.no_grad():
        n_net, names = cuda_kernels(lambda: net(x[:10]))
    assert n_net == 1, names
    n_net_fb, names = cuda_kernels(lambda: torch.autograd.grad(net(x), list(net.parameters()), up))
    assert n_net_fb == 3, names


@pytest.mark.gpu
def test_gpu_capture_equals_eager_without_host_sync():
    """Forward, backward and a plain SGD step of the weights, captured: 3 replays give the bits of
    3 eager steps; eager steps and replays never synchronise with the host."""
    x, ws, bs, up = _case(256, CARTPOLE, seed=3, device="cuda")
    params = [p.clone().requires_grad_(True) for p in ws + bs]
    start = [p.detach().clone() for p in params]

    def step():
        for p in params:
            p.grad = None
        y = mlp_chain(x, params[:3], params[3:])
        y.backward(up)
        with torch.no_grad():
            for p in params:
                p.sub_(1e-2 * p.grad)
        return y

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
    with no_host_sync():
        for _ in range(3):
            step()
    for a, e in zip(replayed, params):
        assert torch.equal(a, e.detach())
    assert not all(torch.equal(a, s) for a, s in zip(replayed, start))
