"""adam_step_: Triton kernel (TRITON_INTERPRET=1 on CPU) and torch reference vs torch.optim.Adam
over several steps with a skipped step and a clip coefficient < 1 (1 to 10 tensors, 1 to 4097
elements, empty ones: more tensors than one launch holds); step counts advanced once per call (per
tensor, or one shared count); members=3 = three single-member calls bit for bit; another BLOCK gives
the same bits; a skipped member
unchanged bit for bit, NaN gradients included; ``follow`` (the target update in Adam's launch) =
Adam then target_lerp_ bit for bit; argument checks. GPU: kernel vs
torch.optim.Adam(fused=True, capturable=True), captured in a CUDA graph = eager, replay after
changing lr and skip in place, no host sync."""
import pytest
import torch

from foxdqn.ops import backend as B
from foxdqn.ops.adam_step import adam_step_
from foxdqn.ops.tensor_list import MAX_SLOTS

from support import (MULTI_TENSOR_SHAPES, assert_close_report, assert_within_ulps, capture_graph, no_host_sync, randn_list,
                     require_compiled_kernels)

_need_compiled = require_compiled_kernels(B.INTERPRET)
F32 = torch.float32
NAN = float("nan")
SHAPES = MULTI_TENSOR_SHAPES
SKIPPED, SCALE, LR = 2, 0.25, 3e-2  # the step the guard skips, the clip coefficient, the learning rate


_params = randn_list


def _grad_draws(params, steps, seed):
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randn(p.shape, generator=g) * 10.0 ** torch.randint(-3, 2, (), generator=g)).to(p.device)
             for p in params] for _ in range(steps)]


def _ours(params, draws, backend, shared_step=False, members=1, lr=LR, eps=1e-8):
    ps = [p.clone() for p in params]
    ms, vs = [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]
    dev = ps[0].device
    shape = (members,) if members > 1 else ()
    steps = [torch.zeros(shape, device=dev)] if shared_step else [torch.zeros(shape, device=dev) for _ in ps]
    lr_t = lr if isinstance(lr, torch.Tensor) else torch.full(shape, lr, device=dev)
    skip, scale = torch.zeros(shape, device=dev), torch.full(shape, SCALE, device=dev)
    for i, grads in enumerate(draws):
        skip.fill_(1.0 if i == SKIPPED else 0.0)
        adam_step_(ps, grads, ms, vs, steps, lr=lr_t, eps=eps, grad_scale=scale, skip=skip, members=members,
                   backend=backend)
    return ps, ms, vs, steps


def _torch_adam(params, draws):
    ps = [torch.nn.Parameter(p.clone()) for p in params]
    opt = torch.optim.Adam(ps, lr=LR, foreach=False)
    for i, grads in enumerate(draws):
        if i == SKIPPED:
            continue
        for p, g in zip(ps, grads):
            p.grad = g * SCALE  # what _foreach_mul_(grads, coef) leaves
        opt.step()
    return [p.detach() for p in ps], [opt.state[p]["step"] for p in ps]


def _assert_tensor_close(actual, expected, ulps, name):
    """Each tensor of ``actual`` within ``ulps`` of ``expected``'s (support.assert_within_ulps)."""
    for k, (a, e) in enumerate(zip(actual, expected)):
        assert_within_ulps(a, e, ulps, name=f"{name}[{k}]")


@pytest.mark.parametrize("shapes", list(SHAPES))
def test_matches_torch_adam_over_steps_with_skip_and_clip(shapes):
    params = _params(SHAPES[shapes], seed=len(shapes))
    draws = _grad_draws(params, 5, seed=7)
    expect, torch_steps = _torch_adam(params, draws)
    kp, km, kv, ks = _ours(params, draws, "triton")
    rp, rm, rv, rs = _ours(params, draws, "torch")
    _assert_tensor_close(kp, expect, 8, "kernel vs torch.optim.Adam")
    _assert_tensor_close(rp, expect, 8, "reference vs torch.optim.Adam")
    _assert_tensor_close(km, rm, 4, "exp_avg kernel vs reference")
    _assert_tensor_close(kv, rv, 4, "exp_avg_sq kernel vs reference")
    for s_k, s_r, s_t in zip(ks, rs, torch_steps):
        assert float(s_k) == float(s_r) == float(s_t) == 4.0  # 5 calls, one skipped: once per call


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_shared_step_count_advances_once(backend):
    """One count shared by 10 tensors (two launches): advanced once per call, same params as per-tensor counts."""
    params = _params(SHAPES["ten_with_empty"], seed=2)
    draws = _grad_draws(params, 3, seed=4)
    sp, _, _, ss = _ours(params, draws, backend, shared_step=True)
    pp, _, _, ps = _ours(params, draws, backend)
    assert len(ss) == 1 and float(ss[0]) == 2.0 and all(float(s) == 2.0 for s in ps)
    for a, b in zip(sp, pp):
        assert torch.equal(a, b)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.slow
def test_members_equal_separate_calls_bit_for_bit(shared):
    shapes = SHAPES["ten_with_empty"]
    params = _params(shapes, seed=9, members=3)
    draws = _grad_draws(params, 3, seed=1)
    lr, eps = torch.tensor([1e-3, 3e-2, 0.1]), torch.tensor([1e-8, 1e-3, 1e-6])
    kp, km, kv, ks = _ours(params, draws, "triton", shared_step=shared, members=3, lr=lr, eps=eps)
    rp, _, _, _ = _ours(params, draws, "torch", shared_step=shared, members=3, lr=lr, eps=eps)
    for p in range(3):
        one = _ours([x[p] for x in params], [[g[p] for g in d] for d in draws], "triton", shared_step=shared,
                    lr=lr[p], eps=eps[p])
        for mine, alone in zip((kp, km, kv, ks), one):
            for a, b in zip(mine, alone):
                assert torch.equal(a[p], b), p
    _assert_tensor_close(kp, rp, 8, "members kernel vs reference")


@pytest.mark.parametrize("shared", [False, True])
def test_block_does_not_change_the_bits(monkeypatch, shared):
    """The element work does not depend on the row length: with BLOCK 128 (3 members of the ten
    tensors, up to 4,097 elements: 33 rows for the largest, its last one a single value;
    member-major) the same bits and counts as at BLOCK."""
    import foxdqn.ops.adam_step as adam_mod

    params = _params(SHAPES["ten_with_empty"], seed=13, members=3)
    draws = _grad_draws(params, 3, seed=14)
    out = {}
    for block in (adam_mod.BLOCK, 128):
        monkeypatch.setattr(adam_mod, "BLOCK", block)
        out[block] = _ours(params, draws, "triton", shared_step=shared, members=3)
    for wide, narrow in zip(*out.values()):
        for a, b in zip(wide, narrow):
            assert torch.equal(a, b)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_skipped_member_unchanged_bit_for_bit_nan_grads(backend):
    params = _params([(5,), (1000,), (0,)], seed=3, members=3)
    grads = [torch.full_like(p, NAN) for p in params]
    for g in grads:
        g[1] = 1.0
    ms = [torch.rand_like(p) for p in params]
    vs = [torch.rand_like(p) for p in params]
    steps = [torch.tensor([3.0, 5.0, 0.0]) for _ in params]
    before = [[t.clone() for t in lst] for lst in (params, ms, vs, steps)]
    skip = torch.tensor([1.0, 0.0, NAN])  # member 0 skipped, member 1 updated, member 2 (NaN) skipped
    adam_step_(params, grads, ms, vs, steps, lr=torch.full((3,), 0.1), skip=skip, members=3, backend=backend)
    for lst, old in zip((params, ms, vs), before):
        for t, o in zip(lst, old):
            assert torch.equal(t[0], o[0]) and torch.equal(t[2], o[2])
            assert not torch.equal(t[1], o[1]) or t.numel() == 0
    for s in steps:
        assert s.tolist() == [3.0, 6.0, 0.0]
    assert torch.isfinite(params[1][1]).all()


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("members", [1, 3])
def test_prior_receives_the_weights_before_each_applied_step(backend, members):
    """``prior`` holds each applied step's input weights bit for bit (more tensors than one launch
    holds, an empty one); a skipped member's prior is left as it was; the step itself is the same
    bits as without ``prior``."""
    params = _params(SHAPES["ten_with_empty"], seed=21, members=members)
    draws = _grad_draws(params, 3, seed=22)
    shape = (members,) if members > 1 else ()
    lr, scale = torch.full(shape, LR), torch.full(shape, SCALE)
    state = {name: ([p.clone() for p in params], [torch.zeros_like(p) for p in params],
                    [torch.zeros_like(p) for p in params], [torch.zeros(shape) for _ in params])
             for name in ("with", "without")}
    prior = [torch.full_like(p, NAN) for p in params]
    skips = [torch.zeros(shape), torch.zeros(shape), torch.ones(shape) if members == 1 else torch.tensor([0.0, 1.0, 0.0])]
    for grads, skip in zip(draws, skips):
        expected = [torch.where(skip.reshape((-1,) + (1,) * (p.dim() - 1)) != 0, old, p) if members > 1 else
                    (old if skip.item() else p.clone()) for p, old in zip(state["with"][0], prior)]
        for name, extra in (("with", {"prior": prior}), ("without", {})):
            ps, ms, vs, st = state[name]
            adam_step_(ps, grads, ms, vs, st, lr=lr, grad_scale=scale, skip=skip, members=members,
                       backend=backend, **extra)
        for got, want in zip(prior, expected):
            assert torch.equal(got, want) or (got.numel() == 0 and want.numel() == 0)
        for a, b in zip(state["with"][0], state["without"][0]):
            assert torch.equal(a, b)
    assert not any(torch.isnan(p).any() for p in prior)  # every member had an applied step


def test_prior_must_not_alias_params():
    params = _params([(4,)], seed=0)
    with pytest.raises(ValueError, match="prior must not share memory"):
        adam_step_(params, [torch.ones(4)], [torch.zeros(4)], [torch.zeros(4)], [torch.zeros(())],
                   lr=torch.tensor(LR), prior=params)


def test_nan_gradient_makes_nan_params_like_torch():
    params = _params([(7,)], seed=0)
    grads = [torch.ones(7)]
    grads[0][3] = NAN
    ours = _ours(params, [grads], "triton")[0][0]
    p = torch.nn.Parameter(params[0].clone())
    p.grad = grads[0] * SCALE
    torch.optim.Adam([p], lr=LR).step()
    assert torch.equal(torch.isnan(ours), torch.isnan(p.detach())) and bool(torch.isnan(ours[3]))


def test_one_launch_boundary():
    for n in (MAX_SLOTS, MAX_SLOTS + 1):
        params = _params([(k + 2,) for k in range(n)], seed=n)
        draws = _grad_draws(params, 2, seed=n)
        kp, _, _, ks = _ours(params, draws, "triton")
        rp, _, _, _ = _ours(params, draws, "torch")
        _assert_tensor_close(kp, rp, 8, f"{n} tensors")
        assert all(float(s) == 2.0 for s in ks)


def _ticket(device):
    from foxdqn.ops.tensor_list import scratch
    return int(scratch("adam_step_", torch.device(device), 1)[1])


_COUNT_CASES = {  # members, shapes
    "65 members": (65, [(3,), (0,)]),  # the last program's tile of 64 counts, then a second one after its wait
    "65 members, all empty": (65, [(0,)]),  # one program, no element work, both tiles
    "final launch all empty": (2, [(3,)] * 8 + [(0,)]),  # the second launch: one program, no element work
}


@pytest.mark.parametrize("case", list(_COUNT_CASES))
@pytest.mark.parametrize("shared", [False, True])
def test_counts_past_one_member_tile_and_all_empty_launches(case, shared):
    """The step counts where the last program has more than one tile of members to advance, or
    no element work: with member 1 skipped and (from 3 members on) member 2's skip NaN, the counts advance
    once per call where not skipped, the params follow the reference, and the ticket is 0 after
    each call."""
    members, shapes = _COUNT_CASES[case]
    params = _params(shapes, seed=11, members=members)
    draws = _grad_draws(params, 2, seed=12)
    skip = torch.zeros(members)
    skip[1] = 1.0
    if members > 2:
        skip[2] = NAN  # member 64, in the second tile, is not skipped: its count must advance
    out = {}
    for backend in ("triton", "torch"):
        ps = [p.clone() for p in params]
        ms, vs = [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]
        steps = [torch.zeros(members)] if shared else [torch.zeros(members) for _ in ps]
        for grads in draws:
            adam_step_(ps, grads, ms, vs, steps, lr=torch.full((members,), LR), skip=skip, members=members,
                       backend=backend)
            if backend == "triton":
                assert _ticket("cpu") == 0
        out[backend] = ps, steps
    want = torch.where(skip == 0.0, 2.0, 0.0)
    for s_k, s_r in zip(out["triton"][1], out["torch"][1]):
        assert torch.equal(s_k, want) and torch.equal(s_r, want)
    _assert_tensor_close(out["triton"][0], out["torch"][0], 8, f"{case}: kernel vs reference")


@pytest.mark.parametrize("hard", [True, False], ids=["hard", "polyak"])
@pytest.mark.parametrize("members,shapes,shared", [
    (1, SHAPES["ten_with_empty"], True),  # an empty tensor, sizes across blocks
    (3, SHAPES["ten_with_empty"], True),
    (3, [(k + 2,) for k in range(MAX_SLOTS + 1)], True),  # two launches: the counter advanced by the last
    (3, SHAPES["two_big"], False),  # one count per tensor
    (65, SHAPES["seven"], True),  # the last program's second tile of members
], ids=["P1-ten", "P3-ten", "P3-two-launches", "P3-counts-per-tensor", "P65"])
def test_follow_is_adam_then_target_lerp_bit_for_bit(hard, members, shapes, shared):
    """``follow`` (the target update in Adam's launch) against Adam, then target_lerp_ of the same
    targets toward the params it stored, kernel against kernel and reference against reference:
    params, moments, step counts, targets and the update counter bit for bit over four calls, with
    a hard copy due every second update or Polyak τ, member 1 skipped at the second call and
    (from 3 members on) member 2's skip NaN at the third (its target then NaN in both, as
    target_lerp_'s weight rule gives it)."""
    from foxdqn.ops.target_lerp import TargetFollow, target_lerp_

    params = _params(shapes, seed=31, members=members)
    draws = _grad_draws(params, 4, seed=32)
    shape = (members,) if members > 1 else ()
    lr, scale = torch.full(shape, LR), torch.full(shape, SCALE)
    tau = torch.linspace(0.05, 0.95, members).reshape(shape) if members > 1 else torch.tensor(0.3)
    period = torch.full(shape, 2, dtype=torch.int64)
    skips = [torch.zeros(shape) for _ in draws]
    if members > 1:
        skips[1][1] = 1.0
        if members > 2:
            skips[2][2] = NAN
    else:
        skips[1].fill_(1.0)
    for backend in ("triton", "torch"):
        out = {}
        for fused in (True, False):
            ps = [p.clone() for p in params]
            ms, vs = [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]
            steps = [torch.zeros(shape)] if shared else [torch.zeros(shape) for _ in ps]
            targets = [p.clone() * 0.5 for p in params]
            updates = torch.zeros((), dtype=torch.int64)
            for grads, skip in zip(draws, skips):
                follow = TargetFollow(targets, updates, tau, period, hard) if fused else None
                adam_step_(ps, grads, ms, vs, steps, lr=lr, grad_scale=scale, skip=skip, members=members,
                           follow=follow, backend=backend)
                if not fused:
                    target_lerp_(targets, ps, updates, skip, tau, period, hard=hard, advance=True,
                                 members=members, backend=backend)
                if backend == "triton":
                    assert _ticket("cpu") == 0
            out[fused] = [*ps, *ms, *vs, *steps, *targets, updates]
        for k, (a, b) in enumerate(zip(out[True], out[False])):
            assert a.shape == b.shape and torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)), (backend, k)
            assert torch.equal(a.isnan(), b.isnan()), (backend, k)
        assert int(out[True][-1]) == len(draws)
        moved = [t for t, p0 in zip(out[True][-1 - len(params):-1], params) if t.numel()]
        assert any(not torch.equal(t, p0 * 0.5) for t, p0 in zip(moved, [p for p in params if p.numel()]))


def test_follow_members_equal_separate_calls_bit_for_bit():
    """With ``follow`` (Polyak, each member its own τ, member 1 skipped at the second call), member p
    of a P = 3 kernel call is its P = 1 kernel call bit for bit: params, targets and counter."""
    from foxdqn.ops.target_lerp import TargetFollow

    params = _params(SHAPES["ten_with_empty"], seed=51, members=3)
    draws = _grad_draws(params, 3, seed=52)
    tau = torch.tensor([0.05, 0.5, 0.9])

    def run(ps0, grads_by_call, shape, tau_p, skips):
        ps = [p.clone() for p in ps0]
        ms, vs = [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]
        steps, targets = [torch.zeros(shape)], [p.clone() * 0.5 for p in ps0]
        updates = torch.zeros((), dtype=torch.int64)
        for grads, skip in zip(grads_by_call, skips):
            adam_step_(ps, grads, ms, vs, steps, lr=torch.full(shape, LR), skip=skip, members=shape[0] if shape else 1,
                       follow=TargetFollow(targets, updates, tau_p, torch.ones(shape, dtype=torch.int64), False),
                       backend="triton")
        return ps, targets, updates

    skips = [torch.zeros(3), torch.tensor([0.0, 1.0, 0.0]), torch.zeros(3)]
    ps, targets, updates = run(params, draws, (3,), tau, skips)
    for p in range(3):
        one = run([x[p] for x in params], [[g[p] for g in d] for d in draws], (), tau[p], [s[p] for s in skips])
        for a, b in zip(ps + targets, one[0] + one[1]):
            assert torch.equal(a[p], b), p
        assert int(one[2]) == int(updates) == len(draws)


def test_follow_argument_errors():
    from foxdqn.ops.target_lerp import TargetFollow

    p = [torch.zeros(3)]
    g, m, v, s = [torch.zeros(3)], [torch.zeros(3)], [torch.zeros(3)], [torch.zeros(())]
    lr, skip, u = torch.tensor(0.1), torch.zeros(()), torch.zeros((), dtype=torch.int64)
    tau, period = torch.tensor(0.5), torch.tensor(2)
    with pytest.raises(ValueError, match="follow must be a TargetFollow, with a skip"):
        adam_step_(p, g, m, v, s, lr=lr, follow=TargetFollow([torch.zeros(3)], u, tau, period, True))
    with pytest.raises(ValueError, match="follow.targets must not share memory with params"):
        adam_step_(p, g, m, v, s, lr=lr, skip=skip, follow=TargetFollow(p, u, tau, period, True))
    with pytest.raises(ValueError, match=r"adam_step_: follow.targets\[0\] must be .*shape \[3\]"):
        adam_step_(p, g, m, v, s, lr=lr, skip=skip, follow=TargetFollow([torch.zeros(4)], u, tau, period, True))
    with pytest.raises(ValueError, match="adam_step_ follow: updates must be an int64 0-d"):
        adam_step_(p, g, m, v, s, lr=lr, skip=skip, follow=TargetFollow([torch.zeros(3)], torch.zeros(()), tau,
                                                                          period, True))


def test_argument_errors():
    p = [torch.zeros(3)]
    g, m, v, s = [torch.zeros(3)], [torch.zeros(3)], [torch.zeros(3)], [torch.zeros(())]
    lr = torch.tensor(0.1)
    with pytest.raises(ValueError, match=r"grads\[0\] must be .*shape \[3\]"):
        adam_step_(p, [torch.zeros(4)], m, v, s, lr=lr)
    with pytest.raises(ValueError, match="exp_avg_sqs has 2 tensors"):
        adam_step_(p, g, m, v + v, s, lr=lr)
    with pytest.raises(ValueError, match="steps must be a list"):
        adam_step_(p * 3, g * 3, m * 3, v * 3, s * 2, lr=lr)
    with pytest.raises(ValueError, match="steps must be distinct"):
        t = [torch.zeros(2), torch.zeros(2)]
        adam_step_(t, [torch.zeros(2)] * 2, [torch.zeros(2), torch.zeros(2)], [torch.zeros(2), torch.zeros(2)],
                   s * 2, lr=lr)
    with pytest.raises(ValueError, match=r"steps\[0\] must be a contiguous torch.float32"):
        adam_step_(p, g, m, v, [torch.zeros((), dtype=torch.int64)], lr=lr)
    with pytest.raises(ValueError, match="lr must be"):
        adam_step_(p, g, m, v, s, lr=0.1)
    with pytest.raises(ValueError, match="beta2 must be a float in"):
        adam_step_(p, g, m, v, s, lr=lr, beta2=1.0)
    with pytest.raises(ValueError, match="eps must be a finite float"):
        adam_step_(p, g, m, v, s, lr=lr, eps=-1.0)
    with pytest.raises(ValueError, match=r"skip must be .*\[P\] = \[2\]"):
        adam_step_([torch.zeros(2, 3)], [torch.zeros(2, 3)], [torch.zeros(2, 3)], [torch.zeros(2, 3)],
                   [torch.zeros(2)], lr=torch.zeros(2), skip=torch.zeros(()), members=2)


@pytest.mark.gpu
@pytest.mark.parametrize("hard", [True, False], ids=["hard", "polyak"])
def test_gpu_follow_is_adam_then_target_lerp_bit_for_bit(hard):
    """On CUDA, 64 members of cartpole_cleanrl's six tensors: ``follow`` against Adam then
    target_lerp_, every tensor and the counter bit for bit over four calls (a hard copy due every
    second update or Polyak τ, a skipped member), eager and replayed from a CUDA graph."""
    from foxdqn.ops.target_lerp import TargetFollow, target_lerp_

    members = 64
    shapes = [(4, 120), (1, 120), (120, 84), (1, 84), (84, 2), (1, 2)]
    params = _params(shapes, seed=41, members=members, device="cuda")
    draws = _grad_draws(params, 4, seed=42)
    lr, scale = torch.full((members,), LR, device="cuda"), torch.full((members,), SCALE, device="cuda")
    tau = torch.linspace(0.05, 0.95, members, device="cuda")
    period = torch.full((members,), 2, dtype=torch.int64, device="cuda")
    skip = torch.zeros(members, device="cuda")
    states = {}
    for name in ("fused", "apart", "graph"):
        states[name] = ([p.clone() for p in params], [torch.zeros_like(p) for p in params],
                        [torch.zeros_like(p) for p in params], [torch.zeros(members, device="cuda")],
                        [p.clone() * 0.5 for p in params], torch.zeros((), dtype=torch.int64, device="cuda"))
    grads = [g.clone() for g in draws[0]]

    def call(name):
        ps, ms, vs, st, targets, updates = states[name]
        follow = None if name == "apart" else TargetFollow(targets, updates, tau, period, hard)
        adam_step_(ps, grads, ms, vs, st, lr=lr, grad_scale=scale, skip=skip, members=members, follow=follow)
        if follow is None:
            target_lerp_(targets, ps, updates, skip, tau, period, hard=hard, advance=True, members=members)

    call("graph")  # the ops' scratch, then the capture (its warm-up calls advance the graph's state too)
    graph, _ = capture_graph(lambda: call("graph"))
    ref = {k: [t.clone() for group in v[:5] for t in group] + [v[5].clone()] for k, v in states.items()}
    for k in ("fused", "apart"):  # bring the eager states to the graph's state before its first replay
        for dst, src in zip([t for group in states[k][:5] for t in group] + [states[k][5]], ref["graph"]):
            dst.copy_(src)
    for i, g in enumerate(draws):
        for dst, src in zip(grads, g):
            dst.copy_(src)
        skip.zero_()
        skip[3] = 1.0 if i == 1 else 0.0
        with no_host_sync():
            call("fused")
            call("apart")
            graph.replay()
    torch.cuda.synchronize()
    flat = {k: [t for group in v[:5] for t in group] + [v[5]] for k, v in states.items()}
    for k, (a, b, c) in enumerate(zip(flat["fused"], flat["apart"], flat["graph"])):
        assert torch.equal(a, b) and torch.equal(a, c), k
    assert not all(torch.equal(t, p * 0.5) for t, p in zip(states["fused"][4], params))


@pytest.mark.gpu
def test_gpu_matches_fused_adam_and_graph_replay():
    shapes = SHAPES["ten_with_empty"] + [(256, 64), (256,), (256, 256)]
    params = _params(shapes, seed=11, device="cuda")
    draws = _grad_draws(params, 4, seed=12)
    ps = [torch.nn.Parameter(p.clone()) for p in params]
    opt = torch.optim.Adam(ps, lr=torch.tensor(LR, device="cuda"), fused=True, capturable=True)
    found_inf = torch.zeros((), device="cuda")
    for i, grads in enumerate(draws):
        for p, g in zip(ps, grads):
            p.grad = g * SCALE
        found_inf.fill_(1.0 if i == SKIPPED else 0.0)
        opt.grad_scale, opt.found_inf = None, found_inf
        opt.step()
    kp, km, kv, ks = _ours(params, draws, "auto")
    # each Adam step moves an element by up to ~lr·|m̂|/sqrt(v̂); where m cancels over steps of
    # opposite signs, a 1-ulp difference in the moments (fma vs separate multiply-add, torch 2.11's
    # fused kernel vs ours) becomes a relative difference of that ratio: measured on the H200,
    # 5 of ~86k elements differed by up to 1.2e-6 = 4e-5·lr after 3 steps. Bound: 1e-3 of a step.
    for k, (a, e) in enumerate(zip(kp, [p.detach() for p in ps])):
        assert_close_report(a, e, atol=1e-3 * LR, rtol=0.0, name=f"kernel vs fused Adam[{k}]")
    _assert_tensor_close(km, [opt.state[p]["exp_avg"] for p in ps], 2, "exp_avg vs fused Adam")
    assert all(float(s) == float(opt.state[p]["step"]) for s, p in zip(ks, ps))

    # captured = eager; lr and skip changed in place between replays
    lr, skip, scale = torch.tensor(LR, device="cuda"), torch.zeros((), device="cuda"), torch.tensor(0.5, device="cuda")
    grads = draws[0]
    state = [[p.clone() for p in params] for _ in range(2)]
    moments = [[[torch.zeros_like(p) for p in params] for _ in range(2)] for _ in range(2)]
    steps = [[torch.zeros((), device="cuda") for _ in params] for _ in range(2)]

    def call(j):
        adam_step_(state[j], grads, moments[j][0], moments[j][1], steps[j], lr=lr, grad_scale=scale, skip=skip)

    with no_host_sync():
        graph, _ = capture_graph(lambda: call(0))  # 3 eager warm-up calls + the capture (not run)
        for _ in range(3):
            call(1)
        graph.replay()
        call(1)
        lr.fill_(1e-4)
        skip.fill_(1.0)
        graph.replay()
        call(1)
        skip.fill_(0.0)
        graph.replay()
        call(1)
    torch.cuda.synchronize()
    for a, b in zip(state[0] + steps[0], state[1] + steps[1]):
        assert torch.equal(a, b)
    assert float(steps[0][0]) == 5.0


@pytest.mark.gpu
@pytest.mark.parametrize("shared", [False, True])
def test_no_program_reads_an_advanced_count_gpu(shared):
    """64 members of eurusd_dqn's parameter shapes (about 15k programs, more than the GPU holds at
    once), from zero moments and counts, 30 times: every element moves by lr (t = 1; a program
    that read the already advanced count, t = 2, would move it by about 0.74 lr), the counts end
    at 1, and the ticket is 0 after every call (module docstring, "Step counts")."""
    dev, members, lr = torch.device("cuda"), 64, 1e-3
    shapes = [(162, 256), (256,), (256, 256), (256,), (256, 1), (1,), (256, 45), (45,)]
    params = randn_list(shapes, 0, members, device=dev, scale=0.05)
    grads = randn_list(shapes, 1, members, device=dev)
    start = [p.clone() for p in params]
    ms, vs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    steps = [torch.zeros(members, device=dev)] if shared else [torch.zeros(members, device=dev) for _ in params]
    lr_t, skip = torch.full((members,), lr, device=dev), torch.zeros(members, device=dev)
    for _ in range(30):
        for p, p0, m, v in zip(params, start, ms, vs):
            p.copy_(p0)
            m.zero_()
            v.zero_()
        for st in steps:
            st.zero_()
        adam_step_(params, grads, ms, vs, steps, lr=lr_t, skip=skip, members=members)
        for p, p0, gr in zip(params, start, grads):
            big = gr.abs() > 1e-3  # eps (1e-8) negligible beside |g|
            moved = (p0 - p)[big] * gr[big].sign()
            assert torch.allclose(moved, torch.full_like(moved, lr), rtol=1e-3, atol=0.0), float(moved.min())
        assert all(torch.equal(st, torch.ones_like(st)) for st in steps)
        assert _ticket(dev) == 0
