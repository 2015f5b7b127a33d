r"""The training guard's per-member state stored into the host's pinned copy by one kernel launch.

What :meth:`foxdqn.population.member_guard.MemberGuard.publish` does once per iteration, so
that the host reads the halts without waiting (docs/design/hot_loop.md#the-contract). Per member
p::

    host[0, p] = int64(halted[p])       (the latch, 0.0 or 1.0)
    host[1, p] = code[p]
    host[2, p] = at_update[p]
    host[3, p] = at_env_steps[p]
    q_host[p]  = int64(q_diverged[p])   (with q_diverged: the Q monitor's flag, 0.0 or 1.0)

On CUDA, ``host`` and ``q_host`` are pinned host memory, which the kernel stores into through its
device mapping (CUDA's unified addressing: a pinned allocation is reachable from the device at
the same address). The stores reach the host some time after the kernel ran, with no order among
them: a host that polls may see member p's ``halted`` before its ``code``, as it could with the
copies before (a reader that needs them together looks again at its next poll,
:meth:`~foxdqn.population.member_guard.MemberGuard.reason`); after a device synchronisation every
store is visible. Why a kernel: the reference below is a stack, a conversion and two
device-to-host copies, four nodes of the iteration's CUDA graph of which the two copies run on the
copy engine; one kernel is one node (docs/bench.md#population).

The reference (:func:`member_publish_reference`) is the definition; the kernel's results equal it
exactly. Kernel: programs of ``BLOCK`` members; device ops only (capturable in a CUDA graph).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.library import device_op, wrap_triton

BLOCK = 256  # members per program


@triton.jit
def _member_publish_kernel(halted_ptr, code_ptr, at_update_ptr, at_env_ptr, host_ptr, q_ptr, q_host_ptr, P,
                           host_stride, QDIV: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < P
    tl.store(host_ptr + offs, tl.load(halted_ptr + offs, mask=m, other=0.0).to(tl.int64), mask=m)
    tl.store(host_ptr + host_stride + offs, tl.load(code_ptr + offs, mask=m, other=0), mask=m)
    tl.store(host_ptr + 2 * host_stride + offs, tl.load(at_update_ptr + offs, mask=m, other=0), mask=m)
    tl.store(host_ptr + 3 * host_stride + offs, tl.load(at_env_ptr + offs, mask=m, other=0), mask=m)
    if QDIV:
        tl.store(q_host_ptr + offs, tl.load(q_ptr + offs, mask=m, other=0.0).to(tl.int64), mask=m)


@device_op("foxdqn::member_publish", mutates_args={"host", "q_host"})
def _member_publish_op(halted: Tensor, code: Tensor, at_update: Tensor, at_env_steps: Tensor, host: Tensor,
                       q_diverged: Tensor, q_host: Tensor, with_qdiv: bool) -> None:
    p = halted.shape[0]
    wrap_triton(_member_publish_kernel)[(triton.cdiv(p, BLOCK),)](
        halted, code, at_update, at_env_steps, host, q_diverged, q_host, p, host.stride(0),
        QDIV=with_qdiv, BLOCK=BLOCK, num_warps=4)


def member_publish_reference(halted: Tensor, code: Tensor, at_update: Tensor, at_env_steps: Tensor, host: Tensor,
                             q_diverged: Tensor | None = None, q_host: Tensor | None = None) -> None:
    """Plain-torch reference of :func:`member_publish` (same arguments and writes): a stack and
    non-blocking copies."""
    host.copy_(torch.stack([halted.to(torch.int64), code, at_update, at_env_steps]), non_blocking=True)
    if q_diverged is not None:
        q_host.copy_(q_diverged.to(torch.int64), non_blocking=True)


def _check(halted, code, at_update, at_env_steps, host, q_diverged, q_host) -> None:
    op = "member_publish"
    if not isinstance(halted, Tensor) or halted.dim() != 1 or halted.dtype != torch.float32:
        raise ValueError(f"{op}: halted must be a float32 tensor [P], got {describe(halted)}")
    if (q_diverged is None) != (q_host is None):
        raise ValueError(f"{op}: q_diverged and q_host go together (both or neither)")
    p, dev = halted.shape[0], halted.device
    named = [("halted", halted, torch.float32), ("code", code, torch.int64), ("at_update", at_update, torch.int64),
             ("at_env_steps", at_env_steps, torch.int64)]
    if q_diverged is not None:
        named.append(("q_diverged", q_diverged, torch.float32))
    for name, t, dtype in named:
        if (not isinstance(t, Tensor) or t.dtype != dtype or tuple(t.shape) != (p,) or not t.is_contiguous()
                or t.device != dev):
            raise ValueError(f"{op}: {name} must be a contiguous {dtype} tensor [{p}] on {dev}, got {describe(t)}")
    where = "pinned host memory" if dev.type == "cuda" else "on the cpu"
    outs = [("host", host, (4, p))] + ([("q_host", q_host, (p,))] if q_diverged is not None else [])
    for name, t, shape in outs:
        pinned = isinstance(t, Tensor) and t.device.type == "cpu" and (dev.type != "cuda" or t.is_pinned())
        if (not pinned or t.dtype != torch.int64 or tuple(t.shape) != shape or t.stride(-1) != 1
                or (len(shape) == 2 and t.stride(0) < p)):
            raise ValueError(f"{op}: {name} must be an int64 tensor {list(shape)} with unit last stride in {where}, "
                             f"got {describe(t)}" + ("" if not isinstance(t, Tensor) or t.device.type != "cpu"
                                                    else f" (pinned: {t.is_pinned()})"))


def member_publish(halted: Tensor, code: Tensor, at_update: Tensor, at_env_steps: Tensor, host: Tensor, *,
                   q_diverged: Tensor | None = None, q_host: Tensor | None = None, backend: str = "auto") -> None:
    """Store the guard's per-member state into its host copy (the module docstring's rows); one
    kernel launch on CUDA. Device ops only: capturable in a CUDA graph; never waits.

    Args:
        halted: float32 ``[P]``, the guard's latch (0.0 or 1.0), contiguous.
        code, at_update, at_env_steps: int64 ``[P]``, contiguous, on ``halted``'s device.
        host: int64 ``[4, P]`` (unit last stride), written: pinned host memory when ``halted`` is
            on CUDA, a CPU tensor when it is on the CPU.
        q_diverged, q_host: None each, or float32 ``[P]`` on ``halted``'s device and int64
            ``[P]`` beside ``host`` (pinned on CUDA): the Q monitor's flags and their host copy.
        backend: "auto" (Triton for CUDA tensors, torch reference for CPU), "triton", "torch".

    Raises:
        ValueError: a wrong dtype, shape, layout or device; ``host`` or ``q_host`` not in pinned
            host memory while the state is on CUDA; ``q_diverged`` without ``q_host`` or the
            reverse; an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check(halted, code, at_update, at_env_steps, host, q_diverged, q_host)
    if resolve_backend("member_publish", backend, halted) == "torch":
        member_publish_reference(halted, code, at_update, at_env_steps, host, q_diverged, q_host)
        return
    qdiv = q_diverged is not None
    _member_publish_op(halted, code, at_update, at_env_steps, host, q_diverged if qdiv else halted,
                       q_host if qdiv else host, qdiv)
