"""Counter-based uniform draws, one independent stream per population member.

Member ``p`` of a population owns a 32-bit key; its draws are a pure function of (key, index), so
they do not depend on the population size P or on the other members: member ``p`` of a
population draws exactly what a population of one with the same seed draws, and the Triton kernel
and the torch reference agree bit for bit. (A batched ``torch.Generator`` cannot do this.)

The contract. All arithmetic is on unsigned 32-bit integers (mod 2**32):

* ``H(x)`` is Chris Wellons' "lowbias32" integer hash (a bijection of the 32-bit integers; shifts
  16, 15, 16, multipliers 0x7feb352d, 0x846ca68b; "Prospecting for Hash Functions",
  https://nullprogram.com/blog/2018/07/31/ and https://github.com/skeeto/hash-prospector)::

      x ^= x >> 16;  x *= 0x7feb352d;  x ^= x >> 15;  x *= 0x846ca68b;  x ^= x >> 16

* key of a seed ``s`` (any int in [-2**63, 2**64), taken mod 2**64 with lo/hi its low/high 32 bits)::

      key(s) = H(H(lo ^ 0x9E3779B9) ^ hi)        (0x9E3779B9 = floor(2**32 / golden ratio))

* draw ``(p, i)`` with ``c = counter + i`` (``0 <= c < 2**63``) and ``lo``/``hi`` its low/high 32 bits::

      h(key, c) = H(H(H(lo) ^ key) ^ hi)
      U         = (h >> 8) * 2**-24              (float32, exact, one of 2**24 values in [0, 1))

The counter is hashed before the key is mixed in: with ``H(key ^ lo)`` two members whose keys
differ by ``d`` would draw the same values at indices ``c`` and ``c ^ d``; here the indices at which
two members' values coincide are themselves scattered pseudo-randomly.

The ops read ``counter`` on the device. Without a ``ticket`` they never advance it: the caller
adds ``n`` in place (``counter.add_(n)``) after drawing ``n`` per member. With a ``ticket`` (an int32
0-d scratch tensor, zero between calls) the launch advances it itself, so a draw is one kernel on
CUDA, not two: every program reads ``counter`` and stores its draws, then, after a barrier of its
warps, does ``atomic_add(ticket, 1)`` (acq_rel, GPU scope); the program that draws the last ticket
stores ``counter + n`` and zeroes the ticket. Every other program's read of ``counter`` is ordered
before its increment, hence before that store (the pattern of :mod:`foxdqn.ops.step_stats`).

Besides float32 uniforms a launch can store them as float64 (the same values: U has 24 bits) or
store :func:`member_randint`'s integers ``low + floor(U · high)``, computed from the same 24 bits,
so the kernel and the reference agree bit for bit in every form. No host reads: capturable in a
CUDA graph.
"""
from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl

from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.library import device_op, wrap_triton

M1, M2 = 0x7FEB352D, 0x846CA68B  # lowbias32's multipliers
SEED_SALT = 0x9E3779B9  # separates key(seed) from the draw hash
MASK32 = 0xFFFFFFFF
RANDINT_MAX_HIGH = 1 << 24  # U has 24 bits: larger ranges would leave values undrawable
BLOCK = 256  # draws per program (an H200 sweep: docs/bench.md#launch-constants); with fewer draws per
#              member than BLOCK, one grid axis runs over all members' draws
NUM_WARPS = 4  # warps per program
MAX_MEMBERS = 65535  # the members are grid axis 1 (CUDA's limit) when n >= BLOCK; the blocks of n axis 0


# ---------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def _lowbias32(x, M1: tl.constexpr, M2: tl.constexpr):
    x = x ^ (x >> 16)
    x = x * tl.full([], M1, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full([], M2, tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def _member_uniform_kernel(keys_ptr, counter_ptr, out_ptr, ticket_ptr, n, total, high, low, M1: tl.constexpr,
                           M2: tl.constexpr, FLAT: tl.constexpr, BLOCK: tl.constexpr, KIND: tl.constexpr,
                           ADVANCE: tl.constexpr):
    """out [P, n]. Grid (blocks of n, P), or with FLAT one axis over the P·n draws (``total``,
    int32: FLAT only for n < BLOCK) so that members of a few draws share a program. KIND: 0
    float32 U, 1 float64 U, 2 int64 ``low + (U·2**24 · high) >> 24``. ADVANCE: the last program
    (ticket) stores ``counter + n``."""
    if FLAT:
        k = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = k < total
        p = k // n
        i = k - p * n
        key = (tl.load(keys_ptr + p, mask=m, other=0) & 0xFFFFFFFF).to(tl.uint32)
        dst = out_ptr + k
    else:
        p = tl.program_id(1)
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        key = (tl.load(keys_ptr + p) & 0xFFFFFFFF).to(tl.uint32)
        dst = out_ptr + p.to(tl.int64) * n + i
    c0 = tl.load(counter_ptr)
    c = c0 + i.to(tl.int64)
    lo = (c & 0xFFFFFFFF).to(tl.uint32)
    hi = ((c >> 32) & 0xFFFFFFFF).to(tl.uint32)
    h = _lowbias32(_lowbias32(_lowbias32(lo, M1, M2) ^ key, M1, M2) ^ hi, M1, M2)
    bits = h >> 8  # the 24 random bits of U
    if KIND == 0:
        tl.store(dst, bits.to(tl.float32) * (1.0 / 16777216.0), mask=m)
    elif KIND == 1:
        tl.store(dst, bits.to(tl.float64) * (1.0 / 16777216.0), mask=m)
    else:
        tl.store(dst, low + ((bits.to(tl.int64) * high) >> 24), mask=m)
    if ADVANCE:
        tl.debug_barrier()  # every warp has read the counter before the (one-thread) ticket increment
        ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu")
        if ticket == tl.num_programs(0) * tl.num_programs(1) - 1:
            tl.store(counter_ptr, c0 + n)
            tl.store(ticket_ptr, 0)


#: the kernel's KIND of each output (float32 and float64 uniforms, int64 integers)
_KINDS = {torch.float32: 0, torch.float64: 1, torch.int64: 2}


@device_op("foxdqn::member_uniform", mutates_args={"counter", "ticket"})
def _member_uniform_op(keys: torch.Tensor, counter: torch.Tensor, ticket: torch.Tensor, n: int, kind: int,
                       high: int, low: int, advance: bool) -> torch.Tensor:
    dtype = {v: k for k, v in _KINDS.items()}[kind]
    out = torch.empty(keys.shape[0], n, device=keys.device, dtype=dtype)
    if out.numel():
        flat = n < BLOCK  # a member's draws fill less than one program
        grid = (triton.cdiv(out.numel(), BLOCK),) if flat else (triton.cdiv(n, BLOCK), keys.shape[0])
        wrap_triton(_member_uniform_kernel)[grid](
            keys, counter, out, ticket, n, out.numel() if flat else 0, high, low, M1=M1, M2=M2, FLAT=flat,
            BLOCK=BLOCK, KIND=kind, ADVANCE=advance, num_warps=NUM_WARPS)
    elif advance:  # no program to advance it
        counter.add_(n)
    return out


# ---------------------------------------------------------------------------------------------
# Reference (plain torch on int64 tensors holding 32-bit values)
# ---------------------------------------------------------------------------------------------
def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c mod 2**32`` for int64 ``x`` in [0, 2**32): the constant split in 16-bit halves so that
    no int64 product overflows (signed overflow is undefined in C++, whatever the device does)."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & MASK32


def lowbias32_reference(x: torch.Tensor) -> torch.Tensor:
    """``H`` of the module docstring on int64 tensors with values in [0, 2**32) (same shape, int64)."""
    x = x ^ (x >> 16)
    x = _mul32(x, M1)
    x = x ^ (x >> 15)
    x = _mul32(x, M2)
    return x ^ (x >> 16)


def member_uniform_reference(keys: torch.Tensor, counter: torch.Tensor, n: int) -> torch.Tensor:
    """Plain-torch reference of :func:`member_uniform` (same arguments and result). Device ops only."""
    c = counter + torch.arange(n, device=keys.device, dtype=torch.int64)  # [n]
    lo, hi = c & MASK32, (c >> 32) & MASK32
    key = (keys & MASK32).unsqueeze(1)  # [P, 1]
    h = lowbias32_reference(lowbias32_reference(lowbias32_reference(lo) ^ key) ^ hi)
    return (h >> 8).to(torch.float32) * 2.0**-24


# ---------------------------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------------------------
def member_keys(seeds: Sequence[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """Each member's 32-bit key from its seed: ``key(s)`` of the module docstring. A host function
    for setup (it reads Python ints), not for the hot loop.

    Args:
        seeds: P ints in [-2**63, 2**64) (taken mod 2**64), one per member.
        device: where the keys go.

    Returns:
        int64 ``[P]`` with values in [0, 2**32). Seeds 0..1000 give distinct keys (tested; two seeds
        differing only in their low 32 bits always do, H being a bijection).

    Raises:
        ValueError: a seed is not an int or is out of range.
    """
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or not -2**63 <= s < 2**64:
            raise ValueError(f"member_keys: seeds must be ints in [-2**63, 2**64), got {s!r}")
    s64 = [s % 2**64 for s in seeds]
    lo = torch.tensor([s & MASK32 for s in s64], dtype=torch.int64)
    hi = torch.tensor([s >> 32 for s in s64], dtype=torch.int64)
    return lowbias32_reference(lowbias32_reference(lo ^ SEED_SALT) ^ hi).to(device)


def _check_args(keys, counter, n, ticket=None) -> None:
    if not isinstance(keys, torch.Tensor) or keys.dim() != 1 or keys.dtype != torch.int64 or not keys.is_contiguous():
        raise ValueError(f"member_uniform: keys must be a contiguous int64 tensor [P], got "
                         f"{getattr(keys, 'dtype', type(keys).__name__)} {tuple(getattr(keys, 'shape', ()))}")
    if keys.shape[0] > MAX_MEMBERS:
        raise ValueError(f"member_uniform: at most {MAX_MEMBERS} members (keys [P]), got P={keys.shape[0]}")
    if not isinstance(counter, torch.Tensor) or counter.dim() != 0 or counter.dtype != torch.int64:
        raise ValueError(f"member_uniform: counter must be a 0-d int64 tensor, got "
                         f"{getattr(counter, 'dtype', type(counter).__name__)} {tuple(getattr(counter, 'shape', ()))}")
    if counter.device != keys.device:
        raise ValueError(f"member_uniform: counter is on {counter.device} but keys are on {keys.device}")
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < 2**31:
        raise ValueError(f"member_uniform: n must be an int in [0, 2**31), got {n!r}")
    if ticket is not None and (not isinstance(ticket, torch.Tensor) or ticket.dim() != 0
                               or ticket.dtype != torch.int32 or ticket.device != keys.device):
        raise ValueError(f"member_uniform: ticket must be None or a 0-d int32 tensor on {keys.device}, got "
                         f"{describe(ticket)}")


def _draw(keys: torch.Tensor, counter: torch.Tensor, n: int, dtype: torch.dtype, high: int, low: int,
          ticket: torch.Tensor | None, backend: str) -> torch.Tensor:
    """The public functions' common part: checked arguments, then the reference or the kernel."""
    _check_args(keys, counter, n, ticket)
    if resolve_backend("member_uniform", backend, keys) == "torch":
        out = member_uniform_reference(keys, counter, n)
        if dtype == torch.int64:
            out = randint_from_uniform(out, high)
            out = out + low if low else out
        else:
            out = out.to(dtype)
        if ticket is not None:
            counter.add_(n)
        return out
    empty = torch.empty((), dtype=torch.int32, device=keys.device) if ticket is None else ticket
    return _member_uniform_op(keys, counter, empty, n, _KINDS[dtype], high, low, ticket is not None)


def member_uniform(keys: torch.Tensor, counter: torch.Tensor, n: int, *, dtype: torch.dtype = torch.float32,
                   ticket: torch.Tensor | None = None, backend: str = "auto") -> torch.Tensor:
    """``n`` uniform draws per member at indices ``counter, ..., counter + n - 1`` (contract: module docstring).

    Device ops only (no host reads of ``counter``): capturable in a CUDA graph. Without ``ticket``
    ``counter`` is not advanced (the caller adds ``n`` to it in place); with it the op advances
    ``counter`` by ``n`` (one kernel on CUDA: module docstring).

    Args:
        keys: int64 ``[P]`` contiguous, P <= 65535, the members' keys (:func:`member_keys`; only the low 32 bits count).
        counter: int64 0-d on keys' device, the index of the first draw; ``0 <= counter`` and
            ``counter + n <= 2**63`` (a device value: not checked).
        n: draws per member, in [0, 2**31).
        dtype: float32 or float64 (the same values: U has 24 bits).
        ticket: None, or an int32 0-d tensor on keys' device, zero between calls (a scratch kept by
            the caller, e.g. :class:`foxdqn.population.random.MemberRandom`): advance ``counter``.
        backend: "auto" (Triton for CUDA tensors, torch for CPU), "triton", "torch".

    Returns:
        ``dtype`` ``[P, n]``: ``out[p, i] = U(h(keys[p], counter + i))``, multiples of 2**-24 in [0, 1).

    Raises:
        ValueError: wrong dtype, shape or device of an argument, bad ``n``, or an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"member_uniform: dtype must be torch.float32 or torch.float64, got {dtype}")
    return _draw(keys, counter, n, dtype, 0, 0, ticket, backend)


def member_randint(keys: torch.Tensor, counter: torch.Tensor, n: int, high: int, *, low: int = 0,
                   ticket: torch.Tensor | None = None, backend: str = "auto") -> torch.Tensor:
    """``n`` integers in [low, low + high) per member: ``low + floor(U * high)`` of
    :func:`member_uniform`'s draws.

    Computed exactly in integers, ``(U * 2**24) * high >> 24``, so it never reaches ``high`` (no
    clamp needed). Bias: each value is hit by either ``floor(2**24 / high)`` or ``ceil(2**24 / high)``
    of the 2**24 equally likely U, a relative error of at most ``high / 2**24`` in its probability
    (none when ``high`` is a power of two). Same indices as ``member_uniform`` (the caller advances
    ``counter`` by ``n``, or the op with a ``ticket``); device ops only.

    Args:
        keys, counter, n, ticket, backend: as :func:`member_uniform`.
        high: the number of values, in [1, 2**24].
        low: the smallest value, an int in [0, 2**62].

    Returns:
        int64 ``[P, n]`` in [low, low + high).

    Raises:
        ValueError: as :func:`member_uniform`, or ``high`` or ``low`` out of range.
        RuntimeError: as :func:`member_uniform`.
    """
    if isinstance(high, bool) or not isinstance(high, int) or not 1 <= high <= RANDINT_MAX_HIGH:
        raise ValueError(f"member_randint: high must be an int in [1, 2**24], got {high!r}")
    if isinstance(low, bool) or not isinstance(low, int) or not 0 <= low <= 2**62:
        raise ValueError(f"member_randint: low must be an int in [0, 2**62], got {low!r}")
    return _draw(keys, counter, n, torch.int64, high, low, ticket, backend)


def randint_from_uniform(u: torch.Tensor, high: int) -> torch.Tensor:
    """int64 ``floor(u * high)`` of float32 uniforms ``u`` in [0, 1) with 24 random bits (torch.rand's
    and :func:`member_uniform`'s), computed exactly in integers, ``(u * 2**24) * high >> 24``: never
    ``high`` (:func:`member_randint` gives the bias). Any shape; device ops only."""
    return ((u * 2.0**24).to(torch.int64) * high) >> 24
