"""Proportional prioritized replay ops: per_sample, per_update, per_insert (foxdqn/ops/per_*.py).

CPU: kernels in the Triton interpreter (backend="triton") against the plain-torch references
(backend="torch") and hand-computed cases. Priorities used for exact index comparisons are small
integers, so every f32/f64 sum is exact and the sampled intervals are identical in both.
GPU (marked): CUDA kernels vs reference at 1M and 10M slots, sample+update inside one CUDA
graph, sync-debug mode "error", torch.compile.
"""
import math
import os

import pytest
import torch

from foxdqn.errors import ConfigError
from foxdqn.ops import per_sample as per_sample_mod
from foxdqn.ops.library import register_ops
from foxdqn.ops.per_sample import per_sample, per_sample_reference
from foxdqn.ops.per_state import PERState
from foxdqn.ops.per_update import per_insert, per_update, per_update_reference

from support import capture_graph, no_host_sync

BACKENDS = ["triton", "torch"]
ONE_MINUS = 0.99999994


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------
def assert_close_report(actual, expected, rtol=1e-6, atol=0.0, what="tensor"):
    """assert_close that reports NaN/Inf mismatches separately from value mismatches."""
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    nan_mismatch = torch.isnan(a) != torch.isnan(e)
    assert not nan_mismatch.any(), f"{what}: NaN at different positions: {nan_mismatch.nonzero().flatten().tolist()[:10]}"
    inf_a, inf_e = torch.isinf(a), torch.isinf(e)
    inf_mismatch = (inf_a != inf_e) | (inf_a & inf_e & (a.sign() != e.sign()))
    assert not inf_mismatch.any(), f"{what}: Inf at different positions: {inf_mismatch.nonzero().flatten().tolist()[:10]}"
    fin = torch.isfinite(a) & torch.isfinite(e)
    torch.testing.assert_close(a[fin], e[fin], rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def make_state(leaves, block, capacity=None, device="cpu", alpha=0.6, eps=1e-6):
    leaves = torch.as_tensor(leaves, dtype=torch.float32)
    capacity = capacity or leaves.numel()
    st = PERState(capacity, device, alpha=alpha, eps=eps, block=block)
    st.leaves[: leaves.numel()] = leaves.to(device)
    st.rebuild_block_sums()
    return st


def clone_state(st):
    new = PERState(st.capacity, st.device, block=st.block)
    new.load_state_dict({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in st.state_dict().items()})
    return new


def state_tensors(st):
    return [t.clone() for t in (st.leaves, st.block_sums, st.max_priority)]


def int_priorities(n, gen, zero_frac=0.3, high=5, device="cpu"):
    p = torch.randint(1, high, (n,), generator=gen).float()
    p[torch.rand(n, generator=gen) < zero_frac] = 0.0
    return p.to(device)


def scalar(v, dtype=torch.float32, device="cpu"):
    return torch.tensor(v, dtype=dtype, device=device)


# ----------------------------------------------------------------------------------------------
# sampling: distribution, golden weights, edge rules
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("size", [37, 29])
def test_distribution_matches_priorities(backend, size):
    """Chi-square of sampled counts against P(i) = p_i^a / sum p^a over [0, size)."""
    gen = torch.Generator().manual_seed(1234)
    cap, block = 37, 8  # 5 blocks, the last one partial
    leaves = torch.rand(cap, generator=gen) * 2.0 + 0.05
    leaves[[0, 5, 20, 36]] = 0.0
    leaves[8:16] = 0.0  # a whole zero-mass block
    st = make_state(leaves, block)
    lv = st.leaves[:cap].double().clone()
    lv[size:] = 0.0
    prob = lv / lv.sum()
    counts = torch.zeros(cap, dtype=torch.float64)
    n_calls, batch = 8, 2048
    for _ in range(n_calls):
        rand = torch.rand(batch, generator=gen)
        idx, _ = per_sample(st, rand, scalar(size, torch.int64), scalar(0.4), backend=backend)
        counts += torch.bincount(idx, minlength=cap).double()
    n = n_calls * batch
    assert counts[prob == 0].sum() == 0, "zero-priority or out-of-range slot sampled"
    nz = prob > 0
    exp = n * prob[nz]
    chi2 = float(((counts[nz] - exp) ** 2 / exp).sum())
    df = int(nz.sum()) - 1
    # stratified sampling has less variance than multinomial: df + 6 sd is a loose bound
    assert chi2 < df + 6 * math.sqrt(2 * df), f"chi2={chi2:.1f} df={df}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_golden(backend):
    # leaves [1, 2, 4, 8], total 15, B = 4, rand 0: targets 0, 3.75, 7.5, 11.25 -> slots 0, 2, 3, 3
    st = make_state([1.0, 2.0, 4.0, 8.0], block=2)
    idx, w = per_sample(st, torch.zeros(4), scalar(4, torch.int64), scalar(0.5), backend=backend)
    assert idx.tolist() == [0, 2, 3, 3]
    # w = (4 * leaf / 15)^-0.5 / max = (leaf / 1)^-0.5
    assert_close_report(w, torch.tensor([1.0, 0.5, 8 ** -0.5, 8 ** -0.5]), rtol=1e-6, what="weights")
    # size 3: total 7; rand 0.5, B = 2: targets 1.75, 5.25 -> slots 1, 2; beta 1: w = (leaf/2)^-1
    idx, w = per_sample(st, torch.full((2,), 0.5), scalar(3, torch.int64), scalar(1.0), backend=backend)
    assert idx.tolist() == [1, 2]
    assert_close_report(w, torch.tensor([1.0, 0.5]), rtol=1e-6, what="weights size 3")


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_priorities_never_sampled(backend):
    gen = torch.Generator().manual_seed(7)
    cap, block = 61, 8
    leaves = int_priorities(cap, gen, zero_frac=0.6)
    leaves[[0, 1, 59, 60]] = 0.0
    leaves[16:32] = 0.0
    leaves[2] = 3.0
    st = make_state(leaves, block)
    rand = torch.rand(509, generator=gen)
    rand[:6] = torch.tensor([0.0, ONE_MINUS, 1.0, float("nan"), -0.5, 2.0])  # clamped to [0, 1)
    idx, w = per_sample(st, rand, scalar(cap, torch.int64), scalar(0.7), backend=backend)
    assert (st.leaves[idx] > 0).all()
    assert ((idx >= 0) & (idx < cap)).all()
    assert torch.isfinite(w).all() and (w > 0).all() and (w <= 1).all()
    assert float(w.max()) == 1.0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batch", [1, 64, 100])
def test_all_equal_priorities(backend, batch):
    cap, block, size = 50, 8, 45
    st = make_state(torch.full((cap,), 0.75), block)
    rand = torch.rand(batch, generator=torch.Generator().manual_seed(batch))
    idx, w = per_sample(st, rand, scalar(size, torch.int64), scalar(0.9), backend=backend)
    assert (w == 1.0).all(), "equal priorities must give weights exactly 1"
    assert ((idx >= 0) & (idx < size)).all()
    # equal masses: stratum k holds slot floor((k + u) / B * size)
    x = (torch.arange(batch, dtype=torch.float64) + rand.double()) / batch
    assert torch.equal(idx, (x * size).floor().long())


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_zero_is_stratified_uniform(backend):
    cap, block, size, batch = 37, 8, 30, 64
    st = make_state(torch.zeros(cap), block)
    st.leaves[33] = 5.0  # beyond size: must not count
    st.rebuild_block_sums()
    rand = torch.rand(batch, generator=torch.Generator().manual_seed(3))
    idx, w = per_sample(st, rand, scalar(size, torch.int64), scalar(0.5), backend=backend)
    x = (torch.arange(batch, dtype=torch.float64) + rand.double()) / batch
    assert torch.equal(idx, torch.clamp((x * size).floor().long(), max=size - 1))
    assert (w == 1.0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("size", [1, 9, 17, 24])
def test_size_below_capacity(backend, size):
    gen = torch.Generator().manual_seed(size)
    cap, block = 40, 8
    leaves = int_priorities(cap, gen, zero_frac=0.2)
    leaves[size:] = 4.0  # stale high priorities above size (must be ignored)
    leaves[0] = 1.0
    st = make_state(leaves, block)
    rand = torch.rand(257, generator=gen)
    idx, w = per_sample(st, rand, scalar(size, torch.int64), scalar(0.5), backend=backend)
    assert (idx < size).all() and (idx >= 0).all()
    ref_idx, ref_w = per_sample_reference(st, rand, scalar(size, torch.int64), scalar(0.5))
    assert torch.equal(idx, ref_idx)
    assert_close_report(w, ref_w, rtol=1e-5, what="weights")


@pytest.mark.parametrize(
    "cap,block,size,batch",
    [(37, 8, 37, 64), (37, 8, 20, 33), (1000, 16, 999, 257), (64, 64, 64, 7), (100, 2, 77, 129), (8200, 8, 8191, 64)],
)
def test_kernel_matches_reference_indices(cap, block, size, batch):
    """Same rand -> same indices (integer priorities: exact sums); the last case has 1025 blocks
    and takes the two-level block search."""
    gen = torch.Generator().manual_seed(cap + batch)
    st = make_state(int_priorities(cap, gen), block)
    for beta in (0.0, 0.4, 1.0):
        rand = torch.rand(batch, generator=gen)
        args = (st, rand, scalar(size, torch.int64), scalar(beta))
        idx, w = per_sample(*args, backend="triton")
        ref_idx, ref_w = per_sample(*args, backend="torch")
        assert torch.equal(idx, ref_idx), f"beta={beta}: {(idx != ref_idx).nonzero().flatten().tolist()[:10]}"
        assert_close_report(w, ref_w, rtol=1e-5, what=f"weights beta={beta}")


@pytest.mark.parametrize("single_max,fine", [(4, 4), (2, 2), (1, 8)])
def test_two_level_search_matches_reference(monkeypatch, single_max, fine):
    monkeypatch.setattr(per_sample_mod, "_SINGLE_LEVEL_MAX", single_max)
    monkeypatch.setattr(per_sample_mod, "_FINE", fine)
    gen = torch.Generator().manual_seed(single_max * 10 + fine)
    cap, block = 83, 4  # 21 blocks
    leaves = int_priorities(cap, gen, zero_frac=0.4)
    leaves[8:20] = 0.0
    st = make_state(leaves, block)
    for size in (83, 50, 3):
        rand = torch.rand(97, generator=gen)
        args = (st, rand, scalar(size, torch.int64), scalar(0.6))
        idx, w = per_sample(*args, backend="triton")
        ref_idx, ref_w = per_sample(*args, backend="torch")
        assert torch.equal(idx, ref_idx)
        assert_close_report(w, ref_w, rtol=1e-5, what="weights")


@pytest.mark.parametrize("prefix_chunk,local", [(2, 2), (4, 4), (1, 8), (2, 1)])
def test_chunked_prefix_matches_reference(monkeypatch, prefix_chunk, local):
    """Above _PREFIX_CHUNK blocks the prefix runs in chunks of _LOCAL blocks (one program each) and
    the search goes chunk -> block -> slot: the same indices as the reference, with zero-mass
    chunks and blocks, size inside a chunk, a single nonzero leaf, all zero."""
    monkeypatch.setattr(per_sample_mod, "_PREFIX_CHUNK", prefix_chunk)
    monkeypatch.setattr(per_sample_mod, "_LOCAL", local)
    gen = torch.Generator().manual_seed(prefix_chunk * 10 + local)
    cap, block = 83, 4  # 21 blocks
    cases = [int_priorities(cap, gen, zero_frac=0.4), torch.zeros(cap), torch.zeros(cap)]
    cases[0][8:40] = 0.0  # whole zero-mass chunks (and blocks)
    cases[1][61] = 3.0  # one nonzero leaf
    for leaves in cases:
        st = make_state(leaves, block)
        for size in (83, 50, 62, 3):
            rand = torch.rand(97, generator=gen)
            args = (st, rand, scalar(size, torch.int64), scalar(0.6))
            idx, w = per_sample(*args, backend="triton")
            ref_idx, ref_w = per_sample(*args, backend="torch")
            assert torch.equal(idx, ref_idx), (size, (idx != ref_idx).nonzero().flatten().tolist()[:10])
            assert_close_report(w, ref_w, rtol=1e-5, what="weights")


def test_chunked_clamps_a_target_past_its_chunk_to_the_last_block_with_mass(monkeypatch):
    """A block sum larger than its leaves (f32 rounding) pushes targets past the chunk's last
    nonzero leaf: they land on that leaf, never on a zero slot or another chunk's."""
    monkeypatch.setattr(per_sample_mod, "_PREFIX_CHUNK", 1)
    monkeypatch.setattr(per_sample_mod, "_LOCAL", 2)
    st = make_state([1.0, 1.0, 0, 0, 0, 0, 0, 0, 2.0, 0, 0, 0, 0, 0, 0, 0], 4)  # chunks {0,1}, {2,3}
    st.block_sums[0] = 10.0  # chunk 0 holds 2 in its leaves, 10 in its sums
    for r in (0.3, 0.5, 0.7, ONE_MINUS):  # targets 3.6, 6, 8.4, ~12 of a total of 12
        idx, _ = per_sample(st, torch.tensor([r]), scalar(16, torch.int64), scalar(0.5), backend="triton")
        assert idx.item() == (1 if r * 12.0 < 10.0 else 8)


def test_chunked_search_clamps_a_target_past_the_local_prefix_to_the_chunk():
    """Rounding between a chunk's carry and its local prefix can put t' past every local entry:
    the search keeps the chunk's last block with mass (here the carry says 10, the local prefix 4),
    never a block of the next chunk."""
    leaves = torch.tensor([1.0, 3.0, 0, 0, 0, 0, 0, 0, 5.0, 0, 0, 0, 0, 0, 0, 0])
    local = torch.tensor([4.0, 4.0, 5.0, 5.0], dtype=torch.float64)  # chunks {0, 1}, {2, 3}
    carry = torch.tensor([10.0, 15.0], dtype=torch.float64)
    chunk_last = torch.tensor([0, 2])
    total, last = torch.tensor([15.0], dtype=torch.float64), torch.tensor([8])
    rand = torch.tensor([0.5])  # target 7.5: chunk 0, t' = 7.5 > 4
    idx, logw = torch.empty(1, dtype=torch.int64), torch.empty(1)
    per_sample_mod._per_chunk_search_kernel[(1,)](
        leaves, local, carry, chunk_last, total, last, rand, scalar(16, torch.int64), scalar(0.5), idx, logw, 1, 2,
        NUM_BLOCKS=4, BLOCK=4, CAPACITY=16, ITEMS=1, G_P2=2, LOCAL=2)
    assert idx.item() == 1


def test_clamp_beyond_last_nonzero_leaf_of_block():
    """Targets past the last nonzero leaf of their block (block sum larger than its leaves, as
    f32 rounding can make it) are clamped to that leaf, never to a zero slot."""
    cap, block = 16, 8
    st = make_state([1.0, 1.0, 1.0, 0, 0, 0, 0, 0, 2.0, 0, 0, 0, 0, 0, 0, 0], block)
    st.block_sums[0] = 10.0  # leaves hold 3: targets in [3, 10) overshoot inside block 0
    rand = torch.tensor([0.3, 0.5, 0.7, ONE_MINUS])  # B=1 each -> targets 3.6, 6, 8.4, ~12
    for r in rand:
        idx, _ = per_sample(st, r.reshape(1), scalar(cap, torch.int64), scalar(0.5), backend="triton")
        expected = 2 if float(r) * 12.0 < 10.0 else 8
        assert idx.item() == expected


@pytest.mark.parametrize("backend", BACKENDS)
def test_size_zero_and_oversize_are_clamped(backend):
    st = make_state([0.0, 2.0, 1.0, 1.0], block=2)
    idx, w = per_sample(st, torch.full((3,), 0.5), scalar(0, torch.int64), scalar(0.5), backend=backend)
    assert idx.tolist() == [0, 0, 0] and (w == 1).all()  # size clamped to 1; all-zero -> uniform over [0, 1)
    idx, _ = per_sample(st, torch.full((3,), 0.5), scalar(99, torch.int64), scalar(0.5), backend=backend)
    assert ((idx >= 1) & (idx < 4)).all()


def test_empty_batch():
    st = make_state([1.0, 2.0], block=2)
    for backend in BACKENDS:
        idx, w = per_sample(st, torch.zeros(0), scalar(2, torch.int64), scalar(0.5), backend=backend)
        assert idx.shape == (0,) and w.shape == (0,)
        per_update(st, torch.zeros(0, dtype=torch.int64), torch.zeros(0), backend=backend)
        per_insert(st, torch.zeros(0, dtype=torch.int64), backend=backend)


# ----------------------------------------------------------------------------------------------
# update / insert
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_update_duplicates_golden(backend):
    st = PERState(37, "cpu", alpha=0.5, eps=0.25, block=8)
    idx = torch.tensor([3, 1, 3, 3, 0, 36, 1])
    td = torch.tensor([0.5, 2.0, 3.75, -1.0, 0.0, 4.0, -7.75])
    per_update(st, idx, td, backend=backend)
    # raw priorities |td| + 0.25: slot3 max(0.75, 4, 1.25) = 4; slot1 max(2.25, 8) = 8; slot0 0.25; slot36 4.25
    expected = torch.zeros(st.capacity_padded)
    expected[[0, 1, 3, 36]] = torch.tensor([0.25, 8.0, 4.0, 4.25]).sqrt()
    assert_close_report(st.leaves, expected, rtol=1e-6, what="leaves")
    exp_sums = expected.view(st.num_blocks, st.block).double().sum(1)
    assert_close_report(st.block_sums, exp_sums, rtol=1e-6, what="block sums")
    assert st.max_priority.item() == 8.0


@pytest.mark.parametrize("n,dup_pool", [(64, 8), (300, 37), (5, 200)])
def test_update_duplicates_kernel_matches_reference(n, dup_pool):
    gen = torch.Generator().manual_seed(n)
    st = make_state(torch.rand(37 * 5, generator=gen), block=8, alpha=0.7, eps=1e-3)
    idx = torch.randint(0, min(dup_pool, st.capacity), (n,), generator=gen)
    td = torch.randn(n, generator=gen) * 3
    a, b = clone_state(st), clone_state(st)
    per_update(a, idx, td, backend="triton")
    per_update(b, idx, td, backend="torch")
    assert_close_report(a.leaves, b.leaves, rtol=2e-6, what="leaves")
    assert_close_report(a.block_sums, b.block_sums, rtol=2e-6, atol=1e-6, what="block sums")
    assert torch.equal(a.max_priority, b.max_priority)
    # order independence: any permutation of the batch gives the bit-identical kernel state
    perm = torch.randperm(n, generator=gen)
    c = clone_state(st)
    per_update(c, idx[perm], td[perm], backend="triton")
    assert torch.equal(c.leaves, a.leaves) and torch.equal(c.max_priority, a.max_priority)
    assert_close_report(c.block_sums, a.block_sums, rtol=2e-6, atol=1e-6, what="block sums (permuted)")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("skip_value", [1.0, float("nan"), 0.0])
def test_skip_flag(backend, skip_value):
    gen = torch.Generator().manual_seed(11)
    st = make_state(torch.rand(45, generator=gen), block=8)
    before = state_tensors(st)
    idx = torch.tensor([0, 9, 9, 44, 20])
    td = torch.tensor([5.0, 1.0, 7.0, 0.1, float("nan")])
    per_update(st, idx, td, skip=torch.tensor(skip_value), backend=backend)
    after = state_tensors(st)
    if skip_value == 0.0:
        assert not torch.equal(after[0], before[0]) and after[2].item() > before[2].item()
    else:
        for x, y, name in zip(after, before, ("leaves", "block_sums", "max_priority")):
            assert torch.equal(x, y), f"{name} changed under skip={skip_value}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_sums_exact_after_random_updates(backend):
    gen = torch.Generator().manual_seed(5)
    st = PERState(203, "cpu", alpha=0.6, eps=1e-2, block=16)
    per_insert(st, torch.arange(150), backend=backend)
    for step in range(6):
        idx = torch.randint(0, 203, (97,), generator=gen)
        if step % 2:
            idx = idx.sort().values
        per_update(st, idx, torch.randn(97, generator=gen).abs() * 4, backend=backend)
        per_insert(st, torch.arange(150 + step * 8, 158 + step * 8) % 203, backend=backend)
        exact = st.leaves.view(st.num_blocks, st.block).double().sum(1)
        assert_close_report(st.block_sums, exact, rtol=1e-6, atol=1e-7, what=f"block sums step {step}")
    assert (st.leaves[203:] == 0).all(), "padding leaves must stay 0"


@pytest.mark.parametrize("backend", BACKENDS)
def test_insert_uses_max_priority(backend):
    st = PERState(20, "cpu", alpha=0.5, eps=0.0, block=4)
    per_insert(st, torch.tensor([0, 1, 2, 2]), backend=backend)
    assert st.leaves[:3].tolist() == [1.0, 1.0, 1.0] and st.block_sums[0].item() == 3.0
    per_update(st, torch.tensor([1]), torch.tensor([16.0]), backend=backend)  # max -> 16, leaf 4
    per_insert(st, torch.tensor([5, 19]), backend=backend)
    assert st.max_priority.item() == 16.0
    assert_close_report(st.leaves[[1, 5, 19]], torch.tensor([4.0, 4.0, 4.0]), rtol=1e-6, what="inserted leaves")
    assert_close_report(st.block_sums, torch.tensor([6.0, 4.0, 0.0, 0.0, 4.0]), rtol=1e-6, what="block sums")


@pytest.mark.parametrize("backend", BACKENDS)
def test_nonfinite_td_uses_previous_max(backend):
    st = PERState(16, "cpu", alpha=1.0, eps=0.0, block=4)
    st.max_priority.fill_(2.0)
    idx = torch.tensor([0, 1, 2, 2])
    td = torch.tensor([float("nan"), float("inf"), 3.0, float("-inf")])
    per_update(st, idx, td, backend=backend)
    # NaN/Inf -> max_priority read before the update (2); slot 2: max(3, 2) = 3; max -> 3
    assert_close_report(st.leaves[:3], torch.tensor([2.0, 2.0, 3.0]), rtol=1e-6, what="leaves")
    assert st.max_priority.item() == 3.0
    assert torch.isfinite(st.block_sums).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_alpha_and_eps_are_live_tensors(backend):
    st = PERState(8, "cpu", alpha=0.5, eps=0.0, block=4)
    per_update(st, torch.tensor([0]), torch.tensor([4.0]), backend=backend)
    st.alpha.fill_(1.0)
    st.eps.fill_(1.0)
    per_update(st, torch.tensor([1]), torch.tensor([4.0]), backend=backend)
    st.alpha.fill_(0.0)
    per_update(st, torch.tensor([2]), torch.tensor([0.0]), backend=backend)
    assert_close_report(st.leaves[:3], torch.tensor([2.0, 5.0, 1.0]), rtol=1e-6, what="leaves")


# ----------------------------------------------------------------------------------------------
# API
# ----------------------------------------------------------------------------------------------
def test_validation_errors():
    with pytest.raises(ConfigError):
        PERState(100, "cpu", block=100)
    with pytest.raises(ConfigError):
        PERState(0, "cpu")
    with pytest.raises(ConfigError):
        PERState(10, "cpu", alpha=-1.0)
    st = PERState(10, "cpu", block=4)
    with pytest.raises(ValueError):
        per_sample(st, torch.zeros(4, dtype=torch.float64), scalar(10, torch.int64), scalar(0.5))
    with pytest.raises(ValueError):
        per_sample(st, torch.zeros(4), 10, scalar(0.5))
    with pytest.raises(ValueError):
        per_sample(st, torch.zeros(4), scalar(10, torch.int64), 0.5)
    with pytest.raises(ValueError):
        per_sample(st, torch.zeros(4), scalar(10, torch.int64), scalar(0.5), backend="cuda")
    with pytest.raises(ValueError):
        per_update(st, torch.zeros(3, dtype=torch.int64), torch.zeros(4))
    with pytest.raises(ValueError):
        per_update(st, torch.zeros(3, dtype=torch.int64), torch.zeros(3), skip=1.0)
    with pytest.raises(ValueError):
        per_insert(st, torch.zeros(3))


def test_ops_registered_and_schema():
    register_ops()  # torch.library registration, made for torch.compile / opcheck only
    assert hasattr(torch.ops.foxdqn, "per_sample")
    assert hasattr(torch.ops.foxdqn, "per_update")
    assert hasattr(torch.ops.foxdqn, "per_insert")
    st = make_state([1.0, 2.0, 0.0, 4.0, 1.0], block=4)
    args = (st.leaves, st.block_sums, torch.rand(6), scalar(5, torch.int64), scalar(0.5), st.block, st.capacity)
    torch.library.opcheck(torch.ops.foxdqn.per_sample.default, args, test_utils=("test_schema",))
    upd = (st.leaves.clone(), st.block_sums.clone(), st.max_priority.clone(), torch.tensor([0, 3, 3]),
           torch.tensor([1.0, 2.0, 0.5]), st.alpha, st.eps, scalar(0.0), st.block, st.capacity)
    torch.library.opcheck(torch.ops.foxdqn.per_update.default, upd, test_utils=("test_schema",))
    ins = (st.leaves.clone(), st.block_sums.clone(), st.max_priority, st.alpha, torch.tensor([2]), st.block,
           st.capacity)
    torch.library.opcheck(torch.ops.foxdqn.per_insert.default, ins, test_utils=("test_schema",))


# ----------------------------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------------------------
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
needs_compiled_triton = pytest.mark.skipif(
    _INTERPRET and torch.cuda.is_available(), reason="TRITON_INTERPRET=1 runs kernels on the host: run GPU tests with TRITON_INTERPRET=0"
)


def _gpu_state(cap, seed, block=1024):
    gen = torch.Generator().manual_seed(seed)
    st = PERState(cap, "cuda", alpha=0.6, eps=1e-3, block=block)
    st.leaves[:cap] = int_priorities(cap, gen, zero_frac=0.2).cuda()
    st.rebuild_block_sums()
    return st, gen


@pytest.mark.gpu
@needs_compiled_triton
@pytest.mark.parametrize("cap,batch", [(1_000_000, 512), (1_000_000, 4096), (10_000_000, 512), (10_000_000, 4096),
                                       (100_000_000, 256)])  # 10M and 100M: the chunked prefix
def test_gpu_kernel_matches_reference(cap, batch):
    st, gen = _gpu_state(cap, seed=cap % 997 + batch)
    for size in (cap, cap // 3 + 17):
        rand = torch.rand(batch, generator=gen).cuda()
        args = (st, rand, scalar(size, torch.int64, "cuda"), scalar(0.4, device="cuda"))
        idx, w = per_sample(*args, backend="triton")
        ref_idx, ref_w = per_sample(*args, backend="torch")
        assert torch.equal(idx, ref_idx), f"size={size}: {(idx != ref_idx).sum().item()} index mismatches"
        assert_close_report(w, ref_w, rtol=1e-5, what="weights")
        assert (st.leaves[idx] > 0).all() and (idx < size).all()
    # update with duplicates
    idx = torch.randint(0, cap, (batch,), generator=gen)
    idx[batch // 2:] = idx[: batch - batch // 2]  # every index twice
    td = (torch.randn(batch, generator=gen) * 2)
    a, b = clone_state(st), clone_state(st)
    per_update(a, idx.cuda(), td.cuda(), backend="triton")
    per_update(b, idx.cuda(), td.cuda(), backend="torch")
    assert_close_report(a.leaves, b.leaves, rtol=2e-6, what="leaves")
    assert_close_report(a.block_sums, b.block_sums, rtol=1e-5, atol=1e-4, what="block sums")
    assert torch.equal(a.max_priority, b.max_priority)
    exact = a.leaves.view(a.num_blocks, a.block).double().sum(1)
    assert_close_report(a.block_sums, exact, rtol=1e-5, atol=1e-4, what="block sums vs exact")


def _sample_update(st, rand, size, beta, td_scale, skip):
    idx, w = per_sample(st, rand, size, beta, backend="triton")
    per_update(st, idx, (td_scale * w).abs() + idx.float() * 1e-7, skip=skip, backend="triton")
    return idx, w


@pytest.mark.gpu
@needs_compiled_triton
@pytest.mark.parametrize("cap", [1_000_000, 10_000_000])
def test_gpu_cuda_graph_capture_replay(cap):
    batch = 512
    st, gen = _gpu_state(cap, seed=3)
    init = clone_state(st)
    size = scalar(cap - 5, torch.int64, "cuda")
    beta = scalar(0.5, device="cuda")
    skip = scalar(0.0, device="cuda")
    td_scale = scalar(3.0, device="cuda")
    rands = [torch.rand(batch, generator=gen).cuda() for _ in range(3)]

    # eager run from the initial state
    eager = clone_state(init)
    eager_out = [_sample_update(eager, r, size, beta, td_scale, skip) for r in rands]

    # graph: warm up on a side stream, restore the state, capture, replay
    static_rand = rands[0].clone()
    graph, (g_idx, g_w) = capture_graph(lambda: _sample_update(st, static_rand, size, beta, td_scale, skip), warmup=2)
    st.load_state_dict(init.state_dict())
    for r, (e_idx, e_w) in zip(rands, eager_out):
        static_rand.copy_(r)
        graph.replay()
        assert torch.equal(g_idx, e_idx)
        assert torch.equal(g_w, e_w)
    torch.cuda.synchronize()
    assert torch.equal(st.leaves, eager.leaves)
    assert torch.equal(st.block_sums, eager.block_sums)
    assert torch.equal(st.max_priority, eager.max_priority)
    # skip flag inside the graph: nothing changes
    before = state_tensors(st)
    skip.fill_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    for x, y in zip(state_tensors(st), before):
        assert torch.equal(x, y)


@pytest.mark.gpu
@needs_compiled_triton
def test_gpu_no_host_sync():
    st, gen = _gpu_state(1_000_000, seed=9)
    size = scalar(999_000, torch.int64, "cuda")
    beta = scalar(0.5, device="cuda")
    skip = scalar(0.0, device="cuda")
    rand = torch.rand(512, generator=gen).cuda()
    ins = torch.arange(4096, device="cuda")
    td = torch.rand(512, device="cuda")
    for _ in range(2):  # warm-up: JIT compilation may sync
        per_insert(st, ins)
        idx, w = per_sample(st, rand, size, beta)
        per_update(st, idx, td, skip=skip)
    torch.cuda.synchronize()
    with no_host_sync():
        for _ in range(3):
            per_insert(st, ins)
            idx, w = per_sample(st, rand, size, beta)
            per_update(st, idx, td, skip=skip)
            per_update(st, idx, td)
    torch.cuda.synchronize()


@pytest.mark.gpu
@needs_compiled_triton
def test_gpu_torch_compile():
    register_ops()  # torch.library registration, made for torch.compile / opcheck only
    st, gen = _gpu_state(1_000_000, seed=21)
    init = clone_state(st)
    size = scalar(1_000_000, torch.int64, "cuda")
    beta = scalar(0.5, device="cuda")
    skip = scalar(0.0, device="cuda")
    td_scale = scalar(2.0, device="cuda")
    rand = torch.rand(512, generator=gen).cuda()

    def step(leaves, block_sums, max_priority, rand):
        idx, w = torch.ops.foxdqn.per_sample(leaves, block_sums, rand, size, beta, st.block, st.capacity)
        torch.ops.foxdqn.per_update(leaves, block_sums, max_priority, idx, (td_scale * w).abs(), st.alpha,
                                    st.eps, skip, st.block, st.capacity)
        return idx, w

    compiled = torch.compile(step, fullgraph=True)
    c_idx, c_w = compiled(st.leaves, st.block_sums, st.max_priority, rand)
    e = clone_state(init)
    e_idx, e_w = step(e.leaves, e.block_sums, e.max_priority, rand)
    assert torch.equal(c_idx, e_idx)
    assert torch.equal(c_w, e_w)
    assert torch.equal(st.leaves, e.leaves) and torch.equal(st.max_priority, e.max_priority)


@pytest.mark.gpu
@needs_compiled_triton
def test_gpu_opcheck():
    register_ops()  # torch.library registration, made for torch.compile / opcheck only
    st, _ = _gpu_state(100_000, seed=2)
    d = "cuda"
    args = (st.leaves, st.block_sums, torch.rand(64, device=d), scalar(99_000, torch.int64, d), scalar(0.5, device=d),
            st.block, st.capacity)
    torch.library.opcheck(torch.ops.foxdqn.per_sample.default, args, test_utils=("test_schema", "test_faketensor"))
    upd = (st.leaves.clone(), st.block_sums.clone(), st.max_priority.clone(), torch.tensor([0, 3, 3], device=d),
           torch.tensor([1.0, 2.0, 0.5], device=d), st.alpha, st.eps, scalar(0.0, device=d), st.block, st.capacity)
    torch.library.opcheck(torch.ops.foxdqn.per_update.default, upd, test_utils=("test_schema", "test_faketensor"))
    ins = (st.leaves.clone(), st.block_sums.clone(), st.max_priority, st.alpha, torch.tensor([2], device=d), st.block,
           st.capacity)
    torch.library.opcheck(torch.ops.foxdqn.per_insert.default, ins, test_utils=("test_schema", "test_faketensor"))
