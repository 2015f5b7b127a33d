"""foxdqn.ops.member_layer_norm: the kernel (TRITON_INTERPRET=1 on CPU) against its torch reference
(F.layer_norm then each member's affine) on odd P, M and C, large offsets and a tiny variance,
strided inputs; members never mix; a row's output does not depend on P; NaN; no gradient; bad
arguments; no rows; MemberLayerNorm takes it where the fused forwards run without gradient. GPU
(`gpu` marker): kernel = reference on CUDA, a capture replays as eager, one kernel."""
from __future__ import annotations

import pytest
import torch

from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.member_layer_norm import member_layer_norm, member_layer_norm_reference

from support import (assert_module_takes_op_without_gradient, assert_replays_give, cuda_kernels,
                     require_compiled_kernels)

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


def test_no_gradient_bad_arguments_and_no_rows():
    x, w, b = _case(2, 3, 8)
    with pytest.raises(ValueError, match="no gradient"):
        member_layer_norm(x, w.requires_grad_(True), b, 1e-5, backend="triton")
    w.requires_grad_(False)
    for args, match in (((x[0], w, b), "x must be a float32 \\[P, M, C\\]"), ((x, w[:1], b), "weight must be"),
                        ((x, w, b.double()), "bias must be"), ((x.double(), w, b), "x must be")):
        with pytest.raises(ValueError, match=match):
            member_layer_norm(*args, 1e-5, backend="triton")
    assert member_layer_norm(x[:, :0], w, b, 1e-5, backend="triton").shape == (2, 0, 8)


def test_member_layer_norm_module_takes_it_without_gradient(monkeypatch):
    from foxdqn.population import layers

    x, w, b = _case(3, 5, 16)
    assert_module_takes_op_without_gradient(monkeypatch, layers.MemberLayerNorm(w, b, 1e-5), (x,),
                                            layers.member_layer_norm_op, "member_layer_norm", rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("p,m,c", [(1, 4096, 64), (64, 512, 64), (3, 1001, 17)])
def test_gpu_kernel_equals_reference(p, m, c):
    x, w, b = _case(p, m, c, device="cuda")
    torch.testing.assert_close(member_layer_norm(x, w, b, 1e-5), member_layer_norm_reference(x, w, b, 1e-5),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_gpu_capture_equals_eager_and_is_one_kernel():
    x, w, b = _case(64, 512, 64, device="cuda")

    def step():
        return [member_layer_norm(x, w, b, 1e-5)]

    assert_replays_give(step, [t.clone() for t in step()])
    _, names = cuda_kernels(step)
    assert names == ["_member_layer_norm_kernel"], names
