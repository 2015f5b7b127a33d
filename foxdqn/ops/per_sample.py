"""Stratified proportional sampling from the blocked priority sum, with IS weights.

Source: Schaul et al. 2016, "Prioritized Experience Replay": eq. 1 ``P(i) = p_i^a / sum_k p_k^a``
(proportional variant, §3.3: the range ``[0, total)`` is split into B equal strata and one value
is drawn uniformly in each), and the importance-sampling weights of §3.4,
``w_i = (N * P(i))^(-beta)`` normalised by ``1 / max_j w_j`` (max over the sampled batch).
No host synchronisation anywhere (docs/design/hot_loop.md#the-contract,
rules 1-4): the uniforms ``rand`` come from the caller's generator, ``size`` and ``beta`` are
0-d device tensors, all shapes are fixed, so the op captures in a CUDA graph.

Algorithm (three kernels, all fixed-grid; four above :data:`_PREFIX_CHUNK` blocks, see "Chunked"):

1. ``_per_prefix_kernel`` (one program): the mass of each block restricted to slots
   ``< size`` (``block_sums[b]`` for blocks wholly below ``size``, the f32 leaves of the block
   holding slot ``size-1`` summed in f64 for that block, 0 above), its inclusive prefix in f64,
   made monotone by construction (a zero-mass block repeats its predecessor's prefix exactly,
   so a search can never land on it), the total, and the last slot ``< size`` with a
   nonzero leaf. Chunks of 4096 blocks with a carry, so any number of blocks works.
2. ``_per_search_kernel`` (``ITEMS`` items per program): target mass
   ``t_k = (k + u_k) / B * total`` (f64); block ``b`` = number of prefix entries ``<= t_k``
   (one vector compare for <= 1024 blocks, else coarse every-128th entry then a 128-wide
   window); inside the block an f64 scan of its leaves picks the first slot ``j`` with
   ``prefix_{b-1} + scan_j > t_k`` and ``leaf_j > 0``. Writes the index and
   ``-beta * log2(leaf)``.
3. ``_per_weights_kernel`` (one program): ``w_k = exp2(lw_k - max_j lw_j)``, which equals
   ``(size*P(k))^(-beta) / max_j (size*P(j))^(-beta)`` (the factors ``size`` and ``total``
   cancel).

Chunked (more than ``_PREFIX_CHUNK`` blocks, e.g. above 4M slots at block 1024): the one-program
prefix would walk every block in turn (docs/bench.md#against-the-targets has the timings), so
kernels 1 and 2 become

1a. ``_per_chunk_kernel`` (one program per ``_LOCAL`` blocks): the same block masses, their prefix
    *within* the chunk (f64, monotone as above), the chunk's mass and its last block with mass;
1b. ``_per_carry_kernel`` (one program): the monotone inclusive prefix of the chunk masses
    (``carry``), the total, and the last slot ``< size`` with a nonzero leaf;
2'. ``_per_chunk_search_kernel``: chunk ``g`` = number of ``carry`` entries ``<= t_k``; inside it,
    with ``t' = t_k - carry[g-1]`` (f64, >= 0), block ``b`` = number of local prefix entries
    ``<= t'`` (clamped to the chunk's last block with mass when rounding puts ``t'`` past it);
    inside the block the same scan as kernel 2, in the chunk's frame.

A zero-mass chunk repeats its predecessor's carry exactly and a zero-mass block its predecessor's
local prefix, so no search lands on either; the edge rules below hold on both paths.

Member axis (a population's P independent sums, ``PERState(members=P)``): ``rand`` is
``[P, B]``, ``beta`` ``[P]``, and every kernel has one more grid axis over the members (the
one-program kernels become one program per member); member p's programs read and write only its
rows (its leaves, block sums, prefix, total, uniforms, beta and outputs), so its indices and
weights are those of a state without the member axis holding its row, and the weights are
normalised by member p's own batch maximum. Without the member axis P = 1 and every offset is 0.

Edge-case rules (kernel and reference agree on them):

* Only slots ``0 <= i < size`` are ever sampled, whatever the leaves above hold; ``size`` is
  clamped to ``[1, capacity]`` (``size == 0`` is a caller bug that cannot be raised without a
  sync: it samples slot 0 with weight 1).
* A slot whose leaf is 0 is never sampled, unless every leaf below ``size`` is 0; then the
  sample is stratified uniform, ``i_k = min(floor((k + u_k) / B * size), size - 1)``, all
  weights 1.
* Float error: a target at or beyond the total mass is clamped to the last slot ``< size``
  with a nonzero leaf; a target beyond the last nonzero leaf of its block (the f32 block sum
  and the f64 scan of the block's leaves can differ by rounding) is clamped to the last nonzero
  leaf of that block.
* ``rand`` is clamped to ``[0, 1)`` (NaN -> 0). All-equal priorities give weights exactly 1.
* With dyadic priorities (exact f32 sums) the kernel and the reference return identical
  indices for the same ``rand``; weights agree to f32 rounding (kernel uses ``exp2/log2``).
"""
from typing import Tuple

import torch
import triton
import triton.language as tl

from foxdqn.ops.backend import resolve_backend
from foxdqn.ops.library import device_op, wrap_triton
from foxdqn.ops.per_state import PERState

__all__ = ["per_sample", "per_sample_reference"]

# Search layout (launcher constants; tests patch _SINGLE_LEVEL_MAX to exercise both paths).
_SINGLE_LEVEL_MAX = 1024  # up to this many blocks (next power of two): one vector compare
_FINE = 128  # otherwise: coarse entries every _FINE blocks, then a _FINE-wide window
_TILE = 2048  # elements per program in the search kernel (ITEMS * max(block, search width))
_PREFIX_CHUNK = 4096  # blocks per loop step of the one-program prefix; more blocks: the chunked path
_LOCAL = 1024  # chunked path: blocks per program of the chunk kernel (and per local search)
_ONE_MINUS = 0.99999994  # largest f32 below 1.0


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _per_prefix_kernel(
    leaves_ptr,  # f32 [capacity_padded]
    block_sums_ptr,  # f32 [NUM_BLOCKS]
    size_ptr,  # int 0-d
    prefix_ptr,  # f64 [NUM_BLOCKS] out: monotone inclusive prefix of the block masses below size
    total_ptr,  # f64 [1] out
    last_ptr,  # i64 [1] out: last slot < size with a nonzero leaf, -1 if none
    NUM_BLOCKS: tl.constexpr,
    BLOCK: tl.constexpr,
    CAPACITY: tl.constexpr,
    CHUNK: tl.constexpr,
):
    m = tl.program_id(0).to(tl.int64)  # the member (one program each): its rows of every array
    leaves_ptr += m * (NUM_BLOCKS * BLOCK)
    block_sums_ptr += m * NUM_BLOCKS
    prefix_ptr += m * NUM_BLOCKS
    total_ptr += m
    last_ptr += m
    size = tl.load(size_ptr).to(tl.int64)
    size = tl.minimum(tl.maximum(size, 1), CAPACITY)
    last_blk = (size - 1) // BLOCK  # block holding slot size-1 (non-negative operands)
    offs = tl.arange(0, BLOCK)
    pos = last_blk * BLOCK + offs
    part = tl.load(leaves_ptr + pos, mask=pos < size, other=0.0)
    partial = tl.sum(part.to(tl.float64), axis=0)

    carry = tl.sum(tl.zeros([CHUNK], dtype=tl.float64), axis=0)  # f64 scalar 0
    carry_max = carry
    last_nz_blk = tl.max(tl.full([CHUNK], -1, dtype=tl.int64), axis=0)  # i64 scalar -1
    for start in range(0, NUM_BLOCKS, CHUNK):
        b = start + tl.arange(0, CHUNK)
        inb = b < NUM_BLOCKS
        bs = tl.load(block_sums_ptr + b, mask=inb & (b < last_blk), other=0.0).to(tl.float64)
        eff = tl.where(b == last_blk, partial, bs)
        s = tl.cumsum(eff, axis=0) + carry
        mono = tl.where(eff > 0, s, 0.0)
        mono = tl.maximum(tl.associative_scan(mono, 0, _max_combine), carry_max)
        tl.store(prefix_ptr + b, mono, mask=inb)
        carry = carry + tl.sum(eff, axis=0)
        carry_max = tl.max(mono, axis=0)
        last_nz_blk = tl.maximum(last_nz_blk, tl.max(tl.where(eff > 0, b, -1).to(tl.int64), axis=0))

    has = last_nz_blk >= 0
    lb = tl.maximum(last_nz_blk, 0)
    pos = lb * BLOCK + offs
    lim = tl.where(has, size, 0)  # (scalar masks are folded into the bound)
    lv = tl.load(leaves_ptr + pos, mask=pos < lim, other=0.0)
    j = tl.max(tl.where(lv > 0, offs, -1), axis=0)
    last = tl.where(has & (j >= 0), lb * BLOCK + j, -1)
    tl.store(total_ptr, carry_max)
    tl.store(last_ptr, last.to(tl.int64))


@triton.jit
def _targets(rand_ptr, total_ptr, last_ptr, size_ptr, k, km, B, CAPACITY: tl.constexpr):
    """(x, target, total, last, size) of items ``k``: ``x = (k + u_k) / B`` in [0, 1), the target
    mass ``x * total`` (f64), the total, the last slot with mass and the clamped size."""
    u = tl.load(rand_ptr + k, mask=km, other=0.0).to(tl.float32)
    u = tl.where(u > 0.0, u, 0.0)  # negative and NaN -> 0
    u = tl.minimum(u, 0.99999994)
    total = tl.load(total_ptr)
    last = tl.load(last_ptr)
    size = tl.load(size_ptr).to(tl.int64)
    size = tl.minimum(tl.maximum(size, 1), CAPACITY)
    x = (k.to(tl.float64) + u.to(tl.float64)) / B  # (I,) in [0, 1)
    return x, x * total, total, last, size


@triton.jit
def _slot_and_weight(leaves_ptr, beta_ptr, idx_ptr, logw_ptr, k, km, B, bc, bvalid, pex, target, x, size, total,
                     last, BLOCK: tl.constexpr):
    """Inside block ``bc`` (mass ``pex`` before it, in the frame of ``target``): the first slot whose
    running mass exceeds ``target`` with a nonzero leaf (else the block's last nonzero leaf, else
    ``last``); the all-zero rule; then the index and ``-beta * log2(leaf)`` stored for items ``k``."""
    offs = tl.arange(0, BLOCK)
    pos = bc[:, None] * BLOCK + offs[None, :]  # (I, BLOCK)
    lmask = km[:, None] & bvalid[:, None] & (pos < size)
    lv = tl.load(leaves_ptr + pos, mask=lmask, other=0.0)
    scan = tl.cumsum(lv.to(tl.float64), axis=1) + pex[:, None]
    nz = lv > 0
    jf = tl.min(tl.where((scan > target[:, None]) & nz, offs[None, :], BLOCK), axis=1)
    jl = tl.max(tl.where(nz, offs[None, :], -1), axis=1)
    j = tl.where(jf < BLOCK, jf, jl)
    idx = tl.where(j >= 0, bc * BLOCK + j, last)  # an invalid block loads no leaf: j = -1
    uniform = (last < 0) | (total <= 0.0)  # every leaf below size is 0
    uidx = tl.minimum((x * size.to(tl.float64)).to(tl.int64), size - 1)
    idx = tl.where(uniform, uidx, idx)
    leaf = tl.load(leaves_ptr + idx, mask=k < tl.where(uniform, 0, B), other=1.0)
    beta = tl.load(beta_ptr).to(tl.float32)
    lw = -beta * tl.log2(leaf)
    lw = tl.where(uniform, 0.0, lw)
    tl.store(idx_ptr + k, idx, mask=km)
    tl.store(logw_ptr + k, lw, mask=km)


@triton.jit
def _member_search_rows(leaves_ptr, total_ptr, last_ptr, rand_ptr, beta_ptr, idx_ptr, logw_ptr, B,
                        LEAVES: tl.constexpr):
    """The member of a search program (``program_id(1)``, int64) and the pointers moved to its rows:
    ``LEAVES`` leaves, one total, last and beta, ``B`` uniforms, indices and log-weights per member."""
    m = tl.program_id(1).to(tl.int64)
    return (m, leaves_ptr + m * LEAVES, total_ptr + m, last_ptr + m, rand_ptr + m * B, beta_ptr + m, idx_ptr + m * B,
            logw_ptr + m * B)


@triton.jit
def _per_search_kernel(
    leaves_ptr,  # f32 [capacity_padded]
    prefix_ptr,  # f64 [NUM_BLOCKS]
    total_ptr,  # f64 [1]
    last_ptr,  # i64 [1]
    rand_ptr,  # f32 [B]
    size_ptr,  # int 0-d
    beta_ptr,  # f32 0-d
    idx_ptr,  # i64 [B] out
    logw_ptr,  # f32 [B] out: -beta * log2(leaf)
    B,
    NUM_BLOCKS: tl.constexpr,
    BLOCK: tl.constexpr,
    CAPACITY: tl.constexpr,
    ITEMS: tl.constexpr,
    SEARCH_P2: tl.constexpr,  # single level: next_pow2(NUM_BLOCKS); two-level: coarse count
    FINE: tl.constexpr,  # 0: single level
):
    m, leaves_ptr, total_ptr, last_ptr, rand_ptr, beta_ptr, idx_ptr, logw_ptr = _member_search_rows(
        leaves_ptr, total_ptr, last_ptr, rand_ptr, beta_ptr, idx_ptr, logw_ptr, B, NUM_BLOCKS * BLOCK)
    prefix_ptr += m * NUM_BLOCKS
    k = tl.program_id(0) * ITEMS + tl.arange(0, ITEMS)  # (I,)
    km = k < B
    x, target, total, last, size = _targets(rand_ptr, total_ptr, last_ptr, size_ptr, k, km, B, CAPACITY)

    # -- block: number of (monotone) prefix entries <= target, i.e. first block whose prefix exceeds it
    if FINE == 0:
        ar = tl.arange(0, SEARCH_P2)
        p = tl.load(prefix_ptr + ar[None, :], mask=(ar[None, :] < NUM_BLOCKS) & km[:, None], other=float("inf"))
        b = tl.sum((p <= target[:, None]).to(tl.int64), axis=1)
    else:
        arc = tl.arange(0, SEARCH_P2)
        cidx = tl.minimum((arc + 1) * FINE - 1, NUM_BLOCKS - 1)
        cmask = (arc[None, :] * FINE < NUM_BLOCKS) & km[:, None]
        pc = tl.load(prefix_ptr + cidx[None, :], mask=cmask, other=float("inf"))
        c0 = tl.sum((pc <= target[:, None]).to(tl.int64), axis=1)
        fidx = c0[:, None] * FINE + tl.arange(0, FINE)[None, :]
        pf = tl.load(prefix_ptr + fidx, mask=(fidx < NUM_BLOCKS) & km[:, None], other=float("inf"))
        b = c0 * FINE + tl.sum((pf <= target[:, None]).to(tl.int64), axis=1)
    bvalid = b < NUM_BLOCKS  # false only when target >= total (float error): clamp below
    bc = tl.minimum(b, NUM_BLOCKS - 1)
    pex = tl.load(prefix_ptr + bc - 1, mask=km & bvalid & (bc > 0), other=0.0)  # mass before block bc

    # -- slot inside the block: first j with pex + scan_j > target and a nonzero leaf. (Comparing
    # against target itself, not target - pex, keeps the product x * total out of an FMA.)
    _slot_and_weight(leaves_ptr, beta_ptr, idx_ptr, logw_ptr, k, km, B, bc, bvalid, pex, target, x, size, total,
                     last, BLOCK)


@triton.jit
def _per_weights_kernel(logw_ptr, w_ptr, B, CHUNK: tl.constexpr):
    # w = exp2(lw - max lw): the max-normalised IS weights (Schaul §3.4), in place over logw;
    # one program per member, the max over its own B
    m = tl.program_id(0).to(tl.int64)
    logw_ptr += m * B
    w_ptr += m * B
    offs = tl.arange(0, CHUNK)
    mx = tl.max(tl.full([CHUNK], float("-inf"), dtype=tl.float32), axis=0)
    for start in range(0, B, CHUNK):
        lw = tl.load(logw_ptr + start + offs, mask=start + offs < B, other=float("-inf"))
        mx = tl.maximum(mx, tl.max(lw, axis=0))
    for start in range(0, B, CHUNK):
        inb = start + offs < B
        lw = tl.load(logw_ptr + start + offs, mask=inb, other=0.0)
        tl.store(w_ptr + start + offs, tl.exp2(lw - mx), mask=inb)


@triton.jit
def _per_chunk_kernel(
    leaves_ptr,  # f32 [capacity_padded]
    block_sums_ptr,  # f32 [NUM_BLOCKS]
    size_ptr,  # int 0-d
    local_ptr,  # f64 [NUM_BLOCKS] out: monotone inclusive prefix of the block masses within each chunk
    chunk_mass_ptr,  # f64 [G] out: each chunk's mass (the last entry of its local prefix)
    chunk_last_ptr,  # i64 [G] out: the chunk's last block with mass, -1 if none
    NUM_BLOCKS: tl.constexpr,
    BLOCK: tl.constexpr,
    CAPACITY: tl.constexpr,
    LOCAL: tl.constexpr,
):
    g = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)  # the member: its rows (G = the programs of axis 0)
    chunks = tl.num_programs(0).to(tl.int64)
    leaves_ptr += m * (NUM_BLOCKS * BLOCK)
    block_sums_ptr += m * NUM_BLOCKS
    local_ptr += m * NUM_BLOCKS
    chunk_mass_ptr += m * chunks
    chunk_last_ptr += m * chunks
    size = tl.load(size_ptr).to(tl.int64)
    size = tl.minimum(tl.maximum(size, 1), CAPACITY)
    last_blk = (size - 1) // BLOCK
    first = g * LOCAL
    mine = (last_blk >= first) & (last_blk < first + LOCAL)  # this chunk holds slot size-1
    offs = tl.arange(0, BLOCK)
    pos = last_blk * BLOCK + offs
    part = tl.load(leaves_ptr + pos, mask=pos < tl.where(mine, size, 0), other=0.0)
    partial = tl.sum(part.to(tl.float64), axis=0)
    b = first + tl.arange(0, LOCAL)
    inb = b < NUM_BLOCKS
    bs = tl.load(block_sums_ptr + b, mask=inb & (b < last_blk), other=0.0).to(tl.float64)
    eff = tl.where(b == last_blk, partial, bs)
    s = tl.cumsum(eff, axis=0)
    mono = tl.associative_scan(tl.where(eff > 0, s, 0.0), 0, _max_combine)
    tl.store(local_ptr + b, mono, mask=inb)
    tl.store(chunk_mass_ptr + g, tl.max(mono, axis=0))
    tl.store(chunk_last_ptr + g, tl.max(tl.where(eff > 0, b, -1).to(tl.int64), axis=0))


@triton.jit
def _per_carry_kernel(
    leaves_ptr,  # f32 [capacity_padded]
    size_ptr,  # int 0-d
    chunk_mass_ptr,  # f64 [G]
    chunk_last_ptr,  # i64 [G]
    carry_ptr,  # f64 [G] out: monotone inclusive prefix of the chunk masses
    total_ptr,  # f64 [1] out
    last_ptr,  # i64 [1] out: last slot < size with a nonzero leaf, -1 if none
    G,
    BLOCK: tl.constexpr,
    CAPACITY: tl.constexpr,
    CHUNK: tl.constexpr,
):
    m = tl.program_id(0).to(tl.int64)  # the member (one program each): its rows of every array
    leaves_ptr += m * (((CAPACITY + BLOCK - 1) // BLOCK) * BLOCK)
    chunk_mass_ptr += m * G
    chunk_last_ptr += m * G
    carry_ptr += m * G
    total_ptr += m
    last_ptr += m
    size = tl.load(size_ptr).to(tl.int64)
    size = tl.minimum(tl.maximum(size, 1), CAPACITY)
    carry = tl.sum(tl.zeros([CHUNK], dtype=tl.float64), axis=0)  # f64 scalar 0
    carry_max = carry
    last_nz_blk = tl.max(tl.full([CHUNK], -1, dtype=tl.int64), axis=0)
    for start in range(0, G, CHUNK):
        c = start + tl.arange(0, CHUNK)
        inc = c < G
        mass = tl.load(chunk_mass_ptr + c, mask=inc, other=0.0)
        s = tl.cumsum(mass, axis=0) + carry
        mono = tl.where(mass > 0, s, 0.0)
        mono = tl.maximum(tl.associative_scan(mono, 0, _max_combine), carry_max)
        tl.store(carry_ptr + c, mono, mask=inc)
        carry = carry + tl.sum(mass, axis=0)
        carry_max = tl.max(mono, axis=0)
        last_nz_blk = tl.maximum(last_nz_blk, tl.max(tl.load(chunk_last_ptr + c, mask=inc, other=-1), axis=0))
    has = last_nz_blk >= 0
    lb = tl.maximum(last_nz_blk, 0)
    offs = tl.arange(0, BLOCK)
    pos = lb * BLOCK + offs
    lv = tl.load(leaves_ptr + pos, mask=pos < tl.where(has, size, 0), other=0.0)
    j = tl.max(tl.where(lv > 0, offs, -1), axis=0)
    tl.store(total_ptr, carry_max)
    tl.store(last_ptr, tl.where(has & (j >= 0), lb * BLOCK + j, -1).to(tl.int64))


@triton.jit
def _per_chunk_search_kernel(
    leaves_ptr,  # f32 [capacity_padded]
    local_ptr,  # f64 [NUM_BLOCKS]
    carry_ptr,  # f64 [G]
    chunk_last_ptr,  # i64 [G]
    total_ptr,  # f64 [1]
    last_ptr,  # i64 [1]
    rand_ptr,  # f32 [B]
    size_ptr,  # int 0-d
    beta_ptr,  # f32 0-d
    idx_ptr,  # i64 [B] out
    logw_ptr,  # f32 [B] out: -beta * log2(leaf)
    B,
    G,
    NUM_BLOCKS: tl.constexpr,
    BLOCK: tl.constexpr,
    CAPACITY: tl.constexpr,
    ITEMS: tl.constexpr,
    G_P2: tl.constexpr,  # next power of two >= G
    LOCAL: tl.constexpr,
):
    m, leaves_ptr, total_ptr, last_ptr, rand_ptr, beta_ptr, idx_ptr, logw_ptr = _member_search_rows(
        leaves_ptr, total_ptr, last_ptr, rand_ptr, beta_ptr, idx_ptr, logw_ptr, B, NUM_BLOCKS * BLOCK)
    local_ptr += m * NUM_BLOCKS
    carry_ptr += m * G
    chunk_last_ptr += m * G
    k = tl.program_id(0) * ITEMS + tl.arange(0, ITEMS)  # (I,)
    km = k < B
    x, target, total, last, size = _targets(rand_ptr, total_ptr, last_ptr, size_ptr, k, km, B, CAPACITY)

    # -- chunk: number of (monotone) carry entries <= target
    ar = tl.arange(0, G_P2)
    pc = tl.load(carry_ptr + ar[None, :], mask=(ar[None, :] < G) & km[:, None], other=float("inf"))
    g = tl.sum((pc <= target[:, None]).to(tl.int64), axis=1)
    gvalid = g < G  # false only when target >= total (float error): clamped below
    gc = tl.minimum(g, G - 1)
    before = tl.load(carry_ptr + gc - 1, mask=km & gvalid & (gc > 0), other=0.0)
    t_local = target - before  # >= 0: before <= target

    # -- block inside the chunk: number of local prefix entries <= t_local, clamped to the chunk's
    # last block with mass (rounding between the carry and the local prefix)
    lo = tl.arange(0, LOCAL)
    lb = gc[:, None] * LOCAL + lo[None, :]
    pl = tl.load(local_ptr + lb, mask=(lb < NUM_BLOCKS) & km[:, None] & gvalid[:, None], other=float("inf"))
    bl = tl.sum((pl <= t_local[:, None]).to(tl.int64), axis=1)
    clast = tl.load(chunk_last_ptr + gc, mask=km, other=-1)
    b = tl.minimum(gc * LOCAL + bl, clast)
    bvalid = gvalid & (b >= 0)
    bc = tl.maximum(b, 0)
    pex = tl.load(local_ptr + bc - 1, mask=km & bvalid & (bc > gc * LOCAL), other=0.0)  # chunk mass before block

    # -- slot inside the block, in the chunk's frame (as _per_search_kernel)
    _slot_and_weight(leaves_ptr, beta_ptr, idx_ptr, logw_ptr, k, km, B, bc, bvalid, pex, t_local, x, size, total,
                     last, BLOCK)


# ----------------------------------------------------------------------------------------------
# Launcher
# ----------------------------------------------------------------------------------------------
def _next_p2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _search_layout(num_blocks: int, block: int, batch: int) -> Tuple[int, int, int]:
    """(ITEMS, SEARCH_P2, FINE) for the search kernel; FINE == 0 means single-level search."""
    nb_p2 = _next_p2(num_blocks)
    if nb_p2 <= _SINGLE_LEVEL_MAX:
        search_p2, fine, width = nb_p2, 0, nb_p2
    else:
        search_p2, fine = _next_p2(triton.cdiv(num_blocks, _FINE)), _FINE
        width = max(search_p2, fine)
    items = max(1, min(_next_p2(batch), _TILE // max(block, width)))
    return items, search_p2, fine


def _per_sample_launch(leaves, block_sums, rand, size, beta, block, capacity, launch=None):
    """Allocate outputs and scratch, launch the three kernels (a grid axis over the members of a
    ``[P, ...]`` state: module docstring). ``launch(kernel)`` wraps a kernel for launching
    (``wrap_triton`` inside the registered op, identity otherwise)."""
    wrap = launch if launch is not None else (lambda kern: kern)
    num_blocks = block_sums.shape[-1]
    members = leaves.shape[0] if leaves.dim() == 2 else 1
    batch = rand.shape[-1]
    dev = leaves.device
    idx = torch.empty(rand.shape, dtype=torch.int64, device=dev)
    w = torch.empty(rand.shape, dtype=torch.float32, device=dev)
    prefix = torch.empty(members, num_blocks, dtype=torch.float64, device=dev)
    total = torch.empty(members, dtype=torch.float64, device=dev)
    last = torch.empty(members, dtype=torch.int64, device=dev)
    if batch == 0:
        return idx, w
    if num_blocks > _PREFIX_CHUNK:
        _chunked_sample(wrap, leaves, block_sums, rand, size, beta, block, capacity, prefix, total, last, idx, w)
        _launch_weights(wrap, w, batch, members)
        return idx, w
    chunk = min(_next_p2(num_blocks), _PREFIX_CHUNK)
    wrap(_per_prefix_kernel)[(members,)](
        leaves, block_sums, size, prefix, total, last,
        NUM_BLOCKS=num_blocks, BLOCK=block, CAPACITY=capacity, CHUNK=chunk,
        num_warps=8 if chunk >= 2048 else 4,
    )
    items, search_p2, fine = _search_layout(num_blocks, block, batch)
    wrap(_per_search_kernel)[(triton.cdiv(batch, items), members)](
        leaves, prefix, total, last, rand, size, beta, idx, w, batch,
        NUM_BLOCKS=num_blocks, BLOCK=block, CAPACITY=capacity, ITEMS=items,
        SEARCH_P2=search_p2, FINE=fine, num_warps=4,
    )
    _launch_weights(wrap, w, batch, members)
    return idx, w


def _launch_weights(wrap, w, batch: int, members: int) -> None:
    wchunk = min(_next_p2(batch), 4096)
    wrap(_per_weights_kernel)[(members,)](w, w, batch, CHUNK=wchunk, num_warps=4 if wchunk <= 1024 else 8)


def _chunked_sample(wrap, leaves, block_sums, rand, size, beta, block, capacity, local, total, last, idx, w):
    """Kernels 1a, 1b and 2' of the module docstring ("Chunked"): ``local`` takes the local prefix;
    ``idx`` and ``w`` (the log-weights, for the weights kernel) are written."""
    num_blocks, batch, dev = block_sums.shape[-1], rand.shape[-1], leaves.device
    members = leaves.shape[0] if leaves.dim() == 2 else 1
    local_width = min(_LOCAL, _next_p2(num_blocks))
    chunks = triton.cdiv(num_blocks, local_width)
    chunk_mass = torch.empty(members, chunks, dtype=torch.float64, device=dev)
    chunk_last = torch.empty(members, chunks, dtype=torch.int64, device=dev)
    carry = torch.empty(members, chunks, dtype=torch.float64, device=dev)
    wrap(_per_chunk_kernel)[(chunks, members)](
        leaves, block_sums, size, local, chunk_mass, chunk_last,
        NUM_BLOCKS=num_blocks, BLOCK=block, CAPACITY=capacity, LOCAL=local_width, num_warps=4,
    )
    carry_chunk = _next_p2(min(chunks, _PREFIX_CHUNK))
    wrap(_per_carry_kernel)[(members,)](
        leaves, size, chunk_mass, chunk_last, carry, total, last, chunks,
        BLOCK=block, CAPACITY=capacity, CHUNK=carry_chunk, num_warps=8 if carry_chunk >= 2048 else 4,
    )
    g_p2 = _next_p2(chunks)
    items = max(1, min(_next_p2(batch), _TILE // max(block, local_width, g_p2)))
    wrap(_per_chunk_search_kernel)[(triton.cdiv(batch, items), members)](
        leaves, local, carry, chunk_last, total, last, rand, size, beta, idx, w, batch, chunks,
        NUM_BLOCKS=num_blocks, BLOCK=block, CAPACITY=capacity, ITEMS=items, G_P2=g_p2, LOCAL=local_width,
        num_warps=4,
    )


@device_op("foxdqn::per_sample", mutates_args=())
def _per_sample_op(
    leaves: torch.Tensor,
    block_sums: torch.Tensor,
    rand: torch.Tensor,
    size: torch.Tensor,
    beta: torch.Tensor,
    block: int,
    capacity: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    return _per_sample_launch(leaves, block_sums, rand, size, beta, block, capacity, wrap_triton)


# ----------------------------------------------------------------------------------------------
# Reference (plain torch: one f64 cumsum over all leaves + searchsorted)
# ----------------------------------------------------------------------------------------------
def per_sample_reference(
    state: PERState, rand: torch.Tensor, size: torch.Tensor, beta: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch stratified proportional sampling; same contract and edge rules as
    :func:`per_sample`, O(capacity) per call, no host sync. With a member axis every member's row
    is sampled on its own (one batched cumsum and searchsorted over the rows)."""
    cap, p = state.capacity, state.num_members
    leaves = state.leaves.view(p, -1)[:, :cap]  # (P, C)
    batch = rand.shape[-1]
    dev = leaves.device
    if batch == 0:
        return (torch.empty(rand.shape, dtype=torch.int64, device=dev),
                torch.empty(rand.shape, dtype=torch.float32, device=dev))
    size_c = size.to(torch.int64).clamp(1, cap)
    pos = torch.arange(cap, device=dev)
    lv = torch.where(pos < size_c, leaves, torch.zeros((), dtype=leaves.dtype, device=dev))
    cum = torch.cumsum(lv.to(torch.float64), dim=1)  # (P, C)
    total = cum[:, -1:]  # (P, 1)
    u = torch.nan_to_num(rand.view(p, batch).to(torch.float32), nan=0.0).clamp(0.0, _ONE_MINUS)
    x = (torch.arange(batch, device=dev, dtype=torch.float64) + u.to(torch.float64)) / batch  # (P, B)
    target = x * total
    idx = torch.searchsorted(cum, target, right=True)  # first slot with cum > target
    last = torch.where(lv > 0, pos, torch.full_like(pos, -1)).amax(dim=1, keepdim=True)  # (P, 1)
    idx = torch.minimum(idx, last)  # float error beyond the last nonzero leaf -> clamp
    uniform = last < 0
    uidx = torch.minimum((x * size_c.to(torch.float64)).to(torch.int64), size_c - 1)
    idx = torch.where(uniform, uidx, idx)
    prob = leaves.gather(1, idx).to(torch.float64) / total  # P(i), eq. 1
    w = (size_c.to(torch.float64) * prob).pow(-beta.view(p, 1).to(torch.float64))  # §3.4
    w = w / w.amax(dim=1, keepdim=True)
    w = torch.where(uniform, torch.ones_like(w), w)
    return idx.view(rand.shape), w.to(torch.float32).view(rand.shape)


# ----------------------------------------------------------------------------------------------
# Public op
# ----------------------------------------------------------------------------------------------
def _check_args(state: PERState, rand, size, beta) -> None:
    dev = state.leaves.device
    lead = () if state.members is None else (state.members,)
    if not isinstance(rand, torch.Tensor) or rand.dim() != len(lead) + 1 or tuple(rand.shape[:-1]) != lead \
            or rand.dtype != torch.float32:
        raise ValueError(f"per_sample: rand must be a float32 tensor [{', '.join(map(str, lead + ('B',)))}], got "
                         f"{getattr(rand, 'dtype', type(rand))} shape {tuple(getattr(rand, 'shape', ()))}")
    if not isinstance(size, torch.Tensor) or size.dim() != 0 or size.dtype not in (torch.int64, torch.int32):
        raise ValueError("per_sample: size must be a 0-d int64 (or int32) tensor on the state's device")
    if not isinstance(beta, torch.Tensor) or tuple(beta.shape) != lead or not beta.dtype.is_floating_point:
        raise ValueError(f"per_sample: beta must be a float tensor of shape {list(lead)} (one per member) on the "
                         "state's device")
    for name, t in (("rand", rand), ("size", size), ("beta", beta)):
        if t.device != dev:
            raise ValueError(f"per_sample: {name} is on {t.device}, the state on {dev}")


def per_sample(
    state: PERState, rand: torch.Tensor, size: torch.Tensor, beta: torch.Tensor, backend: str = "auto"
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Draw a stratified proportional batch and its importance-sampling weights.

    Item ``k`` of ``B`` targets the mass ``(k + rand[k]) / B * total`` where
    ``total = sum_{i < size} leaves[i]``, and returns the slot whose cumulative mass interval
    holds it, so slot ``i`` is drawn with probability ``P(i) = leaves[i] / total``
    (Schaul et al. 2016 eq. 1, §3.3 proportional variant with stratification).

    Args:
        state: the :class:`PERState` (read only).
        rand: f32 ``[B]`` (``[P, B]`` for a state with P members: B per member), uniforms in
            ``[0, 1)`` drawn by the caller (e.g. ``torch.rand`` with a generator registered with
            the CUDA graph, or each member's own stream); clamped to ``[0, 1)``.
        size: 0-d int64 device tensor, number of valid slots (of every member); slots ``>= size``
            are never drawn.
        beta: 0-d (``[P]``: each member's) float device tensor, IS exponent of §3.4 (anneal it on
            the device).
        backend: ``"auto"`` (Triton for CUDA tensors, reference otherwise), ``"triton"``,
            ``"torch"``.

    Returns:
        ``(indices, weights)``: int64 in ``[0, size)`` and f32, ``rand``'s shape,
        ``w_k = (size * P(i_k))^(-beta) / max_j (size * P(i_j))^(-beta)`` (max over this batch;
        with members, over the member's own B, with its own ``P`` and ``beta``), so the largest
        weight (of each member) is 1. Edge rules (zero priorities, all-zero, float clamping,
        ``size`` clamping): see the module docstring.

    Raises:
        ValueError: wrong dtype, shape or device of ``rand``, ``size`` or ``beta``; unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check_args(state, rand, size, beta)
    if resolve_backend("per_sample", backend, state.leaves) == "torch":
        return per_sample_reference(state, rand, size, beta)
    return _per_sample_op(
        state.leaves, state.block_sums, rand, size, beta, state.block, state.capacity
    )
