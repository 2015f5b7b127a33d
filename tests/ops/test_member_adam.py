"""member_adam_: Triton kernel (TRITON_INTERPRET=1 on CPU) vs torch reference on odd shapes and
edge cases; the reference vs torch.optim.Adam(foreach=False) run per member; skipped and lr=0
members unchanged; the rule in float64 at step 1 and 1000; argument checks. GPU: kernel vs
reference on CUDA, and the op captured in a CUDA graph."""
import pytest
import torch

from foxdqn.ops import backend as B
from foxdqn.ops.member_adam import BLOCK, member_adam_, member_adam_reference

from support import assert_close_report, capture_graph, no_host_sync, require_compiled_kernels

_need_compiled = require_compiled_kernels(B.INTERPRET)

F32 = torch.float32
NAN, INF = float("nan"), float("inf")
BACKENDS = ["triton", "torch"]
STATE = ("param", "exp_avg", "exp_avg_sq")


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def grads_like(shape, gen, device="cpu"):
    """Normal draws times 10**k, k uniform in {-3, ..., 2}: magnitudes 1e-3 to 1e2 side by side."""
    g = torch.randn(shape, generator=gen) * 10.0 ** torch.randint(-3, 3, shape, generator=gen).to(F32)
    return g.to(device)


def member_vectors(members, gen, device="cpu"):
    """Per-member lr in [1e-4, 0.3] (log-uniform) and eps in {1e-8, 1e-6, 1e-3}."""
    lr = 10.0 ** (-4 + 3.5 * torch.rand(members, generator=gen))
    eps = torch.tensor([1e-8, 1e-6, 1e-3])[torch.randint(0, 3, (members,), generator=gen)]
    return lr.to(F32).to(device), eps.to(F32).to(device)


def new_state(shape, gen, device="cpu"):
    """param ~ N(0, 1); zero moments, as before a first update."""
    param = torch.randn(shape, generator=gen).to(device)
    return {"param": param, "exp_avg": torch.zeros_like(param), "exp_avg_sq": torch.zeros_like(param)}


def run(state, grad, step, lr, eps, skip, betas=(0.9, 0.999), backend="torch"):
    member_adam_(state["param"], grad, state["exp_avg"], state["exp_avg_sq"], step, lr, eps, skip, *betas,
                 backend=backend)


def clone(state):
    return {k: v.clone() for k, v in state.items()}


def assert_member_close(actual, expected, rtol, name):
    """|a - e| <= rtol * (largest |e| of that member's slice) for every member: a tolerance on the
    scale of the member's tensor, since a value that cancels to near 0 keeps an absolute error of
    the size of its terms. NaN and Inf must sit at the same places."""
    scale = expected.detach().abs().nan_to_num(nan=0.0, posinf=0.0).reshape(expected.shape[0], -1).amax(1)
    for p in range(expected.shape[0]):
        assert_close_report(actual[p], expected[p], rtol=0.0, atol=rtol * float(scale[p]) + 1e-30,
                            name=f"{name}[member {p}]")


# ---------------------------------------------------------------------------------------------
# kernel vs reference
# ---------------------------------------------------------------------------------------------
#: Kernel vs reference: both evaluate the same float32 expressions, except that torch's CPU lerp
#: uses a fused multiply-add and the interpreter does not (on CUDA, either compiler may fuse).
#: That is half an ulp of w1*(g - m) per update, about 6e-8 of the member's scale of exp_avg,
#: carried into later updates (decaying by beta1) and into param through m / denom; the largest
#: seen here is 1.4e-7. 1e-6 of the member's scale leaves room and still catches a 1e-6 relative
#: change of one bias correction.
KERNEL_RTOL = 1e-6

SHAPES = [(1, 3), (3, 5, 7), (4, 1), (2, 130), (5,), (2, BLOCK + 3)]  # (5,): one element per member
BETAS = [(0.9, 0.999), (0.3, 0.95), (0.0, 0.5)]  # 1 - 0.3 >= 0.5: torch's other lerp branch; beta1 = 0


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("betas", BETAS)
def test_kernel_matches_reference_over_updates(shape, betas):
    gen = torch.Generator().manual_seed(sum(shape) + int(10 * betas[0]))
    members = shape[0]
    lr, eps = member_vectors(members, gen)
    state = new_state(shape, gen)
    out = {b: clone(state) for b in BACKENDS}
    step = torch.zeros(members)
    for t in range(6):
        grad = grads_like(shape, gen)
        skip = (torch.rand(members, generator=gen) < 0.3).to(F32) if members > 1 else torch.zeros(1)
        step += skip == 0
        before = {b: clone(out[b]) for b in BACKENDS}
        for b in BACKENDS:
            run(out[b], grad, step, lr, eps, skip, betas, backend=b)
        for k in STATE:
            assert_member_close(out["triton"][k], out["torch"][k], KERNEL_RTOL, f"{k} after update {t}")
            for p in skip.nonzero().flatten().tolist():  # skipped: untouched in both, bit for bit
                assert all(torch.equal(out[b][k][p], before[b][k][p]) for b in BACKENDS), (k, p)
    assert not torch.equal(out["torch"]["param"], state["param"])  # the updates did move params


@pytest.mark.parametrize("backend", BACKENDS)
def test_skipped_member_is_bit_identical_whatever_its_grad(backend):
    gen = torch.Generator().manual_seed(1)
    shape = (4, 3, 33)
    lr, eps = member_vectors(4, gen)
    state = new_state(shape, gen)
    state["exp_avg"].normal_(generator=gen)
    state["exp_avg_sq"].uniform_(0.0, 2.0, generator=gen)
    grad = grads_like(shape, gen)
    grad[1, 0, 0], grad[1, 2, 5], grad[3, 1, 1] = NAN, INF, -INF  # NaN/Inf only in skipped members
    skip = torch.tensor([0.0, 1.0, 0.0, 1.0])
    before = clone(state)
    run(state, grad, torch.tensor([3.0, 7.0, 3.0, 2.0]), lr, eps, skip, backend=backend)
    for k in STATE:
        for p in (1, 3):
            assert torch.equal(state[k][p], before[k][p]), (k, p)
        for p in (0, 2):
            assert torch.isfinite(state[k][p]).all() and not torch.equal(state[k][p], before[k][p]), (k, p)


@pytest.mark.parametrize("backend", BACKENDS)
def test_any_nonzero_skip_skips(backend):
    gen = torch.Generator().manual_seed(2)
    state = new_state((4, 9), gen)
    before = clone(state)
    run(state, grads_like((4, 9), gen), torch.ones(4), torch.full((4,), 0.1), torch.full((4,), 1e-8),
        torch.tensor([0.0, NAN, -1.0, 0.5]), backend=backend)
    assert not torch.equal(state["param"][0], before["param"][0])
    for k in STATE:
        assert torch.equal(state[k][1:], before[k][1:]), k


@pytest.mark.parametrize("backend", BACKENDS)
def test_lr_zero_member_does_not_move(backend):
    gen = torch.Generator().manual_seed(3)
    shape = (3, 2, 65)
    state = new_state(shape, gen)
    lr = torch.tensor([0.01, 0.0, 0.2])
    before = clone(state)
    step = torch.zeros(3)
    for _ in range(5):
        step += 1
        run(state, grads_like(shape, gen), step, lr, torch.full((3,), 1e-8), torch.zeros(3), backend=backend)
    assert torch.equal(state["param"][1], before["param"][1])
    assert not torch.equal(state["exp_avg"][1], before["exp_avg"][1])  # the moments still follow the grads
    for p in (0, 2):
        assert not torch.equal(state["param"][p], before["param"][p])


def rule_float64(state, grad, step, lr, eps, betas):
    """Algorithm 1 of Kingma & Ba 2015 in float64, from the float32 inputs: (param, m, v)."""
    b1, b2 = betas
    d = {k: v.double() for k, v in state.items()}
    g = grad.double()
    col = (-1,) + (1,) * (grad.dim() - 1)
    t = step.double().view(col)
    m = b1 * d["exp_avg"] + (1 - b1) * g
    v = b2 * d["exp_avg_sq"] + (1 - b2) * g * g
    m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
    return d["param"] - lr.double().view(col) * m_hat / (v_hat.sqrt() + eps.double().view(col)), m, v


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t", [1.0, 1000.0])
def test_step_1_and_1000_follow_the_rule(backend, t):
    """From nonzero moments at step t: the float64 rule, to float32 precision (the few roundings
    of a float32 evaluation: 1e-6 of the member's scale); kernel and reference agree."""
    gen = torch.Generator().manual_seed(int(t))
    shape = (3, 4, 11)
    lr, eps = torch.tensor([1e-3, 0.05, 0.3]), torch.tensor([1e-8, 1e-3, 1e-6])
    state = new_state(shape, gen)
    state["exp_avg"].normal_(generator=gen)
    state["exp_avg_sq"].uniform_(0.0, 3.0, generator=gen)
    grad = grads_like(shape, gen)
    step = torch.full((3,), t)
    expect = rule_float64(state, grad, step, lr, eps, (0.9, 0.999))
    got = clone(state)
    run(got, grad, step, lr, eps, torch.zeros(3), backend=backend)
    for k, e in zip(STATE, expect):
        assert_member_close(got[k], e, 1e-6, k)
    assert (got["param"] != state["param"]).any(2).any(1).all()  # every member moved


@pytest.mark.parametrize("backend", BACKENDS)
def test_first_step_zero_grads_leave_params(backend):
    state = new_state((3, 7), torch.Generator().manual_seed(4))
    before = clone(state)
    run(state, torch.zeros(3, 7), torch.ones(3), torch.full((3,), 0.5), torch.tensor([1e-8, 1e-3, 1e-30]),
        torch.zeros(3), backend=backend)
    for k in STATE:
        assert torch.equal(state[k], before[k]), k


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's g*g
def test_large_grads(backend):
    """|g| up to 1e19: finite moments, a first step of about lr per weight (Adam's update is
    invariant to the grad's scale). |g| = 1e25: (1 - beta2) * g * g overflows to Inf, as in torch,
    and m / Inf = 0 leaves the weight."""
    gen = torch.Generator().manual_seed(5)
    state = new_state((2, 3, 5), gen)
    grad = torch.randn(2, 3, 5, generator=gen).sign() * 10.0 ** torch.randint(15, 20, (2, 3, 5), generator=gen)
    grad[1, 2, 4] = 1e25
    lr = torch.tensor([0.01, 0.02])
    before = clone(state)
    run(state, grad, torch.ones(2), lr, torch.full((2,), 1e-8), torch.zeros(2), backend=backend)
    moved = before["param"] - state["param"]
    finite = grad.abs() < 1e20
    expect = (lr.view(2, 1, 1) * grad.sign()).expand_as(grad)
    # (atol: moved is a difference of float32 weights |w| < 5, exact to their half ulp, 2.4e-7)
    assert_close_report(moved[finite], expect[finite], atol=1e-6, name="first step")
    assert state["exp_avg_sq"][1, 2, 4] == INF and moved[1, 2, 4] == 0.0
    assert torch.isfinite(state["exp_avg_sq"][finite]).all()


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's g*g
def test_kernel_matches_reference_on_edge_cases():
    """Zero grads after updates, lr 0, step 1 and 1000, grads up to 1e25 (overflow), skip: one
    state, both backends, the same outputs (bit for bit where no FMA question arises: Inf, skip)."""
    gen = torch.Generator().manual_seed(6)
    shape = (6, 3, 17)
    state = new_state(shape, gen)
    state["exp_avg"].normal_(generator=gen)
    state["exp_avg_sq"].uniform_(0.0, 3.0, generator=gen)
    grad = grads_like(shape, gen)
    grad[0] = 0.0
    grad[1] *= 1e18
    grad[1, 0, :3] = 1e25
    lr = torch.tensor([0.1, 0.1, 0.0, 0.01, 0.3, 0.2])
    step = torch.tensor([5.0, 1.0, 3.0, 1000.0, 1.0, 2.0])
    skip = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    out = {b: clone(state) for b in BACKENDS}
    for b in BACKENDS:
        run(out[b], grad, step, lr, torch.full((6,), 1e-8), skip, backend=b)
    for k in STATE:
        assert_member_close(out["triton"][k], out["torch"][k], KERNEL_RTOL, k)
        assert torch.equal(out["triton"][k][5], state[k][5])
    assert torch.equal(out["triton"]["param"][2], state["param"][2])  # lr 0
    assert (out["triton"]["exp_avg_sq"][1, 0, :3] == INF).all()


# ---------------------------------------------------------------------------------------------
# reference vs torch.optim.Adam
# ---------------------------------------------------------------------------------------------
#: The reference calls torch's own ops in torch's order with the same float32 scalars; the one
#: difference is where the bias corrections are computed (torch.pow on a float64 tensor here,
#: Python's float pow in torch.optim.Adam), which can move a float32 scalar by 1 ulp (6e-8) and
#: an update by about 1.2e-7 of its size. 1e-6 of the member's scale bounds that with margin over
#: the 25 updates (on this machine the two agree bit for bit).
TORCH_RTOL = 1e-6


@pytest.mark.parametrize("shape", [(3, 5, 7), (2, 130), (4, 1)])
@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.3, 0.95)])
def test_reference_equals_torch_adam_per_member(shape, betas):
    gen = torch.Generator().manual_seed(sum(shape))
    members = shape[0]
    lr, eps = member_vectors(members, gen)
    state = new_state(shape, gen)
    torch_params = [torch.nn.Parameter(state["param"][p].clone()) for p in range(members)]
    optims = [torch.optim.Adam([w], lr=float(lr[p]), eps=float(eps[p]), betas=betas, foreach=False)
              for p, w in enumerate(torch_params)]
    step = torch.zeros(members)
    for _ in range(25):
        grad = grads_like(shape, gen)
        step += 1
        run(state, grad, step, lr, eps, torch.zeros(members), betas, backend="torch")
        for p, (w, opt) in enumerate(zip(torch_params, optims)):
            w.grad = grad[p].clone()
            opt.step()
    expect = {"param": torch.stack([w.detach() for w in torch_params]),
              "exp_avg": torch.stack([o.state[w]["exp_avg"] for w, o in zip(torch_params, optims)]),
              "exp_avg_sq": torch.stack([o.state[w]["exp_avg_sq"] for w, o in zip(torch_params, optims)])}
    for k in STATE:
        assert_member_close(state[k], expect[k], TORCH_RTOL, k)
    assert step.tolist() == [float(o.state[w]["step"]) for w, o in zip(torch_params, optims)]


# ---------------------------------------------------------------------------------------------
# arguments
# ---------------------------------------------------------------------------------------------
def _args(**over):
    a = dict(param=torch.zeros(2, 3), grad=torch.zeros(2, 3), exp_avg=torch.zeros(2, 3), exp_avg_sq=torch.zeros(2, 3),
             step=torch.ones(2), lr=torch.ones(2), eps=torch.ones(2), skip=torch.zeros(2), beta1=0.9, beta2=0.999)
    a.update(over)
    return a


@pytest.mark.parametrize("over, match", [
    (dict(param=torch.zeros(2, 3, dtype=torch.float64)), "param must be"),
    (dict(param=torch.zeros(())), "param must be"),
    (dict(param=torch.zeros(3, 2).t()), "param must be"),
    (dict(grad=torch.zeros(2, 4)), "grad must be"),
    (dict(exp_avg=torch.zeros(3, 2).t()), "exp_avg must be"),
    (dict(exp_avg_sq=torch.zeros(2, 3, dtype=torch.float16)), "exp_avg_sq must be"),
    (dict(step=torch.ones(3)), r"step must be .*\[P\] = \[2\]"),
    (dict(step=torch.ones(2, dtype=torch.int64)), "step must be"),
    (dict(lr=torch.ones(2, 1)), "lr must be"),
    (dict(eps=1e-8), "eps must be"),
    (dict(skip=torch.zeros(2, dtype=torch.bool)), "skip must be"),
    (dict(beta1=1.0), r"beta1 must be a float in \[0, 1\)"),
    (dict(beta2=-0.1), "beta2 must be"),
    (dict(beta1=True), "beta1 must be"),
])
def test_bad_arguments(over, match):
    with pytest.raises(ValueError, match=match):
        member_adam_(**_args(**over))


def test_unknown_backend():
    with pytest.raises(ValueError, match="backend must be"):
        member_adam_(**_args(), backend="cuda")


def test_reference_has_the_same_signature():
    import inspect

    ref = list(inspect.signature(member_adam_reference).parameters)
    assert ref == list(inspect.signature(member_adam_).parameters)[:-1]
    assert ref == ["param", "grad", "exp_avg", "exp_avg_sq", "step", "lr", "eps", "skip", "beta1", "beta2"]


def test_empty_slices_are_a_no_op():
    for b in BACKENDS:
        member_adam_(**_args(**{k: torch.zeros(2, 0) for k in STATE + ("grad",)}), backend=b)


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES + [(64, 256, 129)])
@pytest.mark.parametrize("betas", BETAS)
def test_gpu_kernel_matches_reference(shape, betas):
    gen = torch.Generator().manual_seed(sum(shape))
    members = shape[0]
    lr, eps = member_vectors(members, gen)
    state = new_state(shape, gen)
    out = {b: {k: v.cuda() for k, v in state.items()} for b in BACKENDS}
    step = torch.zeros(members)
    for _ in range(6):
        grad = grads_like(shape, gen)
        skip = (torch.rand(members, generator=gen) < 0.3).to(F32)
        step += skip == 0
        for b in BACKENDS:
            run(out[b], grad.cuda(), step.cuda(), lr.cuda(), eps.cuda(), skip.cuda(), betas, backend=b)
    for k in STATE:  # both on CUDA: the same expressions, FMA contraction may differ
        assert_member_close(out["triton"][k].cpu(), out["torch"][k].cpu(), KERNEL_RTOL, k)


@pytest.mark.gpu
def test_gpu_captured_in_a_cuda_graph():
    """Three parameter tensors updated inside one captured graph; grads, step, lr and skip change
    in place between replays; every replay equals the eager reference, without a host sync."""
    dev = "cuda"
    gen = torch.Generator().manual_seed(7)
    shapes = [(8, 33, 17), (8, 17), (8, 1)]
    states = [{k: v.to(dev) for k, v in new_state(s, gen).items()} for s in shapes]
    grads = [torch.zeros(s, device=dev) for s in shapes]
    step, skip = torch.zeros(8, device=dev), torch.zeros(8, device=dev)
    lr, eps = (t.to(dev) for t in member_vectors(8, gen))
    ref_states = [clone(s) for s in states]
    ref_step = step.clone()

    def body():
        step.add_(skip == 0)
        for st, g in zip(states, grads):
            member_adam_(st["param"], g, st["exp_avg"], st["exp_avg_sq"], step, lr, eps, skip, 0.9, 0.999)

    skip.fill_(1.0)  # the warm-up call (compiles the kernel) skips every member: it changes nothing
    graph, _ = capture_graph(body, warmup=1)
    assert torch.equal(step, ref_step) and all(torch.equal(st[k], ref[k]) for st, ref in zip(states, ref_states)
                                               for k in STATE)
    for t in range(5):
        for g, s in zip(grads, shapes):
            g.copy_(grads_like(s, gen, dev))
        skip.copy_((torch.rand(8, generator=gen) < 0.3).to(F32))
        if t == 3:
            lr.mul_(2.0)
        torch.cuda.synchronize()
        with no_host_sync():
            graph.replay()
        torch.cuda.synchronize()
        ref_step.add_(skip == 0)
        for st, g in zip(ref_states, grads):
            run(st, g, ref_step, lr, eps, skip, backend="torch")
        assert torch.equal(step, ref_step)
        for st, ref in zip(states, ref_states):
            for k in STATE:
                assert_member_close(st[k].cpu(), ref[k].cpu(), KERNEL_RTOL, f"{k} after replay {t}")
