"""foxdqn.ops.prune_masks: the kernel (TRITON_INTERPRET=1 on CPU) writes the same masks and weights
as its torch reference (the stable argsort the population ran before) on odd shapes, both layouts,
ties (already pruned zeros, repeated magnitudes), NaN and inf weights, k = 0, steps before, between,
at and after the schedule's window (t_end off the Δt grid), a skipped member; the reference equals
the single run's MagnitudePruner; bad arguments are refused naming the argument. GPU (``gpu``):
kernel = reference at a trading size, a captured replay = eager, one kernel for two matrices. Many
matrices in one call (two launches) equal each matrix alone."""
from __future__ import annotations

import pytest
import torch

from foxdqn.ops.prune_masks import due_row, prune_masks_, prune_masks_reference

from support import assert_replays_give, cuda_kernels


def _weights(p, shape, seed=0, ties=False, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(p, *shape, generator=g)
    if ties:  # repeated magnitudes of both signs, exact zeros, pruned entries (mask 0)
        w = torch.round(w * 2) / 2
    mask = (torch.rand(p, *shape, generator=g) > (0.3 if ties else 0.0)).float()
    return w.to(device), mask.to(device)


def _table(rows, cols, n, seed=1):
    g = torch.Generator().manual_seed(seed)
    k = torch.sort(torch.randint(0, n, (rows, cols), generator=g), dim=0).values
    k[0] = 0  # a first step that prunes nothing
    return k.contiguous()


def _both(w, mask, t, skip, table, col, window, transposed):
    got_w, got_m = w.clone(), mask.clone()
    want_w, want_m = w.clone(), mask.clone()
    step = torch.tensor(t, device=w.device)
    prune_masks_([got_w], [got_m], step, skip, table, *window, [transposed], first_col=col, backend="triton")
    prune_masks_reference(want_w, want_m, step, skip, table, col, *window, transposed)
    return (got_w, got_m), (want_w, want_m)


WINDOW = (3, 20, 4)  # t0, t_end (off the grid: due at 3, 7, 11, 15, 19, 20), Δt


@pytest.mark.parametrize("t", [0, 2, 3, 5, 7, 19, 20, 21, 1000])
@pytest.mark.parametrize("p,shape,transposed", [(1, (7, 5), True), (3, (33, 17), True), (2, (3, 2, 3, 3), False),
                                                (2, (40, 41), True)])
@pytest.mark.parametrize("ties", [False, True])
def test_kernel_equals_reference(t, p, shape, transposed, ties):
    w, mask = _weights(p, shape, seed=t, ties=ties)
    n = w[0].numel()
    table = _table(6, 2, n)  # due at 3, 7, 11, 15, 19 and t_end = 20
    skip = torch.zeros(p)
    if p > 1:
        skip[1] = 1.0
    got, want = _both(w, mask, t, skip, table, 1, WINDOW, transposed)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
    row = due_row(t, *WINDOW)
    if row is not None:
        k = int(table[row, 1])
        assert (want[1][0] == 0).sum() == k  # member 0 is never skipped: exactly k zeros
        if p > 1:
            assert torch.equal(want[1][1], mask[1])  # the skipped member keeps its mask
    else:
        assert torch.equal(want[1], mask)
    assert torch.equal(want[0], w * want[1])


@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply")  # inf · 0 in the interpreter
def test_nan_and_inf_rank_as_a_stable_sort_ranks_them():
    w, mask = _weights(2, (9, 6), seed=3)
    w[0, 0, 0], w[0, 2, 1], w[1, 4, 4] = float("nan"), float("inf"), float("-inf")
    mask[0, 2, 1] = 0.0  # inf · 0 = NaN, as the reference's product
    table = torch.tensor([[50], [53]])  # t = 0 and 1
    got, want = _both(w, mask, 0, torch.zeros(2), table, 0, (0, 1, 1), True)
    assert torch.equal(got[1], want[1])
    assert torch.equal(torch.isnan(got[0]), torch.isnan(want[0]))
    assert torch.equal(torch.nan_to_num(got[0]), torch.nan_to_num(want[0]))


def test_reference_equals_the_single_runs_pruner():
    """Member p's slice of the reference = a single run's MagnitudePruner.step on its classic
    [out, in] matrix (the same schedule's k)."""
    from foxdqn.step.pruning import MagnitudePruner

    w, _ = _weights(3, (11, 6), seed=5)
    mask = torch.ones_like(w)
    t0, t_end, freq = 2, 9, 3
    linear = torch.nn.Linear(11, 6, bias=False)
    single = MagnitudePruner(linear, torch.nn.Linear(11, 6, bias=False), 0.1, 0.7, t0, t_end, freq, torch.device("cpu"))
    steps = [t0, 5, 8, 9]
    table = torch.floor(single.sparsity_at(torch.tensor(steps)) * 66).to(torch.int64).view(-1, 1).contiguous()
    for t in (2, 3, 5, 9):
        prune_masks_([w], [mask], torch.tensor(t), torch.zeros(3), table, t0, t_end, freq, [True], backend="triton")
    for p in range(3):
        with torch.no_grad():
            linear.weight.copy_(_weights(3, (11, 6), seed=5)[0][p].t())
        single.masks[0].fill_(1.0)
        for t in (2, 3, 5, 9):
            single.step(torch.tensor(t), torch.tensor(0.0))
        assert torch.equal(mask[p].t(), single.masks[0]) and torch.equal(w[p].t(), linear.weight.detach())


def test_due_row():
    assert [due_row(t, *WINDOW) for t in range(0, 23)] == [
        None, None, None, 0, None, None, None, 1, None, None, None, 2, None, None, None, 3, None, None, None, 4, 5,
        None, None]
    assert due_row(8, 0, 8, 4) == 2 and due_row(5, 5, 5, 1) == 0


def _args():
    w, mask = _weights(2, (5, 4))
    return dict(weights=[w], masks=[mask], t=torch.tensor(3), skip=torch.zeros(2), k_table=_table(4, 1, 20),
                first_col=0, t0=0, t_end=5, freq=2, transposed=[True])


@pytest.mark.parametrize("change,match", [
    (dict(weights=[torch.zeros(2, 5, 4, dtype=torch.float64)]), r"weights\[0\] must be contiguous float32"),
    (dict(weights=[torch.zeros(2, 4, 5).transpose(1, 2)]), r"weights\[0\] must be contiguous float32"),
    (dict(masks=[torch.zeros(2, 5)]), r"masks\[0\] must be contiguous"),
    (dict(masks=[]), "lists of one length"),
    (dict(weights=[torch.zeros(2, 5, 4), torch.zeros(3, 5, 4)], masks=[torch.zeros(2, 5, 4), torch.zeros(3, 5, 4)],
          transposed=[True, True], k_table=_table(4, 2, 20)), r"weights\[1\] must be contiguous float32 \[P=2"),
    (dict(t=torch.tensor(3.0)), "t must be contiguous torch.int64"),
    (dict(skip=torch.zeros(3)), "skip must be contiguous torch.float32"),
    (dict(k_table=torch.zeros(3, dtype=torch.int64)), "k_table must be contiguous int64"),
    (dict(first_col=1), "must lie in k_table's 1 columns"),
    (dict(freq=0), "freq >= 1"),
    (dict(t0=6), "0 <= t0 <= t_end"),
    (dict(t_end=7), "one row per mask-update step"),
    (dict(weights=[torch.zeros(2, 5, 4, 1)], masks=[torch.zeros(2, 5, 4, 1)]), "when transposed"),
])
def test_bad_arguments(change, match):
    args = {**_args(), **change}
    with pytest.raises(ValueError, match=match):
        prune_masks_(**args, backend="triton")


@pytest.mark.parametrize("t", [3, 7, 8])
def test_many_matrices_in_one_call_equal_each_alone(t):
    """Matrices of mixed shapes and layouts (19: two launches of up to 16) in one call: each equals
    the reference of its own column."""
    shapes = [((7, 5), True), ((3, 2, 3, 3), False), ((9, 4), True), ((2, 6), False)] * 5
    shapes = shapes[:19]
    p = 2
    pairs = [_weights(p, shape, seed=i, ties=i % 2 == 1) for i, (shape, _) in enumerate(shapes)]
    table = _table(6, 21, 10)  # columns 2 .. 20 used
    skip = torch.tensor([0.0, 1.0]) if t == 8 else torch.zeros(p)
    step = torch.tensor(t)
    got = [(w.clone(), m.clone()) for w, m in pairs]
    prune_masks_([w for w, _ in got], [m for _, m in got], step, skip, table, *WINDOW, [tr for _, tr in shapes],
                 first_col=2, backend="triton")
    for i, ((w, m), (shape, tr)) in enumerate(zip(pairs, shapes)):
        want_w, want_m = w.clone(), m.clone()
        prune_masks_reference(want_w, want_m, step, skip, table, 2 + i, *WINDOW, tr)
        assert torch.equal(got[i][1], want_m) and torch.equal(got[i][0], want_w), i


@pytest.mark.gpu
@pytest.mark.parametrize("t", [0, 100, 150, 2400])
def test_gpu_kernel_equals_reference(t):
    w, mask = _weights(64, (256, 256), seed=t, ties=True, device="cuda")
    table = _table(25, 3, 65536).cuda()  # 0, 100, ..., 2400
    skip = (torch.arange(64, device="cuda") % 7 == 3).float()
    got, want = _both(w, mask, t, skip, table, 2, (0, 2400, 100), True)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])


@pytest.mark.gpu
def test_gpu_capture_equals_eager_and_one_kernel():
    w0, m0 = _weights(8, (128, 96), seed=2, device="cuda")
    v0, n0 = _weights(8, (96, 45), seed=3, device="cuda")
    table = _table(5, 2, 96 * 45).cuda()  # t in [0, 8] every 2
    t, skip = torch.tensor(2, device="cuda"), torch.zeros(8, device="cuda")
    w, mask, w2, mask2 = w0.clone(), m0.clone(), v0.clone(), n0.clone()

    def step():
        w.copy_(w0)
        mask.copy_(m0)
        w2.copy_(v0)
        mask2.copy_(n0)
        prune_masks_([w, w2], [mask, mask2], t, skip, table, 0, 8, 2, [True, False])
        return [w, mask, w2, mask2]

    eager = [x.clone() for x in step()]
    assert (eager[1] == 0).any() and (eager[3] == 0).any()
    assert_replays_give(step, eager)
    _, names = cuda_kernels(lambda: prune_masks_([w, w2], [mask, mask2], t, skip, table, 0, 8, 2, [True, False]))
    assert names == ["_prune_masks_kernel"], names
