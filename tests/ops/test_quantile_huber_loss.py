"""Tests of foxdqn.ops.quantile_huber_loss (IQN eq. 3, QR-DQN eq. 9-10).

CPU: forward and backward Triton kernels run under TRITON_INTERPRET=1 (tests/conftest.py) and
are checked against hand-computed values and the torch reference (loss and autograd grads);
the reference's own gradient is checked with gradcheck in float64.
GPU (`gpu` marker): CUDA kernels vs reference, CUDA graph capture + replay of forward and
backward, sync debug mode, torch.compile with backward.
"""
from __future__ import annotations

import pytest
import torch

from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.library import register_ops
from foxdqn.ops.quantile_huber_loss import (
    _launch_config,
    _qhl_backward_launch,
    _qhl_forward_launch,
    quantile_huber_loss,
    quantile_huber_loss_reference,
)

from support import assert_close_nan, capture_graph, no_host_sync, require_compiled_kernels

NAN = float("nan")

_gpu_tests_need_compiled_kernels = require_compiled_kernels(INTERPRET)


def _case(num_rows: int, n: int, n_target: int, seed: int, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(num_rows, n, generator=g) * 2
    t = torch.randn(num_rows, n_target, generator=g) * 2 + 0.3
    tau = torch.rand(num_rows, n, generator=g) * 0.98 + 0.01
    w = torch.randn(num_rows, generator=g)  # upstream gradient per sample
    return (x.to(device) for x in (q, t, tau, w))


def _loss_and_grad(fn, q, t, tau, w, kappa, **kw):
    q = q.detach().clone().requires_grad_(True)
    loss = fn(q, t, tau, kappa, **kw)
    (grad,) = torch.autograd.grad((loss * w).sum(), q)
    return loss.detach(), grad


# ------------------------------------------------------------------------------ hand-computed
# B=1, N=N'=2: quantiles [0, 1], taus [0.25, 0.75], targets [0.5, 3].
# delta (rows i, cols j) = [[0.5, 3.0], [-0.5, 2.0]]; weights |tau_i - 1{delta<0}| = [[.25, .25], [.25, .75]].
# kappa=1:   L/k = [[0.125, 2.5], [0.125, 1.5]] -> rho = [[0.03125, 0.625], [0.03125, 1.125]]
#            loss = (0.65625 + 1.15625) / 2 = 0.90625
#            psi = [[0.5, 1], [-0.5, 1]] -> grad_i = -(1/2) sum_j w psi = [-0.1875, -0.3125]
# kappa=2.5: L/k = [[0.05, 1.75], [0.05, 0.8]] -> rho = [[0.0125, 0.4375], [0.0125, 0.6]]
#            loss = 1.0625 / 2 = 0.53125; psi = [[0.2, 1], [-0.2, 0.8]] -> grad = [-0.15, -0.275]
# kappa=0:   |delta| = [[0.5, 3], [0.5, 2]] -> rho = [[0.125, 0.75], [0.125, 1.5]]
#            loss = 2.5 / 2 = 1.25; psi = sign = [[1, 1], [-1, 1]] -> grad = [-0.25, -0.25]
HAND = [
    pytest.param(1.0, 0.90625, [-0.1875, -0.3125], id="kappa1"),
    pytest.param(2.5, 0.53125, [-0.15, -0.275], id="kappa2.5"),
    pytest.param(0.0, 1.25, [-0.25, -0.25], id="kappa0"),
]


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("kappa,loss_expected,grad_expected", HAND)
def test_hand_computed(backend, kappa, loss_expected, grad_expected):
    q = torch.tensor([[0.0, 1.0]], requires_grad=True)
    tau = torch.tensor([[0.25, 0.75]])
    t = torch.tensor([[0.5, 3.0]])
    loss = quantile_huber_loss(q, t, tau, kappa, backend=backend)
    assert loss.shape == (1,) and loss.dtype == torch.float32
    loss.sum().backward()
    torch.testing.assert_close(loss.detach(), torch.tensor([loss_expected]), atol=1e-6, rtol=0)
    torch.testing.assert_close(q.grad, torch.tensor([grad_expected]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("kappa", [0.0, 1.0, 2.5])
def test_delta_exactly_zero_and_kappa(backend, kappa):
    # one quantile 0.5 at tau = 0.3 against targets 0.5, 0.5 + k, 0.5 - k: delta = 0, +k, -k exactly.
    # kappa > 0: rho = [0, 0.3 * k/2, 0.7 * k/2] -> loss = (k/2) / 3; psi = [0, 1, -1]
    #            -> grad = -(0.3 * 1 + 0.7 * -1) / 3 = 0.4 / 3.
    # kappa = 0: all three deltas are 0 -> loss 0, grad 0 (sign(0) = 0).
    q = torch.tensor([[0.5]], requires_grad=True)
    t = torch.tensor([[0.5, 0.5 + kappa, 0.5 - kappa]])
    tau = torch.tensor([[0.3]])
    loss = quantile_huber_loss(q, t, tau, kappa, backend=backend)
    loss.sum().backward()
    loss_expected = 0.5 * kappa / 3 if kappa > 0 else 0.0
    grad_expected = 0.4 / 3 if kappa > 0 else 0.0
    torch.testing.assert_close(loss.detach(), torch.tensor([loss_expected]), atol=1e-6, rtol=0)
    torch.testing.assert_close(q.grad, torch.tensor([[grad_expected]]), atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------ vs reference
@pytest.mark.parametrize("kappa", [0.0, 1.0, 2.5])
@pytest.mark.parametrize("n,n_target", [(8, 8), (32, 32), (8, 32), (32, 8)])
@pytest.mark.parametrize("num_rows", [1, 7, 1023])
def test_kernel_matches_reference(num_rows, n, n_target, kappa):
    q, t, tau, w = _case(num_rows, n, n_target, seed=num_rows + 31 * n + n_target)
    loss, grad = _loss_and_grad(quantile_huber_loss, q, t, tau, w, kappa, backend="triton")
    loss_ref, grad_ref = _loss_and_grad(quantile_huber_loss_reference, q, t, tau, w, kappa)
    assert_close_nan(loss, loss_ref, atol=1e-5, rtol=1e-5)
    assert_close_nan(grad, grad_ref, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kappa", [0.0, 1.0])
@pytest.mark.parametrize("n,n_target,blocks", [(13, 19, (2, 4, 8)), (64, 64, None), (200, 200, None), (5, 3, (4, 8, 2))])
def test_chunked_tiling_matches_reference(n, n_target, blocks, kappa):
    # odd sizes, several i and j chunks with partial last chunks, and the CUDA tiling, all in the interpreter
    num_rows = 11
    q, t, tau, w = _case(num_rows, n, n_target, seed=n)
    if blocks is None:
        blocks = _launch_config(num_rows, n, n_target, interpret=False)
    loss = _qhl_forward_launch(q, t, tau, kappa, blocks=blocks)
    grad = _qhl_backward_launch(w, q, t, tau, kappa, blocks=blocks)
    loss_ref, grad_ref = _loss_and_grad(quantile_huber_loss_reference, q, t, tau, w, kappa)
    assert_close_nan(loss, loss_ref, atol=1e-5, rtol=1e-5)
    assert_close_nan(grad, grad_ref, atol=1e-6, rtol=1e-5)


def test_broadcast_taus_and_strided_inputs():
    # QR-DQN: fixed midpoints tau_i = (2i + 1) / 2N broadcast over the batch (row stride 0);
    # quantiles a strided slice of a wider tensor.
    num_rows, n = 9, 16
    q_full, t, _, w = _case(num_rows, 2 * n, n, seed=5)
    q = q_full[:, n:]
    tau = ((torch.arange(n) * 2 + 1) / (2 * n)).expand(num_rows, n)
    assert tau.stride(0) == 0 and q.stride(0) == 2 * n
    loss, grad = _loss_and_grad(quantile_huber_loss, q, t, tau, w, 1.0, backend="triton")
    loss_ref, grad_ref = _loss_and_grad(quantile_huber_loss_reference, q, t, tau.contiguous(), w, 1.0)
    assert_close_nan(loss, loss_ref)
    assert_close_nan(grad, grad_ref, atol=1e-6)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_targets_and_taus_get_no_grad(backend):
    q, t, tau, _ = _case(3, 4, 5, seed=1)
    q.requires_grad_(True)
    t.requires_grad_(True)
    tau.requires_grad_(True)
    quantile_huber_loss(q, t, tau, 1.0, backend=backend).sum().backward()
    assert q.grad is not None
    assert t.grad is None and tau.grad is None


def test_no_grad_needed():
    q, t, tau, _ = _case(3, 4, 5, seed=2)
    with torch.no_grad():
        loss = quantile_huber_loss(q, t, tau, 1.0, backend="triton")
    torch.testing.assert_close(loss, quantile_huber_loss_reference(q, t, tau, 1.0), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kappa", [0.0, 1.0, 2.5])
def test_reference_gradcheck_float64(kappa):
    q, t, tau, _ = _case(2, 3, 4, seed=3)
    q = q.double().requires_grad_(True)
    t, tau = t.double(), tau.double()
    assert torch.autograd.gradcheck(lambda x: quantile_huber_loss_reference(x, t, tau, kappa), (q,))


# ------------------------------------------------------------------------------ NaN
@pytest.mark.parametrize("kappa", [0.0, 1.0])
def test_nan_propagation(kappa):
    # Rule: loss_b is NaN iff row b has a NaN in quantiles, targets or taus; grad[b, i] is NaN iff
    # quantile[b, i] or tau[b, i] is NaN or any target[b, :] is NaN.
    q, t, tau, w = _case(5, 4, 6, seed=9)
    q[0, 1] = NAN
    t[1, 5] = NAN
    tau[2, 3] = NAN
    # rows 3, 4 finite
    loss, grad = _loss_and_grad(quantile_huber_loss, q, t, tau, w, kappa, backend="triton")
    assert torch.equal(torch.isnan(loss), torch.tensor([True, True, True, False, False]))
    expected_nan = torch.zeros(5, 4, dtype=torch.bool)
    expected_nan[0, 1] = True
    expected_nan[1, :] = True
    expected_nan[2, 3] = True
    assert torch.equal(torch.isnan(grad), expected_nan)
    loss_ref, grad_ref = _loss_and_grad(quantile_huber_loss_reference, q, t, tau, w, kappa)
    assert_close_nan(loss, loss_ref)
    if kappa > 0:
        assert_close_nan(grad, grad_ref, atol=1e-6)
    else:
        # torch's abs backward uses sgn(NaN) = 0, so the reference drops some NaNs from the
        # gradient (documented); finite entries still agree.
        fin = ~expected_nan
        torch.testing.assert_close(grad[fin], grad_ref[fin], atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("backend", ["auto", "triton", "torch"])
def test_errors(backend):
    q, t, tau, _ = _case(2, 3, 4, seed=0)
    with pytest.raises(ValueError, match="kappa"):
        quantile_huber_loss(q, t, tau, -1.0, backend=backend)
    with pytest.raises(ValueError, match="kappa"):
        quantile_huber_loss(q, t, tau, float("nan"), backend=backend)
    with pytest.raises(ValueError, match="taus"):
        quantile_huber_loss(q, t, tau[:, :2], 1.0, backend=backend)
    with pytest.raises(ValueError, match="target_quantiles"):
        quantile_huber_loss(q, t[:1], tau, 1.0, backend=backend)
    with pytest.raises(ValueError, match="quantiles"):
        quantile_huber_loss(q[0], t, tau, 1.0, backend=backend)


def test_bad_backend_and_dtype():
    q, t, tau, _ = _case(2, 3, 4, seed=0)
    with pytest.raises(ValueError, match="backend"):
        quantile_huber_loss(q, t, tau, 1.0, backend="cuda")
    with pytest.raises(ValueError, match="float32"):
        quantile_huber_loss(q.double(), t, tau, 1.0, backend="triton")


# ------------------------------------------------------------------------------ a kappa per group of rows
GROUP_KAPPAS = [1.0, 0.0, 0.3, 2.5]  # 0.3: not a float32 value


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_grouped_kappa_rows_equal_the_float_kappa_of_their_group(backend):
    """kappa [G]: group g's rows get the loss and gradient of the float kappa_g bit for bit (a
    population's member p equals a population of one), kappa 0 included, and no row reads another
    group's kappa."""
    per = 5
    q, t, tau, w = _case(per * len(GROUP_KAPPAS), 7, 9, seed=3)
    kappas = torch.tensor(GROUP_KAPPAS)
    loss, grad = _loss_and_grad(quantile_huber_loss, q, t, tau, w, kappas, backend=backend)
    assert torch.isfinite(grad).all()  # kappa 0 rows: no 0/0 in the branch not taken
    for g, kappa in enumerate(GROUP_KAPPAS):
        rows = slice(g * per, (g + 1) * per)
        alone = _loss_and_grad(quantile_huber_loss, q[rows], t[rows], tau[rows], w[rows], kappa, backend=backend)
        assert torch.equal(loss[rows], alone[0]) and torch.equal(grad[rows], alone[1]), kappa
    one_kappa = _loss_and_grad(quantile_huber_loss, q, t, tau, w, 1.0, backend=backend)
    assert not torch.equal(loss, one_kappa[0])


@pytest.mark.parametrize("blocks", [None, (2, 4, 8), (4, 8, 2)])
def test_grouped_kappa_kernels_match_reference(blocks):
    """Row blocks that span two groups (BLOCK_B not dividing B/G) read each row's own kappa."""
    per = 3
    q, t, tau, w = _case(per * len(GROUP_KAPPAS), 13, 19, seed=8)
    kappas = torch.tensor(GROUP_KAPPAS)
    loss = _qhl_forward_launch(q, t, tau, 1.0, blocks=blocks, kappas=kappas)
    grad = _qhl_backward_launch(w, q, t, tau, 1.0, blocks=blocks, kappas=kappas)
    loss_ref, grad_ref = _loss_and_grad(quantile_huber_loss_reference, q, t, tau, w, kappas)
    assert_close_nan(loss, loss_ref, atol=1e-5, rtol=1e-5)
    assert_close_nan(grad, grad_ref, atol=1e-6, rtol=1e-5)


def test_grouped_kappa_reference_gradcheck_float64():
    q, t, tau, _ = _case(4, 3, 5, seed=2)
    q = q.double().requires_grad_(True)
    kappas = torch.tensor([0.5, 2.0], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x: quantile_huber_loss_reference(x, t.double(), tau.double(), kappas), (q,))


@pytest.mark.parametrize("backend", ["auto", "triton", "torch"])
def test_grouped_kappa_errors(backend):
    q, t, tau, _ = _case(4, 3, 4, seed=0)
    with pytest.raises(ValueError, match="G dividing B=4"):
        quantile_huber_loss(q, t, tau, torch.ones(3), backend=backend)
    with pytest.raises(ValueError, match="G dividing B=4"):
        quantile_huber_loss(q, t, tau, torch.ones(2, dtype=torch.int64), backend=backend)


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("kappa", [0.0, 1.0, 2.5])
@pytest.mark.parametrize("num_rows,n,n_target", [(1, 8, 8), (7, 8, 32), (1023, 32, 8), (256, 64, 64), (4096, 200, 200)])
def test_gpu_matches_reference(num_rows, n, n_target, kappa):
    q, t, tau, w = _case(num_rows, n, n_target, seed=n + n_target, device="cuda")
    loss, grad = _loss_and_grad(quantile_huber_loss, q, t, tau, w, kappa)  # auto -> Triton
    loss_ref, grad_ref = _loss_and_grad(quantile_huber_loss_reference, q, t, tau, w, kappa)
    assert_close_nan(loss, loss_ref, atol=1e-4, rtol=1e-5)
    assert_close_nan(grad, grad_ref, atol=1e-5, rtol=1e-5)
    # deterministic: fixed-order reductions, no atomics
    loss2, grad2 = _loss_and_grad(quantile_huber_loss, q, t, tau, w, kappa)
    assert torch.equal(loss, loss2) and torch.equal(grad, grad2)


@pytest.mark.gpu
def test_gpu_nan_propagation():
    q, t, tau, w = _case(3, 4, 6, seed=9, device="cuda")
    q[0, 1] = NAN
    t[1, 5] = NAN
    loss, grad = _loss_and_grad(quantile_huber_loss, q, t, tau, w, 1.0)
    loss_ref, grad_ref = _loss_and_grad(quantile_huber_loss_reference, q, t, tau, w, 1.0)
    assert_close_nan(loss, loss_ref)
    assert_close_nan(grad, grad_ref, atol=1e-6)


@pytest.mark.gpu
def test_gpu_cuda_graph_capture_forward_backward():
    num_rows, n, n_target = 256, 32, 32
    q0, t, tau, w = _case(num_rows, n, n_target, seed=1, device="cuda")
    q = q0.clone().requires_grad_(True)

    def step():
        loss = quantile_huber_loss(q, t, tau, 1.0)
        (grad,) = torch.autograd.grad((loss * w).sum(), q)
        return loss.detach(), grad

    graph, (loss_static, grad_static) = capture_graph(step, warmup=3)
    for seed in (2, 3):
        q2, t2, tau2, w2 = _case(num_rows, n, n_target, seed=seed, device="cuda")
        with torch.no_grad():
            q.copy_(q2)
        t.copy_(t2)
        tau.copy_(tau2)
        w.copy_(w2)
        graph.replay()
        torch.cuda.synchronize()
        loss_ref, grad_ref = _loss_and_grad(quantile_huber_loss_reference, q2, t2, tau2, w2, 1.0)
        assert_close_nan(loss_static, loss_ref, atol=1e-4, rtol=1e-5)
        assert_close_nan(grad_static, grad_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
def test_gpu_no_host_sync():
    q0, t, tau, w = _case(512, 32, 32, seed=4, device="cuda")
    q = q0.clone().requires_grad_(True)
    loss = quantile_huber_loss(q, t, tau, 1.0)  # warm-up: kernel compilation outside the check
    torch.autograd.grad((loss * w).sum(), q)
    torch.cuda.synchronize()
    with no_host_sync():
        for _ in range(3):
            loss = quantile_huber_loss(q, t, tau, 1.0)
            (grad,) = torch.autograd.grad((loss * w).sum(), q)
    loss_ref, grad_ref = _loss_and_grad(quantile_huber_loss_reference, q0, t, tau, w, 1.0)
    assert_close_nan(loss.detach(), loss_ref, atol=1e-4, rtol=1e-5)
    assert_close_nan(grad, grad_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("kappa", [0.0, 1.0])
def test_gpu_torch_compile_with_backward(kappa):
    register_ops()  # torch.library registration, made for torch.compile / opcheck only
    q0, t, tau, w = _case(129, 32, 16, seed=5, device="cuda")

    def fn(q, t, tau, w):
        return (quantile_huber_loss(q, t, tau, kappa) * w).sum()

    compiled = torch.compile(fn, fullgraph=True)
    q = q0.clone().requires_grad_(True)
    out = compiled(q, t, tau, w)
    out.backward()
    q_eager = q0.clone().requires_grad_(True)
    out_eager = fn(q_eager, t, tau, w)
    out_eager.backward()
    torch.testing.assert_close(out, out_eager, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(q.grad, q_eager.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
def test_gpu_torch_compile_kappa_argument():
    register_ops()  # torch.library registration, made for torch.compile / opcheck only
    # kappa as a function argument: from the second value on Dynamo recompiles with it symbolic
    # (automatic dynamic), so the eager-only kappa check must not break the graph, and Inductor
    # passes it to the kernels as an fp64 scalar, which they cast to fp32 (an fp64 kappa would
    # promote the fp32 loop-carried accumulator and fail to compile).
    q0, t, tau, w = _case(129, 32, 16, seed=6, device="cuda")

    def fn(q, t, tau, w, kappa):
        return (quantile_huber_loss(q, t, tau, kappa) * w).sum()

    compiled = torch.compile(fn, fullgraph=True)
    for kappa in (1.0, 2.5, 0.5, 0.0):
        q = q0.clone().requires_grad_(True)
        out = compiled(q, t, tau, w, kappa)
        out.backward()
        q_eager = q0.clone().requires_grad_(True)
        out_eager = fn(q_eager, t, tau, w, kappa)
        out_eager.backward()
        torch.testing.assert_close(out, out_eager, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(q.grad, q_eager.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
def test_gpu_grouped_kappa_matches_reference_and_float_kappa():
    per = 256
    q, t, tau, w = _case(per * len(GROUP_KAPPAS), 32, 32, seed=6, device="cuda")
    kappas = torch.tensor(GROUP_KAPPAS, device="cuda")
    loss, grad = _loss_and_grad(quantile_huber_loss, q, t, tau, w, kappas)
    loss_ref, grad_ref = _loss_and_grad(quantile_huber_loss_reference, q, t, tau, w, kappas)
    assert_close_nan(loss, loss_ref, atol=1e-4, rtol=1e-5)
    assert_close_nan(grad, grad_ref, atol=1e-5, rtol=1e-5)
    for g, kappa in enumerate(GROUP_KAPPAS):
        rows = slice(g * per, (g + 1) * per)
        alone = _loss_and_grad(quantile_huber_loss, q[rows], t[rows], tau[rows], w[rows], kappa)
        torch.testing.assert_close(loss[rows], alone[0], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(grad[rows], alone[1], atol=1e-6, rtol=1e-6)
