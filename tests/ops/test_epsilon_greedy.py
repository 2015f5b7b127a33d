"""epsilon_greedy: Triton kernel (interpreter) vs torch reference on odd shapes, ties and NaN in q
(within one column tile and across tiles),
ε = 0 and 1, a schedule mid-way and past its end, G > 1 groups (per-env and per-program schedule
rows), A = 1; the random actions equal
MemberRandom's randint draws; argument checks; linear_value (LinearSchedule and the reference's
ε); on the GPU the compiled kernel, captured."""
import pytest
import torch

from foxdqn.ops.epsilon_greedy import epsilon_greedy, epsilon_greedy_reference, epsilon_schedule_reference
from foxdqn.ops.member_uniform import member_keys, member_randint, member_uniform
from foxdqn.device.schedules import LinearSchedule, linear_value

F32, I64 = torch.float32, torch.int64


def _case(n, a, groups, seed, device="cpu", ties=True):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, a, generator=g)
    if ties:  # few distinct values: many rows with a tied maximum
        q = torch.round(q * 2) / 2
    u = torch.rand(groups, 2, n // groups, generator=g)
    u.view(-1)[:4] = torch.tensor([0.0, 1.0 - 2.0**-24, 0.5, 2.0**-24])[:u.numel()]
    start = torch.rand(groups, generator=g)
    end = torch.rand(groups, generator=g) * 0.1
    duration = 1.0 + torch.rand(groups, generator=g) * 50
    return [t.to(device) for t in (q, start, end, duration, u)]


def _both(q, step, start, end, duration, u, backend="triton"):
    k = epsilon_greedy(q, step, start, end, duration, u, backend=backend)
    r = epsilon_greedy(q, step, start, end, duration, u, backend="torch")
    return k, r


# one group; groups of N // G envs not a multiple of the kernel's BLOCK (8: per-env schedule rows),
# and a multiple (one group per program); N a multiple of BLOCK (no row mask) or not, also with
# groups not aligned to the blocks (24 x 2, 48 x 3)
SHAPES = [(1, 1, 1), (37, 5, 1), (66, 45, 1), (64, 45, 1), (129, 3, 3), (260, 7, 4), (96, 5, 3), (120, 9, 15),
          (24, 5, 2), (48, 7, 3)]


@pytest.mark.parametrize("n,a,groups", SHAPES)
@pytest.mark.parametrize("step", [0, 17, 10**9])
def test_kernel_equals_reference(n, a, groups, step):
    q, start, end, duration, u = _case(n, a, groups, seed=n * 31 + a + step % 97)
    k, r = _both(q, torch.tensor(step), start, end, duration, u)
    assert k.dtype == r.dtype == I64 and k.shape == (n,)
    assert torch.equal(k, r)
    assert bool(((k >= 0) & (k < a)).all())


def test_eps_zero_is_argmax_with_ties_lowest_and_nan_first():
    q = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [0.0, float("nan"), 5.0, float("nan")],
                      [-float("inf")] * 4, [1.0, float("inf"), float("inf"), 0.0]])
    n = q.shape[0]
    zero = torch.zeros(1)
    u = torch.rand(1, 2, n)
    for backend in ("triton", "torch"):
        out = epsilon_greedy(q, torch.tensor(5), zero, zero, torch.ones(1), u, backend=backend)
        assert out.tolist() == q.argmax(dim=1).tolist() == [1, 0, 1, 0, 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_argmax_across_column_tiles(dtype, monkeypatch):
    """A wider than one tile (MAX_BLOCK_A patched to 4): the maximum, a tie and a NaN in a later
    tile, a NaN in an earlier tile than a larger value, -inf rows, a larger value only in the
    ragged last tile; ε = 0, so every action is the argmax (torch.argmax's rule)."""
    import foxdqn.ops.epsilon_greedy as eg

    monkeypatch.setattr(eg, "MAX_BLOCK_A", 4)
    nan, inf = float("nan"), float("inf")
    rows = [[0, 1, 2, 3, 4, 5, 9, 7, 8, 1], [5, 1, 2, 3, 5, 5, 1, 1, 1, 5], [0, 1, 2, 3, 4, nan, 9, nan, 1, 1],
            [0, nan, 2, 3, 4, 5, 9, 7, 8, 1], [-inf] * 10, [-inf] * 9 + [1.0], [1, 1, 1, 1, 1, 1, 1, 1, 1, 2],
            [3, 1, 1, 1, 3, 1, 1, 1, 1, 3]]
    q = torch.tensor(rows, dtype=dtype)
    zero, u = torch.zeros(1), torch.rand(1, 2, q.shape[0])
    k, r = _both(q, torch.tensor(5), zero, zero, torch.ones(1), u)
    assert k.tolist() == r.tolist() == q.argmax(dim=1).tolist() == [6, 0, 5, 1, 0, 9, 9, 0]


def test_eps_one_is_the_random_action_of_every_env():
    n, a = 68, 45
    q = torch.randn(n, a)
    u = torch.rand(1, 2, n)
    one = torch.ones(1)
    expected = ((u[0, 1] * 2**24).to(I64) * a) >> 24
    for backend in ("triton", "torch"):
        out = epsilon_greedy(q, torch.tensor(0), one, one, torch.ones(1), u, backend=backend)
        assert torch.equal(out, expected)
    assert len(set(expected.tolist())) > a // 2  # the draws spread over the actions
    top = epsilon_greedy(q, torch.tensor(0), one, one, torch.ones(1), torch.full((1, 2, n), 1.0 - 2.0**-24),
                         backend="triton")
    assert top.tolist() == [a - 1] * n  # the largest uniform gives the last action, never A


def test_schedule_matches_linear_schedule_and_groups_read_their_own_row():
    sched = LinearSchedule(1.0, 0.05, 1000, torch.device("cpu"))
    n = 64
    q = torch.zeros(n, 4)
    q[:, 2] = 1.0  # greedy action 2
    for step in (0, 1, 500, 999, 1000, 5000):
        eps = float(sched(torch.tensor(step)))
        u = torch.full((1, 2, n), 0.0)
        u[0, 0] = torch.linspace(0, 1, n)
        out = epsilon_greedy(q, torch.tensor(step), sched.start.view(1), sched.end.view(1), sched.duration.view(1),
                             u, backend="triton")
        assert torch.equal(out != 2, u[0, 0] < eps)
    # two groups, ε = 1 and ε = 0: the first half explores (action 0 from u = 0), the second is greedy
    start = torch.tensor([1.0, 0.0])
    out = epsilon_greedy(q, torch.tensor(3), start, start.clone(), torch.ones(2), torch.zeros(2, 2, n // 2),
                         backend="triton")
    assert out.tolist() == [0] * (n // 2) + [2] * (n // 2)


def test_linear_value_endpoints_midpoint_and_groups():
    start, end, duration = torch.tensor([1.0, 0.5]), torch.tensor([0.1, 0.5]), torch.tensor([100.0, 10.0])
    for step, want in ((0, [1.0, 0.5]), (50, [0.55, 0.5]), (100, [0.1, 0.5]), (10_000, [0.1, 0.5])):
        got = linear_value(torch.tensor(step), start, end, duration)
        assert got.dtype == torch.float32 and got.shape == (2,)
        torch.testing.assert_close(got, torch.tensor(want))
        assert torch.equal(got, epsilon_schedule_reference(torch.tensor(step), start, end, duration))
        sched = LinearSchedule(1.0, 0.1, 100, torch.device("cpu"))
        assert torch.equal(sched(torch.tensor(step)), got[0])  # 0-d


def test_non_contiguous_q():
    q, start, end, duration, u = _case(50, 6, 2, seed=3)
    qt = q.t().contiguous().t()  # same values, column-major strides
    k, r = _both(qt, torch.tensor(4), start, end, duration, u)
    assert torch.equal(k, r) and torch.equal(k, epsilon_greedy_reference(q, torch.tensor(4), start, end, duration, u))


def test_random_actions_equal_member_randint():
    """A population that passes its members' next 2n uniforms draws what MemberRandom.uniform(n)
    then MemberRandom.randint(A, n) drew."""
    keys = member_keys([0, 7, 123], "cpu")
    n, a = 10, 45
    counter = torch.tensor(40)
    u = member_uniform(keys, counter, 2 * n).view(3, 2, n)
    expected = member_randint(keys, counter + n, n, a)
    one = torch.ones(3)
    out = epsilon_greedy(torch.zeros(3 * n, a), torch.tensor(0), one, one, one, u, backend="triton")
    assert torch.equal(out.view(3, n), expected)
    assert torch.equal(u[:, 0], member_uniform(keys, counter, n))


def test_argument_errors():
    q, start, end, duration, u = _case(8, 3, 2, seed=1)
    with pytest.raises(ValueError, match="q must be"):
        epsilon_greedy(q.half(), torch.tensor(0), start, end, duration, u)
    with pytest.raises(ValueError, match="step must be"):
        epsilon_greedy(q, torch.tensor(0.0), start, end, duration, u)
    with pytest.raises(ValueError, match="duration must be"):
        epsilon_greedy(q, torch.tensor(0), start, end, duration[:1], u)
    with pytest.raises(ValueError, match="do not split"):
        epsilon_greedy(q[:7], torch.tensor(0), start, end, duration, u)
    with pytest.raises(ValueError, match="u must be"):
        epsilon_greedy(q, torch.tensor(0), start, end, duration, u.view(2, 8))
    with pytest.raises(ValueError, match="backend"):
        epsilon_greedy(q, torch.tensor(0), start, end, duration, u, backend="cuda")


@pytest.mark.gpu
def test_gpu_kernel_equals_reference_and_captures():
    from support import capture_graph

    q, start, end, duration, u = _case(4096 * 3, 45, 3, seed=5, device="cuda")
    step = torch.tensor(20, device="cuda")
    k, r = _both(q, step, start, end, duration, u, backend="auto")
    assert torch.equal(k, r)
    graph, out = capture_graph(lambda: epsilon_greedy(q, step, start, end, duration, u))
    step.fill_(10**6)
    graph.replay()
    assert torch.equal(out, epsilon_greedy_reference(q, step, start, end, duration, u))


@pytest.mark.gpu
@pytest.mark.parametrize("a", [1, 2, 100])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gpu_argmax_widths_and_dtypes(a, dtype):
    """The compiled kernel at A = 1, 2 (one tile narrower than 16) and 100 (two tiles of 64), float32
    and float64 q with ties, NaN and -inf planted in some rows: ε = 0, so every action is the argmax."""
    q, start, end, duration, u = _case(1000, a, 1, seed=a, device="cuda")
    q = q.to(dtype)
    q[::7, -1] = float("nan")
    q[3::11] = float("-inf")
    zero = torch.zeros(1, device="cuda")
    k, r = _both(q, torch.tensor(5, device="cuda"), zero, zero, torch.ones(1, device="cuda"), u, backend="auto")
    assert torch.equal(k, r) and torch.equal(k, q.argmax(dim=1))
