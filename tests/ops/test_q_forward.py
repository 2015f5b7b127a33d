"""foxdqn.ops.q_forward: the kernel (TRITON_INTERPRET=1 on CPU) against the torch reference and a
float64 emulation of its arithmetic: odd row counts, P = 1 (nn.Linear layout) and P = 3 (population
layout), 1 and 2 hidden layers, widths 1 to 256, D0 = 3 and 162 (not a multiple of BLOCK_K), A = 1
to 64, dueling and plain heads; strided (non-contiguous) weights and biases; other launch constants;
M = 0; a NaN in x stays in its row; members never mix; the same bits on every call; the TF32 path
(operands rounded to TF32) against a float64 emulation; the no-gradient rule; bad arguments; the
reference is QNetwork's and MemberQNetwork's modules; the torch.library registration. GPU (`gpu`
marker): kernel = emulation and reference on CUDA at eurusd_dqn's 4,096 × 162 → 256 → 256 →
dueling 45 in TF32 and full float32, one kernel launch, CUDA-graph capture = eager without host
sync, torch.compile; MemberQNetwork's no-gradient forward is one kernel."""
from __future__ import annotations

import pytest
import torch

import foxdqn.ops.q_forward as qf_mod
from foxdqn.nn.heads import DuelingHead, QHead
from foxdqn.nn.mlp import MLPEncoder
from foxdqn.nn.qnet import QNetwork
from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.library import register_ops
from foxdqn.ops.mlp_chain import tf32_enabled
from foxdqn.ops.q_forward import q_forward, q_forward_reference, q_forward_supported
from foxdqn.population.network import MemberQNetwork

from support import (assert_close_nan, assert_close_ulps, capture_graph, no_host_sync, require_compiled_kernels,
                     round_tf32)

_need_compiled = require_compiled_kernels(INTERPRET)

EURUSD = [162, 256, 256]  # eurusd_dqn: obs 162 → 256 → 256 → dueling head of 45 actions


def _case(members, rows, dims, actions, dueling, population, seed=0, device="cpu"):
    """x, weights and biases of the network ``dims`` = [D0, H1, (H2)] with an A-action head:
    population layout (``[P, in, out]``, x ``[P, M, D0]``) or nn.Linear layout (``[out, in]``,
    x ``[M, D0]``, ``members`` = 1). 1/sqrt(fan-in) weights: about half the pre-activations < 0."""
    g = torch.Generator().manual_seed(seed)
    ins = dims + ([dims[-1]] if dueling else [])
    outs = dims[1:] + ([1, actions] if dueling else [actions])
    lead = (members,) if population else ()
    x = torch.randn(*lead, rows, dims[0], generator=g)
    ws, bs = [], []
    for i, o in zip(ins, outs):
        if population:
            ws.append(torch.randn(members, i, o, generator=g) / i ** 0.5)
            bs.append(torch.randn(members, 1, o, generator=g) * 0.2)
        else:
            ws.append(torch.randn(o, i, generator=g) / i ** 0.5)
            bs.append(torch.randn(o, generator=g) * 0.2)
    return x.to(device), [w.to(device) for w in ws], [b.to(device) for b in bs]


def _kernel(x, ws, bs, dueling):
    return q_forward(x, ws, bs, dueling=dueling, backend="triton")


def _emulate(x, ws, bs, dueling, tf32):
    """The kernel's arithmetic in float64 on the CPU: every product's operands rounded to TF32 with
    ``tf32`` (activations first rounded to float32, as the kernel holds them), the value's row sum
    unrounded (float32 FMA in the kernel), biases added after the products."""
    def r(t):
        return round_tf32(t.float()).double() if tf32 else t

    population = ws[0].dim() == 3
    ws = [w.detach().cpu().double() if population else w.detach().cpu().double().t() for w in ws]  # [.., in, out]
    bs = [b.detach().cpu().double() for b in bs]
    h = x.detach().cpu().double()
    h = h[None] if population and h.dim() == 2 else h
    depth = len(ws) - (2 if dueling else 1)
    for w, b in zip(ws[:depth], bs[:depth]):
        h = torch.relu(r(h) @ r(w) + b)
    out = r(h) @ r(ws[-1]) + bs[-1]
    if dueling:
        out = (h @ ws[-2] + bs[-2]) + out - out.mean(-1, keepdim=True)
    return out.reshape(*x.shape[:-1], out.shape[-1])


# (P, M, [D0, H1, (H2)], A, dueling, population layout)
SHAPES = [
    (1, 1, [3, 5], 2, True, False),  # one row, one hidden layer
    (1, 7, [162, 1], 1, False, False),  # width 1, A = 1
    (1, 33, [3, 17, 5], 45, True, False),
    (1, 100, EURUSD, 45, True, False),  # eurusd_dqn's network
    (1, 33, [162, 64, 64], 45, False, False),
    (3, 7, [162, 64], 64, True, True),  # population, one hidden layer, A = 64
    (3, 33, [3, 256, 17], 2, False, True),
    (3, 100, [162, 5, 256], 64, False, True),
    (3, 1, [3, 1, 1], 1, True, True),  # widths 1; dueling with A = 1 (Q = V)
    (1, 128, EURUSD, 45, True, True),  # population layout, P = 1
]


def _id(shape):
    p, m, dims, a, dueling, population = shape
    return f"P{p}-M{m}-{'x'.join(map(str, dims))}-A{a}-{'duel' if dueling else 'q'}-{'pop' if population else 'lin'}"


@pytest.mark.parametrize("shape", SHAPES, ids=[_id(s) for s in SHAPES])
def test_kernel_equals_reference(shape):
    members, rows, dims, actions, dueling, population = shape
    x, ws, bs = _case(*shape, seed=rows + len(dims))
    got = _kernel(x, ws, bs, dueling)
    want = q_forward_reference(x, ws, bs, dueling=dueling)
    lead = (members,) if population and x.dim() == 3 else ()
    assert got.shape == want.shape == (*lead, rows, actions) and got.is_contiguous()
    assert got.dtype == torch.float32 and not got.requires_grad
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)  # float32 sums in another order
    assert_close_ulps(got, _emulate(x, ws, bs, dueling, tf32=False), rtol=1e-5, ulps=64)
    if rows >= 33 and dims[1] > 1:  # both sides of the first ReLU are exercised
        w1, b1 = ws[0], bs[0]
        z1 = torch.baddbmm(b1, x if x.dim() == 3 else x[None], w1) if population else torch.nn.functional.linear(
            x, w1, b1)
        assert (z1 > 0).any() and (z1 < 0).any()


def test_one_network_in_either_layout():
    """P = 1: x ``[M, D0]`` or ``[1, M, D0]`` with weights in either layout; Q takes x's leading
    shape, and the four are the same bits (the same products in the same order)."""
    x, ws, bs = _case(1, 40, [162, 48, 40], 9, True, True, seed=1)
    lws = [w[0].t() for w in ws]  # nn.Linear layout [out, in], as views
    lbs = [b[0, 0] for b in bs]
    q = _kernel(x, ws, bs, True)
    assert q.shape == (1, 40, 9)
    for xx, w, b in ((x[0], ws, bs), (x[0], lws, lbs), (x, lws, lbs)):
        got = _kernel(xx, w, b, True)
        assert got.shape == (*xx.shape[:-1], 9) and torch.equal(got.reshape(q.shape), q)
        torch.testing.assert_close(got, q_forward_reference(xx, w, b, dueling=True), rtol=1e-5, atol=2e-5)


def test_launch_constants_are_read_at_each_launch(monkeypatch):
    """Other tile sizes (a sweep sets them on the module) give the same Q to float rounding."""
    x, ws, bs = _case(3, 40, [37, 48, 40], 9, True, True, seed=2)
    want = q_forward_reference(x, ws, bs, dueling=True)
    real, seen = qf_mod._launch, []

    def spy(grid, args, meta, tiles, d0, h2):
        seen.append((grid, meta["BLOCK_M"], tiles))
        real(grid, args, meta, tiles, d0, h2)

    monkeypatch.setattr(qf_mod, "_launch", spy)
    monkeypatch.setattr(qf_mod, "_FITS", {})
    for block_m, block_k, block_n in ((16, 16, 16), (64, 64, 64)):
        monkeypatch.setattr(qf_mod, "BLOCK_M", block_m)
        monkeypatch.setattr(qf_mod, "BLOCK_K", block_k)
        monkeypatch.setattr(qf_mod, "BLOCK_N", block_n)
        torch.testing.assert_close(_kernel(x, ws, bs, True), want, rtol=1e-5, atol=2e-5)
        assert seen[-1] == (((40 + block_m - 1) // block_m, 3), block_m, (block_k, block_n, qf_mod.NUM_STAGES))


def test_smaller_tiles_where_the_shared_memory_is_smaller(monkeypatch):
    """A device where the module's tiles raise OutOfResources (a GPU with less shared memory than
    the H200): the launch is retried with SMALL_TILES, which that device keeps from then on."""
    from triton.runtime.errors import OutOfResources

    real, tried = qf_mod._launch, []

    def small_smem(grid, args, meta, tiles, d0, h2):
        tried.append(tiles)
        if tiles != qf_mod.SMALL_TILES:
            raise OutOfResources(262144, 166912, "shared memory")
        real(grid, args, meta, tiles, d0, h2)

    monkeypatch.setattr(qf_mod, "_launch", small_smem)
    monkeypatch.setattr(qf_mod, "_FITS", {})
    x, ws, bs = _case(1, 40, [37, 48, 40], 9, True, False, seed=3)
    want = q_forward_reference(x, ws, bs, dueling=True)
    for _ in range(2):
        torch.testing.assert_close(_kernel(x, ws, bs, True), want, rtol=1e-5, atol=2e-5)
    big = (qf_mod.BLOCK_K, qf_mod.BLOCK_N, qf_mod.NUM_STAGES)
    assert tried == [big, qf_mod.SMALL_TILES, qf_mod.SMALL_TILES]  # the second call goes straight to them
    assert qf_mod._FITS == {x.device: qf_mod.SMALL_TILES}


def test_strided_weights_and_biases():
    """Weights and biases are read through their strides: transposed views (nn.Linear weights
    given as ``Wᵀ.t()``, population weights as ``[P, out, in]`` transposed) and biases sliced out
    of wider tensors give the contiguous tensors' Q."""
    for population in (False, True):
        x, ws, bs = _case(3 if population else 1, 21, [11, 24, 19], 6, True, population, seed=3)
        want = _kernel(x, ws, bs, True)
        if population:
            sws = [w.transpose(1, 2).contiguous().transpose(1, 2) for w in ws]
            sbs = [torch.stack([b, b], dim=3)[..., 0] for b in bs]
        else:
            sws = [w.t().contiguous().t() for w in ws]
            sbs = [torch.stack([b, b], dim=1)[:, 0] for b in bs]
        assert not any(w.is_contiguous() for w in sws if w.shape[-1] > 1 and w.shape[-2] > 1)
        assert not any(b.is_contiguous() for b in sbs if b.shape[-1] > 1)
        torch.testing.assert_close(_kernel(x, sws, sbs, True), want, rtol=0, atol=0)


@pytest.mark.parametrize("dims,dueling", [([162, 64, 48], True), ([3, 17], False), ([5, 1, 1], True)])
def test_members_at_any_member_stride(dims, dueling):
    """x ``[P, M, D0]`` whose members are contiguous blocks at a member stride of their own (the
    halves of a stacked pair ``[P, 2, M, D0]``, as the population's replay and decoder give them)
    gives the contiguous x's Q bit for bit, and so do its ε-greedy actions."""
    from foxdqn.ops.q_forward_epsilon_greedy import q_forward_epsilon_greedy

    x, ws, bs = _case(3, 13, dims, 7, dueling, True, seed=8)
    pair = torch.stack([x, torch.full_like(x, float("nan"))], dim=1)  # [P, 2, M, D0]; the other half never read
    for half in (pair[:, 0], torch.stack([pair[:, 1], x], dim=1)[:, 1]):
        assert not half.is_contiguous() and q_forward_supported(half, ws, bs, dueling)
        assert torch.equal(_kernel(half, ws, bs, dueling), _kernel(x, ws, bs, dueling))
    sched = dict(step=torch.tensor(3), start=torch.full((3,), 0.5), end=torch.full((3,), 0.1),
                 duration=torch.full((3,), 10.0), u=torch.rand(3, 2, 13, generator=torch.Generator().manual_seed(1)))
    assert torch.equal(q_forward_epsilon_greedy(pair[:, 0], ws, bs, dueling=dueling, **sched, backend="triton"),
                       q_forward_epsilon_greedy(x, ws, bs, dueling=dueling, **sched, backend="triton"))


@pytest.mark.parametrize("population", [False, True])
def test_empty_rows(population):
    x, ws, bs = _case(3 if population else 1, 0, [162, 17, 5], 45, True, population)
    q = _kernel(x, ws, bs, True)
    assert q.shape == ((3, 0, 45) if population else (0, 45))


@pytest.mark.parametrize("depth", [1, 2])
def test_nan_stays_in_its_row(depth):
    dims = [162, 64, 17][:depth + 1]
    x, ws, bs = _case(3, 33, dims, 45, True, True, seed=4)
    x[1, 5, 100] = float("nan")
    got = _kernel(x, ws, bs, True)
    want = q_forward_reference(x, ws, bs, dueling=True)
    assert torch.isnan(got[1, 5]).all()
    assert torch.isfinite(got[1, torch.arange(33) != 5]).all() and torch.isfinite(got[[0, 2]]).all()
    assert_close_nan(got, want, atol=2e-5, rtol=1e-5)


def test_members_never_mix():
    """Member p's Q reads only member p's weights and rows: changing member 1's weights, biases and
    observations leaves members 0 and 2 bit for bit."""
    x, ws, bs = _case(3, 40, [162, 64, 48], 45, True, True, seed=5)
    before = _kernel(x, ws, bs, True)
    for t in [x, *ws, *bs]:
        t[1] = t[1] * 1.5 + 0.25
    after = _kernel(x, ws, bs, True)
    assert torch.equal(after[[0, 2]], before[[0, 2]])
    assert (after[1] - before[1]).abs().max() > 0.1
    torch.testing.assert_close(after, q_forward_reference(x, ws, bs, dueling=True), rtol=1e-5, atol=2e-5)


def test_same_bits_every_call():
    x, ws, bs = _case(1, 100, EURUSD, 45, True, False, seed=6)
    assert torch.equal(_kernel(x, ws, bs, True), _kernel(x, ws, bs, True))


def test_cpu_backends_run_the_reference():
    x, ws, bs = _case(3, 9, [5, 7], 4, True, True, seed=7)
    want = q_forward_reference(x, ws, bs, dueling=True)
    assert torch.equal(q_forward(x, ws, bs, dueling=True), want)  # auto: CPU tensors
    assert torch.equal(q_forward(x, ws, bs, dueling=True, backend="torch"), want)


# ------------------------------------------------------------------------------ the modules
def _nets(head, seed=0, members=3, obs=9, hidden=(24, 17), actions=5):
    torch.manual_seed(seed)
    return [QNetwork(MLPEncoder(obs, list(hidden)), head(hidden[-1], actions)) for _ in range(members)]


@pytest.mark.parametrize("head", [QHead, DuelingHead])
def test_reference_is_the_modules(head):
    """q_forward_reference is QNetwork(MLPEncoder, QHead | DuelingHead) with its nn.Linear weights,
    and MemberQNetwork with its [P, in, out] weights, bit for bit; the kernel equals both to float
    rounding (under no_grad: the modules' parameters require grad)."""
    nets = _nets(head)
    net, dueling = nets[0], head is DuelingHead
    linears = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]  # W_1, W_2, (value, advantage | q)
    ws, bs = [m.weight for m in linears], [m.bias for m in linears]
    obs = torch.randn(13, 9)
    with torch.no_grad():
        want = net(obs)
        assert torch.equal(q_forward_reference(obs, ws, bs, dueling=dueling), want)
        torch.testing.assert_close(_kernel(obs, ws, bs, dueling), want, rtol=1e-5, atol=2e-5)
        members = MemberQNetwork.from_networks(nets, "relu")
        pobs = torch.randn(3, 13, 9)
        want = members(pobs)
        mws, mbs = list(members.weights), list(members.biases)
        assert torch.equal(q_forward_reference(pobs, mws, mbs, dueling=dueling), want)
        torch.testing.assert_close(_kernel(pobs, mws, mbs, dueling), want, rtol=1e-5, atol=2e-5)


# ------------------------------------------------------------------------------ no gradient
def test_no_gradient_rule():
    """Under no_grad or inference_mode, or with grad mode on when nothing requires grad, the op runs;
    with grad mode on and an input requiring grad it raises, naming that input."""
    x, ws, bs = _case(1, 9, [6, 8], 3, True, False, seed=8)
    want = q_forward_reference(x, ws, bs, dueling=True)
    torch.testing.assert_close(_kernel(x, ws, bs, True), want, rtol=1e-5, atol=2e-5)  # grad mode on, no grad needed
    trained = [w.clone().requires_grad_(True) for w in ws]
    assert not q_forward_supported(x, trained, bs, True)
    with pytest.raises(ValueError, match=r"q_forward: weights\[0\] requires grad with grad mode on"):
        _kernel(x, trained, bs, True)
    with pytest.raises(ValueError, match=r"q_forward: biases\[2\] requires grad"):
        _kernel(x, ws, bs[:2] + [bs[2].clone().requires_grad_(True)], True)
    with pytest.raises(ValueError, match=r"q_forward: x requires grad"):
        q_forward(x.clone().requires_grad_(True), ws, bs, dueling=True)  # any backend: the op's rule
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            assert q_forward_supported(x, trained, bs, True)
            q = _kernel(x, trained, bs, True)
            assert not q.requires_grad and q.grad_fn is None
            torch.testing.assert_close(q, want, rtol=1e-5, atol=2e-5)


# ------------------------------------------------------------------------------ TF32
def test_round_tf32_is_round_to_nearest():
    v = torch.tensor([1.0 + 2.0**-11, 1.0 + 2.0**-10 + 2.0**-11, -(1.0 + 3 * 2.0**-12), 1.0 + 2.0**-12,
                      float("nan"), float("inf")])
    want = torch.tensor([1.0 + 2.0**-10, 1.0 + 2.0**-9, -(1.0 + 2.0**-10), 1.0, float("nan"), float("inf")])
    torch.testing.assert_close(round_tf32(v), want, rtol=0, atol=0, equal_nan=True)


TF32_SHAPES = [(1, 100, EURUSD, 45, True, False), (3, 33, [162, 64], 45, True, True),
               (3, 33, [37, 48, 40], 9, False, True)]


def _check_tf32(got, x, ws, bs, dueling):
    """``got`` (the kernel in TF32) against the float64 emulation of TF32 products. An activation
    that float32 summation puts on the other side of a TF32 rounding boundary than float64 does
    moves that operand by one TF32 ulp (2**-10 relative), and with two hidden layers that moves
    more layer-2 activations across their boundaries, so a few rows stay far from the emulation:
    up to about 3,000 float32 ulps of max |Q| in the interpreter (a plain head of 2 actions, over
    40 seeds; 1,600 for eurusd_dqn's network at 4,096 rows), where TF32 itself moves Q by about
    4,000. Hence a bound of 2**12 ulps on every value, and the test that the kernel rounds as the
    emulation does: over 96 rows or more, the root mean square of the difference is under a
    quarter of TF32's own (measured 0.01-0.12)."""
    want, ieee = _emulate(x, ws, bs, dueling, tf32=True), _emulate(x, ws, bs, dueling, tf32=False)
    assert_close_ulps(got, want, rtol=1e-5, ulps=2**12, name="q vs TF32 float64")
    got = got.detach().cpu().double()
    if got.numel() >= 96 * got.shape[-1]:
        rms = (got - want).pow(2).mean().sqrt()
        tf32_rms = (want - ieee).pow(2).mean().sqrt()
        assert rms < 0.25 * tf32_rms, (float(rms), float(tf32_rms))


@pytest.mark.parametrize("shape", TF32_SHAPES, ids=[_id(s) for s in TF32_SHAPES])
def test_tf32_path_rounds_operands(monkeypatch, shape):
    """With TF32 chosen (as on CUDA under matmul precision "high") every product's operands are
    rounded to TF32, to nearest; the interpreter's dot then multiplies them in float32: the kernel
    equals the float64 emulation of that arithmetic (:func:`_check_tf32`), and differs from the
    full-float32 run by TF32's error."""
    x, ws, bs = _case(*shape, seed=9)
    dueling = shape[4]
    ieee = _kernel(x, ws, bs, dueling)
    monkeypatch.setattr(qf_mod, "_prec", lambda t: "tf32")
    got = _kernel(x, ws, bs, dueling)
    _check_tf32(got, x, ws, bs, dueling)
    assert (got - ieee).abs().max() > 1e-4 * ieee.abs().max()  # TF32 did round (about 5e-4 relative)


def test_tf32_enabled_follows_matmul_precision():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert tf32_enabled() and qf_mod.tf32_enabled is tf32_enabled
        torch.set_float32_matmul_precision("highest")
        assert not tf32_enabled()
    finally:
        torch.set_float32_matmul_precision(before)


# ------------------------------------------------------------------------------ arguments
def _good(population=False):
    x, ws, bs = _case(3 if population else 1, 5, [4, 6, 7], 3, True, population)
    return dict(x=x, weights=ws, biases=bs, dueling=True)


def _set(key, i, value):
    return lambda a: a[key].__setitem__(i, value)


BAD = [
    (lambda a: (a.update(weights=[torch.zeros(257, 4), torch.zeros(7, 257), *a["weights"][2:]]),
                a.update(biases=[torch.zeros(257), *a["biases"][1:]])),
     r"hidden width must be 1 to 256, got 257 \(weights\[0\], W_1\)"),
    (lambda a: (a["weights"].__setitem__(1, torch.zeros(257, 6)), a["biases"].__setitem__(1, torch.zeros(257)),
                a["weights"].__setitem__(2, torch.zeros(1, 257)), a["weights"].__setitem__(3, torch.zeros(3, 257))),
     r"hidden width must be 1 to 256, got 257 \(weights\[1\], W_2\)"),
    (lambda a: (a["weights"].__setitem__(3, torch.zeros(65, 7)), a["biases"].__setitem__(3, torch.zeros(65))),
     r"actions A must be 1 to 64, got 65 \(weights\[3\], W_a\)"),
    (lambda a: a.update(weights=[a["weights"][0], torch.zeros(7, 6), *a["weights"][1:]],
                        biases=[a["biases"][0], torch.zeros(7), *a["biases"][1:]]),
     r"1 or 2 hidden layers and the head \(w_v and W_a\).*got 5 weights and 5 biases"),
    (lambda a: a.update(weights=a["weights"][2:], biases=a["biases"][2:]), r"1 or 2 hidden layers.*got 2 weights"),
    (lambda a: a.update(dueling=False), r"1 or 2 hidden layers and the head \(W_q\).*got 4 weights and 4 biases "
                                        r"\(dueling=False\)"),  # 3 hidden layers
    (lambda a: a["weights"].__setitem__(1, torch.zeros(7, 5)), r"weights\[1\] \(W_2\) must be a float32 \[out, 6\]"),
    (lambda a: a.update(biases=a["biases"][:3]), r"got 4 weights and 3 biases"),
    (lambda a: a.update(x=a["x"].double()), r"x must be a float32 \[P, M, D0\] or \[M, D0\] tensor with contiguous "
                                            r"rows .*, got torch.float64"),
    (lambda a: a.update(x=torch.zeros(4, 5).t()), r"x must be .*\(not contiguous\)"),
    (lambda a: a.update(x=torch.zeros(1, 4, 10)[..., ::2]), r"x must be .*contiguous rows.*\(not contiguous\)"),
    (lambda a: a.update(x=torch.zeros(2, 2, 5, 4)), r"x must be .*got .*\[2, 2, 5, 4\]"),
    (lambda a: a.update(x=torch.zeros(5, 3)), r"weights\[0\] \(W_1\) must be a float32 \[out, 3\]"),
    (lambda a: a.update(x=torch.zeros(3, 5, 4)), r"x has P = 3 members, the nn.Linear layout"),
    (_set("weights", 0, torch.zeros(6, 4, dtype=torch.float16)), r"weights\[0\] \(W_1\) must be .*float16"),
    (_set("weights", 2, torch.zeros(2, 7)), r"weights\[2\] \(w_v\) must have one output"),
    (_set("weights", 1, torch.zeros(1, 7, 6)), r"weights\[1\] \(W_2\) must be a float32 \[out, in\] tensor like "
                                               r"weights\[0\]"),
    (_set("biases", 0, torch.zeros(6, dtype=torch.float64)), r"biases\[0\] \(W_1\) must be a float32 \[6\] tensor"),
    (_set("biases", 1, torch.zeros(1, 7)), r"biases\[1\] \(W_2\) must be a float32 \[7\] tensor"),
    (_set("biases", 3, None), r"biases\[3\] \(W_a\) must be .* got NoneType"),
    (lambda a: a.update(x=[[0.0] * 4]), r"x must be a tensor, got list"),
    (lambda a: a.update(dueling=1), r"dueling must be a bool, got int"),
    (lambda a: a.update(weights=tuple(a["weights"][:1]) + (None,)), r"1 or 2 hidden layers"),
]


@pytest.mark.parametrize("change,match", BAD)
def test_bad_arguments(change, match):
    args = _good()
    change(args)
    with pytest.raises(ValueError, match=match):
        q_forward(args["x"], args["weights"], args["biases"], dueling=args["dueling"], backend="triton")
    assert not q_forward_supported(args["x"], args["weights"], args["biases"], args["dueling"])


POPULATION_BAD = [
    (_set("weights", 1, torch.zeros(2, 6, 7)), r"weights\[1\] \(W_2\) must be a float32 \[3, 6, out\]"),
    (_set("weights", 2, torch.zeros(7, 1)), r"weights\[2\] \(w_v\) must be a float32 \[3, in, out\] tensor like"),
    (_set("biases", 0, torch.zeros(3, 6)), r"biases\[0\] \(W_1\) must be a float32 \[3, 1, 6\] tensor"),
    (lambda a: a.update(x=torch.zeros(2, 5, 4)), r"weights\[0\] \(W_1\) must be a float32 \[2, 4, out\]"),
]


@pytest.mark.parametrize("change,match", POPULATION_BAD)
def test_bad_population_arguments(change, match):
    args = _good(population=True)
    change(args)
    with pytest.raises(ValueError, match=match):
        q_forward(args["x"], args["weights"], args["biases"], dueling=True, backend="triton")
    assert not q_forward_supported(args["x"], args["weights"], args["biases"], True)


def test_unknown_backend():
    args = _good()
    with pytest.raises(ValueError, match="backend must be"):
        q_forward(**args, backend="cuda")


def test_supported_limits():
    assert q_forward_supported(**_good()) and q_forward_supported(**_good(population=True))
    x, ws, bs = _case(1, 3, [300, 256, 256], 64, True, False)
    assert q_forward_supported(x, ws, bs, True) and not q_forward_supported(x, ws, bs, False)
    x, ws, bs = _case(3, 3, [5, 256], 64, False, True)
    assert q_forward_supported(x, ws, bs, False) and not q_forward_supported(x, ws, bs, True)


def test_registered_with_torch_library():
    """register_ops() registers torch.ops.foxdqn.q_forward; its schema holds (torch.compile of it: GPU test)."""
    register_ops()
    assert hasattr(torch.ops.foxdqn, "q_forward")
    x, ws, bs = _case(3, 9, [5, 7], 4, True, True, seed=10)
    torch.library.opcheck(torch.ops.foxdqn.q_forward.default, (x, ws, bs, True), test_utils=("test_schema",))
    torch.testing.assert_close(torch.ops.foxdqn.q_forward(x, ws, bs, True),
                               q_forward_reference(x, ws, bs, dueling=True), rtol=1e-5, atol=2e-5)


# ------------------------------------------------------------------------------ GPU
GPU_SHAPES = [(1, 4096, EURUSD, 45, True, False), (1, 4097, EURUSD, 45, True, False),
              (1, 128, EURUSD, 45, True, False), (1, 1, EURUSD, 45, True, False),
              (3, 1000, EURUSD, 45, True, True), (1, 4096, [162, 256], 45, False, False),
              (3, 300, [162, 120, 84], 2, False, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=[_id(s) for s in GPU_SHAPES])
def test_gpu_kernel_equals_reference_highest(matmul_precision, shape):
    """Matmul precision "highest": IEEE float32 products. The kernel equals the float64 emulation to
    float32 sums, and torch's float32 reference (cuBLAS sums in another order) likewise."""
    matmul_precision("highest")
    assert not tf32_enabled()
    x, ws, bs = _case(*shape, seed=shape[1], device="cuda")
    dueling = shape[4]
    with torch.no_grad():
        got = _kernel(x, ws, bs, dueling)
        ref = q_forward_reference(x, ws, bs, dueling=dueling)
    assert_close_ulps(got, _emulate(x, ws, bs, dueling, tf32=False), rtol=1e-5, ulps=64, name="q vs float64")
    assert_close_ulps(got, ref, rtol=1e-5, ulps=128, name="q vs torch")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=[_id(s) for s in GPU_SHAPES])
def test_gpu_kernel_tf32_equals_emulation(matmul_precision, shape):
    """Matmul precision "high" (the run's default): the kernel's TF32 products (operands rounded to
    nearest, then the tensor cores, whose products of TF32 operands are exact in float32) equal the
    float64 emulation as in the interpreter test (:func:`_check_tf32`); Q is within TF32's error of
    torch's own TF32 path (cuBLAS)."""
    matmul_precision("high")
    assert tf32_enabled()
    x, ws, bs = _case(*shape, seed=shape[1] + 1, device="cuda")
    dueling = shape[4]
    with torch.no_grad():
        got = _kernel(x, ws, bs, dueling)
        ref = q_forward_reference(x, ws, bs, dueling=dueling)
    _check_tf32(got, x, ws, bs, dueling)
    assert_close_ulps(got, ref, rtol=1e-2, ulps=2**15, name="q vs torch")  # 2**-8 of max |q|


@pytest.mark.gpu
def test_gpu_one_kernel_launch():
    """eurusd_dqn's collect-step forward (4,096 rows) and a population's (P = 3) are one launch each."""
    from support import cuda_kernels

    for members, population in ((1, False), (3, True)):
        x, ws, bs = _case(members, 4096, EURUSD, 45, True, population, device="cuda")
        with torch.no_grad():
            n, names = cuda_kernels(lambda: q_forward(x, ws, bs, dueling=True))
        assert n == 1, names
        assert "q_forward" in names[0], names


@pytest.mark.gpu
def test_gpu_modules_equal_kernel(matmul_precision):
    """An eurusd_dqn-shaped QNetwork and a MemberQNetwork of 3 on CUDA: the op with their weights
    (no_grad, as the collect step) equals their modules' forward to TF32 rounding (``head(encoder(obs))``:
    both networks run the op themselves without gradients)."""
    matmul_precision("high")
    nets = [n.cuda() for n in _nets(DuelingHead, obs=162, hidden=(256, 256), actions=45)]
    members = MemberQNetwork.from_networks(nets, "relu").cuda()
    linears = [m for m in nets[0].modules() if isinstance(m, torch.nn.Linear)]
    obs, pobs = torch.randn(4096, 162, device="cuda"), torch.randn(3, 1000, 162, device="cuda")
    with torch.no_grad():
        got = q_forward(obs, [m.weight for m in linears], [m.bias for m in linears], dueling=True)
        assert_close_ulps(got, nets[0].head(nets[0].encoder(obs)), rtol=1e-2, ulps=2**15, name="QNetwork")
        got = q_forward(pobs, list(members.weights), list(members.biases), dueling=True)
        want = torch.stack([net.head(net.encoder(o)) for net, o in zip(nets, pobs)])  # the modules
        assert_close_ulps(got, want, rtol=1e-2, ulps=2**15, name="MemberQNetwork")


@pytest.mark.gpu
@pytest.mark.parametrize("population", [False, True])
def test_gpu_capture_equals_eager_without_host_sync(population):
    """The forward captured in a CUDA graph: a replay after the inputs change in place gives the bits
    of an eager call on them; eager calls and replays never synchronise with the host."""
    x, ws, bs = _case(3 if population else 1, 4096, EURUSD, 45, True, population, seed=11, device="cuda")

    def forward():
        with torch.no_grad():
            return q_forward(x, ws, bs, dueling=True)

    graph, out = capture_graph(forward)
    with no_host_sync():
        x.mul_(-0.5)
        ws[1].mul_(1.25)
        graph.replay()
        eager = forward()
    assert torch.equal(out, eager)
    assert_close_ulps(out, q_forward_reference(x, ws, bs, dueling=True), rtol=1e-2, ulps=2**15)


@pytest.mark.gpu
def test_gpu_torch_compile():
    """After register_ops() the op traces into a torch.compile graph (fullgraph) and gives eager's Q."""
    register_ops()  # torch.library registration, made for torch.compile / opcheck only
    x, ws, bs = _case(3, 1000, EURUSD, 45, True, True, seed=12, device="cuda")

    def fn(x):
        with torch.no_grad():
            return q_forward(x, ws, bs, dueling=True) * 2.0

    compiled = torch.compile(fn, fullgraph=True)
    torch.testing.assert_close(compiled(x), fn(x), rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_gpu_member_network_runs_one_kernel_without_grad():
    """MemberQNetwork of 4 members of eurusd_dqn's network on CUDA: a no-grad forward is one kernel
    and equals each member's own QNetwork; with gradients the modules run (autograd)."""
    from support import cuda_kernels

    torch.manual_seed(3)
    nets = [QNetwork(MLPEncoder(162, [256, 256]), DuelingHead(256, 45)).cuda() for _ in range(4)]
    net = MemberQNetwork.from_networks(nets, "relu")
    obs = torch.randn(4, 512, 162, device="cuda")
    with torch.no_grad():
        n, names = cuda_kernels(lambda: net(obs))
        got = net(obs)
        want = torch.stack([m.head(m.encoder(o)) for m, o in zip(nets, obs)])  # each member's own modules
    assert n == 1, names
    assert_close_ulps(got, want, rtol=1e-2, ulps=2**15)
    assert net(obs).requires_grad  # grad mode on, trainable parameters: the modules, differentiable
