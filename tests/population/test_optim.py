"""foxdqn.population.optim: per-member grad norm and clipping against torch's global-norm code run
on each member's slices; MemberAdam against torch.optim.Adam per member (kernel in the Triton
interpreter and reference), a skipped member, state_dict round-trip, zero_grad, argument checks,
no host reads. GPU: clip + MemberAdam captured in a CUDA graph."""
import pytest
import torch

from foxdqn.ops import backend as B
from foxdqn.population.optim import MemberAdam, clip_member_grads_, member_grad_norm

from support import capture_graph, forbid_syncs, no_host_sync, require_compiled_kernels

_need_compiled = require_compiled_kernels(B.INTERPRET)

F32 = torch.float32
NAN, INF = float("nan"), float("inf")
BACKENDS = ["triton", "torch"]
SHAPES = [(4, 3, 5), (4, 5), (4,), (4, 2, 1, 7)]  # P = 4; (4,): one value per member


def random_grads(gen, shapes=SHAPES, scale=None):
    """Normal grads; member p's scaled by ``scale[p]`` (default 10**(p - 2)) so norms differ."""
    members = shapes[0][0]
    scale = torch.tensor([10.0 ** (p - 2) for p in range(members)]) if scale is None else scale
    return [torch.randn(s, generator=gen) * scale.view((members,) + (1,) * (len(s) - 1)) for s in shapes]


def member_slices(tensors, p):
    return [t[p] for t in tensors]


# ---------------------------------------------------------------------------------------------
# member_grad_norm, clip_member_grads_
# ---------------------------------------------------------------------------------------------
def test_member_grad_norm_is_each_members_own_norm():
    grads = random_grads(torch.Generator().manual_seed(0))
    norms = member_grad_norm(grads)
    assert norms.dtype == F32 and norms.shape == (4,)
    for p in range(4):
        own = torch.linalg.vector_norm(torch.cat([g.flatten() for g in member_slices(grads, p)]))
        torch.testing.assert_close(norms[p], own, rtol=1e-6, atol=0.0)
    assert len(set(norms.tolist())) == 4  # the members' norms differ (1e-2 ... 1e1)


def test_member_grad_norm_of_views_and_non_finite_members():
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(3, 6, 4, generator=gen).transpose(1, 2), torch.randn(3, 2, generator=gen)]  # a strided view
    grads[1][1, 0] = NAN
    grads[0][2, 1, 1] = INF
    norms = member_grad_norm(grads)
    assert torch.isnan(norms[1]) and norms[2] == INF and torch.isfinite(norms[0])
    own = torch.linalg.vector_norm(torch.cat([grads[0][0].flatten(), grads[1][0]]))
    torch.testing.assert_close(norms[0], own, rtol=1e-6, atol=0.0)


def test_clip_equals_clip_grad_norm_per_member():
    grads = random_grads(torch.Generator().manual_seed(2))
    norms_before = member_grad_norm(grads)
    max_norm = norms_before * torch.tensor([0.5, 2.0, 0.01, 1.0])  # clipped, within, clipped, at the bound
    expect, expect_norms = [], []
    for p in range(4):
        own = [torch.nn.Parameter(torch.zeros_like(s)) for s in member_slices(grads, p)]
        for w, s in zip(own, member_slices(grads, p)):
            w.grad = s.clone()
        expect_norms.append(torch.nn.utils.clip_grad_norm_(own, float(max_norm[p])))
        expect.append([w.grad for w in own])
    before = [g.clone() for g in grads]
    norms = clip_member_grads_(grads, max_norm)
    torch.testing.assert_close(norms, torch.stack(expect_norms), rtol=1e-6, atol=0.0)
    for p in range(4):
        for got, want in zip(member_slices(grads, p), expect[p]):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=0.0)
    for g, b in zip(grads, before):  # within the bound: multiplied by exactly 1
        assert torch.equal(g[1], b[1])
    after = member_grad_norm(grads)  # clipped: max_norm, less the 1e-6 added to the norm
    shrunk = max_norm * norms_before / (norms_before + 1e-6)
    torch.testing.assert_close(after[[0, 2]], shrunk[[0, 2]], rtol=1e-5, atol=0.0)


def test_clip_leaves_other_members_when_one_is_nan():
    grads = random_grads(torch.Generator().manual_seed(3))
    grads[0][2, 0, 0] = NAN
    before = [g.clone() for g in grads]
    clip_member_grads_(grads, torch.full((4,), 1e6))
    for g, b in zip(grads, before):
        assert torch.isnan(g[2]).all()  # torch's rule: a NaN norm makes a NaN factor
        assert torch.equal(g[[0, 1, 3]], b[[0, 1, 3]])


@pytest.mark.parametrize("grads, max_norm, match", [
    ([], torch.ones(2), "grads must be a non-empty list"),
    (torch.zeros(2, 3), torch.ones(2), "grads must be a non-empty list"),
    ([torch.zeros(2, 3), torch.zeros(3, 3)], torch.ones(2), r"grads\[1\] must be a float32 tensor \[2, ...\]"),
    ([torch.zeros(2, 3, dtype=torch.float64)], torch.ones(2), r"grads\[0\] must be"),
    ([torch.zeros(2, 3)], torch.ones(3), r"max_norm must be a float32 tensor \[P\] = \[2\]"),
    ([torch.zeros(2, 3)], 1.0, "max_norm must be"),
])
def test_clip_bad_arguments(grads, max_norm, match):
    with pytest.raises(ValueError, match=match):
        clip_member_grads_(grads, max_norm)


# ---------------------------------------------------------------------------------------------
# MemberAdam
# ---------------------------------------------------------------------------------------------
def new_params(gen, shapes=SHAPES):
    return [torch.randn(s, generator=gen).requires_grad_() for s in shapes]


def snapshot(opt):
    """Copies of the params and of every state tensor."""
    return [p.detach().clone() for p in opt.params] + [t.clone() for t in opt.state_dict().values()]


def give_grads(opt, grads):
    opt.zero_grad()
    for p, g in zip(opt.params, grads):
        p.grad.add_(g)


def assert_scaled_close(actual, expected, rtol=1e-6):
    """|a - e| <= rtol * max|e|: MemberAdam runs member_adam_, whose reference agrees with
    torch.optim.Adam bit for bit on this machine and whose kernel agrees to about 1e-7 of the
    tensor's scale (an FMA in torch's lerp; tests/ops/test_member_adam.py): a weight that is
    near 0 keeps an error of the size of the other weights' roundings."""
    torch.testing.assert_close(actual, expected, rtol=0.0, atol=rtol * float(expected.abs().max()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_member_adam_equals_torch_adam_per_member(backend):
    gen = torch.Generator().manual_seed(4)
    params = new_params(gen)
    lr = torch.tensor([1e-3, 1e-2, 0.1, 0.0])
    eps = torch.tensor([1e-8, 1e-6, 1e-3, 1e-8])
    opt = MemberAdam(params, lr=lr, eps=eps, betas=(0.8, 0.99), backend=backend)
    copies = [[torch.nn.Parameter(p.detach()[q].clone()) for p in params] for q in range(4)]
    optims = [torch.optim.Adam(c, lr=float(lr[q]), eps=float(eps[q]), betas=(0.8, 0.99), foreach=False)
              for q, c in enumerate(copies)]
    for _ in range(8):
        grads = random_grads(gen)
        give_grads(opt, grads)
        opt.step(torch.zeros(4))
        for q, (c, o) in enumerate(zip(copies, optims)):
            for w, g in zip(c, member_slices(grads, q)):
                w.grad = g.clone()
            o.step()
    assert opt.steps.tolist() == [8.0] * 4
    for q, (c, o) in enumerate(zip(copies, optims)):
        for i, w in enumerate(c):
            assert_scaled_close(params[i].detach()[q], w.detach())
            assert_scaled_close(opt.exp_avg[i][q], o.state[w]["exp_avg"])
            assert_scaled_close(opt.exp_avg_sq[i][q], o.state[w]["exp_avg_sq"])
    assert all(torch.equal(p.detach()[3], w.detach()) for p, w in zip(params, copies[3]))  # lr 0: not moved


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_skip_leaves_that_member_and_not_the_others(backend):
    """Two runs from the same start with the same grads; run B skips member 2 at its 3rd update:
    member 2 is bit-identical across that update, the other members equal run A's bit for bit."""
    runs = {}
    for name in ("A", "B"):
        gen = torch.Generator().manual_seed(5)
        opt = MemberAdam(new_params(gen), lr=[0.01, 0.02, 0.03, 0.04], backend=backend)
        history = []
        for t in range(5):
            give_grads(opt, random_grads(gen))
            skip = torch.tensor([0.0, 0.0, 1.0, 0.0]) if (name == "B" and t == 2) else torch.zeros(4)
            before = snapshot(opt)
            opt.step(skip)
            history.append((before, snapshot(opt)))
        runs[name] = (opt, history)
    opt_b, hist_b = runs["B"]
    before, after = hist_b[2]
    for x, y in zip(before, after):
        if x.dim() >= 1 and x.shape[0] == 4:  # params, moments, step, lr, eps: member 2's slice
            assert torch.equal(x[2], y[2])
    assert opt_b.steps.tolist() == [5.0, 5.0, 4.0, 5.0]
    opt_a, _ = runs["A"]
    for x, y in zip(snapshot(opt_a), snapshot(opt_b)):
        if x.dim() >= 1 and x.shape[0] == 4:
            assert torch.equal(x[[0, 1, 3]], y[[0, 1, 3]])
    assert not torch.equal(opt_a.params[0][2], opt_b.params[0][2])  # member 2 did lose an update


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_dict_round_trip_continues_identically(backend):
    gen = torch.Generator().manual_seed(6)
    a = MemberAdam(new_params(gen), lr=[0.01, 0.02, 0.05, 0.1], eps=1e-6, betas=(0.85, 0.995), backend=backend)
    for _ in range(3):
        give_grads(a, random_grads(gen))
        a.step(torch.tensor([0.0, 1.0, 0.0, 0.0]))
    state = a.state_dict()
    assert set(state) == {"step", "lr", "eps", "betas"} | {f"exp_avg{s}.{i}" for s in ("", "_sq") for i in range(4)}
    assert all(isinstance(t, torch.Tensor) for t in state.values())
    b = MemberAdam([p.detach().clone().requires_grad_() for p in a.params], lr=0.5, betas=(0.85, 0.995),
                   backend=backend)
    own = [b.steps, b.lr, b.eps, *b.exp_avg, *b.exp_avg_sq]
    ptrs = [t.data_ptr() for t in own]
    b.load_state_dict(state)
    assert [t.data_ptr() for t in own] == ptrs  # loaded in place: a captured graph would see it
    assert b.lr.tolist() == a.lr.tolist() and b.steps.tolist() == [3.0, 0.0, 3.0, 3.0]
    for _ in range(4):
        grads = random_grads(gen)
        skip = (torch.rand(4, generator=gen) < 0.3).to(F32)
        for opt in (a, b):
            give_grads(opt, grads)
            opt.step(skip)
    for x, y in zip(snapshot(a), snapshot(b)):
        assert torch.equal(x, y)
    # the dict was a snapshot: a's later updates did not change it
    assert state["step"].tolist() == [3.0, 0.0, 3.0, 3.0]


def test_load_state_dict_refuses_a_mismatch():
    gen = torch.Generator().manual_seed(7)
    opt = MemberAdam(new_params(gen), lr=0.01, backend="torch")
    good = opt.state_dict()
    with pytest.raises(ValueError, match=r"missing keys \['exp_avg_sq.3'\]"):
        opt.load_state_dict({k: v for k, v in good.items() if k != "exp_avg_sq.3"})
    with pytest.raises(ValueError, match=r"unexpected keys \['exp_avg.4'\]"):
        opt.load_state_dict({**good, "exp_avg.4": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"exp_avg.1 must be torch.float32 \[4, 5\]"):
        opt.load_state_dict({**good, "exp_avg.1": torch.zeros(4, 6)})
    with pytest.raises(ValueError, match="betas"):
        opt.load_state_dict({**good, "betas": torch.tensor([0.9, 0.99], dtype=torch.float64)})
    before = snapshot(opt)
    with pytest.raises(ValueError):
        opt.load_state_dict({**good, "lr": torch.ones(4), "step": torch.ones(5)})
    assert all(torch.equal(x, y) for x, y in zip(before, snapshot(opt)))  # nothing copied on a refusal


def test_zero_grad_creates_then_zeroes_in_place():
    gen = torch.Generator().manual_seed(8)
    opt = MemberAdam(new_params(gen), lr=0.01, backend="torch")
    assert all(p.grad is None for p in opt.params)
    opt.zero_grad()
    ptrs = [p.grad.data_ptr() for p in opt.params]
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in opt.params)
    x = torch.randn(4, 5, generator=gen)
    loss = sum((p * p).sum() for p in opt.params) + (opt.params[1] * x).sum()
    loss.backward()  # accumulates into the zero grads, in place
    assert [p.grad.data_ptr() for p in opt.params] == ptrs
    torch.testing.assert_close(opt.params[1].grad, 2 * opt.params[1].detach() + x)
    opt.zero_grad()
    assert [p.grad.data_ptr() for p in opt.params] == ptrs
    assert all(not p.grad.any() for p in opt.params)


def test_step_without_grads_is_refused():
    opt = MemberAdam(new_params(torch.Generator().manual_seed(9)), lr=0.01)
    with pytest.raises(ValueError, match=r"params\[0\] has no grad; call zero_grad\(\)"):
        opt.step(torch.zeros(4))


@pytest.mark.parametrize("kwargs, match", [
    (dict(params=[]), "params must be a non-empty list"),
    (dict(params=[torch.zeros(4, 3), torch.zeros(3, 3)]),
     r"params\[1\] must be a contiguous float32 tensor \[4, ...\]"),
    (dict(params=[torch.zeros(3, 4).t()]), r"params\[0\] must be a contiguous"),
    (dict(lr=-0.1), "lr must be finite and >= 0"),
    (dict(lr=[0.1, 0.2]), r"lr must have one value per member \(\[4\]\)"),
    (dict(lr=torch.tensor([0.1, NAN, 0.1, 0.1])), "lr must be finite"),
    (dict(lr="fast"), "lr must be a number"),
    (dict(eps=-1e-8), "eps must be finite and >= 0"),
    (dict(betas=(0.9, 1.0)), r"betas must be two floats in \[0, 1\)"),
    (dict(betas=0.9), "betas must be"),
    (dict(backend="cuda"), "backend must be"),
])
def test_member_adam_bad_arguments(kwargs, match):
    args = dict(params=[torch.zeros(4, 3)], lr=0.01)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        MemberAdam(**args)
    if "params" not in kwargs:
        opt = MemberAdam([torch.zeros(4, 3)], lr=0.01)
        opt.zero_grad()
        with pytest.raises(ValueError, match=r"skip must be a float32 tensor \[P\] = \[4\]"):
            opt.step(torch.zeros(4, dtype=torch.bool))


def test_lr_and_eps_are_the_optimizers_own_tensors():
    lr = torch.tensor([0.1, 0.2, 0.3, 0.4])
    opt = MemberAdam([torch.zeros(4, 3)], lr=lr, eps=[1e-8, 1e-7, 1e-6, 1e-5])
    lr.zero_()  # the caller's tensor: copied
    assert opt.lr.tolist() == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert opt.lr.dtype == opt.eps.dtype == F32 and opt.eps.shape == (4,)
    assert opt.steps.tolist() == [0.0] * 4 and all(not m.any() for m in opt.exp_avg + opt.exp_avg_sq)


@pytest.mark.parametrize("backend", BACKENDS)
def test_update_path_reads_nothing_on_the_host(monkeypatch, backend):
    gen = torch.Generator().manual_seed(10)
    opt = MemberAdam(new_params(gen), lr=0.01, backend=backend)
    give_grads(opt, random_grads(gen))
    grads = [p.grad for p in opt.params]
    skip, max_norm = torch.tensor([0.0, 1.0, 0.0, 0.0]), torch.full((4,), 0.5)
    with monkeypatch.context() as m:
        forbid_syncs(m)
        member_grad_norm(grads)
        clip_member_grads_(grads, max_norm)
        opt.step(skip)
        opt.zero_grad()


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_clip_and_step_captured_in_a_cuda_graph():
    """Clip + MemberAdam.step captured once; each replay (new grads, skip and max_norm written in
    place) equals the same calls run eagerly on a copy with the torch reference."""
    dev = "cuda"
    gen = torch.Generator().manual_seed(11)
    shapes = [(8, 64, 33), (8, 33), (8, 1)]
    params = [torch.randn(s, generator=gen).to(dev).requires_grad_() for s in shapes]
    opt = MemberAdam(params, lr=torch.logspace(-4, -1, 8), eps=1e-8)
    ref = MemberAdam([p.detach().clone().requires_grad_() for p in params], lr=opt.lr.clone(), eps=1e-8,
                     backend="torch")
    opt.zero_grad()
    ref.zero_grad()
    skip, max_norm = torch.ones(8, device=dev), torch.ones(8, device=dev)
    norms = torch.zeros(8, device=dev)

    def body():
        norms.copy_(clip_member_grads_([p.grad for p in opt.params], max_norm))
        opt.step(skip)

    graph, _ = capture_graph(body, warmup=1)  # warm-up with every member skipped: nothing moves
    assert opt.steps.tolist() == [0.0] * 8
    for t in range(4):
        grads = [torch.randn(s, generator=gen).to(dev) * 3 for s in shapes]
        for o in (opt, ref):
            for p, g in zip(o.params, grads):
                p.grad.copy_(g)
        skip.copy_((torch.rand(8, generator=gen) < 0.3).to(F32))
        max_norm.copy_(torch.rand(8, generator=gen) * 20)
        torch.cuda.synchronize()
        with no_host_sync():
            graph.replay()
        torch.cuda.synchronize()
        ref_norms = clip_member_grads_([p.grad for p in ref.params], max_norm)
        ref.step(skip)
        torch.testing.assert_close(norms, ref_norms, rtol=1e-6, atol=0.0)
        assert torch.equal(opt.steps, ref.steps)
        for a, b in zip(snapshot(opt), snapshot(ref)):
            assert_scaled_close(a, b)
