"""clip_coefficient: Triton kernel (TRITON_INTERPRET=1 on CPU) vs torch reference vs
torch.nn.utils.clip_grad_norm_; foxdqn.step.grad_clip.grad_norm_and_coefficient vs torch's; GPU: kernel =
reference, captured in a CUDA graph without a host sync, fewer kernels than torch."""
import pytest
import torch

from foxdqn.ops.clip_coefficient import clip_coefficient, norm_rows
from foxdqn.step.grad_clip import grad_norm_and_coefficient
from foxdqn.step.scalars import device_scalar

from support import assert_close_report, capture_graph, cuda_kernels, no_host_sync, torch_clip

F32 = torch.float32
NAN, INF = float("nan"), float("inf")


def _grads(seed, shapes, scale=1.0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(s, generator=g) * scale).to(device) for s in shapes]


SHAPES = {"one": [(7,)], "three_odd": [(5, 3), (3,), (1, 1)], "seven": [(4, 9), (9,), (9, 2), (2,), (1,), (3, 3, 2), (11,)]}


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("shapes", list(SHAPES))
@pytest.mark.parametrize("max_norm, scale", [(1.0, 1.0), (10.0, 1.0), (1e-7, 1.0), (3e38, 1.0), (0.5, 1e-8),
                                             (2.0, 0.0)])
def test_matches_torch_clip_grad_norm(backend, shapes, max_norm, scale):
    grads = _grads(len(SHAPES[shapes]) + int(max_norm * 7) % 5, SHAPES[shapes], scale)
    expect_total, expect_grads = torch_clip(grads, max_norm)
    norms = norm_rows(torch._foreach_norm(grads, 2))
    total, coef = clip_coefficient(norms, torch.tensor(max_norm), backend=backend)
    assert total.shape == () and coef.shape == () and total.dtype == coef.dtype == F32
    assert_close_report(total, expect_total, rtol=2e-7, name="total")
    expect_coef = min(1.0, max_norm / (float(expect_total) + 1e-6))
    assert_close_report(coef, torch.tensor(expect_coef, dtype=F32), rtol=1e-6, name="coef")
    if scale == 0.0:
        assert float(total) == 0.0 and float(coef) == 1.0
    for g, e in zip(grads, expect_grads):
        assert_close_report(g * coef, e, rtol=1e-6, atol=1e-30, name="clipped grad")


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("bad, max_norm, expect", [
    (NAN, 1.0, (NAN, NAN)),       # NaN norm: NaN total and coefficient (torch: grads become NaN)
    (INF, 1.0, (INF, 0.0)),       # Inf norm: Inf total, coefficient 0
    (INF, INF, (INF, NAN)),       # 0 * Inf
    (2e19, 1.0, (INF, 0.0)),      # finite norms whose squares overflow float32, as torch's vector_norm
])
def test_non_finite_like_torch(backend, bad, max_norm, expect):
    norms = torch.tensor([1.0, bad, 2.0], dtype=F32)
    ref_total = torch.linalg.vector_norm(norms, 2)
    ref_coef = torch.clamp(max_norm / (ref_total + 1e-6), max=1.0)
    total, coef = clip_coefficient(norms, torch.tensor(max_norm), backend=backend)
    assert_close_report(torch.stack([total, coef]), torch.tensor(expect, dtype=F32), name="kernel vs expected")
    assert_close_report(torch.stack([total, coef]), torch.stack([ref_total, ref_coef]), name="kernel vs torch")


def test_rows_each_with_own_bound_kernel_equals_reference():
    g = torch.Generator().manual_seed(3)
    norms = torch.rand(5, 13, generator=g) * torch.tensor([1.0, 0.01, 100.0, 0.0, 1.0])[:, None]
    norms[4, 6] = NAN
    max_norm = torch.tensor([0.5, 10.0, 1.0, 1.0, 1.0])
    kt, kc = clip_coefficient(norms, max_norm, backend="triton")
    rt, rc = clip_coefficient(norms, max_norm, backend="torch")
    assert kt.shape == kc.shape == (5,)
    assert_close_report(kt, rt, rtol=2e-7, name="total")
    assert_close_report(kc, rc, rtol=1e-6, name="coef")
    assert kc[1] == 1.0 and kc[3] == 1.0 and kt[3] == 0.0 and torch.isnan(kc[4])
    for p in range(4):  # each row is torch's clip of that row alone
        e = torch.clamp(max_norm[p] / (torch.linalg.vector_norm(norms[p]) + 1e-6), max=1.0)
        assert_close_report(kc[p], e, rtol=1e-6, name=f"row {p}")


def test_grad_clip_helper_equals_torch_and_skips_missing_grads():
    grads = _grads(11, SHAPES["seven"], scale=3.0)
    expect_total, expect_grads = torch_clip(grads, 2.0)
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    params.insert(2, torch.nn.Parameter(torch.zeros(4)))  # no grad: left out, as torch does
    before = [p.grad.clone() for p in params if p.grad is not None]
    total, coef = grad_norm_and_coefficient(params, device_scalar(torch.device("cpu"), 2.0))
    assert_close_report(total, expect_total, rtol=2e-7, name="total")
    got = [p.grad for p in params if p.grad is not None]
    assert len(got) == len(expect_grads) and float(expect_total) > 2.0 and float(coef) < 1.0
    for g, b, e in zip(got, before, expect_grads):
        assert torch.equal(g, b)  # the gradients are left as they are: Adam's kernel scales them
        assert_close_report(g * coef, e, rtol=1e-6, name="clipped grad")
    total0, coef0 = grad_norm_and_coefficient([torch.nn.Parameter(torch.zeros(2))], device_scalar("cpu", 2.0))
    assert float(total0) == 0.0 and float(coef0) == 1.0


def test_norm_rows_views_one_buffer_and_stacks_others():
    buf = torch.tensor([3.0, 4.0, 5.0])
    view = norm_rows([buf[0], buf[1], buf[2]])
    assert view.data_ptr() == buf.data_ptr() and torch.equal(view, buf)
    stacked = norm_rows([buf[0], buf[2]])  # not consecutive: stacked
    assert stacked.data_ptr() != buf.data_ptr() and stacked.tolist() == [3.0, 5.0]
    with pytest.raises(ValueError, match=r"norms\[1\]"):
        norm_rows([buf[0], torch.tensor(1.0, dtype=torch.float64)])


@pytest.mark.parametrize("norms, max_norm, match", [
    (torch.ones(3, dtype=torch.float64), torch.tensor(1.0), "norms"),
    (torch.ones(0), torch.tensor(1.0), "norms"),
    (torch.ones(2, 3), torch.tensor(1.0), "max_norm"),
    (torch.ones(3), torch.tensor([1.0]), "max_norm"),
    (torch.ones(6)[::2], torch.tensor(1.0), "unit last stride"),
])
def test_bad_arguments(norms, max_norm, match):
    with pytest.raises(ValueError, match=match):
        clip_coefficient(norms, max_norm)


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_kernel_equals_reference_and_torch():
    for shapes in SHAPES.values():
        grads = _grads(5, shapes, device="cuda")
        expect_total, expect_grads = torch_clip(grads, 0.5)
        norms = norm_rows(torch._foreach_norm(grads, 2))
        total, coef = clip_coefficient(norms, torch.tensor(0.5, device="cuda"))
        rt, rc = clip_coefficient(norms, torch.tensor(0.5, device="cuda"), backend="torch")
        assert_close_report(total, rt, rtol=2e-7, name="total vs reference")
        assert_close_report(coef, rc, rtol=1e-6, name="coef vs reference")
        assert_close_report(total, expect_total, rtol=2e-7, name="total vs torch")


@pytest.mark.gpu
def test_gpu_captured_no_sync_and_fewer_kernels():
    dev = torch.device("cuda")
    shapes = [(64, 32), (64,), (64, 64), (64,), (3, 64), (3,)]
    src = _grads(7, shapes, scale=2.0, device=dev)
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in src]
    for p, g in zip(params, src):
        p.grad = g.clone()
    bound = device_scalar(dev, 1.0)

    def body():
        for p, g in zip(params, src):
            p.grad.copy_(g)
        return grad_norm_and_coefficient(params, bound)

    grad_norm_and_coefficient(params, bound)  # eager first: makes the op's scratch
    graph, (total, coef) = capture_graph(body)
    with no_host_sync():
        graph.replay()
    torch.cuda.synchronize()
    expect_total, expect_grads = torch_clip(src, 1.0)
    assert_close_report(total, expect_total, rtol=2e-7, name="total")
    for p, e in zip(params, expect_grads):
        assert_close_report(p.grad * coef, e, rtol=1e-6, name="grad")
    ours, _ = cuda_kernels(lambda: grad_norm_and_coefficient(params, bound))
    theirs, _ = cuda_kernels(lambda: torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True))
    assert ours == 1 < theirs, (ours, theirs)  # one launch for up to 8 tensors; torch 2.11: 10
