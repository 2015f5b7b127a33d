"""Priority writes into the blocked sum: TD-error updates and insertion of fresh slots.

Source: Schaul et al. 2016, "Prioritized Experience Replay", §3.3 (proportional variant):
priority ``p_i = |delta_i| + eps``, stored leaf ``p_i^alpha`` (eq. 1), new transitions get the
maximal priority seen so far. No host synchronisation, fixed shapes, CUDA-graph capturable
(docs/design/guard.md#skip: a bad step is skipped on the device through a
0-d ``skip`` flag written by the training guard; docs/design/hot_loop.md#the-contract, rules 1, 3, 5).

``per_update`` = three kernels:

1. ``_per_zero_kernel``: ``leaves[idx] = 0`` for every touched slot.
2. ``_per_scatter_max_kernel``: ``atomic_max(leaves[idx], (|td| + eps)^alpha)``. Leaves are
   >= 0, so after step 1 the float ``atomic_max`` leaves the largest value among duplicates:
   order-independent, hence deterministic. A non-finite ``|td|`` (NaN, Inf) uses the
   ``max_priority`` read before this update instead (the item stays sampleable and cannot
   poison the sums; normally the guard's ``skip`` flag catches such a step first).
3. ``_per_block_sum_kernel``: item ``k`` recomputes ``block_sums[idx_k // block]`` as the f32
   sum of the block's leaves, unless item ``k-1`` touched the same block (then that one does);
   two items that touch the same block non-adjacently both write the same value (same data,
   same reduction), so the result is deterministic and each block costs one read when the
   indices are sorted or contiguous (the usual ring-buffer insert). It also raises
   ``max_priority`` by ``atomic_max`` over the finite raw priorities of the batch.

``per_insert`` = ``_per_insert_kernel`` (``leaves[idx] = max_priority^alpha``) + kernel 3
without the max update. ``per_insert_row`` inserts the contiguous slots ``row·N .. row·N + N − 1``
(a replay ring's time row ``row`` of N envs, the row a device tensor) in one kernel,
``_per_insert_row_kernel``: program ``b`` owns the ``b``-th block the range touches, writes its
slots of the range and sums the block from the values it holds (no other program writes that
block, so no second pass); the same leaves and, up to the f32 sum's order, the same block sums as
``per_insert`` of those slots.

Rules: duplicates -> the largest ``|td|`` wins; ``skip`` (0-d f32) != 0 -> nothing is written
(leaves, block sums, ``max_priority`` bit-identical); indices must lie in ``[0, capacity)``
(the kernels ignore others, the reference raises an index error); ``td_abs`` is taken in
absolute value again (a signed TD error is accepted); ``alpha == 0`` gives leaf 1 for every
priority including 0 (``0^0 = 1``).

Member axis (``PERState(members=P)``, a population's P sums): ``indices`` and ``td_abs`` are
``[P, N]`` (member p's N slots of its own sum) and ``skip`` is ``[P]`` (each member's guard flag);
every kernel has a second grid axis over the members, and member p's programs read and write only
its rows (leaves, block sums, ``max_priority``, ``alpha``, ``eps``, its items and its skip flag),
so member p's row changes exactly as a state without the member axis given its items would, and
a skipped member leaves its row bit-identical while the others are written.
"""
from typing import Optional

import torch
import triton
import triton.language as tl

from foxdqn.ops.backend import resolve_backend
from foxdqn.ops.library import device_op, wrap_triton
from foxdqn.ops.per_state import PERState

__all__ = ["per_update", "per_update_reference", "per_insert", "per_insert_reference", "per_insert_row",
           "per_insert_row_reference"]

_ZERO_BLOCK = 1024  # items per program of the elementwise kernels
_SUM_TILE = 1024  # elements per program of the block-sum kernel (ITEMS * block)


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _leaf_value(q, alpha):
    # q^alpha for q >= 0 (no libdevice pow: exp2/log2 work in the interpreter too); 0^0 = 1.
    pw = tl.exp2(alpha * tl.log2(tl.where(q > 0, q, 1.0)))
    return tl.where(q > 0, pw, tl.where(alpha == 0.0, 1.0, 0.0))


@triton.jit
def _member_rows(leaves_ptr, idx_ptr, N, STRIDE: tl.constexpr):
    """Member ``program_id(1)``'s leaves and items: ``leaves_ptr`` and ``idx_ptr`` moved to its
    rows (``STRIDE`` leaves and ``N`` items per member), and the member as int64."""
    m = tl.program_id(1).to(tl.int64)
    return leaves_ptr + m * STRIDE, idx_ptr + m * N, m


@triton.jit
def _per_zero_kernel(leaves_ptr, idx_ptr, skip_ptr, N, CAPACITY: tl.constexpr, STRIDE: tl.constexpr,
                     HAS_SKIP: tl.constexpr, BLOCK_N: tl.constexpr):
    leaves_ptr, idx_ptr, m = _member_rows(leaves_ptr, idx_ptr, N, STRIDE)
    skip_ptr += m
    n = N
    if HAS_SKIP:  # skip folded into the item count (a skipped call touches nothing)
        n = tl.where(tl.load(skip_ptr).to(tl.float32) == 0.0, N, 0)
    k = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = k < n
    idx = tl.load(idx_ptr + k, mask=m, other=0).to(tl.int64)
    m = m & (idx >= 0) & (idx < CAPACITY)
    tl.store(leaves_ptr + idx, tl.zeros([BLOCK_N], dtype=tl.float32), mask=m)


@triton.jit
def _per_scatter_max_kernel(leaves_ptr, idx_ptr, td_ptr, maxp_ptr, alpha_ptr, eps_ptr, skip_ptr, N,
                            CAPACITY: tl.constexpr, STRIDE: tl.constexpr, HAS_SKIP: tl.constexpr,
                            BLOCK_N: tl.constexpr):
    leaves_ptr, idx_ptr, m = _member_rows(leaves_ptr, idx_ptr, N, STRIDE)
    td_ptr += m * N
    maxp_ptr += m
    alpha_ptr += m
    eps_ptr += m
    skip_ptr += m
    n = N
    if HAS_SKIP:  # skip folded into the item count (a skipped call touches nothing)
        n = tl.where(tl.load(skip_ptr).to(tl.float32) == 0.0, N, 0)
    k = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = k < n
    idx = tl.load(idx_ptr + k, mask=m, other=0).to(tl.int64)
    m = m & (idx >= 0) & (idx < CAPACITY)
    a = tl.abs(tl.load(td_ptr + k, mask=m, other=0.0).to(tl.float32))
    finite = (a == a) & (a < float("inf"))
    q = tl.where(finite, a + tl.load(eps_ptr), tl.load(maxp_ptr))
    v = _leaf_value(q, tl.load(alpha_ptr))
    tl.atomic_max(leaves_ptr + idx, v, mask=m)


@triton.jit
def _per_insert_kernel(leaves_ptr, idx_ptr, maxp_ptr, alpha_ptr, N, CAPACITY: tl.constexpr, STRIDE: tl.constexpr,
                       BLOCK_N: tl.constexpr):
    leaves_ptr, idx_ptr, m = _member_rows(leaves_ptr, idx_ptr, N, STRIDE)
    maxp_ptr += m
    alpha_ptr += m
    k = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = k < N
    idx = tl.load(idx_ptr + k, mask=m, other=0).to(tl.int64)
    m = m & (idx >= 0) & (idx < CAPACITY)
    v = _leaf_value(tl.load(maxp_ptr), tl.load(alpha_ptr))
    tl.store(leaves_ptr + idx, tl.zeros([BLOCK_N], dtype=tl.float32) + v, mask=m)


@triton.jit
def _per_insert_row_kernel(leaves_ptr, block_sums_ptr, row_ptr, maxp_ptr, alpha_ptr, N, CAPACITY: tl.constexpr,
                           BLOCK: tl.constexpr):
    num_blocks: tl.constexpr = (CAPACITY + BLOCK - 1) // BLOCK
    m = tl.program_id(1).to(tl.int64)
    leaves_ptr += m * (num_blocks * BLOCK)
    block_sums_ptr += m * num_blocks
    lo = tl.load(row_ptr).to(tl.int64) * N  # the slots lo .. lo + N - 1
    hi = lo + N
    blk = tl.maximum(lo, 0) // BLOCK + tl.program_id(0)
    first = blk * BLOCK + tl.zeros([BLOCK], dtype=tl.int64)  # the block's first slot, in every lane
    pos = first + tl.arange(0, BLOCK)
    own = (first < hi) & (first < num_blocks * BLOCK)  # the whole block, or nothing
    new = own & (pos >= lo) & (pos < hi) & (pos < CAPACITY)
    v = _leaf_value(tl.load(maxp_ptr + m), tl.load(alpha_ptr + m))
    lv = tl.where(new, v, tl.load(leaves_ptr + pos, mask=own, other=0.0))
    tl.store(leaves_ptr + pos, lv, mask=new)
    tl.store(block_sums_ptr + blk, tl.sum(lv, axis=0), mask=(blk * BLOCK < hi) & (blk < num_blocks))


@triton.jit
def _per_block_sum_kernel(leaves_ptr, block_sums_ptr, idx_ptr, td_ptr, maxp_ptr, eps_ptr, skip_ptr, N,
                          CAPACITY: tl.constexpr, BLOCK: tl.constexpr, ITEMS: tl.constexpr,
                          HAS_SKIP: tl.constexpr, UPDATE_MAX: tl.constexpr):
    leaves_ptr, idx_ptr, m = _member_rows(leaves_ptr, idx_ptr, N, ((CAPACITY + BLOCK - 1) // BLOCK) * BLOCK)
    block_sums_ptr += m * ((CAPACITY + BLOCK - 1) // BLOCK)
    td_ptr += m * N
    maxp_ptr += m
    eps_ptr += m
    skip_ptr += m
    n = N
    if HAS_SKIP:  # skip folded into the item count (a skipped call touches nothing)
        n = tl.where(tl.load(skip_ptr).to(tl.float32) == 0.0, N, 0)
    k = tl.program_id(0) * ITEMS + tl.arange(0, ITEMS)  # (I,)
    km = k < n
    idx = tl.load(idx_ptr + k, mask=km, other=0).to(tl.int64)
    valid = km & (idx >= 0) & (idx < CAPACITY)
    prev = tl.load(idx_ptr + k - 1, mask=km & (k > 0), other=-1).to(tl.int64)
    prev_ok = (prev >= 0) & (prev < CAPACITY)
    blk = tl.maximum(idx, 0) // BLOCK
    prev_blk = tl.where(prev_ok, tl.maximum(prev, 0) // BLOCK, -1)
    do = valid & (prev_blk != blk)  # first item of a run touching this block
    offs = tl.arange(0, BLOCK)
    pos = blk[:, None] * BLOCK + offs[None, :]  # (I, BLOCK)
    lv = tl.load(leaves_ptr + pos, mask=do[:, None], other=0.0)
    tl.store(block_sums_ptr + blk, tl.sum(lv, axis=1), mask=do)
    if UPDATE_MAX:
        a = tl.abs(tl.load(td_ptr + k, mask=valid, other=0.0).to(tl.float32))
        finite = (a == a) & (a < float("inf"))
        q = tl.where(valid & finite, a + tl.load(eps_ptr), 0.0)
        qm = tl.max(q, axis=0)
        # max_priority only grows, so a stale read can only cause a redundant atomic, never a
        # missed one; most programs skip the same-address atomic this way.
        tl.atomic_max(maxp_ptr, qm, mask=qm > tl.load(maxp_ptr))


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
def _sum_items(block: int, n: int) -> int:
    items = max(1, _SUM_TILE // block)
    return max(1, min(items, 1 << max(0, (n - 1).bit_length())))


def _per_update_launch(leaves, block_sums, max_priority, indices, td_abs, alpha, eps, skip, block, capacity,
                       launch=None):
    wrap = launch if launch is not None else (lambda kern: kern)
    n = indices.shape[-1]
    members = indices.shape[0] if indices.dim() == 2 else 1  # one more grid axis: the members
    if n == 0:
        return
    has_skip = skip is not None
    skip_t = skip if has_skip else td_abs  # dummy pointer, never read (not aliased with a written arg)
    grid = (triton.cdiv(n, _ZERO_BLOCK), members)
    stride = leaves.shape[-1]
    wrap(_per_zero_kernel)[grid](leaves, indices, skip_t, n, CAPACITY=capacity, STRIDE=stride, HAS_SKIP=has_skip,
                                 BLOCK_N=_ZERO_BLOCK, num_warps=4)
    wrap(_per_scatter_max_kernel)[grid](leaves, indices, td_abs, max_priority, alpha, eps, skip_t, n,
                                        CAPACITY=capacity, STRIDE=stride, HAS_SKIP=has_skip, BLOCK_N=_ZERO_BLOCK,
                                        num_warps=4)
    items = _sum_items(block, n)
    wrap(_per_block_sum_kernel)[(triton.cdiv(n, items), members)](
        leaves, block_sums, indices, td_abs, max_priority, eps, skip_t, n,
        CAPACITY=capacity, BLOCK=block, ITEMS=items, HAS_SKIP=has_skip, UPDATE_MAX=True, num_warps=4,
    )


def _per_insert_launch(leaves, block_sums, max_priority, alpha, indices, block, capacity, launch=None):
    wrap = launch if launch is not None else (lambda kern: kern)
    n = indices.shape[-1]
    members = indices.shape[0] if indices.dim() == 2 else 1  # one more grid axis: the members
    if n == 0:
        return
    wrap(_per_insert_kernel)[(triton.cdiv(n, _ZERO_BLOCK), members)](
        leaves, indices, max_priority, alpha, n, CAPACITY=capacity, STRIDE=leaves.shape[-1], BLOCK_N=_ZERO_BLOCK,
        num_warps=4
    )
    items = _sum_items(block, n)
    wrap(_per_block_sum_kernel)[(triton.cdiv(n, items), members)](
        leaves, block_sums, indices, indices, max_priority, alpha, alpha, n,  # td/eps/skip: unused dummies
        CAPACITY=capacity, BLOCK=block, ITEMS=items, HAS_SKIP=False, UPDATE_MAX=False, num_warps=4,
    )


@device_op("foxdqn::per_insert_row", mutates_args=("leaves", "block_sums"))
def _per_insert_row_op(leaves: torch.Tensor, block_sums: torch.Tensor, max_priority: torch.Tensor,
                       alpha: torch.Tensor, row: torch.Tensor, n: int, block: int, capacity: int) -> None:
    members = leaves.shape[0] if leaves.dim() == 2 else 1
    wrap_triton(_per_insert_row_kernel)[(triton.cdiv(n, block) + 1, members)](
        leaves, block_sums, row, max_priority, alpha, n, CAPACITY=capacity, BLOCK=block, num_warps=4)


@device_op("foxdqn::per_update", mutates_args=("leaves", "block_sums", "max_priority"))
def _per_update_op(
    leaves: torch.Tensor,
    block_sums: torch.Tensor,
    max_priority: torch.Tensor,
    indices: torch.Tensor,
    td_abs: torch.Tensor,
    alpha: torch.Tensor,
    eps: torch.Tensor,
    skip: Optional[torch.Tensor],
    block: int,
    capacity: int,
) -> None:
    _per_update_launch(leaves, block_sums, max_priority, indices, td_abs, alpha, eps, skip, block, capacity,
                       wrap_triton)


@device_op("foxdqn::per_insert", mutates_args=("leaves", "block_sums"))
def _per_insert_op(
    leaves: torch.Tensor,
    block_sums: torch.Tensor,
    max_priority: torch.Tensor,
    alpha: torch.Tensor,
    indices: torch.Tensor,
    block: int,
    capacity: int,
) -> None:
    _per_insert_launch(leaves, block_sums, max_priority, alpha, indices, block, capacity, wrap_triton)


# ----------------------------------------------------------------------------------------------
# References (plain torch: scatter_reduce amax + per-touched-block sums)
# ----------------------------------------------------------------------------------------------
def _rows(state: PERState) -> tuple[torch.Tensor, ...]:
    """``(leaves, block_sums, max_priority, alpha, eps)`` of ``state`` as member rows: views
    ``[P, capacity_padded]``, ``[P, num_blocks]`` and ``[P, 1]`` (P = 1 without a member axis),
    so that writes into them write the state."""
    p = state.num_members
    return (state.leaves.view(p, -1), state.block_sums.view(p, -1), state.max_priority.view(p, 1),
            state.alpha.view(p, 1), state.eps.view(p, 1))


def _touched_block_sums_(state: PERState, idx: torch.Tensor, apply: Optional[torch.Tensor]) -> None:
    leaves, block_sums = _rows(state)[:2]
    blk = idx // state.block  # (P, N)
    member = torch.arange(blk.shape[0], device=blk.device)[:, None].expand_as(blk)
    sums = leaves.view(blk.shape[0], state.num_blocks, state.block)[member, blk].sum(dim=-1)  # (P, N)
    if apply is not None:
        sums = torch.where(apply, sums, block_sums.gather(1, blk))
    block_sums.index_put_((member, blk), sums)  # duplicates write identical values


def per_update_reference(state: PERState, indices: torch.Tensor, td_abs: torch.Tensor,
                         skip: Optional[torch.Tensor] = None) -> None:
    """Plain-torch :func:`per_update` (same rules, member axis included), in place, no host sync."""
    if indices.shape[-1] == 0:
        return
    leaves, _, max_priority, alpha, eps = _rows(state)
    p = state.num_members
    idx = indices.to(torch.int64).view(p, -1)
    a = td_abs.to(torch.float32).abs().view(p, -1)
    finite = torch.isfinite(a)
    q = torch.where(finite, a + eps, max_priority)  # raw priority, Schaul §3.3
    v = q.pow(alpha)  # torch.pow(0, 0) = 1
    apply = None
    if skip is not None:
        apply = skip.to(torch.float32).view(-1, 1) == 0.0  # (P, 1), or (1, 1) for one flag
        v = torch.where(apply, v, leaves.gather(1, idx))  # skipped: write back the old leaves
    leaves.scatter_reduce_(1, idx, v, reduce="amax", include_self=False)  # duplicates: max wins
    _touched_block_sums_(state, idx, apply)
    qmax = torch.where(finite, q, torch.zeros_like(q)).amax(dim=1, keepdim=True)
    new_max = torch.maximum(max_priority, qmax)
    if apply is not None:
        new_max = torch.where(apply, new_max, max_priority)
    max_priority.copy_(new_max)


def per_insert_reference(state: PERState, indices: torch.Tensor) -> None:
    """Plain-torch :func:`per_insert` (member axis included), in place, no host sync."""
    if indices.shape[-1] == 0:
        return
    leaves, _, max_priority, alpha, _ = _rows(state)
    idx = indices.to(torch.int64).view(state.num_members, -1)
    v = max_priority.pow(alpha).expand(idx.shape)
    leaves.scatter_(1, idx, v)
    _touched_block_sums_(state, idx, None)


# ----------------------------------------------------------------------------------------------
# Public ops
# ----------------------------------------------------------------------------------------------
def _lead(state: PERState) -> tuple:
    """The member shape of ``state``'s per-member values: ``()`` or ``(P,)``."""
    return () if state.members is None else (state.members,)


def _check_indices(name: str, state: PERState, indices: torch.Tensor) -> None:
    lead = _lead(state)
    if not isinstance(indices, torch.Tensor) or indices.dim() != len(lead) + 1 or tuple(indices.shape[:-1]) != lead \
            or indices.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name}: indices must be an int64 (or int32) tensor [{', '.join(map(str, lead + ('N',)))}]")
    if indices.device != state.leaves.device:
        raise ValueError(f"{name}: indices are on {indices.device}, the state on {state.leaves.device}")


def per_update(state: PERState, indices: torch.Tensor, td_abs: torch.Tensor,
               skip: Optional[torch.Tensor] = None, backend: str = "auto") -> None:
    """Write new priorities for sampled slots after a learning step (Schaul §3.3), in place.

    For each ``k``: raw priority ``q_k = |td_abs[k]| + eps`` (``max_priority`` as read before
    this call when ``td_abs[k]`` is NaN or Inf), ``leaves[indices[k]] = q_k^alpha``; when a slot
    appears several times, the largest ``q`` wins (order-independent, deterministic). Then the
    sums of the touched blocks are recomputed from their leaves and
    ``max_priority = max(max_priority, max of the finite q_k)``.

    Args:
        state: :class:`PERState`; ``leaves``, ``block_sums`` and ``max_priority`` are written.
        indices: int64 ``[N]`` slots in ``[0, capacity)`` (usually the sampled batch); with P
            members ``[P, N]``, row p member p's slots of its own sum.
        td_abs: float of ``indices``' shape, ``|TD error|`` per item (absolute value is taken again).
        skip: optional 0-d f32 device tensor (``[P]``: one per member); any value != 0 (1.0: the
            training guard's skip flag) leaves the whole state (member p's row) bit-identical.
        backend: ``"auto"`` | ``"triton"`` | ``"torch"``.

    Raises:
        ValueError: wrong rank, dtype or device of an argument; shape mismatch; unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check_indices("per_update", state, indices)
    if not isinstance(td_abs, torch.Tensor) or td_abs.shape != indices.shape or not td_abs.dtype.is_floating_point:
        raise ValueError(f"per_update: td_abs must be a float tensor of shape {tuple(indices.shape)}")
    if td_abs.device != state.leaves.device:
        raise ValueError(f"per_update: td_abs is on {td_abs.device}, the state on {state.leaves.device}")
    if skip is not None and (not isinstance(skip, torch.Tensor) or tuple(skip.shape) != _lead(state)
                             or skip.device != state.leaves.device):
        raise ValueError(f"per_update: skip must be a tensor of shape {list(_lead(state))} (one flag per member) "
                         "on the state's device (or None)")
    if resolve_backend("per_update", backend, state.leaves) == "torch":
        per_update_reference(state, indices, td_abs, skip)
        return
    _per_update_op(
        state.leaves, state.block_sums, state.max_priority, indices.contiguous(), td_abs.contiguous(), state.alpha,
        state.eps,
        skip, state.block, state.capacity,
    )


def per_insert(state: PERState, indices: torch.Tensor, backend: str = "auto") -> None:
    """Give freshly written slots the maximal priority seen so far (Schaul §3.3), in place.

    ``leaves[indices] = max_priority^alpha`` (duplicates write the same value), then the sums of
    the touched blocks are recomputed. ``max_priority`` is not changed.

    Args:
        state: :class:`PERState`; ``leaves`` and ``block_sums`` are written.
        indices: int64 ``[N]`` slots in ``[0, capacity)`` just written by the replay buffer
            (contiguous or sorted indices cost one block read per touched block); with P members
            ``[P, N]``, row p member p's slots (each gets member p's ``max_priority^alpha``).
        backend: ``"auto"`` | ``"triton"`` | ``"torch"``.

    Raises:
        ValueError: wrong rank, dtype or device of ``indices``; unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check_indices("per_insert", state, indices)
    if resolve_backend("per_insert", backend, state.leaves) == "torch":
        per_insert_reference(state, indices)
        return
    _per_insert_op(
        state.leaves, state.block_sums, state.max_priority, state.alpha, indices.contiguous(), state.block,
        state.capacity
    )


def _row_slots(state: PERState, row: torch.Tensor, n: int) -> torch.Tensor:
    """int64 ``[N]`` (``[P, N]``): the slots ``row·n + e`` of :func:`per_insert_row`, every member's."""
    slots = row.to(torch.int64) * n + torch.arange(n, device=row.device)
    return slots if state.members is None else slots.expand(state.members, n)


def per_insert_row_reference(state: PERState, row: torch.Tensor, n: int) -> None:
    """Plain-torch :func:`per_insert_row`: :func:`per_insert_reference` of the slots ``row·n + e``."""
    per_insert_reference(state, _row_slots(state, row, n))


def per_insert_row(state: PERState, row: torch.Tensor, n: int, backend: str = "auto") -> None:
    """:func:`per_insert` of the contiguous slots ``row·n .. row·n + n − 1`` (a replay ring's time
    row ``row`` of ``n`` envs; with P members, every member's slots), in place, in one kernel on
    the device (module docstring): ``leaves[row·n + e] = max_priority^alpha`` (member p's), then
    the sums of the touched blocks. Slots outside ``[0, capacity)`` are ignored by the kernel (the
    reference raises an index error).

    Args:
        state: :class:`PERState`; ``leaves`` and ``block_sums`` are written.
        row: int64 ``[1]`` (or 0-d) device tensor, the time row (read on the device: no host sync).
        n: slots per row (``>= 0``), a Python int.
        backend: ``"auto"`` | ``"triton"`` | ``"torch"``.

    Raises:
        ValueError: ``row`` not an integer tensor of one element on the state's device, or ``n`` < 0;
            unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    if not isinstance(row, torch.Tensor) or row.numel() != 1 or row.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"per_insert_row: row must be an int64 (or int32) tensor of one element, got {row!r}")
    if row.device != state.leaves.device:
        raise ValueError(f"per_insert_row: row is on {row.device}, the state on {state.leaves.device}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"per_insert_row: n must be an int >= 0, got {n!r}")
    if resolve_backend("per_insert_row", backend, state.leaves) == "torch":
        per_insert_row_reference(state, row, n)
        return
    if n:
        _per_insert_row_op(state.leaves, state.block_sums, state.max_priority, state.alpha, row.reshape(1), n,
                           state.block, state.capacity)
