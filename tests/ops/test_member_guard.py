"""member_guard: Triton kernel (interpreter) vs torch reference on odd shapes (P, B, A from 1; B
over several row tiles; Q a strided view), every halt case (NaN and Inf loss or norm, the clip,
a member already halted, the latch over calls), the update sums (NaN and Inf as 0, a NaN or
infinite Q row), no stats, members never mix, argument checks; on the GPU the compiled kernel
against the reference and captured without host syncs."""
import pytest
import torch

from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.member_guard import LOSS_CLIP, NON_FINITE, STATS_FIELDS, _blocks, member_guard

from support import require_compiled_kernels

_need_compiled = require_compiled_kernels(INTERPRET)
NAN, INF = float("nan"), float("inf")


def _case(P, B, A, seed, device="cpu"):
    """Inputs with every halt case among the first members and Q a strided view of [P, 2B, A]."""
    g = torch.Generator().manual_seed(seed)
    loss = torch.rand(P, generator=g) * 3
    gn = torch.rand(P, generator=g) * 2
    special = [(0, NAN, None), (1, None, INF), (2, 10.0, None), (3, -INF, None), (4, None, NAN), (6, 5.0, None)]
    for p, lv, gv in special:
        if p < P:
            if lv is not None:
                loss[p] = lv
            if gv is not None:
                gn[p] = gv
    halted = torch.zeros(P)
    halted[5 % P] = 1.0  # already halted (member 5; for P <= 5 one of the special ones)
    q = torch.randn(P, 2 * B, A, generator=g)[:, :B]
    if P > 7:
        q[7, B - 1, A - 1] = NAN  # a NaN Q: max-Q not counted
    if P > 8:
        q[8, 0] = INF  # an infinite row max: not counted
    if P > 9:
        q[9] = -INF
    state = dict(code=torch.zeros(P, dtype=torch.int64), at_update=torch.full((P,), -1),
                 at_env_steps=torch.full((P,), -1), halted=halted)
    return [t.to(device) for t in (loss, gn, torch.full((P,), 5.0), q)], {k: v.to(device) for k, v in state.items()}


def _run(backend, P, B, A, seed=0, with_stats=True, calls=1, device="cpu"):
    (loss, gn, clip, q), st = _case(P, B, A, seed, device)
    wide = torch.full((P, STATS_FIELDS + 4), 0.25, dtype=torch.float64, device=device)  # stats: columns 4..
    for i in range(calls):
        skip = member_guard(loss, gn, clip, st["halted"], st["code"], st["at_update"], st["at_env_steps"],
                            torch.tensor(7 + i, device=device), torch.tensor(100 + i, device=device),
                            stats=wide[:, 4:] if with_stats else None, q=q if with_stats else None, backend=backend)
        assert skip is st["halted"]
        loss = torch.where(torch.arange(P, device=device) == P - 1, NAN, loss)  # the last member goes bad later
    return st, wide


SHAPES = [(1, 1, 1), (3, 5, 2), (7, 37, 45), (12, 300, 3), (11, 2 * 128 + 1, 7)]


@pytest.mark.parametrize("P,B,A", SHAPES)
@pytest.mark.parametrize("with_stats", [True, False])
def test_kernel_equals_reference(P, B, A, with_stats):
    assert _blocks(3)[0] == 128  # B = 300 and 257 rows: several row tiles
    (sk, wk), (sr, wr) = (_run(b, P, B, A, seed=P + B, with_stats=with_stats, calls=2) for b in ("triton", "torch"))
    for name in sk:
        assert torch.equal(sk[name], sr[name]), name
    assert torch.equal(wk[:, :8], wr[:, :8])  # untouched columns, loss, norm, count, skips: exact
    torch.testing.assert_close(wk, wr, rtol=1e-6, atol=1e-6)  # the max-Q mean: to float32 rounding
    if not with_stats:
        assert (wk == 0.25).all()


def _q_case(P, B, A, seed):
    """Q ``[P, B, A]`` (a strided view) with, among the first members, a NaN, +Inf, -Inf, an entry at
    and one above the bound, in later row tiles too; thresholds with Inf and NaN among them."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(P, 2 * B, A, generator=g)[:, :B]
    cells = [(1, B - 1, A - 1, NAN), (2, 0, 0, INF), (3, B // 2, 0, -INF), (4, B - 1, 0, 5.0), (5, 0, A - 1, -5.5)]
    for p, b, a, v in cells:
        if p < P:
            q[p, b, a] = v
    thr = torch.full((P,), 5.0)
    for p, v in ((2, INF), (6, NAN), (7, 0.5)):
        if p < P:
            thr[p] = v
    return q, thr


@pytest.mark.parametrize("P,B,A", SHAPES)
def test_q_divergence_flag_kernel_equals_reference_and_the_rule(P, B, A):
    """q_diverged: any non-finite Q or |Q| above the member's bound (strict; a NaN bound never trips
    the magnitude test), the kernel's equal to the reference's; the other outputs as without it."""
    q, thr = _q_case(P, B, A, seed=P * B)
    out = {}
    for backend in ("triton", "torch"):
        (loss, gn, clip, _), st = _case(P, B, A, 0)
        flags = torch.full((P,), 0.5)
        stats = torch.zeros(P, STATS_FIELDS, dtype=torch.float64)
        member_guard(loss, gn, clip, st["halted"], st["code"], st["at_update"], st["at_env_steps"], torch.tensor(3),
                     torch.tensor(9), stats=stats, q=q, q_threshold=thr, q_diverged=flags, backend=backend)
        out[backend] = flags
    assert torch.equal(out["triton"], out["torch"])
    rule = [bool((~torch.isfinite(q[p])).any() or (q[p].abs() > thr[p]).any()) for p in range(P)]
    assert out["torch"].tolist() == [float(r) for r in rule]
    expected = {1: True, 2: True, 3: True, 4: False, 5: True}
    for p, want in expected.items():
        if p < P and not (p == 4 and q[4].abs().max() > 5.0):
            assert bool(out["torch"][p]) == want, p


def test_q_divergence_arguments_are_checked():
    (loss, gn, clip, q), st = _case(3, 4, 2, 0)
    args = (loss, gn, clip, st["halted"], st["code"], st["at_update"], st["at_env_steps"], torch.tensor(0),
            torch.tensor(0))
    stats = torch.zeros(3, STATS_FIELDS, dtype=torch.float64)
    with pytest.raises(ValueError, match="q_diverged must be"):
        member_guard(*args, stats=stats, q=q, q_threshold=torch.ones(3), q_diverged=None)
    with pytest.raises(ValueError, match="q_threshold must be"):
        member_guard(*args, stats=stats, q=q, q_threshold=torch.ones(2), q_diverged=torch.zeros(3))
    with pytest.raises(ValueError, match="need q"):
        member_guard(*args, q_threshold=torch.ones(3), q_diverged=torch.zeros(3))


def test_halts_and_sums_of_every_case():
    st, wide = _run("triton", 12, 9, 4, calls=2)
    # 0 NaN loss, 1 Inf norm, 2 loss above the clip, 3 -Inf loss, 4 NaN norm, 5 halted before,
    # 6 loss at the clip (not above it), 11 NaN loss on the second call
    halted = [1.0] * 6 + [0.0] * 5 + [1.0]
    assert st["halted"].tolist() == halted
    assert st["code"].tolist() == [NON_FINITE, NON_FINITE, LOSS_CLIP, NON_FINITE, NON_FINITE] + [0] * 6 + [NON_FINITE]
    assert st["at_update"].tolist() == [7] * 5 + [-1] * 6 + [8] and st["at_env_steps"].tolist()[11] == 101
    s = wide[:, 4:] - 0.25
    assert s[:, 2].tolist() == [2.0] * 12  # updates counted, skipped or not
    assert s[:, 3].tolist() == [2.0] * 6 + [0.0] * 5 + [1.0]  # skips
    assert s[0, 0] == 0 and s[1, 1] == 0 and s[3, 0] == 0 and s[4, 1] == 0  # NaN and Inf as 0
    assert s[2, 0] == 20.0 and s[6, 0] == 10.0
    assert s[7, 4] == 0 and s[8, 4] == 0 and s[9, 4] == 0 and s[10, 4] != 0  # NaN, +Inf, -Inf Q: 0


def test_members_never_mix():
    """Member 1's inputs changed (a NaN loss, huge Q): every other member's outputs are unchanged,
    and each member's equal a population of one."""
    P, B, A = 5, 13, 6
    base, wide = _run("triton", P, B, A, seed=3)
    (loss, gn, clip, q), st = _case(P, B, A, 3)
    loss[1], q[1] = NAN, 1e30
    w2 = torch.full((P, STATS_FIELDS), 0.25, dtype=torch.float64)
    member_guard(loss, gn, clip, st["halted"], st["code"], st["at_update"], st["at_env_steps"], torch.tensor(7),
                 torch.tensor(100), stats=w2, q=q, backend="triton")
    others = [0, 2, 3, 4]
    for name in st:
        assert torch.equal(st[name][others], base[name][others]), name
    assert torch.equal(w2[others], wide[others, 4:])
    (loss, gn, clip, q), st = _case(P, B, A, 3)
    for p in range(P):
        one = {k: v[p:p + 1].clone() for k, v in st.items()}
        w1 = torch.full((1, STATS_FIELDS), 0.25, dtype=torch.float64)
        member_guard(loss[p:p + 1], gn[p:p + 1], clip[p:p + 1], one["halted"], one["code"], one["at_update"],
                     one["at_env_steps"], torch.tensor(7), torch.tensor(100), stats=w1, q=q[p:p + 1], backend="triton")
        assert torch.equal(w1[0], wide[p, 4:]) and all(torch.equal(one[k][0], base[k][p]) for k in one), p


def test_argument_errors():
    (loss, gn, clip, q), st = _case(3, 4, 2, 0)
    args = [loss, gn, clip, st["halted"], st["code"], st["at_update"], st["at_env_steps"], torch.tensor(0),
            torch.tensor(0)]
    stats = torch.zeros(3, STATS_FIELDS, dtype=torch.float64)
    with pytest.raises(ValueError, match="member_guard: loss must be a float32 tensor"):
        member_guard(loss.double(), *args[1:])
    with pytest.raises(ValueError, match="member_guard: halted must be a contiguous"):
        member_guard(*args[:3], torch.zeros(4), *args[4:])
    with pytest.raises(ValueError, match="member_guard: updates must be"):
        member_guard(*args[:7], torch.tensor([0]), args[8])
    with pytest.raises(ValueError, match="stats and q go together"):
        member_guard(*args, stats=stats)
    with pytest.raises(ValueError, match=r"member_guard: stats must be a float64 tensor \[P, 5\]"):
        member_guard(*args, stats=stats.float(), q=q)
    with pytest.raises(ValueError, match="member_guard: q must be a float32 tensor"):
        member_guard(*args, stats=stats, q=q[:2])
    with pytest.raises(ValueError, match="member_guard: backend must be"):
        member_guard(*args, backend="cuda")


@pytest.mark.gpu
def test_gpu_kernel_equals_reference_and_captures():
    from support import capture_graph, no_host_sync

    P, B, A = 64, 1000, 45
    (sk, wk), (sr, wr) = (_run(b, P, B, A, seed=1, calls=3, device="cuda") for b in ("auto", "torch"))
    for name in sk:
        assert torch.equal(sk[name], sr[name]), name
    assert torch.equal(wk[:, :8], wr[:, :8])
    torch.testing.assert_close(wk, wr, rtol=1e-6, atol=1e-6)
    (loss, gn, clip, q), st = _case(P, B, A, 2, "cuda")
    stats = torch.zeros(P, STATS_FIELDS, dtype=torch.float64, device="cuda")
    updates, steps = torch.zeros((), dtype=torch.int64, device="cuda"), torch.zeros((), dtype=torch.int64, device="cuda")
    with no_host_sync():
        graph, _ = capture_graph(lambda: member_guard(loss, gn, clip, st["halted"], st["code"], st["at_update"],
                                                      st["at_env_steps"], updates, steps, stats=stats, q=q))
        for _ in range(5):
            graph.replay()
    torch.cuda.synchronize()
    assert stats[:, 2].tolist() == [8.0] * P  # 3 warm-up calls, 5 replays
