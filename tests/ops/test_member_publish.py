"""member_publish: Triton kernel (interpreter) vs torch reference on odd P (1, over one program's
block, not a multiple of it), with and without the Q flags, a strided host copy, values that
need all 64 bits; argument checks; on the GPU the compiled kernel storing into pinned host memory,
captured in a CUDA graph without host syncs, against the reference."""
import pytest
import torch

from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.member_publish import BLOCK, member_publish, member_publish_reference

from support import require_compiled_kernels

_need_compiled = require_compiled_kernels(INTERPRET)


def _state(P, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    halted = (torch.rand(P, generator=g) < 0.4).to(torch.float32)
    code = torch.randint(0, 9, (P,), generator=g)
    at_update = torch.randint(-1, 2**40, (P,), generator=g)  # beyond 32 bits
    at_env = torch.randint(-1, 2**50, (P,), generator=g)
    q = (torch.rand(P, generator=g) < 0.5).to(torch.float32)
    return [t.to(device) for t in (halted, code, at_update, at_env, q)]


def _publish(backend, P, seed, with_q, pad=0):
    halted, code, at_update, at_env, q = _state(P, seed)
    wide = torch.full((4, P + pad), -7, dtype=torch.int64)  # the host copy a view of wider rows when pad
    host = wide[:, :P]
    q_host = torch.full((P,), -7, dtype=torch.int64)
    member_publish(halted, code, at_update, at_env, host, q_diverged=q if with_q else None,
                   q_host=q_host if with_q else None, backend=backend)
    return wide, q_host, (halted, code, at_update, at_env, q)


@pytest.mark.parametrize("P", [1, 3, BLOCK, BLOCK + 1, 2 * BLOCK + 37])
@pytest.mark.parametrize("with_q", [True, False])
@pytest.mark.parametrize("pad", [0, 5])
def test_kernel_equals_reference_and_the_rows(P, with_q, pad):
    (wk, qk, state), (wr, qr, _) = (_publish(b, P, P + pad, with_q, pad) for b in ("triton", "torch"))
    assert torch.equal(wk, wr) and torch.equal(qk, qr)
    halted, code, at_update, at_env, q = state
    assert wk[0, :P].tolist() == [int(h) for h in halted.tolist()]
    assert torch.equal(wk[1, :P], code) and torch.equal(wk[2, :P], at_update) and torch.equal(wk[3, :P], at_env)
    assert (wk[:, P:] == -7).all()  # columns past P untouched
    assert qk.tolist() == ([int(x) for x in q.tolist()] if with_q else [-7] * P)


def test_arguments_are_checked():
    halted, code, at_update, at_env, q = _state(4, 0)
    host = torch.zeros(4, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match="halted must be a float32"):
        member_publish(code, code, at_update, at_env, host)
    with pytest.raises(ValueError, match="code must be a contiguous torch.int64 tensor \\[4\\]"):
        member_publish(halted, code[:3], at_update, at_env, host)
    with pytest.raises(ValueError, match="host must be an int64 tensor \\[4, 4\\]"):
        member_publish(halted, code, at_update, at_env, torch.zeros(3, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="host must be an int64"):
        member_publish(halted, code, at_update, at_env, torch.zeros(4, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="go together"):
        member_publish(halted, code, at_update, at_env, host, q_diverged=q)
    with pytest.raises(ValueError, match="q_host must be"):
        member_publish(halted, code, at_update, at_env, host, q_diverged=q, q_host=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="backend must be"):
        member_publish(halted, code, at_update, at_env, host, backend="cuda")


@pytest.mark.gpu
def test_gpu_stores_into_pinned_memory_and_captures():
    from support import capture_graph, no_host_sync

    P = 2 * BLOCK + 37
    state = _state(P, 3, "cuda")
    halted, code, at_update, at_env, q = state
    host = torch.full((4, P), -7, dtype=torch.int64, pin_memory=True)
    q_host = torch.full((P,), -7, dtype=torch.int64, pin_memory=True)
    with pytest.raises(ValueError, match="pinned host memory"):
        member_publish(halted, code, at_update, at_env, torch.zeros(4, P, dtype=torch.int64))
    with no_host_sync():
        graph, _ = capture_graph(lambda: member_publish(halted, code, at_update, at_env, host, q_diverged=q,
                                                        q_host=q_host))
        code.add_(1)  # a change on the device after the capture: the next replay publishes it
        graph.replay()
    torch.cuda.synchronize()
    want_host = torch.zeros(4, P, dtype=torch.int64)
    want_q = torch.zeros(P, dtype=torch.int64)
    member_publish_reference(*(t.cpu() for t in (halted, code, at_update, at_env)), want_host, q.cpu(), want_q)
    assert torch.equal(host, want_host) and torch.equal(q_host, want_q)
