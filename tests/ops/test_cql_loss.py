"""foxdqn.ops.cql_loss: the Triton kernel (Triton's interpreter on the CPU) against the plain-torch
reference (α · foxdqn.objectives.cql.cql_regulariser): loss and gradient w.r.t. Q on odd shapes,
strided Q (a member's s rows of a stacked forward), per-member α including 0, NaN confined to its
member, members independent of G; the GPU test compares them on CUDA."""
import pytest
import torch

from foxdqn.ops.cql_loss import cql_loss, cql_loss_reference


def _inputs(g, b, a, weighted=True, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(g, b, a, generator=gen) * 3).to(device)
    action = torch.randint(0, a, (g * b,), generator=gen).to(device)
    weight = (torch.rand(g * b, generator=gen) + 0.1).to(device) if weighted else None
    alpha = (torch.rand(g, generator=gen) * 2).to(device)
    return q, action, weight, alpha


def _both(q, action, weight, alpha, backend="triton"):
    out = []
    for fn in (lambda x: cql_loss(x, action, weight, alpha, backend=backend),
               lambda x: cql_loss_reference(x, action, weight, alpha)):
        x = q.detach().clone().requires_grad_(True)
        loss = fn(x)
        upstream = torch.arange(1, loss.shape[0] + 1, dtype=torch.float32, device=loss.device)
        (grad,) = torch.autograd.grad((loss * upstream).sum(), x)
        out.append((loss.detach(), grad))
    return out


@pytest.mark.parametrize("g,b,a", [(1, 1, 1), (1, 7, 3), (2, 33, 45), (3, 5, 7), (1, 300, 45), (2, 64, 129)])
@pytest.mark.parametrize("weighted", [True, False])
def test_kernel_equals_reference(g, b, a, weighted):
    (lk, gk), (lr, gr) = _both(*_inputs(g, b, a, weighted))
    torch.testing.assert_close(lk, lr, rtol=2e-5, atol=1e-5)
    torch.testing.assert_close(gk, gr, rtol=2e-5, atol=1e-6)


def test_a_strided_view_is_read_in_place():
    """The s rows of a stacked [G, 2B, A] forward: the kernel reads the view (its strides)."""
    q, action, weight, alpha = _inputs(3, 9, 45)
    stacked = torch.cat([q, torch.full_like(q, float("nan"))], dim=1)  # s' rows: never read
    view = stacked[:, :9]
    assert not view.is_contiguous()
    lk = cql_loss(view, action, weight, alpha, backend="triton")
    torch.testing.assert_close(lk, cql_loss_reference(q, action, weight, alpha), rtol=2e-5, atol=1e-5)


def test_alpha_zero_member_adds_nothing_and_nan_stays_in_its_member():
    q, action, weight, alpha = _inputs(3, 6, 5)
    alpha[1] = 0.0
    (lk, gk), _ = _both(q, action, weight, alpha)
    assert lk[1] == 0 and (gk[1] == 0).all()
    q[2, 3, 1] = float("nan")
    (lk, gk), _ = _both(q, action, weight, alpha)
    assert torch.isnan(lk[2]) and torch.isfinite(lk[:2]).all() and torch.isfinite(gk[:2]).all()


def test_a_members_result_does_not_depend_on_the_others():
    q, action, weight, alpha = _inputs(4, 21, 45, seed=3)
    whole = cql_loss(q, action, weight, alpha, backend="triton")
    for m in range(4):
        rows = slice(m * 21, (m + 1) * 21)
        one = cql_loss(q[m:m + 1], action[rows], weight[rows], alpha[m:m + 1], backend="triton")
        assert torch.equal(one, whole[m:m + 1])


def test_the_term_is_the_soft_maximum_gap():
    """Two actions, Q = (0, log 3), data action 0: logsumexp = log 4, c = log 4 (α = 1, w = 1)."""
    q = torch.tensor([[[0.0, torch.log(torch.tensor(3.0))]]])
    loss = cql_loss(q, torch.tensor([0]), None, torch.ones(1), backend="triton")
    torch.testing.assert_close(loss, torch.log(torch.tensor([4.0])))


def test_bad_input_is_named():
    q, action, weight, alpha = _inputs(2, 3, 4)
    with pytest.raises(ValueError, match="alpha must be float32 \\[2\\]"):
        cql_loss(q, action, weight, alpha[:1])
    with pytest.raises(ValueError, match="action must be int64 \\[6\\]"):
        cql_loss(q, action[:5], weight, alpha)
    with pytest.raises(ValueError, match="q must be float32 \\[G, B, A\\]"):
        cql_loss(q[0], action, weight, alpha)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("g,b,a", [(1, 256, 45), (64, 256, 45), (3, 4096, 45), (2, 33, 129)])
def test_cuda_kernel_equals_reference(g, b, a):
    (lk, gk), (lr, gr) = _both(*_inputs(g, b, a, device="cuda"), backend="auto")
    torch.testing.assert_close(lk, lr, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gk, gr, rtol=1e-5, atol=1e-6)
