"""foxdqn.ops.member_layer_norm: the kernel (TRITON_INTERPRET=1 on CPU) against its torch reference
(F.layer_norm then each member's affine) on odd P, M and C, large offsets and a tiny variance,
strided inputs; members never mix; a row's output does not depend on P; NaN; bad arguments; no
rows; MemberLayerNorm takes it where the fused forwards run. The backward (one kernel): dx, dγ and
dβ against autograd through the reference on odd shapes, one and many row blocks a member (the last
program's sums), only the gradients asked for, the same bits on a second call and for a member
alone, no rows, NaN. GPU (`gpu` marker): kernel = reference on CUDA, a capture of the forward
replays as eager, one kernel forward and one backward."""
from __future__ import annotations

import pytest
import torch

from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.member_layer_norm import member_layer_norm, member_layer_norm_reference

from support import assert_replays_give, cuda_kernels, require_compiled_kernels

_need_compiled = require_compiled_kernels(INTERPRET)


def _case(p, m, c, seed=0, device="cpu", offset=0.0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(p, m, c, generator=g) * scale + offset
    w = torch.randn(p, 1, c, generator=g)
    b = torch.randn(p, 1, c, generator=g)
    return x.to(device), w.to(device), b.to(device)


@pytest.mark.parametrize("p,m,c", [(1, 1, 1), (1, 7, 5), (3, 8, 32), (2, 130, 17), (5, 3, 64)])
def test_kernel_equals_reference(p, m, c):
    x, w, b = _case(p, m, c)
    got = member_layer_norm(x, w, b, 1e-5, backend="triton")
    torch.testing.assert_close(got, member_layer_norm_reference(x, w, b, 1e-5), rtol=1e-5, atol=1e-5)


def test_large_offsets_tiny_variance_and_strided_input():
    """Rows of 1000 ± 0.01 (ill-conditioned in float32): the kernel's error against float64 is of the
    order of torch's own (about 0.03 and 0.016 here), not the reference to a tolerance."""
    x, w, b = _case(2, 9, 24, offset=1e3, scale=1e-2)
    got = member_layer_norm(x, w, b, 1e-5, backend="triton")
    exact = member_layer_norm_reference(x.double(), w.double(), b.double(), 1e-5)
    torch_error = (member_layer_norm_reference(x, w, b, 1e-5).double() - exact).abs().max()
    assert (got.double() - exact).abs().max() <= 3 * torch_error + 1e-6
    wide = torch.cat([x, x], dim=-1)[..., :24]  # not contiguous
    torch.testing.assert_close(member_layer_norm(wide, w, b, 1e-5, backend="triton"), got)


def test_members_never_mix_and_a_row_does_not_depend_on_p():
    x, w, b = _case(4, 6, 20, seed=1)
    together = member_layer_norm(x, w, b, 1e-5, backend="triton")
    for p in range(4):
        alone = member_layer_norm(x[p:p + 1], w[p:p + 1], b[p:p + 1], 1e-5, backend="triton")
        assert torch.equal(together[p:p + 1], alone)


def test_nan_stays_in_its_row():
    x, w, b = _case(2, 4, 8)
    x[1, 2, 3] = float("nan")
    got = member_layer_norm(x, w, b, 1e-5, backend="triton")
    assert torch.isnan(got[1, 2]).all()
    rest = torch.ones(2, 4, dtype=torch.bool)
    rest[1, 2] = False
    assert torch.isfinite(got[rest]).all()


def test_bad_arguments_and_no_rows():
    x, w, b = _case(2, 3, 8)
    for args, match in (((x[0], w, b), "x must be a float32 \\[P, M, C\\]"), ((x, w[:1], b), "weight must be"),
                        ((x, w, b.double()), "bias must be"), ((x.double(), w, b), "x must be")):
        with pytest.raises(ValueError, match=match):
            member_layer_norm(*args, 1e-5, backend="triton")
    assert member_layer_norm(x[:, :0], w, b, 1e-5, backend="triton").shape == (2, 0, 8)


def test_member_layer_norm_module_takes_it_without_gradient():
    """Where the fused forwards run (cpu_kernels here) and under no_grad: the op's one kernel, equal
    to the torch path's output to float rounding."""
    from foxdqn.ops.backend import cpu_kernels
    from foxdqn.population import layers

    x, w, b = _case(3, 5, 16)
    module = layers.MemberLayerNorm(w, b, 1e-5)
    with torch.no_grad():
        want = module(x)
        with cpu_kernels():
            got = module(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with torch.no_grad(), cpu_kernels():
        assert torch.equal(module(x), member_layer_norm(x, w, b, 1e-5, backend="triton"))


# ------------------------------------------------------------------------------ backward
def _grads(x, w, b, dy, backend, need=(True, True, True)):
    """y and (dx, dγ, dβ) of Σ y · dy through member_layer_norm (None where not asked for)."""
    leaves = [t.detach().clone().requires_grad_(n) for t, n in zip((x, w, b), need)]
    y = member_layer_norm(*leaves, 1e-5, backend=backend) if x.dtype == torch.float32 else \
        member_layer_norm_reference(*leaves, 1e-5)  # float64: the reference itself
    asked = [t for t in leaves if t.requires_grad]
    got = iter(torch.autograd.grad(y, asked, dy))
    return y.detach(), [next(got) if t.requires_grad else None for t in leaves]


# (P, M, C): one row; a block's padded rows and columns; several row blocks a member (the last
# program's sum over 9 and 65 parts, a SUM tile of several passes); wide rows (one row a block)
BACKWARD = [(1, 1, 1), (3, 7, 5), (2, 130, 17), (1, 1040, 64), (2, 3, 300)]


@pytest.mark.parametrize("p,m,c", BACKWARD, ids=[f"P{p}-M{m}-C{c}" for p, m, c in BACKWARD])
def test_backward_equals_autograd_through_the_reference(p, m, c):
    x, w, b = _case(p, m, c, seed=m + c)
    dy = torch.randn(p, m, c, generator=torch.Generator().manual_seed(c))
    y, got = _grads(x, w, b, dy, "triton")
    ref_y, want = _grads(x.double(), w.double(), b.double(), dy.double(), "torch")
    torch.testing.assert_close(y, ref_y.float(), rtol=1e-5, atol=1e-5)
    scale = [max(1.0, t.abs().max().item()) for t in want]
    for a, e, s, name in zip(got, want, scale, ("dx", "dgamma", "dbeta")):
        torch.testing.assert_close(a, e.float(), rtol=2e-5, atol=1e-5 * s * max(1, m) ** 0.5, msg=name)
    _, again = _grads(x, w, b, dy, "triton")
    assert all(torch.equal(a, e) for a, e in zip(got, again))  # every ticket back at zero, fixed sums


def test_backward_of_a_member_is_its_run_alone_and_asks_only_what_is_needed():
    x, w, b = _case(3, 70, 24, seed=3)
    dy = torch.randn(3, 70, 24, generator=torch.Generator().manual_seed(4))
    _, together = _grads(x, w, b, dy, "triton")
    for p in range(3):
        _, alone = _grads(x[p:p + 1], w[p:p + 1], b[p:p + 1], dy[p:p + 1], "triton")
        assert all(torch.equal(a[p:p + 1], e) for a, e in zip(together, alone)), p
    _, frozen = _grads(x, w, b, dy, "triton", need=(True, False, False))
    assert frozen[1] is None and frozen[2] is None and torch.equal(frozen[0], together[0])
    _, params = _grads(x, w, b, dy, "triton", need=(False, True, True))
    assert params[0] is None and torch.equal(params[1], together[1]) and torch.equal(params[2], together[2])


def test_backward_with_no_rows_and_with_nan():
    x, w, b = _case(2, 4, 8, seed=9)
    _, empty = _grads(x[:, :0], w, b, torch.zeros(2, 0, 8), "triton")
    assert empty[0].shape == (2, 0, 8) and not empty[1].any() and not empty[2].any()
    x[1, 2, 3] = float("nan")
    _, got = _grads(x, w, b, torch.ones(2, 4, 8), "triton")
    assert torch.isnan(got[0][1, 2]).all() and torch.isfinite(got[0][0]).all()
    assert torch.isfinite(got[1][0]).all() and torch.isnan(got[1][1]).any()  # member 1's γ gradient only
    assert torch.equal(got[2][1], torch.full((1, 8), 4.0))  # dβ = Σ dy does not read x


def test_member_layer_norm_module_trains_through_the_op(monkeypatch):
    """Where the fused forwards run (cpu_kernels here), MemberLayerNorm with a gradient to come is
    the op (one forward and one backward kernel): its gradients equal the torch path's."""
    from foxdqn.ops.backend import cpu_kernels
    from foxdqn.population import layers

    x, w, b = _case(3, 9, 16, seed=5)
    module = layers.MemberLayerNorm(w.clone(), b.clone(), 1e-5)
    dy = torch.randn(3, 9, 16, generator=torch.Generator().manual_seed(6))
    xs = x.clone().requires_grad_(True)
    calls = []
    real = layers.member_layer_norm_op.member_layer_norm
    monkeypatch.setattr(layers.member_layer_norm_op, "member_layer_norm",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    with cpu_kernels():
        got = torch.autograd.grad(module(xs), [xs, module.weight, module.bias], dy)
    assert calls == [1]
    want = torch.autograd.grad(module(xs), [xs, module.weight, module.bias], dy)  # the torch path
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("p,m,c", [(1, 4096, 64), (64, 512, 64), (3, 1001, 17)])
def test_gpu_kernel_equals_reference(p, m, c):
    x, w, b = _case(p, m, c, device="cuda")
    torch.testing.assert_close(member_layer_norm(x, w, b, 1e-5), member_layer_norm_reference(x, w, b, 1e-5),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("p,m,c", [(1, 8192, 64), (64, 8192, 64), (3, 1001, 17)])
def test_gpu_backward_equals_autograd_in_one_kernel(p, m, c):
    """On CUDA: dx, dγ, dβ equal autograd through the float64 reference; the backward is one
    kernel. (Captured inside ``eurusd_attention``'s update by the bench's kernels section.)"""
    x, w, b = _case(p, m, c, device="cuda", seed=m)
    dy = torch.randn(p, m, c, device="cuda")
    _, got = _grads(x, w, b, dy, "triton")
    _, want = _grads(x.double(), w.double(), b.double(), dy.double(), "torch")
    for a, e, name in zip(got, want, ("dx", "dgamma", "dbeta")):
        torch.testing.assert_close(a, e.float(), rtol=1e-4, atol=1e-4 * max(1.0, e.abs().max().item()), msg=name)
    leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
    y = member_layer_norm(*leaves, 1e-5)
    n, names = cuda_kernels(lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True))
    assert names == ["_member_layer_norm_backward_kernel"], names


@pytest.mark.gpu
def test_gpu_capture_equals_eager_and_is_one_kernel():
    x, w, b = _case(64, 512, 64, device="cuda")

    def step():
        return [member_layer_norm(x, w, b, 1e-5)]

    assert_replays_give(step, [t.clone() for t in step()])
    _, names = cuda_kernels(step)
    assert names == ["_member_layer_norm_kernel"], names
