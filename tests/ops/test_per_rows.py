"""per_rows: Triton kernel (interpreter on the CPU) = torch reference exactly (one member, odd P and
B, n = 1, 2 and 5, the write pointer at 0, mid-ring and wrapped so that moved rows wrap below row
0), the rule against a single run's Priorities.sample, argument errors; on the GPU the compiled kernel."""
import pytest
import torch

from foxdqn.ops.per_rows import per_rows, per_rows_reference


def _case(p, b, rows, envs, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, rows * envs, (p, b), generator=g).to(device)


@pytest.mark.parametrize("p,b,rows,envs", [(1, 1, 3, 1), (3, 7, 11, 4), (5, 33, 8, 3), (2, 300, 64, 5)])
@pytest.mark.parametrize("n_step", [1, 2, 5])
@pytest.mark.parametrize("ptr", [0, 1, 6])
def test_kernel_matches_reference(p, b, rows, envs, n_step, ptr):
    if n_step >= rows:
        pytest.skip("the ring holds more rows than the n-step window")
    slots = _case(p, b, rows, envs, seed=p * b + n_step)
    slots[0, 0] = (ptr - 1) % rows * envs  # the newest row
    ptr_t = torch.tensor(ptr % rows)
    got = per_rows(slots, ptr_t, rows, envs, n_step, backend="triton")
    want = per_rows_reference(slots, ptr_t, rows, envs, n_step)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # the ring row of member q's slot t·N + e is t·P·N + q·N + e; moved slots are n − 1 rows back
    t, e = want[1] // envs, want[1] % envs
    assert torch.equal(want[0], t * p * envs + torch.arange(p)[:, None] * envs + e)
    age = (ptr % rows - 1 - t) % rows
    assert bool((age >= n_step - 1).all())  # no sampled row is in the n − 1 newest any more
    if n_step > 1:
        assert bool((want[1] != slots).any())


def test_reference_is_a_single_runs_move_back():
    """Member p's slots move as Priorities.sample moves a single run's (foxdqn/replay/prioritized.py)."""
    rows, envs, n = 9, 4, 3
    ptr = torch.tensor(2)
    slots = torch.arange(rows * envs).view(1, -1)
    t, e = slots // envs, slots % envs
    want = torch.where((ptr - 1 - t) % rows < n - 1, (t - (n - 1)) % rows, t) * envs + e
    assert torch.equal(per_rows(slots, ptr, rows, envs, n, backend="triton")[1], want)


def test_argument_errors():
    slots = _case(2, 3, 5, 2, 0)
    with pytest.raises(ValueError, match="slots must be"):
        per_rows(slots.int(), torch.tensor(0), 5, 2, 1)
    with pytest.raises(ValueError, match="slots must be"):
        per_rows(slots.view(-1), torch.tensor(0), 5, 2, 1)
    with pytest.raises(ValueError, match="ptr must be"):
        per_rows(slots, torch.tensor([0, 1]), 5, 2, 1)
    with pytest.raises(ValueError, match="n_step must be"):
        per_rows(slots, torch.tensor(0), 5, 2, 0)
    with pytest.raises(ValueError, match="backend"):
        per_rows(slots, torch.tensor(0), 5, 2, 1, backend="gpu")


@pytest.mark.gpu
def test_compiled_kernel_matches_reference_on_cuda():
    slots = _case(64, 128, 1000, 32, 1, "cuda")
    ptr = torch.tensor(3, device="cuda")
    got, want = per_rows(slots, ptr, 1000, 32, 3), per_rows_reference(slots, ptr, 1000, 32, 3)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
