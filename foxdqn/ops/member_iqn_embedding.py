r"""P members' IQN quantile embedding times the state features in one kernel: ψ(s) ⊙ φ(τ).

    φ_j(τ) = ReLU(Σ_{i<n} cos(π i τ) w_ij + b_j)          (IQN eq. 4, Dabney et al. 2018)
    x_p[m·N + k] = h_p[m] ⊙ φ_p(τ_p[m, k])                  (p = 0 .. P − 1)

h float32 ``[P, M, H]`` (ψ(s), the encoder's features), τ float32 ``[P, M, N]`` (N fractions per
row; any strides: the policy's K fixed midpoints broadcast over the rows are an expanded view),
``pi_i`` float32 ``[n]`` (π·i, :class:`foxdqn.nn.iqn.CosineEmbedding`'s buffer), W ``[P, n, H]`` and
b ``[P, 1, H]`` (each member's ``embedding.linear`` transposed, the population's layout:
:class:`foxdqn.population.distributional.MemberIQNNetwork`), x float32 ``[P, M·N, H]``, the hidden
layer's input. Through torch ops that is the multiply τ·π i, ``cos``, the Linear with its ReLU
(``foxdqn.ops.member_linear``) and the multiply by ψ(s) broadcast over the fractions: four kernels
and three ``[P, M·N, ·]`` intermediates in memory; here one kernel that writes x only (issue 33:
kernels per update; the IQN population's three passes per update take it).

Kernels (Triton).

* forward, a grid of (blocks of ``BLOCK_M`` rows of M·N, blocks of ``BLOCK_N`` columns of H, P):
  a program computes cos(τ_r · π i) of its rows in registers (the ``[BLOCK_M, BLOCK_E]`` operand,
  ``BLOCK_E = max(16, next_pow2(n))``, zero past n), one ``tl.dot`` with W's ``[BLOCK_E, BLOCK_N]``
  tile, adds b in float32 after the product (as ``F.linear``), the ReLU, then multiplies by row
  m's features: x = h[m] · φ (one rounding, as torch's multiply). With ``h_next`` (no gradient:
  the online network's policy pass over s and s'), rows m >= M take their features from h_next's
  row m − M, so the two sets of rows need no concatenation.
* backward, a grid of (M, blocks of ``BLOCK_N`` columns, P): a program takes one row m of h and its
  N fractions in chunks of ``BLOCK_J``, recomputes z = cos · W + b, and from dx writes dz = dx · h[m]
  where φ > 0 (else 0: the ReLU's backward), and dh[m] = Σ_k dx[m·N + k] · φ(τ[m, k]) summed over the
  fractions in increasing chunks (the multiply's backward with its broadcast's sum); the first
  column block also writes cos(τ · π i) of its rows. Where b needs its gradient, each program also
  stores its row's Σ_k dz, and the last program of each (member, column block) (a ticket each:
  :func:`foxdqn.ops.tensor_list.last_of_group`) sums the M rows' parts in row order into
  db = Σ_rows dz. dW = cosᵀ dz (``torch.bmm``, cuBLAS) follows: two launches where the torch ops'
  backward takes five.

A program reads member p's rows and parameters only: members never mix. The tiles do not depend
on P, so member p of P equals a population of one bit for bit. NaN or ±inf in τ or h reach only the
rows they are in (and, through dz, W's gradient, as in the reference).

Precision: :mod:`foxdqn.ops.mlp_chain`'s rule for the product (TF32 operands rounded to nearest
where torch runs float32 CUDA matmuls in TF32, the run's default; else IEEE float32). τ · π i is
rounded to float32 before the cosine, as torch's multiply; Triton's cosine (libdevice ``cos`` on
CUDA, numpy's in the interpreter) may differ from torch's by an ulp. So x and the gradients equal
:func:`member_iqn_embedding_reference` to float rounding (about 1e-6 relative in IEEE float32,
1e-3 in TF32).

Capture: device ops only; outputs ``torch.empty`` (from a graph's pool inside a capture).

Source: Dabney, Ostrovski, Silver & Munos (2018), "Implicit Quantile Networks for Distributional
Reinforcement Learning", eq. 4 and §3 (ψ(s) ⊙ φ(τ)); the Linear layer and ReLU as ``torch.nn``
defines them.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, float32_problem, resolve_backend
from foxdqn.ops.library import wrap_triton
from foxdqn.ops.member_linear import _tile, member_batched
from foxdqn.ops.mlp_chain import _prec, _tf32
from foxdqn.ops.tensor_list import group_scratch, last_of_group, sum_of_parts

__all__ = ["member_iqn_embedding", "member_iqn_embedding_reference", "member_iqn_embedding_supported"]

#: Rows (of M·N) per forward program: 32, so Triton compiles the product to mma.sync, whose
#: operands load straight from registers and swizzled shared memory (docs/bench.md#kernels: at 64
#: rows, wgmma's B operand goes back to shared memory after the TF32 rounding).
BLOCK_M = 32
BLOCK_N = 128  # columns of H per program (forward and backward): each recomputes its rows' cosines
BLOCK_J = 32  # fractions per step of the backward's loop over a row's N fractions
NUM_WARPS = 4
MAX_EMBEDDING = 128  # n: the cosine basis in one [*, 128] tile
SUM_TILE = 1024  # the bias gradient's sum tile [SUM_M, BLOCK_N] (docs/bench.md#launch-constants)
MAX_MEMBERS = 65535  # a grid axis


# ----------------------------------------------------------------------------- kernels
@triton.jit
def _cosines(taus_ptr, rows, rm, N, stm, stn, pi_ptr, e, em):
    """cos(τ_r · π i) of rows ``rows`` (r = m·N + k, member base pointer ``taus_ptr``): [len(rows),
    BLOCK_E], 0 outside the rows or past n."""
    tau = tl.load(taus_ptr + (rows // N).to(tl.int64) * stm + (rows % N).to(tl.int64) * stn, mask=rm, other=0.0)
    pi_i = tl.load(pi_ptr + e, mask=em, other=0.0)
    return tl.where(rm[:, None] & em[None, :], tl.cos(tau[:, None] * pi_i[None, :]), 0.0)


@triton.jit
def _weights(w_ptr, b_ptr, e, em, cols, cm, swe, swh, sbh, PREC: tl.constexpr):
    """(W[:, cols] rounded for the product, [BLOCK_E, len(cols)]; b[cols]) of member base pointers, 0 outside."""
    w = tl.load(w_ptr + e.to(tl.int64)[:, None] * swe + cols[None, :] * swh, mask=em[:, None] & cm[None, :], other=0.0)
    return _tf32(w, PREC), tl.load(b_ptr + cols * sbh, mask=cm, other=0.0)


@triton.jit
def _pre_activation(c, w, b, PREC: tl.constexpr):
    """z = c · W + b (:func:`_weights`' W and b), float32 [len(c), len(b)]."""
    return tl.dot(_tf32(c, PREC), w, input_precision=PREC) + b[None, :]


@triton.jit
def _iqn_embedding_forward_kernel(h_ptr, h2_ptr, taus_ptr, pi_ptr, w_ptr, b_ptr, x_ptr, M, MA, N, E, H, shp, shm,
                                  shh, sh2p, sh2m, sh2h, stp, stm, stn, swp, swe, swh, sbp, sbh, PREC: tl.constexpr,
                                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
                                  PAIR: tl.constexpr):
    # rows m < MA take ψ from h; with PAIR, rows MA .. M − 1 from h2 (row m − MA)
    p = tl.program_id(2).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    e = tl.arange(0, BLOCK_E)
    rm, cm, em = rows < M * N, cols < H, e < E
    c = _cosines(taus_ptr + p * stp, rows, rm, N, stm, stn, pi_ptr, e, em)
    w, b = _weights(w_ptr + p * swp, b_ptr + p * sbp, e, em, cols, cm, swe, swh, sbh, PREC)
    z = _pre_activation(c, w, b, PREC)
    phi = tl.where(z < 0, 0.0, z)  # relu; a NaN stays NaN
    m = (rows // N).to(tl.int64)
    if PAIR:
        psi = tl.load(h_ptr + p * shp + m[:, None] * shm + cols[None, :] * shh,
                      mask=(rm & (m < MA))[:, None] & cm[None, :], other=0.0)
        psi += tl.load(h2_ptr + p * sh2p + (m - MA)[:, None] * sh2m + cols[None, :] * sh2h,
                       mask=(rm & (m >= MA))[:, None] & cm[None, :], other=0.0)
    else:
        psi = tl.load(h_ptr + p * shp + m[:, None] * shm + cols[None, :] * shh, mask=rm[:, None] & cm[None, :],
                      other=0.0)
    offs = (p * M * N + rows.to(tl.int64))[:, None] * H + cols[None, :]
    tl.store(x_ptr + offs, psi * phi, mask=rm[:, None] & cm[None, :])


@triton.jit
def _iqn_embedding_backward_kernel(dx_ptr, h_ptr, taus_ptr, pi_ptr, w_ptr, b_ptr, dz_ptr, dh_ptr, cos_ptr, db_ptr,
                                   part_ptr, ticket_ptr, M, N, E, H, sdp, sdr, sdh, shp, shm, shh, stp, stm, stn, swp,
                                   swe, swh, sbp, sbh, PREC: tl.constexpr, BLOCK_N: tl.constexpr,
                                   BLOCK_E: tl.constexpr, BLOCK_J: tl.constexpr, DB: tl.constexpr,
                                   SUM_M: tl.constexpr):
    # one row m of h, its N fractions in chunks (module docstring)
    p = tl.program_id(2).to(tl.int64)
    m = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    e = tl.arange(0, BLOCK_E)
    cm, em = cols < H, e < E
    psi = tl.load(h_ptr + p * shp + m.to(tl.int64) * shm + cols * shh, mask=cm, other=0.0)
    w, b = _weights(w_ptr + p * swp, b_ptr + p * sbp, e, em, cols, cm, swe, swh, sbh, PREC)  # once for all chunks
    dh = tl.zeros([BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)  # Σ_k dz[m·N + k] (DB)
    for k0 in range(0, N, BLOCK_J):
        k = k0 + tl.arange(0, BLOCK_J)
        rows = m * N + k
        rm = k < N
        c = _cosines(taus_ptr + p * stp, rows, rm, N, stm, stn, pi_ptr, e, em)
        if tl.program_id(1) == 0:
            tl.store(cos_ptr + (p * M * N + rows.to(tl.int64))[:, None] * E + e[None, :], c,
                     mask=rm[:, None] & em[None, :])
        z = _pre_activation(c, w, b, PREC)
        phi = tl.where(z < 0, 0.0, z)
        mask = rm[:, None] & cm[None, :]
        g = tl.load(dx_ptr + p * sdp + rows.to(tl.int64)[:, None] * sdr + cols[None, :] * sdh, mask=mask, other=0.0)
        dh += tl.sum(tl.where(mask, g * phi, 0.0), axis=0)
        dz = tl.where(phi > 0, g * psi[None, :], 0.0)  # the ReLU's backward (torch: where the output > 0)
        tl.store(dz_ptr + (p * M * N + rows.to(tl.int64))[:, None] * H + cols[None, :], dz, mask=mask)
        if DB:
            db += tl.sum(tl.where(mask, dz, 0.0), axis=0)
    tl.store(dh_ptr + (p * M + m) * H + cols, dh, mask=cm)
    if DB:  # this row's part of db; the last program of (member, column block) sums the M parts in row order
        tl.store(part_ptr + (p * M + m) * H + cols, db, mask=cm)
        group = p * tl.num_programs(1) + tl.program_id(1)
        if last_of_group(ticket_ptr + group, M):
            tl.store(db_ptr + p * H + cols, sum_of_parts(part_ptr, p * M, M, H, cols, cm, SUM_M, BLOCK_N), mask=cm)
            tl.store(ticket_ptr + group, 0)


# ----------------------------------------------------------------------------- launches
def _block_e(e: int) -> int:
    return max(16, triton.next_power_of_2(e))


def _forward(h: Tensor, taus: Tensor, pi_i: Tensor, w: Tensor, b: Tensor, h_next: Tensor | None = None) -> Tensor:
    """x float32 [P, M·N, H] of h's rows, then h_next's (M = their rows together)."""
    members, ma, hd = h.shape
    m = ma + (0 if h_next is None else h_next.shape[1])
    n, e = taus.shape[2], w.shape[1]
    x = h.new_empty(members, m * n, hd)
    h2 = h if h_next is None else h_next
    if m * n and hd:
        grid = (triton.cdiv(m * n, BLOCK_M), triton.cdiv(hd, BLOCK_N), members)
        wrap_triton(_iqn_embedding_forward_kernel)[grid](
            h, h2, taus, pi_i, w, b, x, m, ma, n, e, hd, h.stride(0), h.stride(1), h.stride(2), h2.stride(0),
            h2.stride(1), h2.stride(2), taus.stride(0), taus.stride(1), taus.stride(2), w.stride(0), w.stride(1),
            w.stride(2), b.stride(0), b.stride(2), PREC=_prec(h), BLOCK_M=_tile(m * n, BLOCK_M),
            BLOCK_N=_tile(hd, BLOCK_N), BLOCK_E=_block_e(e), PAIR=h_next is not None, num_warps=NUM_WARPS)
    return x


def _backward(dx: Tensor, h: Tensor, taus: Tensor, pi_i: Tensor, w: Tensor, b: Tensor,
              need_b: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """(dz float32 [P, M·N, H], dh float32 [P, M, H], cos float32 [P, M·N, n], db float32
    [P, 1, H] where ``need_b``, else None)."""
    members, m, hd = h.shape
    n, e = taus.shape[2], w.shape[1]
    if not (m * n and hd):  # no rows, fractions or columns: zeros flow back (and the empty products)
        cos = torch.cos(taus.reshape(members, m * n, 1) * pi_i)
        db = h.new_zeros(members, 1, hd) if need_b else None
        return h.new_zeros(members, m * n, hd), h.new_zeros(members, m, hd), cos, db
    dz, dh, cos = h.new_empty(members, m * n, hd), h.new_empty(members, m, hd), h.new_empty(members, m * n, e)
    block_n = _tile(hd, BLOCK_N)
    grid = (m, triton.cdiv(hd, block_n), members)
    db = h.new_empty(members, 1, hd) if need_b else None
    parts, tickets = group_scratch("member_iqn_embedding", h.device, members * m * hd, members * grid[1]) \
        if need_b else (dh, dh)
    wrap_triton(_iqn_embedding_backward_kernel)[grid](
        dx, h, taus, pi_i, w, b, dz, dh, cos, dh if db is None else db, parts, tickets, m, n, e, hd, dx.stride(0),
        dx.stride(1), dx.stride(2), h.stride(0), h.stride(1), h.stride(2), taus.stride(0), taus.stride(1),
        taus.stride(2), w.stride(0), w.stride(1), w.stride(2), b.stride(0), b.stride(2), PREC=_prec(h),
        BLOCK_N=block_n, BLOCK_E=_block_e(e), BLOCK_J=_tile(n, BLOCK_J), DB=need_b,
        SUM_M=max(1, min(triton.next_power_of_2(m), SUM_TILE // block_n)), num_warps=NUM_WARPS)
    return dz, dh, cos, db


class _MemberIQNEmbedding(torch.autograd.Function):
    """x = the forward kernel's; backward: the backward kernel (dz, dh, cos), then dW = cosᵀ dz and
    db = Σ_rows dz (module docstring). τ and π i get no gradient."""

    @staticmethod
    def forward(ctx, h, taus, pi_i, w, b):
        ctx.save_for_backward(h, taus, pi_i, w, b)
        return _forward(h, taus, pi_i, w, b)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_x):
        h, taus, pi_i, w, b = ctx.saved_tensors
        need_h, _, _, need_w, need_b = ctx.needs_input_grad
        if not (need_h or need_w or need_b):
            return None, None, None, None, None
        dz, dh, cos, db = _backward(grad_x, h, taus, pi_i, w, b, need_b)
        dw = member_batched(torch.bmm, cos.transpose(1, 2), dz) if need_w else None
        return (dh if need_h else None), None, None, dw, db


# ----------------------------------------------------------------------------- checks
def _next_problem(h, h_next) -> str | None:
    """Why ``h_next`` does not go after ``h``'s rows, or None (h itself is checked by :func:`_problem`)."""
    if h_next is None:
        return None
    if not (isinstance(h, Tensor) and h.dim() == 3 and isinstance(h_next, Tensor) and h_next.dtype == torch.float32
            and h_next.dim() == 3 and h_next.shape[0] == h.shape[0] and h_next.shape[2] == h.shape[2]
            and h_next.device == h.device):
        return f"member_iqn_embedding: h_next must be float32 [P, M', H] of h's P and H on h's device, " \
               f"got {describe(h_next)}"
    return None


def _all_problems(h, taus, pi_i, w, b, h_next) -> str | None:
    """Why the arguments (h_next included) are outside :func:`member_iqn_embedding`'s contract, or None."""
    return _next_problem(h, h_next) or _problem(h, taus, pi_i, w, b, 0 if h_next is None else h_next.shape[1])


def _problem(h, taus, pi_i, w, b, more_rows: int = 0) -> str | None:
    """Why the arguments are outside :func:`member_iqn_embedding`'s contract, or None (``more_rows``:
    h_next's, whose fractions ``taus`` holds after h's)."""
    op = "member_iqn_embedding"
    problem = float32_problem(op, (("h", h, 3), ("taus", taus, 3), ("pi_i", pi_i, 1), ("w", w, 3), ("b", b, 3)))
    if problem:
        return problem
    members, m, hd = h.shape
    if not 1 <= members <= MAX_MEMBERS:
        return f"{op}: h must hold 1 to {MAX_MEMBERS} members, got {describe(h)}"
    if tuple(taus.shape[:2]) != (members, m + more_rows):
        return f"{op}: taus must be [{members}, {m + more_rows}, N] (h's members and rows), got {describe(taus)}"
    e = pi_i.shape[0]
    if not 1 <= e <= MAX_EMBEDDING:
        return f"{op}: pi_i must hold 1 to {MAX_EMBEDDING} values (the cosine basis), got {describe(pi_i)}"
    if tuple(w.shape) != (members, e, hd):
        return f"{op}: w must be [{members}, {e}, {hd}] (h's members, pi_i's basis, h's width), got {describe(w)}"
    if tuple(b.shape) != (members, 1, hd):
        return f"{op}: b must be [{members}, 1, {hd}], got {describe(b)}"
    if not pi_i.is_contiguous():
        return f"{op}: pi_i must be contiguous, got {describe(pi_i)}"
    if len({t.device for t in (h, taus, pi_i, w, b)}) != 1:
        return f"{op}: h, taus, pi_i, w and b must be on one device"
    return None


def member_iqn_embedding_supported(h, taus, pi_i, w, b, h_next=None) -> bool:
    """Whether :func:`member_iqn_embedding` takes the arguments: float32 ``[P, M, H]``,
    ``[P, M, N]`` (``[P, M + M', N]`` with ``h_next`` ``[P, M', H]``), contiguous ``[n]``
    (1 <= n <= 128), ``[P, n, H]``, ``[P, 1, H]`` on one device, 1 <= P <= 65535. A metadata check
    only (no device read)."""
    return _all_problems(h, taus, pi_i, w, b, h_next) is None


# ----------------------------------------------------------------------------- reference
def member_iqn_embedding_reference(h: Tensor, taus: Tensor, pi_i: Tensor, w: Tensor, b: Tensor) -> Tensor:
    """Plain torch (what :class:`foxdqn.population.distributional.MemberIQNNetwork` runs without the
    op): φ = ``relu(baddbmm(b, cos(τ[..., None] · π i), W))``, x = ψ(s) broadcast over the fractions
    times φ, ``[P, M·N, H]``; differentiable by autograd."""
    p, m, n = taus.shape
    phi = torch.relu(torch.baddbmm(b, torch.cos(taus[..., None] * pi_i).reshape(p, m * n, -1), w))
    return (h[:, :, None, :] * phi.view(p, m, n, -1)).view(p, m * n, -1)


# ----------------------------------------------------------------------------- public
def member_iqn_embedding(h: Tensor, taus: Tensor, pi_i: Tensor, w: Tensor, b: Tensor, *,
                         h_next: Tensor | None = None, backend: str = "auto") -> Tensor:
    """ψ(s) ⊙ φ(τ) of every member's IQN head (Dabney et al. 2018, eq. 4), one kernel forward and
    two launches backward, the bias gradient in the first (module docstring).

    Args:
        h: ψ(s), float32 ``[P, M, H]``, any strides, 1 <= P <= 65535.
        taus: τ, float32 ``[P, M, N]`` in [0, 1], any strides (an expanded view of shared fractions
            too); with ``h_next``, ``[P, M + M', N]``.
        h_next: None, or float32 ``[P, M', H]`` (any strides, h's device): more rows after h's, as
            if ``torch.cat([h, h_next], dim=1)`` were h, read in place by the forward kernel (the
            online network's policy pass over s and s' in one launch, no concatenation). With a
            gradient to compute, the concatenation and the ops' backward.
        pi_i: π·i, float32 ``[n]`` contiguous, 1 <= n <= 128.
        w, b: the embedding's Linear, float32 ``[P, n, H]`` and ``[P, 1, H]`` (a member's
            ``nn.Linear.weight`` transposed, its bias), any strides.
        backend: ``"auto"`` (the kernels for CUDA tensors, else the reference; the kernels inside
            :func:`foxdqn.ops.backend.cpu_kernels`), ``"triton"`` (CPU tensors need
            TRITON_INTERPRET=1) or ``"torch"`` (:func:`member_iqn_embedding_reference`).

    Returns:
        x float32 ``[P, M·N, H]`` (``[P, (M + M')·N, H]`` with ``h_next``), contiguous (row m·N + k:
        row m's features times φ(τ[m, k]));
        differentiable w.r.t. h, w and b (first order on the kernel path; τ and π i get none).

    Raises:
        ValueError: outside the contract above (:func:`member_iqn_embedding_supported` is False),
            an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    problem = _all_problems(h, taus, pi_i, w, b, h_next)
    if problem is not None:
        raise ValueError(problem)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (h, w, b, h_next) if t is not None)
    if h_next is not None and (grad or resolve_backend("member_iqn_embedding", backend, h) == "torch"):
        h, h_next = torch.cat([h, h_next], dim=1), None
    if resolve_backend("member_iqn_embedding", backend, h) == "torch":
        return member_iqn_embedding_reference(h, taus, pi_i, w, b)
    if grad:
        return _MemberIQNEmbedding.apply(h, taus, pi_i, w, b)
    return _forward(h, taus, pi_i, w, b, h_next)
