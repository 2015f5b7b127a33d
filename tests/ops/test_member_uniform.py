"""member_uniform / member_randint / member_keys: the contract restated with Python ints, Triton
kernel (TRITON_INTERPRET=1 on CPU) vs torch reference bit for bit (odd shapes, counters across
the 32-bit boundary and past it; float64 uniforms, randint with low, the counter advanced by the
op with a ticket), member independence, counter shifts, statistics (shown to catch broken
hashes), randint; GPU: kernel vs reference on CUDA and CUDA-graph capture."""
import pytest
import torch

from foxdqn.ops import backend as B
from foxdqn.ops.member_uniform import (BLOCK, MAX_MEMBERS, member_keys, member_randint, member_uniform,
                                       member_uniform_reference)

from support import capture_graph, no_host_sync, require_compiled_kernels

_need_compiled = require_compiled_kernels(B.INTERPRET)

M32 = 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------
# The contract of the module docstring, in plain Python ints
# ---------------------------------------------------------------------------------------------
def spec_h(x: int) -> int:
    """lowbias32 (Wellons, hash-prospector)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def spec_key(seed: int) -> int:
    s = seed % 2**64
    return spec_h(spec_h((s & M32) ^ 0x9E3779B9) ^ (s >> 32))


def spec_u(key: int, c: int) -> float:
    h = spec_h(spec_h(spec_h(c & M32) ^ key) ^ (c >> 32))
    return (h >> 8) / 2**24


def draw(keys, counter, n, backend):
    return member_uniform(keys, torch.tensor(counter, dtype=torch.int64, device=keys.device), n, backend=backend)


BACKENDS = ["triton", "torch"]
COUNTERS = [0, 2**32 - 5, 2**40]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("counter", COUNTERS + [2**63 - 7])
def test_both_follow_the_contract(backend, counter):
    seeds = [0, 1, 2**40 + 3, -1]
    keys = member_keys(seeds)
    assert keys.tolist() == [spec_key(s) for s in seeds]
    out = draw(keys, counter, 7, backend)
    expect = [[spec_u(spec_key(s), counter + i) for i in range(7)] for s in seeds]
    assert out.dtype == torch.float32 and out.tolist() == expect  # exact: multiples of 2**-24


@pytest.mark.parametrize("P", [1, 3, 7])
@pytest.mark.parametrize("n", [1, 5, 129, 1000])
@pytest.mark.parametrize("counter", COUNTERS)
def test_kernel_equals_reference(P, n, counter):
    keys = member_keys(range(100, 100 + P))
    k, r = draw(keys, counter, n, "triton"), draw(keys, counter, n, "torch")
    assert k.shape == r.shape == (P, n)
    assert torch.equal(k, r)


@pytest.mark.parametrize("P,n", [(300, 5), (130, BLOCK - 1), (64, 64)])
def test_kernel_equals_reference_with_members_sharing_programs(P, n):
    """n < BLOCK: one grid axis over all P·n draws, members' rows starting mid-program."""
    keys = member_keys(range(P))
    k, r = draw(keys, 2**32 - 3, n, "triton"), draw(keys, 2**32 - 3, n, "torch")
    assert torch.equal(k, r)


def test_kernel_equals_reference_over_several_blocks_and_any_int64_key():
    keys = torch.tensor([0, M32, -1, 2**40 + 17, -(2**50)])  # only the low 32 bits count
    k, r = draw(keys, 2**32 - 1000, 2 * BLOCK + 3, "triton"), draw(keys, 2**32 - 1000, 2 * BLOCK + 3, "torch")
    assert torch.equal(k, r)
    assert torch.equal(r, draw(keys & M32, 2**32 - 1000, 2 * BLOCK + 3, "torch"))
    assert not torch.equal(r[0], r[2]) and torch.equal(r[1], r[2])  # -1 & M32 == M32


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_shapes(backend):
    assert draw(member_keys([1, 2]), 5, 0, backend).shape == (2, 0)
    assert draw(member_keys([]), 5, 9, backend).shape == (0, 9)


@pytest.mark.parametrize("backend", BACKENDS)
def test_member_independent_of_population(backend):
    seeds = [11, 0, 7, 2**33, 5]
    pop = draw(member_keys(seeds), 2**32 - 5, 300, backend)
    for p, s in enumerate(seeds):
        assert torch.equal(pop[p], draw(member_keys([s]), 2**32 - 5, 300, backend)[0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("counter", COUNTERS)
def test_counter_shift(backend, counter):
    keys = member_keys([3, 4, 5])
    assert torch.equal(draw(keys, counter, 10, backend)[:, 5:], draw(keys, counter + 5, 5, backend))


def test_the_op_does_not_advance_the_counter():
    keys, counter = member_keys([1]), torch.tensor(42)
    for backend in BACKENDS:
        member_uniform(keys, counter, 10, backend=backend)
    assert int(counter) == 42


# every form of the kernel (float32, float64, randint with low) on odd shapes: both grids (FLAT for
# n < BLOCK, members sharing programs; blocks x members), one program and many
FORMS = [dict(dtype=torch.float32), dict(dtype=torch.float64), dict(high=1), dict(high=6, low=17),
         dict(high=2**24, low=2**40)]
SHAPES = [(1, 1), (3, 5), (300, 5), (7, 129), (2, 2 * BLOCK + 3), (5, 1000)]


def drawn(keys, counter, n, backend, ticket=None, high=None, low=0, dtype=torch.float32):
    if high is None:
        return member_uniform(keys, counter, n, dtype=dtype, ticket=ticket, backend=backend)
    return member_randint(keys, counter, n, high, low=low, ticket=ticket, backend=backend)


@pytest.mark.parametrize("form", FORMS, ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()))
@pytest.mark.parametrize("P,n", SHAPES)
@pytest.mark.parametrize("advance", [False, True], ids=["caller-advances", "ticket"])
def test_every_form_kernel_equals_reference_and_advances_the_counter_with_a_ticket(form, P, n, advance):
    keys = member_keys(range(40, 40 + P))
    out, counters = {}, {}
    for backend in BACKENDS:
        counter = torch.tensor(2**32 - 7)
        ticket = torch.zeros((), dtype=torch.int32) if advance else None
        out[backend] = drawn(keys, counter, n, backend, ticket, **form)
        counters[backend] = int(counter)
        assert ticket is None or int(ticket) == 0  # zero again for the next call
    k, r = out["triton"], out["torch"]
    assert k.shape == (P, n) and k.dtype == r.dtype == form.get("dtype", torch.int64 if "high" in form else None)
    assert torch.equal(k, r)
    assert counters["triton"] == counters["torch"] == 2**32 - 7 + (n if advance else 0)
    u = draw(keys, 2**32 - 7, n, "torch").double()  # the float32 uniforms every form is made of
    if "high" in form:
        assert torch.equal(r, torch.floor(u * form["high"]).long() + form.get("low", 0))
    else:
        assert torch.equal(r.double(), u)


@pytest.mark.parametrize("backend", BACKENDS)
def test_draws_with_a_ticket_follow_each_other_and_members_are_independent_of_p(backend):
    """Two draws with the op advancing the counter are the draws at counter, then counter + n1
    (what the caller's add_ gave), and member p draws what a population of one draws."""
    seeds = [3, 9, 2**33, 0]
    keys, counter, ticket = member_keys(seeds), torch.tensor(11), torch.zeros((), dtype=torch.int32)
    a = member_uniform(keys, counter, 300, ticket=ticket, backend=backend)
    b = member_randint(keys, counter, 7, 45, low=2, ticket=ticket, backend=backend)
    assert int(counter) == 11 + 307
    assert torch.equal(a, draw(keys, 11, 300, backend))
    assert torch.equal(b, member_randint(keys, torch.tensor(311), 7, 45, backend=backend) + 2)
    for p, s in enumerate(seeds):
        one, c1 = member_keys([s]), torch.tensor(11)
        t1 = torch.zeros((), dtype=torch.int32)
        assert torch.equal(member_uniform(one, c1, 300, ticket=t1, backend=backend)[0], a[p])
        assert torch.equal(member_randint(one, c1, 7, 45, low=2, ticket=t1, backend=backend)[0], b[p])


def test_an_empty_draw_with_a_ticket_still_advances_the_counter():
    for backend in BACKENDS:
        counter = torch.tensor(5)
        assert member_uniform(member_keys([]), counter, 9, ticket=torch.zeros((), dtype=torch.int32),
                              backend=backend).shape == (0, 9)
        assert int(counter) == 14


def test_keys_of_seeds_differ():
    keys = member_keys(range(1001))
    assert keys.dtype == torch.int64 and keys.shape == (1001,)
    assert len(set(keys.tolist())) == 1001
    assert int(keys.min()) >= 0 and int(keys.max()) <= M32
    # the high 32 bits count, negative seeds are taken mod 2**64
    assert len(set(member_keys([5, 5 + 2**32, 5 + 2**40, -5, 2**64 - 5]).tolist())) == 4
    assert member_keys([-5]).tolist() == member_keys([2**64 - 5]).tolist()


# ---------------------------------------------------------------------------------------------
# Statistics: loose enough never to flake (fixed keys), tight enough to catch a broken hash
# ---------------------------------------------------------------------------------------------
def stat_failures(u: torch.Tensor) -> list:
    """Names of the failed checks on float ``[P, N]`` draws (N = 10**6 / P); each bound is >= 6
    standard deviations of the statistic for independent uniform draws."""
    u = u.double()
    x = u.flatten()
    n = x.numel()
    fails = []
    if abs(float(x.mean()) - 0.5) > 2e-3:  # sd 2.9e-4
        fails.append("mean")
    if abs(float(x.var()) - 1 / 12) > 5e-4:  # sd 7.5e-5
        fails.append("variance")
    counts = torch.bincount((x * 16).long(), minlength=16).double()
    if float(((counts - n / 16) ** 2 / (n / 16)).sum()) > 60:  # chi2, 15 dof: mean 15, sd 5.5
        fails.append("chi2_16")
    a, b = u[:, :-1].flatten(), u[:, 1:].flatten()  # consecutive draws of one member
    if abs(float(torch.corrcoef(torch.stack([a, b]))[0, 1])) > 6e-3:  # sd 1e-3
        fails.append("lag1")
    pairs = torch.bincount((a * 8).long() * 8 + (b * 8).long(), minlength=64).double()
    m = a.numel() / 64
    if float(((pairs - m) ** 2 / m).sum()) > 140:  # chi2, 63 dof: mean 63, sd 11.2
        fails.append("pairs_8x8")
    if u.shape[0] > 1 and float(torch.corrcoef(u).fill_diagonal_(0).abs().max()) > 0.02:  # sd 2e-3
        fails.append("cross_member")
    return fails


def test_statistics_of_the_draws():
    keys = member_keys([0, 1, 2, 3])
    for counter in (0, 2**32 - 125_000):  # the second one crosses the 32-bit boundary mid-row
        assert stat_failures(draw(keys, counter, 250_000, "torch")) == []


def test_statistics_catch_broken_hashes():
    c = torch.arange(250_000, dtype=torch.int64).expand(4, -1)
    bad = {
        "counter": c & M32,  # h = counter
        "weyl": (c * 0x9E3779B9) & M32,  # uniform marginals, lattice pairs
        "key_ignored": member_uniform_reference(torch.zeros(4, dtype=torch.int64), torch.tensor(0), 250_000),
    }
    for name, h in bad.items():
        u = h if h.dtype == torch.float32 else (h >> 8).float() * 2.0**-24
        assert stat_failures(u) != [], name


def test_streams_of_related_keys_are_not_shifted_or_permuted_copies():
    """With H(key ^ lo) keys k and k ^ d would draw the same value at indices i and i ^ d;
    with H(key + lo) at i and i - d. The contract's hash orders counter before key: neither."""
    n = 1 << 16
    idx = torch.arange(n)
    for k in (0, 12345, 0xDEADBEEF):
        for d in (1, 2, 255, 1 << 10):
            a, b = draw(torch.tensor([k, k ^ d]), 0, n, "torch")
            assert float((a == b[idx ^ d]).double().mean()) < 1e-3, (k, d)
            b2 = draw(torch.tensor([(k + d) & M32]), 0, n, "torch")[0]
            assert float((a[d:] == b2[:-d]).double().mean()) < 1e-3, (k, d)


# ---------------------------------------------------------------------------------------------
# randint
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("high", [1, 2, 6, 1000, 2**24])
def test_randint_is_floor_of_u_times_high(backend, high):
    keys = member_keys([9, 10, 11])
    counter = torch.tensor(2**32 - 5)
    r = member_randint(keys, counter, 200, high, backend=backend)
    u = member_uniform(keys, counter, 200, backend=backend)
    assert r.dtype == torch.int64 and r.shape == (3, 200)
    assert torch.equal(r, torch.floor(u.double() * high).long())  # exact in float64
    assert int(r.min()) >= 0 and int(r.max()) <= high - 1


def test_randint_rough_uniformity_and_top_value():
    r = member_randint(member_keys([1, 2]), torch.tensor(0), 300_000, 6, backend="torch")
    counts = torch.bincount(r.flatten(), minlength=6).double()
    assert counts.numel() == 6
    assert float(((counts - 1e5) ** 2 / 1e5).sum()) < 40  # chi2, 5 dof
    # the largest U, 1 - 2**-24, maps to high - 1 even for high = 2**24
    top = torch.tensor([(1 << 24) - 1], dtype=torch.int64)
    assert int(((top * 2**24) >> 24)[0]) == 2**24 - 1


# ---------------------------------------------------------------------------------------------
# argument checks
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "keys, counter, n, match",
    [
        (torch.zeros(2, 2, dtype=torch.int64), torch.tensor(0), 3, "keys must be"),
        (torch.zeros(3, dtype=torch.int32), torch.tensor(0), 3, "keys must be"),
        (torch.zeros(6, dtype=torch.int64)[::2], torch.tensor(0), 3, "keys must be"),
        (torch.zeros(MAX_MEMBERS + 1, dtype=torch.int64), torch.tensor(0), 3, "at most 65535 members"),
        (torch.zeros(3, dtype=torch.int64), torch.tensor([0]), 3, "counter must be"),
        (torch.zeros(3, dtype=torch.int64), torch.tensor(0, dtype=torch.int32), 3, "counter must be"),
        (torch.zeros(3, dtype=torch.int64), torch.tensor(0), -1, "n must be"),
        (torch.zeros(3, dtype=torch.int64), torch.tensor(0), 2.0, "n must be"),
        (torch.zeros(3, dtype=torch.int64), torch.tensor(0), True, "n must be"),
    ],
)
def test_bad_arguments(keys, counter, n, match):
    with pytest.raises(ValueError, match=match):
        member_uniform(keys, counter, n)


def test_bad_high_seeds_and_backend():
    keys, counter = member_keys([1]), torch.tensor(0)
    for high in (0, 2**24 + 1, 3.0, True):
        with pytest.raises(ValueError, match="member_randint: high must be"):
            member_randint(keys, counter, 4, high)
    for seed in (1.5, True, 2**64, -(2**63) - 1):
        with pytest.raises(ValueError, match="member_keys: seeds must be"):
            member_keys([seed])
    with pytest.raises(ValueError, match="member_uniform: backend must be"):
        member_uniform(keys, counter, 4, backend="cuda")
    for low in (-1, 2**62 + 1, 1.0, True):
        with pytest.raises(ValueError, match="member_randint: low must be"):
            member_randint(keys, counter, 4, 3, low=low)
    with pytest.raises(ValueError, match="member_uniform: dtype must be"):
        member_uniform(keys, counter, 4, dtype=torch.float16)
    for ticket in (torch.zeros(1, dtype=torch.int32), torch.zeros((), dtype=torch.int64), 0):
        with pytest.raises(ValueError, match="member_uniform: ticket must be"):
            member_uniform(keys, counter, 4, ticket=ticket)


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 7, 64])
@pytest.mark.parametrize("n", [1, 5, 129, 1000, 3 * BLOCK + 1])
@pytest.mark.parametrize("counter", COUNTERS)
def test_gpu_kernel_equals_reference(P, n, counter):
    keys = member_keys(range(P), "cuda")
    k = draw(keys, counter, n, "auto")
    assert torch.equal(k, draw(keys, counter, n, "torch"))  # the reference on CUDA
    assert torch.equal(k.cpu(), draw(keys.cpu(), counter, n, "torch"))  # and on CPU


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_gpu_graph_capture_advances_the_counter(backend):
    n = 777
    keys = member_keys([3, 1, 4], "cuda")
    counter = torch.zeros((), dtype=torch.int64, device="cuda")

    def body():
        u = member_uniform(keys, counter, n, backend=backend)
        counter.add_(n)
        return u

    graph, out = capture_graph(body, warmup=2)  # the warm-up advances the counter by 2 n
    counter.zero_()
    seen = []
    for _ in range(2):
        with no_host_sync():
            graph.replay()
        torch.cuda.synchronize()
        seen.append(out.clone())
    assert int(counter) == 2 * n
    assert torch.equal(seen[0], draw(keys, 0, n, "auto"))
    assert torch.equal(seen[1], draw(keys, n, n, "auto"))
    assert not torch.equal(seen[0], seen[1])


@pytest.mark.gpu
@pytest.mark.parametrize("P,n", [(3, 5), (64, 64), (5, 3 * BLOCK + 1), (64, 4096)])
def test_gpu_the_op_advances_the_counter_in_a_captured_graph(P, n):
    """With a ticket the launch advances the counter itself (one kernel): captured, each replay
    draws the next n values per member, the uniforms and the randint, bit for bit the reference's."""
    keys = member_keys(range(P), "cuda")
    counter = torch.zeros((), dtype=torch.int64, device="cuda")
    ticket = torch.zeros((), dtype=torch.int32, device="cuda")

    def body():
        return (member_uniform(keys, counter, n, dtype=torch.float64, ticket=ticket),
                member_randint(keys, counter, n, 45, low=3, ticket=ticket))

    graph, out = capture_graph(body, warmup=2)
    counter.zero_()
    for i in range(3):
        with no_host_sync():
            graph.replay()
        torch.cuda.synchronize()
        assert int(counter) == 2 * n * (i + 1) and int(ticket) == 0
        start = torch.tensor(2 * n * i)
        assert torch.equal(out[0].cpu(), member_uniform(keys.cpu(), start, n, dtype=torch.float64, backend="torch"))
        assert torch.equal(out[1].cpu(), member_randint(keys.cpu(), start + n, n, 45, low=3, backend="torch"))
