"""step_stats: Triton kernel (interpreter) vs torch reference on odd N (over several blocks),
A = 1, with and without trades and the env-step counter, float32 and float64 inputs; counts are
exact, the float64 sums agree to rounding and repeat bit for bit; argument checks; on the GPU the
compiled kernel, captured."""
import pytest
import torch

from foxdqn.ops.step_stats import BLOCK, NUM_FIELDS, step_stats

F32, F64, I64 = torch.float32, torch.float64, torch.int64


def _case(n, a, dtype, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    action = torch.randint(0, a, (n,), generator=g)
    reward = torch.randn(n, generator=g, dtype=dtype) * 1e-3
    done = torch.rand(n, generator=g) < 0.2
    ret = torch.where(done, torch.randn(n, generator=g, dtype=dtype), torch.zeros((), dtype=dtype))
    length = torch.where(done, torch.randint(1, 500, (n,), generator=g), torch.zeros((), dtype=I64))
    traded = torch.rand(n, generator=g) < 0.5
    return [t.to(device) for t in (action, reward, done, ret, length, traded)]


def _accumulate(backend, steps, a, with_traded, with_steps, device="cpu"):
    acc = torch.zeros(NUM_FIELDS, dtype=F64, device=device)
    hist = torch.zeros(a, dtype=F64, device=device)
    env_steps = torch.zeros((), dtype=I64, device=device) if with_steps else None
    for action, reward, done, ret, length, traded in steps:
        step_stats(action, reward, done, ret, length, traded if with_traded else None, acc, hist, env_steps,
                   backend=backend)
    return acc, hist, env_steps


@pytest.mark.parametrize("n,a,dtype,with_traded,with_steps", [
    (1, 1, F32, True, True), (37, 5, F64, False, True), (2 * BLOCK + 3, 45, F32, True, False)])
def test_kernel_equals_reference(n, a, dtype, with_traded, with_steps):
    steps = [_case(n, a, dtype, seed=n + k) for k in range(3)]
    (acc_k, hist_k, st_k), (acc_r, hist_r, st_r) = (_accumulate(b, steps, a, with_traded, with_steps)
                                                    for b in ("triton", "torch"))
    for f in (1, 2, 4, 5):  # counts: exact
        assert acc_k[f] == acc_r[f], f
    torch.testing.assert_close(acc_k, acc_r, rtol=1e-13, atol=1e-15)
    assert torch.equal(hist_k, hist_r) and float(hist_k.sum()) == 3 * n
    if with_steps:
        assert int(st_k) == int(st_r) == 3 * n
    if not with_traded:
        assert float(acc_k[5]) == 0.0
    again = _accumulate("triton", steps, a, with_traded, with_steps)
    assert torch.equal(again[0], acc_k)  # deterministic: the same sums bit for bit


def test_values_of_a_small_step():
    action = torch.tensor([0, 2, 2, 1])
    reward = torch.tensor([0.5, -1.0, 0.25, 2.0])
    done = torch.tensor([True, False, True, False])
    ret = torch.tensor([3.0, 9.0, -1.0, 9.0])  # 9.0 where not done: not counted
    length = torch.tensor([10, 99, 4, 99])
    traded = torch.tensor([True, True, False, False])
    for backend in ("triton", "torch"):
        acc, hist, steps = torch.zeros(NUM_FIELDS, dtype=F64), torch.zeros(3, dtype=F64), torch.tensor(7)
        step_stats(action, reward, done, ret, length, traded, acc, hist, steps, backend=backend)
        assert acc.tolist() == [2.0, 2.0, 14.0, 1.75, 4.0, 2.0]
        assert hist.tolist() == [1.0, 1.0, 2.0] and int(steps) == 11


def test_argument_errors():
    action, reward, done, ret, length, traded = _case(8, 3, F32, seed=0)
    acc, hist = torch.zeros(NUM_FIELDS, dtype=F64), torch.zeros(3, dtype=F64)
    with pytest.raises(ValueError, match="done must be"):
        step_stats(action, reward, done.float(), ret, length, traded, acc, hist)
    with pytest.raises(ValueError, match="acc must be"):
        step_stats(action, reward, done, ret, length, traded, acc.float(), hist)
    with pytest.raises(ValueError, match="env_steps must be"):
        step_stats(action, reward, done, ret, length, traded, acc, hist, torch.tensor(0.0))
    with pytest.raises(ValueError, match="reward must be"):
        step_stats(action, reward[:4], done, ret, length, traded, acc, hist)


@pytest.mark.gpu
def test_gpu_kernel_equals_reference_and_captures():
    from support import capture_graph

    steps = [_case(4096 * 8 + 5, 45, F32, seed=k, device="cuda") for k in range(4)]
    (acc_k, hist_k, st_k), (acc_r, hist_r, st_r) = (_accumulate(b, steps, 45, True, True, device="cuda")
                                                    for b in ("auto", "torch"))
    torch.testing.assert_close(acc_k, acc_r, rtol=1e-13, atol=1e-15)
    assert torch.equal(hist_k, hist_r) and int(st_k) == int(st_r)
    acc, hist, env_steps = torch.zeros(NUM_FIELDS, dtype=F64, device="cuda"), torch.zeros(45, dtype=F64,
                                                                                          device="cuda"), \
        torch.zeros((), dtype=I64, device="cuda")
    graph, _ = capture_graph(lambda: step_stats(*steps[0], acc, hist, env_steps))
    graph.replay()
    torch.cuda.synchronize()
    assert int(env_steps) == 4 * steps[0][0].shape[0] and float(hist.sum()) == 4 * steps[0][0].shape[0]
