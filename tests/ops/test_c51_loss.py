"""c51_loss: the Triton kernels (interpreter on the CPU) against the torch reference (the ops of
foxdqn.objectives.c51.c51_cross_entropy) on odd shapes (one group, odd groups and rows, one action,
K = 2 and 51, Double DQN or not, a penalty), the gradient against autograd's of the reference, a*
where the selection's maximum is clear, terminal rows and rewards past the bounds, NaN rows,
groups that never mix, argument errors; the weighted mean per group (c51_weighted_loss) against
the reference's ce and weighted_mean; on the GPU the compiled kernels."""
import pytest
import torch

from foxdqn.ops.c51_loss import MAX_ATOMS, c51_loss, c51_loss_reference, c51_weighted_loss
from foxdqn.ops.c51_project import support_table


def _case(g, rows, a, k, seed, double=True, penalty=False, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    r = g * rows
    v_min = -torch.rand(g, generator=gen, dtype=torch.float64) * 10 - 1
    v_max = torch.rand(g, generator=gen, dtype=torch.float64) * 10 + 1
    support = torch.stack([torch.linspace(float(lo), float(hi), k) for lo, hi in zip(v_min, v_max)]).float()
    logits = torch.randn(r, a, k, generator=gen) * 2
    target = torch.randn(r, a, k, generator=gen) * 2
    select = torch.randn(r, a, k, generator=gen) * 2 if double else None
    pen = torch.rand(r, a, generator=gen) if penalty else None
    action = torch.randint(0, a, (r,), generator=gen)
    reward = torch.randn(r, generator=gen) * 5
    reward[::5] = 100.0  # past v_max
    discount = torch.full((r,), 0.97)
    discount[::3] = 0.0  # terminal
    out = [logits, action, target, select, pen, reward, discount, support, v_min, v_max]
    return [t.to(device) if isinstance(t, torch.Tensor) else t for t in out]


def _run(case, backend):
    logits = case[0].clone().requires_grad_(True)
    ce, q = c51_loss(logits, *case[1:], backend=backend)
    (ce * torch.linspace(0.5, 1.5, ce.shape[0], device=ce.device)).sum().backward()
    return ce.detach(), q, logits.grad


def _selection_clear(case, margin=1e-4):
    """Rows whose a* (the argmax of the selection Q) is clear by ``margin``."""
    logits, action, target, select, pen, _, _, support, _, _ = case
    g, k = support.shape
    p = torch.softmax((target if select is None else select).view(g, -1, *target.shape[1:]), -1)
    sel = (p * support.view(g, 1, 1, k)).sum(-1).view(target.shape[:2])
    if pen is not None:
        sel = sel - pen
    if sel.shape[1] == 1:
        return torch.ones(sel.shape[0], dtype=torch.bool)
    top = sel.topk(2, dim=1).values
    return (top[:, 0] - top[:, 1]) > margin


@pytest.mark.parametrize("g,rows,a,k,double,penalty", [(1, 7, 3, 51, True, False), (3, 5, 4, 51, False, False),
                                                        (5, 3, 1, 2, True, True), (2, 9, 5, 11, False, True),
                                                        (1, 1, 2, 51, True, True), (3, 33, 3, 51, True, False)])
def test_kernel_matches_reference(g, rows, a, k, double, penalty):
    case = _case(g, rows, a, k, seed=g * 100 + rows, double=double, penalty=penalty)
    ce_k, q_k, grad_k = _run(case, "triton")
    ce_r, q_r, grad_r = _run(case, "torch")
    clear = _selection_clear(case)
    assert clear.sum() >= max(1, case[0].shape[0] // 2)
    torch.testing.assert_close(q_k, q_r, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ce_k[clear], ce_r[clear], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_k[clear], grad_r[clear], rtol=1e-5, atol=1e-6)
    assert not q_k.requires_grad and ce_k.shape == (g * rows,) and grad_k.shape == case[0].shape


def test_gradient_reaches_only_the_taken_action():
    case = _case(2, 4, 3, 51, seed=3)
    _, _, grad = _run(case, "triton")
    taken = torch.nn.functional.one_hot(case[1], 3).bool()
    assert (grad[~taken] == 0).all() and (grad[taken].abs().sum(-1) > 0).all()
    # the gradient of a row's cross-entropy sums to 0 over its atoms (Σ_k (p_k Σm − m_k) = 0)
    torch.testing.assert_close(grad.sum(-1), torch.zeros(8, 3), atol=1e-6, rtol=0)


def test_groups_never_mix():
    """Each group's rows give what a batch of that group alone gives (its own support and bounds)."""
    case = _case(3, 6, 3, 51, seed=4)
    ce, q, grad = _run(case, "triton")
    for i in range(3):
        rows = slice(6 * i, 6 * i + 6)
        one = [t[rows].contiguous() if t is not None and t.shape[0] == 18 else t for t in case[:7]]
        one += [case[7][i:i + 1].contiguous(), case[8][i:i + 1], case[9][i:i + 1]]
        ce1, q1, grad1 = _run(one, "triton")
        w = torch.linspace(0.5, 1.5, 18)[rows] / torch.linspace(0.5, 1.5, 6)
        torch.testing.assert_close(ce[rows], ce1, rtol=0, atol=0)
        torch.testing.assert_close(q[rows], q1, rtol=0, atol=0)
        torch.testing.assert_close(grad[rows], grad1 * w[:, None, None], rtol=1e-6, atol=1e-7)


def test_nan_rows_stay_in_their_row():
    case = _case(1, 6, 3, 51, seed=5)
    case[2][1, :, 4] = float("nan")  # the target distribution of row 1: NaN in every action
    case[5][3] = float("nan")  # row 3's reward
    case[0][4, case[1][4], 0] = float("nan")  # row 4's online logits at its action
    ce_k, _, grad_k = _run(case, "triton")
    ce_r, _, _ = _run(case, "torch")
    assert torch.isnan(ce_k[[1, 3, 4]]).all() and torch.isnan(ce_r[[1, 3, 4]]).all()
    fine = torch.tensor([0, 2, 5])
    assert torch.isfinite(ce_k[fine]).all() and torch.isfinite(grad_k[fine]).all()


def test_table_given_equals_table_made():
    case = _case(3, 4, 3, 51, seed=6)
    table = support_table(case[8], case[9], 51)
    a = c51_loss(*case, backend="triton")
    b = c51_loss(*case, table=table, backend="triton")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_argument_errors():
    case = _case(2, 3, 3, 5, seed=7)
    with pytest.raises(ValueError, match="logits must be"):
        c51_loss(case[0].double(), *case[1:])
    with pytest.raises(ValueError, match="action must be"):
        c51_loss(case[0], case[1].int(), *case[2:])
    with pytest.raises(ValueError, match="penalty must be"):
        c51_loss(*case[:4], torch.zeros(6, 2), *case[5:])
    with pytest.raises(ValueError, match="G dividing|support must be"):
        c51_loss(*case[:7], torch.zeros(4, 5), *case[8:])
    with pytest.raises(ValueError, match="v_min must be"):
        c51_loss(*case[:8], case[8][:1], case[9])
    with pytest.raises(ValueError, match="backend"):
        c51_loss(*case, backend="gpu")
    big = _case(1, 2, 2, MAX_ATOMS + 1, seed=8)
    with pytest.raises(ValueError, match="at most"):
        c51_loss(*big, backend="triton")


def test_auto_is_the_reference_on_the_cpu():
    case = _case(2, 3, 3, 7, seed=9)
    a, b = c51_loss(*case), c51_loss_reference(*case)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.gpu
@pytest.mark.parametrize("g,rows,a,k", [(1, 128, 45, 51), (64, 32, 3, 51), (64, 48, 5, 51), (3, 7, 1, 2)])
def test_compiled_kernels_match_reference_on_cuda(g, rows, a, k):
    case = _case(g, rows, a, k, seed=g + rows, penalty=True, device="cuda")
    ce_k, q_k, grad_k = _run(case, "auto")
    ce_r, q_r, grad_r = _run(case, "torch")
    clear = _selection_clear([t.cpu() if isinstance(t, torch.Tensor) else t for t in case]).cuda()
    torch.testing.assert_close(q_k, q_r, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ce_k[clear], ce_r[clear], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_k[clear], grad_r[clear], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("g,rows,a,k,double", [(1, 7, 3, 51, True), (3, 5, 4, 51, False), (2, 3, 1, 2, True)])
def test_dueling_kernel_matches_reference(g, rows, a, k, double):
    """Rainbow's head: value streams given, the logits v + adv − mean_a adv formed in the kernels;
    the loss, Q and the gradients of the advantages and the online value stream = autograd's of
    the reference (dueling_logits, then the plain reference)."""
    case = _case(g, rows, a, k, seed=50 + g * rows, double=double, penalty=True)
    gen = torch.Generator().manual_seed(g)
    streams = [torch.randn(g * rows, k, generator=gen) for _ in range(3)]
    if not double:
        streams[2] = None
    res = {}
    for backend in ("triton", "torch"):
        adv = case[0].clone().requires_grad_(True)
        v = streams[0].clone().requires_grad_(True)
        ce, q = c51_loss(adv, *case[1:], value=v, target_value=streams[1], select_value=streams[2], backend=backend)
        (ce * torch.linspace(0.5, 1.5, ce.shape[0])).sum().backward()
        res[backend] = ce.detach(), q, adv.grad, v.grad
    from foxdqn.ops.c51_loss import dueling_logits

    combined = [dueling_logits(streams[0], case[0]), case[1], dueling_logits(streams[1], case[2]),
                dueling_logits(streams[2], case[3]), *case[4:]]
    clear = _selection_clear(combined)
    assert clear.sum() >= max(1, g * rows // 2)
    (ce_k, q_k, ga_k, gv_k), (ce_r, q_r, ga_r, gv_r) = res["triton"], res["torch"]
    torch.testing.assert_close(q_k, q_r, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ce_k[clear], ce_r[clear], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ga_k[clear], ga_r[clear], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gv_k[clear], gv_r[clear], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="value streams"):
        c51_loss(*case, value=streams[0])


def test_blocks_take_the_loop_over_atoms_only_for_many_rows():
    """One member's batch (256 rows, K = 51) keeps the [1, K, K] projection tile; 64 members' take
    LOOP_ROWS rows per program with the loop over atoms; small K keeps its 16-row tile."""
    from foxdqn.ops import c51_loss as mod

    assert mod._blocks(256, 51) == (1, 64, False)
    assert mod._blocks(64 * 256, 51) == (mod.LOOP_ROWS, 64, True)
    assert mod._blocks(64 * 256, 11) == (16, 16, False)
    assert mod._blocks(mod.LOOP_ROWS * (mod.MIN_PROGRAMS - 1), 51)[2] is False


@pytest.mark.parametrize("g,rows,a,k,double,penalty,dueling", [(3, 33, 4, 51, True, True, False),
                                                                (2, 13, 3, 51, False, False, True),
                                                                (1, 9, 2, 20, True, False, False)])
def test_loop_over_atoms_equals_the_tile_and_the_reference(monkeypatch, g, rows, a, k, double, penalty, dueling):
    """With the loop over output atoms forced (MIN_PROGRAMS = 1, LOOP_ROWS rows per program, rows
    not a multiple of it): ce, Q and the gradients are bit for bit the tile's (the interpreter sums
    each row's hat products in the same order) and equal the reference."""
    from foxdqn.ops import c51_loss as mod

    case = _case(g, rows, a, k, seed=7 * g + rows, double=double, penalty=penalty)
    streams = [torch.randn(g * rows, k, generator=torch.Generator().manual_seed(k)) for _ in range(3)] \
        if dueling else [None, None, None]
    if dueling and not double:
        streams[2] = None

    def run(backend):
        adv = case[0].clone().requires_grad_(True)
        v = None if streams[0] is None else streams[0].clone().requires_grad_(True)
        ce, q = c51_loss(adv, *case[1:], value=v, target_value=streams[1], select_value=streams[2], backend=backend)
        (ce * torch.linspace(0.5, 1.5, ce.shape[0])).sum().backward()
        return ce.detach(), q, adv.grad, None if v is None else v.grad

    seen = []
    real = mod._blocks
    monkeypatch.setattr(mod, "_blocks", lambda r, kk: seen.append(real(r, kk)) or seen[-1])
    tile = run("triton")
    monkeypatch.setattr(mod, "MIN_PROGRAMS", 1)
    loop = run("triton")
    assert [s[2] for s in seen] == [False, False, True, True]  # forward and backward of each run
    for t, l in zip(tile, loop):
        assert (t is None and l is None) or torch.equal(t, l)
    monkeypatch.undo()
    ref = run("torch")
    from foxdqn.ops.c51_loss import dueling_logits

    combined = [dueling_logits(streams[0], case[0]), case[1], dueling_logits(streams[1], case[2]),
                dueling_logits(streams[2], case[3]), *case[4:]]
    clear = _selection_clear(combined)
    assert clear.sum() >= max(1, g * rows // 2)
    torch.testing.assert_close(loop[1], ref[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loop[0][clear], ref[0][clear], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loop[2][clear], ref[2][clear], rtol=1e-5, atol=1e-6)


def _run_weighted(case, weight, backend, streams=(None, None, None), upstream=None):
    """(loss, ce, q, grad of the advantages/logits, grad of the value stream) of c51_weighted_loss."""
    adv = case[0].clone().requires_grad_(True)
    v = None if streams[0] is None else streams[0].clone().requires_grad_(True)
    loss, ce, q = c51_weighted_loss(adv, *case[1:], weight, value=v, target_value=streams[1],
                                    select_value=streams[2], backend=backend)
    if upstream is None:
        loss.backward(torch.ones_like(loss))  # a population's unit seed
    else:
        (loss * upstream).sum().backward()
    return loss.detach(), ce, q, adv.grad, None if v is None else v.grad


@pytest.mark.parametrize("g,rows,a,k,double,dueling,loop", [(1, 7, 3, 51, True, False, False),
                                                            (3, 5, 4, 51, False, True, False),
                                                            (5, 3, 1, 2, True, False, False),
                                                            (2, 33, 3, 51, True, True, True),
                                                            (4, 1, 2, 11, False, False, False)])
def test_weighted_loss_matches_weighted_mean_of_the_reference(monkeypatch, g, rows, a, k, double, dueling, loop):
    """loss_g = Σ w·ce / B_g of each group, ce, q and the gradients (a unit seed and a non-unit
    upstream) = the reference's ce, weighted_mean and autograd, on rows whose a* is clear (the loss
    of a group compared only where all its rows are clear); ``loop``: the projection's loop over
    atoms with 8-row programs (rows not a multiple of 8: the masked tail rows add nothing)."""
    from foxdqn.objectives.base import weighted_mean
    from foxdqn.ops import c51_loss as mod

    if loop:
        monkeypatch.setattr(mod, "MIN_PROGRAMS", 1)
    case = _case(g, rows, a, k, seed=11 * g + rows + k, double=double, penalty=True)
    gen = torch.Generator().manual_seed(rows)
    weight = torch.rand(g * rows, generator=gen) + 0.25
    streams = [torch.randn(g * rows, k, generator=gen) for _ in range(3)] if dueling else [None, None, None]
    if dueling and not double:
        streams[2] = None
    from foxdqn.ops.c51_loss import dueling_logits

    combined = [dueling_logits(streams[0], case[0]), case[1], dueling_logits(streams[1], case[2]),
                dueling_logits(streams[2], case[3]), *case[4:]]
    clear = _selection_clear(combined)
    assert clear.sum() >= max(1, g * rows // 2)
    upstream = torch.linspace(0.5, 2.0, g)
    for up in (None, upstream):
        loss_k, ce_k, q_k, ga_k, gv_k = _run_weighted(case, weight, "triton", streams, up)
        adv = case[0].clone().requires_grad_(True)
        v = None if streams[0] is None else streams[0].clone().requires_grad_(True)
        ce_r, q_r = c51_loss_reference(adv, *case[1:], value=v, target_value=streams[1], select_value=streams[2])
        loss_r = weighted_mean(ce_r.view(g, rows), weight)
        (loss_r * (torch.ones(g) if up is None else up)).sum().backward()
        assert loss_k.shape == (g,) and not ce_k.requires_grad and not q_k.requires_grad
        torch.testing.assert_close(q_k, q_r, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ce_k[clear], ce_r.detach()[clear], rtol=1e-5, atol=1e-5)
        whole = clear.view(g, rows).all(dim=1)
        torch.testing.assert_close(loss_k[whole], loss_r.detach()[whole], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ga_k[clear], adv.grad[clear], rtol=1e-5, atol=1e-7)
        if dueling:
            torch.testing.assert_close(gv_k[clear], v.grad[clear], rtol=1e-5, atol=1e-7)
    # the kernel's per-row ce is c51_loss's, bit for bit
    ce_plain, _, _ = _run(case, "triton")
    if not dueling:
        assert torch.equal(ce_k, ce_plain)


def test_weighted_loss_groups_never_mix_and_zero_weights_count_nothing():
    """A group's loss and gradient are those of its rows alone; a row of weight 0 adds nothing to
    its group's loss and gets no gradient."""
    case = _case(3, 6, 3, 51, seed=21)
    weight = torch.rand(18, generator=torch.Generator().manual_seed(1)) + 0.5
    weight[[2, 9]] = 0.0
    loss, ce, _, grad, _ = _run_weighted(case, weight, "triton")
    assert (grad[[2, 9]] == 0).all() and (grad[[0, 1, 3]].abs().sum() > 0)
    for i in range(3):
        rows = slice(6 * i, 6 * i + 6)
        one = [t[rows].contiguous() if t is not None and t.shape[0] == 18 else t for t in case[:7]]
        one += [case[7][i:i + 1].contiguous(), case[8][i:i + 1], case[9][i:i + 1]]
        loss1, ce1, _, grad1, _ = _run_weighted(one, weight[rows].contiguous(), "triton")
        torch.testing.assert_close(loss[i:i + 1], loss1, rtol=1e-6, atol=0)
        assert torch.equal(ce[rows], ce1) and torch.equal(grad[rows], grad1)
    torch.testing.assert_close(loss, (ce * weight).view(3, 6).mean(dim=1), rtol=1e-6, atol=0)


def test_weighted_loss_argument_errors_and_auto_on_the_cpu():
    case = _case(2, 3, 3, 5, seed=22)
    with pytest.raises(ValueError, match="weight must be"):
        c51_weighted_loss(*case, torch.ones(5))
    with pytest.raises(ValueError, match="weight must be"):
        c51_weighted_loss(*case, torch.ones(6, dtype=torch.float64))
    with pytest.raises(ValueError, match="logits must be"):
        c51_weighted_loss(case[0].double(), *case[1:], torch.ones(6))
    weight = torch.rand(6)
    loss, ce, q = c51_weighted_loss(*case, weight)  # auto: the reference on CPU tensors
    ce_r, q_r = c51_loss_reference(*case)
    assert torch.equal(ce, ce_r) and torch.equal(q, q_r)
    assert torch.equal(loss, (ce_r.view(2, 3) * weight.view(2, 3)).mean(dim=1))


@pytest.mark.gpu
@pytest.mark.parametrize("g,rows,a,k", [(1, 256, 45, 51), (64, 32, 3, 51), (64, 48, 5, 51), (3, 7, 1, 2)])
def test_compiled_weighted_loss_matches_reference_on_cuda(g, rows, a, k):
    from foxdqn.objectives.base import weighted_mean

    case = _case(g, rows, a, k, seed=g + rows, penalty=True, device="cuda")
    weight = torch.rand(g * rows, device="cuda") + 0.25
    upstream = torch.linspace(0.5, 2.0, g, device="cuda")
    loss_k, ce_k, q_k, grad_k, _ = _run_weighted(case, weight, "auto", upstream=upstream)
    adv = case[0].clone().requires_grad_(True)
    ce_r, q_r = c51_loss_reference(adv, *case[1:])
    loss_r = weighted_mean(ce_r.view(g, rows), weight)
    (loss_r * upstream).sum().backward()
    clear = _selection_clear([t.cpu() if isinstance(t, torch.Tensor) else t for t in case]).cuda()
    whole = clear.view(g, rows).all(dim=1)
    torch.testing.assert_close(q_k, q_r, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ce_k[clear], ce_r.detach()[clear], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss_k[whole], loss_r.detach()[whole], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_k[clear], adv.grad[clear], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("g,rows,a,k,double,dueling", [(3, 5, 4, 51, True, True), (2, 7, 3, 11, False, False),
                                                       (1, 4, 2, 51, True, False), (2, 3, 1, 2, False, True)])
def test_biases_added_in_the_kernels_equal_biased_streams(g, rows, a, k, double, dueling):
    """Streams without their bias plus C51Biases give, bit for bit on the interpreter, the loss, ce,
    q and the streams' gradients of the biased streams (the kernels add the same float32 operands);
    the bias gradients are each group's rows of the stream gradients summed, and the reference
    (which adds the biases first) agrees."""
    from foxdqn.ops.c51_loss import C51Biases, _biased

    case = _case(g, rows, a, k, seed=31 * g + rows, double=double, penalty=True)
    gen = torch.Generator().manual_seed(a + k)
    streams = [torch.randn(g * rows, k, generator=gen) for _ in range(3)] if dueling else [None, None, None]
    if not double:
        streams[2] = None
    bias = C51Biases(*(torch.randn(g, a * k, generator=gen) for _ in range(2)),
                     torch.randn(g, a * k, generator=gen) if double else None,
                     *((torch.randn(g, k, generator=gen) for _ in range(2)) if dueling else (None, None)),
                     torch.randn(g, k, generator=gen) if dueling and double else None)
    weight = torch.rand(g * rows, generator=gen) + 0.5
    up = torch.linspace(0.5, 1.5, g)

    def run(with_bias, backend="triton"):
        adv, v = case[0].clone().requires_grad_(True), None
        if dueling:
            v = streams[0].clone().requires_grad_(True)
        lb = bias.logits.clone().requires_grad_(True)
        vb = bias.value.clone().requires_grad_(True) if dueling else None
        if with_bias:
            b = bias._replace(logits=lb, value=vb)
            args = [adv, *case[1:]]
            kw = dict(value=v, target_value=streams[1], select_value=streams[2], bias=b)
        else:  # the streams biased first (what baddbmm returns), no C51Biases
            args = [_biased(adv, lb), case[1], _biased(case[2], bias.target), _biased(case[3], bias.select), *case[4:]]
            kw = dict(value=_biased(v, vb), target_value=_biased(streams[1], bias.target_value),
                      select_value=_biased(streams[2], bias.select_value))
        loss, ce, q = c51_weighted_loss(*args, weight, backend=backend, **kw)
        (loss * up).sum().backward()
        return [loss.detach(), ce, q, adv.grad, lb.grad] + ([v.grad, vb.grad] if dueling else [])

    kernel, plain, ref = run(True), run(False), run(True, "torch")
    for x, y in zip(kernel, plain):
        assert torch.equal(x, y)
    torch.testing.assert_close(kernel[4], kernel[3].view(g, rows, a * k).sum(dim=1), rtol=1e-6, atol=1e-7)
    assert (kernel[4].abs().sum() > 0) == (not dueling or a > 1)  # one action: v + adv − adv's mean is v
    from foxdqn.ops.c51_loss import dueling_logits

    combined = [dueling_logits(_biased(streams[0], bias.value), _biased(case[0], bias.logits)), case[1],
                dueling_logits(_biased(streams[1], bias.target_value), _biased(case[2], bias.target)),
                dueling_logits(_biased(streams[2], bias.select_value), _biased(case[3], bias.select)), *case[4:]]
    clear = _selection_clear(combined)
    if clear.all():  # every row's a* clear: the whole loss and the bias gradients compare
        torch.testing.assert_close(kernel[0], ref[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(kernel[4], ref[4], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(kernel[1][clear], ref[1][clear], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kernel[2], ref[2], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kernel[3][clear], ref[3][clear], rtol=1e-5, atol=1e-6)


def test_bias_argument_errors():
    from foxdqn.ops.c51_loss import C51Biases

    case = _case(2, 3, 3, 5, seed=40)  # Double DQN, no dueling
    ok = C51Biases(torch.zeros(2, 15), torch.zeros(2, 15), torch.zeros(2, 15))
    c51_loss(*case, bias=ok, backend="triton")
    with pytest.raises(ValueError, match="bias.target must be"):
        c51_loss(*case, bias=ok._replace(target=torch.zeros(2, 5)), backend="triton")
    with pytest.raises(ValueError, match="bias.select must be"):
        c51_loss(*case, bias=ok._replace(select=None), backend="triton")
    with pytest.raises(ValueError, match="bias.value must be None"):
        c51_loss(*case, bias=ok._replace(value=torch.zeros(2, 5)), backend="triton")
    with pytest.raises(ValueError, match="C51Biases"):
        c51_loss(*case, bias=(torch.zeros(2, 15),) * 3, backend="triton")
