"""The member axis of the PER ops (PERState(members=P), foxdqn/ops/per_*.py): P independent sums.

CPU: the Triton kernels in the interpreter against the plain-torch references, both with the member
axis, on odd shapes (P = 3, capacities that are no multiple of the block, batches that are no power
of two, the two-level and chunked searches); and member p of a P-member state against a state
without the member axis holding member p's row alone, which is what makes a population member's
replay that of a population of one: the indices must be equal bit for bit, the weights too (same
backend), and a member's update, insert and skip flag must touch its own row only.
"""
import pytest
import torch

from foxdqn.errors import ConfigError
from foxdqn.ops import per_sample as per_sample_mod
from foxdqn.ops.per_sample import per_sample
from foxdqn.ops.per_state import PERState
from foxdqn.ops.per_update import per_insert, per_insert_row, per_update

BACKENDS = ["triton", "torch"]


def int_priorities(n, gen, zero_frac=0.3, high=5):
    p = torch.randint(1, high, (n,), generator=gen).float()
    p[torch.rand(n, generator=gen) < zero_frac] = 0.0
    return p


def member_state(rows, block, alpha=(0.6, 0.3, 1.0), eps=(1e-6, 1e-2, 0.5)):
    """A P-member state whose member p holds ``rows[p]`` (P = len(rows)), with a different α and
    ε per member."""
    p, cap = len(rows), len(rows[0])
    st = PERState(cap, "cpu", alpha=torch.tensor(alpha[:p]), eps=torch.tensor(eps[:p]), block=block, members=p)
    for m, row in enumerate(rows):
        st.leaves[m, :cap] = torch.as_tensor(row, dtype=torch.float32)
    st.rebuild_block_sums()
    return st


def single_state(st, m):
    """A state without the member axis holding member ``m``'s row, α, ε and max priority."""
    one = PERState(st.capacity, "cpu", alpha=float(st.alpha[m]), eps=float(st.eps[m]), block=st.block)
    one.leaves.copy_(st.leaves[m])
    one.block_sums.copy_(st.block_sums[m])
    one.max_priority.copy_(st.max_priority[m])
    return one


def clone(st):
    new = PERState(st.capacity, st.device, alpha=st.alpha.clone(), eps=st.eps.clone(), block=st.block,
                   members=st.members)
    new.load_state_dict({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in st.state_dict().items()})
    return new


def rows_of(gen, p, cap, **kw):
    rows = [int_priorities(cap, gen, **kw) for _ in range(p)]
    rows[1][: cap // 2] = 0.0  # members differ a lot: a mix-up of rows changes the indices
    rows[-1][cap // 3:] *= 8.0
    return rows


def assert_rows_sample_alone(st, rand, size, beta, backend):
    """per_sample of the P-member state = per_sample of each member's row alone (bit for bit)."""
    idx, w = per_sample(st, rand, size, beta, backend=backend)
    assert idx.shape == rand.shape and w.shape == rand.shape
    for m in range(st.members):
        i1, w1 = per_sample(single_state(st, m), rand[m].contiguous(), size, beta[m], backend=backend)
        assert torch.equal(idx[m], i1), (m, (idx[m] != i1).nonzero().flatten().tolist()[:10])
        assert torch.equal(w[m], w1), m
        assert float(w[m].max()) == 1.0  # normalised by the member's own batch maximum
    return idx, w


@pytest.mark.parametrize("cap,block,size,batch", [(37, 8, 37, 13), (37, 8, 20, 33), (203, 16, 150, 7), (9, 2, 5, 1)])
def test_sample_kernel_matches_reference_and_members_sample_alone(cap, block, size, batch):
    gen = torch.Generator().manual_seed(cap * 7 + batch)
    st = member_state(rows_of(gen, 3, cap), block)
    for beta in ([0.4, 0.0, 1.0], [1.0, 0.7, 0.25]):
        rand = torch.rand(3, batch, generator=gen)
        args = (st, rand, torch.tensor(size), torch.tensor(beta))
        idx, w = assert_rows_sample_alone(*args, backend="triton")
        ref_idx, ref_w = assert_rows_sample_alone(*args, backend="torch")
        assert torch.equal(idx, ref_idx)
        torch.testing.assert_close(w, ref_w, rtol=1e-5, atol=0.0)
        assert ((idx >= 0) & (idx < size)).all()
        for m in range(3):
            assert (st.leaves[m][idx[m]] > 0).all()


@pytest.mark.parametrize("single_max,fine", [(4, 4), (1, 8)])
def test_two_level_search_with_members(monkeypatch, single_max, fine):
    monkeypatch.setattr(per_sample_mod, "_SINGLE_LEVEL_MAX", single_max)
    monkeypatch.setattr(per_sample_mod, "_FINE", fine)
    gen = torch.Generator().manual_seed(single_max + fine)
    st = member_state(rows_of(gen, 3, 83, zero_frac=0.4), 4)  # 21 blocks
    for size in (83, 50, 3):
        rand = torch.rand(3, 97, generator=gen)
        args = (st, rand, torch.tensor(size), torch.tensor([0.6, 0.2, 0.9]))
        idx, w = assert_rows_sample_alone(*args, backend="triton")
        ref_idx, ref_w = per_sample(*args, backend="torch")
        assert torch.equal(idx, ref_idx)
        torch.testing.assert_close(w, ref_w, rtol=1e-5, atol=0.0)


@pytest.mark.parametrize("prefix_chunk,local", [(2, 2), (1, 8), (2, 1)])
def test_chunked_prefix_with_members(monkeypatch, prefix_chunk, local):
    """The chunked path (more blocks than _PREFIX_CHUNK), its chunk and carry scratch per member;
    member 1 all zero (stratified uniform), member 2 one nonzero leaf."""
    monkeypatch.setattr(per_sample_mod, "_PREFIX_CHUNK", prefix_chunk)
    monkeypatch.setattr(per_sample_mod, "_LOCAL", local)
    gen = torch.Generator().manual_seed(prefix_chunk * 10 + local)
    rows = [int_priorities(83, gen, zero_frac=0.4), torch.zeros(83), torch.zeros(83)]
    rows[0][8:40] = 0.0
    rows[2][61] = 3.0
    st = member_state(rows, 4)
    for size in (83, 62, 3):
        rand = torch.rand(3, 29, generator=gen)
        args = (st, rand, torch.tensor(size), torch.tensor([0.6, 0.5, 0.4]))
        idx, w = assert_rows_sample_alone(*args, backend="triton")
        ref_idx, ref_w = per_sample(*args, backend="torch")
        assert torch.equal(idx, ref_idx), (size, (idx != ref_idx).nonzero().tolist()[:10])
        torch.testing.assert_close(w, ref_w, rtol=1e-5, atol=0.0)
        assert (w[1] == 1.0).all()  # all-zero member: uniform, weights 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_update_and_insert_touch_only_their_member(backend):
    """Duplicates, NaN/Inf TD, a skipped member: member p's row after update and insert equals a
    state of its row alone given its items; a skipped member's row is bit-identical; kernel =
    reference."""
    gen = torch.Generator().manual_seed(4)
    cap, block, n = 45, 8, 11
    st = member_state([torch.rand(cap, generator=gen) for _ in range(3)], block)
    st.max_priority.copy_(torch.tensor([1.0, 2.0, 3.0]))
    idx = torch.randint(0, cap, (3, n), generator=gen)
    idx[:, 5:8] = idx[:, :3]  # duplicates within each member
    idx[2] = idx[0]  # and the same slots in two members
    td = torch.randn(3, n, generator=gen) * 4
    td[0, 3], td[2, 4] = float("nan"), float("inf")
    skip = torch.tensor([0.0, 1.0, 0.0])
    before = clone(st)
    per_update(st, idx, td, skip=skip, backend=backend)
    ins = torch.arange(30, 39).expand(3, 9).contiguous()
    per_insert(st, ins, backend=backend)
    assert torch.equal(st.leaves[1][:30], before.leaves[1][:30]) and st.max_priority[1] == 2.0  # skipped member
    for m in range(3):
        one = single_state(before, m)
        per_update(one, idx[m].contiguous(), td[m].contiguous(), skip=skip[m], backend=backend)
        per_insert(one, ins[m].contiguous(), backend=backend)
        assert torch.equal(st.leaves[m], one.leaves), m
        assert torch.equal(st.block_sums[m], one.block_sums), m
        assert torch.equal(st.max_priority[m], one.max_priority), m


@pytest.mark.parametrize("members", [None, 1, 3])
@pytest.mark.parametrize("cap,block,n,row", [(45, 8, 9, 4), (45, 8, 9, 0), (203, 16, 29, 6), (203, 16, 7, 28),
                                             (64, 4, 1, 63), (40, 8, 40, 0), (9, 2, 3, 2)])
def test_insert_row_is_insert_of_the_rows_slots(members, cap, block, n, row):
    """per_insert_row (one kernel) writes the leaves per_insert writes for the slots row·n + e, bit
    for bit, and their block sums up to the f32 sum's order; its reference is per_insert's
    (the same bits). Odd rows and blocks, the range inside one block, over several, at the padded
    end of the capacity, one slot, the whole capacity; member p's max priority and α its own."""
    gen = torch.Generator().manual_seed(cap + n + row)
    p = members or 1
    st = member_state([torch.rand(cap, generator=gen) for _ in range(3)][:p], block)
    st.max_priority.copy_(torch.tensor([1.5, 2.0, 3.0][:p]))
    if members is None:
        st = single_state(st, 0)
    slots = torch.arange(row * n, row * n + n)
    slots = slots if members is None else slots.expand(members, n).contiguous()
    want = clone(st) if members else single_state(member_state([st.leaves[:cap]], block), 0)
    if members is None:
        want.max_priority.copy_(st.max_priority)
    per_insert(want, slots, backend="torch")
    for backend in ("torch", "triton"):
        got = clone(st) if members else single_state(member_state([st.leaves[:cap]], block), 0)
        if members is None:
            got.max_priority.copy_(st.max_priority)
        per_insert_row(got, torch.tensor([row]), n, backend=backend)
        assert torch.equal(got.leaves, want.leaves), backend
        if backend == "torch":
            assert torch.equal(got.block_sums, want.block_sums)
        torch.testing.assert_close(got.block_sums, want.block_sums, rtol=1e-6, atol=0.0)
        exact = got.leaves.view(p, st.num_blocks, block).double().sum(-1).view_as(got.block_sums)
        torch.testing.assert_close(got.block_sums.double(), exact, rtol=1e-6, atol=1e-7)


def test_insert_row_kernel_ignores_slots_outside_the_capacity_and_checks_its_arguments():
    st = member_state([torch.rand(20) for _ in range(2)], 4)
    before = clone(st)
    per_insert_row(st, torch.tensor([5]), 4, backend="triton")  # slots 20..23: padding, never written
    assert torch.equal(st.leaves, before.leaves) and torch.equal(st.block_sums, before.block_sums)
    per_insert_row(st, torch.tensor([3]), 0, backend="triton")  # no slot
    assert torch.equal(st.leaves, before.leaves)
    per_insert_row(st, torch.tensor([4]), 6, backend="triton")  # 24..29: past the padding too
    assert torch.equal(st.leaves, before.leaves) and torch.equal(st.block_sums, before.block_sums)
    with pytest.raises(ValueError, match="row must be"):
        per_insert_row(st, torch.tensor([1, 2]), 4)
    with pytest.raises(ValueError, match="row must be"):
        per_insert_row(st, torch.tensor([1.0]), 4)
    with pytest.raises(ValueError, match="n must be"):
        per_insert_row(st, torch.tensor([1]), -1)
    with pytest.raises(ValueError, match="backend"):
        per_insert_row(st, torch.tensor([1]), 4, backend="cpu")


@pytest.mark.parametrize("n,dup_pool", [(64, 8), (5, 200)])
def test_update_kernel_matches_reference_with_members(n, dup_pool):
    gen = torch.Generator().manual_seed(n)
    st = member_state([torch.rand(37 * 5, generator=gen) for _ in range(3)], 8)
    idx = torch.randint(0, min(dup_pool, st.capacity), (3, n), generator=gen)
    td = torch.randn(3, n, generator=gen) * 3
    a, b = clone(st), clone(st)
    per_update(a, idx, td, skip=torch.tensor([0.0, 0.0, 1.0]), backend="triton")
    per_update(b, idx, td, skip=torch.tensor([0.0, 0.0, 1.0]), backend="torch")
    torch.testing.assert_close(a.leaves, b.leaves, rtol=2e-6, atol=0.0)
    torch.testing.assert_close(a.block_sums, b.block_sums, rtol=2e-6, atol=1e-6)
    assert torch.equal(a.max_priority, b.max_priority)
    assert torch.equal(a.leaves[2], st.leaves[2])
    exact = a.leaves.view(3, a.num_blocks, a.block).double().sum(-1)
    torch.testing.assert_close(a.block_sums.double(), exact, rtol=1e-6, atol=1e-7)


def test_member_state_shapes_parameters_and_errors():
    alpha = torch.tensor([0.5, 0.7])
    st = PERState(10, "cpu", alpha=alpha, eps=1e-3, block=4, members=2)
    assert st.leaves.shape == (2, 12) and st.block_sums.shape == (2, 3) and st.max_priority.shape == (2,)
    assert st.alpha is alpha and st.eps.tolist() == pytest.approx([1e-3, 1e-3]) and st.num_members == 2
    assert PERState(10, "cpu").num_members == 1
    with pytest.raises(ConfigError, match="members"):
        PERState(10, "cpu", members=0)
    with pytest.raises(ConfigError, match="alpha"):
        PERState(10, "cpu", alpha=torch.tensor([0.5, -1.0]), members=2)
    with pytest.raises(ConfigError, match="alpha"):
        PERState(10, "cpu", alpha=torch.tensor([0.5, 0.5, 0.5]), members=2)
    with pytest.raises(ConfigError, match="members"):
        st.load_state_dict(PERState(10, "cpu", block=4).state_dict())
    with pytest.raises(ValueError, match="rand"):
        per_sample(st, torch.zeros(4), torch.tensor(10), torch.tensor([0.5, 0.5]))
    with pytest.raises(ValueError, match="beta"):
        per_sample(st, torch.zeros(2, 4), torch.tensor(10), torch.tensor(0.5))
    with pytest.raises(ValueError, match="indices"):
        per_update(st, torch.zeros(4, dtype=torch.int64), torch.zeros(4))
    with pytest.raises(ValueError, match="skip"):
        per_update(st, torch.zeros(2, 4, dtype=torch.int64), torch.zeros(2, 4), skip=torch.tensor(0.0))
    with pytest.raises(ValueError, match="indices"):
        per_insert(st, torch.zeros(3, 4, dtype=torch.int64))


# ----------------------------------------------------------------------------------------------
# GPU (compiled kernels; not run on the CPU machines)
# ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("cap,batch", [(1_000_000, 512), (10_000_000, 256)])  # 10M: the chunked prefix
def test_gpu_member_kernels_match_reference_and_rows_alone(cap, batch):
    gen = torch.Generator().manual_seed(cap % 991 + batch)
    rows = [int_priorities(cap, gen, zero_frac=0.2) for _ in range(3)]
    rows[1][: cap // 2] = 0.0
    st = PERState(cap, "cuda", alpha=torch.tensor([0.6, 0.3, 1.0], device="cuda"), eps=1e-3, block=1024, members=3)
    for m, row in enumerate(rows):
        st.leaves[m, :cap] = row.cuda()
    st.rebuild_block_sums()
    rand = torch.rand(3, batch, generator=gen).cuda()
    size, beta = torch.tensor(cap - 17, device="cuda"), torch.tensor([0.4, 0.7, 1.0], device="cuda")
    idx, w = per_sample(st, rand, size, beta, backend="triton")
    ref_idx, ref_w = per_sample(st, rand, size, beta, backend="torch")
    assert torch.equal(idx, ref_idx)
    torch.testing.assert_close(w, ref_w, rtol=1e-5, atol=0.0)
    for m in range(3):
        one = PERState(cap, "cuda", alpha=float(st.alpha[m]), eps=1e-3, block=1024)
        one.leaves.copy_(st.leaves[m])
        one.block_sums.copy_(st.block_sums[m])
        i1, w1 = per_sample(one, rand[m].contiguous(), size, beta[m], backend="triton")
        assert torch.equal(idx[m], i1) and torch.equal(w[m], w1)
    td = torch.rand(3, batch, generator=gen).cuda() * 3
    skip = torch.tensor([0.0, 1.0, 0.0], device="cuda")
    a, b = clone(st), clone(st)
    per_update(a, idx, td, skip=skip, backend="triton")
    per_update(b, idx, td, skip=skip, backend="torch")
    torch.testing.assert_close(a.leaves, b.leaves, rtol=2e-6, atol=0.0)
    torch.testing.assert_close(a.block_sums, b.block_sums, rtol=1e-5, atol=1e-4)
    assert torch.equal(a.max_priority, b.max_priority) and torch.equal(a.leaves[1], st.leaves[1])

