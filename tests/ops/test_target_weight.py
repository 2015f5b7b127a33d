"""target_weight: Triton kernel (TRITON_INTERPRET=1 on CPU) vs torch reference vs the rule written
out (Polyak τ or the hard copy's period, times 1 − skip; the counter's advance); one group and
[G] groups (population); GPU: kernel = reference, captured without a host sync, one kernel."""
import pytest
import torch

from foxdqn.ops.target_weight import target_weight

from support import capture_graph, cuda_kernels, no_host_sync

F32, I64 = torch.float32, torch.int64


def _run(backend, updates, skip, tau, period, hard, advance, device="cpu"):
    u = torch.tensor(updates, dtype=I64, device=device)
    s = torch.tensor(skip, dtype=F32, device=device)
    w = torch.full_like(s, -7.0)
    target_weight(u, s, torch.tensor(tau, dtype=F32, device=device), torch.tensor(period, dtype=I64, device=device),
                  w, hard=hard, advance=advance, backend=backend)
    return w, int(u)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("advance", [False, True])
def test_polyak_one_group(backend, advance):
    for updates, skip, tau in [(0, 0.0, 0.005), (41, 1.0, 0.005), (7, 0.0, 1.0), (3, 0.0, 0.0), (2**40, 0.0, 0.3)]:
        w, u = _run(backend, updates, skip, tau, 5, False, advance)
        expect = torch.mul(torch.tensor(tau), 1.0 - torch.tensor(skip))
        assert w.shape == () and torch.equal(w, expect), (updates, skip, tau, w)
        assert u == updates + int(advance)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_hard_copies_on_the_period(backend):
    got = [float(_run(backend, u, 0.0, 0.25, 3, True, True)[0]) for u in range(7)]
    assert got == [0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0]  # (u + 1) % 3 == 0
    assert float(_run(backend, 2, 1.0, 0.25, 3, True, False)[0]) == 0.0  # skipped: no copy
    assert [float(_run(backend, u, 0.0, 0.25, 1, True, False)[0]) for u in range(3)] == [1.0] * 3


@pytest.mark.parametrize("hard", [False, True])
def test_groups_kernel_equals_reference(hard):
    g = torch.Generator().manual_seed(0)
    n = 37  # odd: a partly masked block
    skip = (torch.rand(n, generator=g) < 0.3).to(F32).tolist()
    tau = torch.rand(n, generator=g).tolist()
    period = torch.randint(1, 6, (n,), generator=g).tolist()
    for updates in (0, 4, 11):
        wk, uk = _run("triton", updates, skip, tau, period, hard, True)
        wr, ur = _run("torch", updates, skip, tau, period, hard, True)
        assert torch.equal(wk, wr) and uk == ur == updates + 1
        base = [float((updates + 1) % p == 0) for p in period] if hard else tau
        expect = torch.tensor(base, dtype=F32) * (1.0 - torch.tensor(skip, dtype=F32))
        assert torch.equal(wk, expect)


@pytest.mark.parametrize("key, value, match", [
    ("updates", torch.tensor(0, dtype=torch.int32), "updates"),
    ("skip", torch.zeros(2), "skip"),
    ("tau", torch.tensor(0.1, dtype=torch.float64), "tau"),
    ("hard_period", torch.tensor(2.0), "hard_period"),
    ("weight", torch.zeros(2, 2), "weight"),
])
def test_bad_arguments(key, value, match):
    args = dict(updates=torch.tensor(0), skip=torch.tensor(0.0), tau=torch.tensor(0.1),
                hard_period=torch.tensor(2), weight=torch.zeros(()))
    args[key] = value
    with pytest.raises(ValueError, match=match):
        target_weight(**args, hard=False)


@pytest.mark.gpu
@pytest.mark.parametrize("hard", [False, True])
def test_gpu_kernel_equals_reference_captured_one_kernel(hard):
    dev = torch.device("cuda")
    n = 5
    skip = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0], device=dev)
    tau = torch.tensor([0.1, 0.2, 0.3, 1.0, 0.5], device=dev)
    period = torch.tensor([1, 2, 3, 4, 5], dtype=I64, device=dev)
    updates = torch.zeros((), dtype=I64, device=dev)
    w = torch.empty(n, device=dev)

    def body():
        target_weight(updates, skip, tau, period, w, hard=hard, advance=True)

    graph, _ = capture_graph(body, warmup=1)  # the warm-up advances the counter once
    u_ref = torch.ones((), dtype=I64)
    for _ in range(6):
        ref = torch.empty(n)
        with no_host_sync():
            graph.replay()
        torch.cuda.synchronize()
        target_weight(u_ref, skip.cpu(), tau.cpu(), period.cpu(), ref, hard=hard, advance=True, backend="torch")
        assert torch.equal(w.cpu(), ref) and int(updates) == int(u_ref)
    kernels, _ = cuda_kernels(body)
    assert kernels == 1
