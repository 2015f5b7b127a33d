r"""P dueling heads, one per member: both streams' Linear layers and the combine in one kernel,
the backward in two.

    V_p = x_p W_p^V + b_p^V          A_p = x_p W_p^A + b_p^A          (p = 0 .. P − 1)
    Q_p[r, a] = (V_p[r] + A_p[r, a]) − (Σ_a' A_p[r, a']) / A

x float32 ``[P, M, K]`` (the encoder's last hidden layer), W^V ``[P, K, 1]``, b^V ``[P, 1, 1]``,
W^A ``[P, K, A]``, b^A ``[P, 1, A]`` (each member's ``nn.Linear.weight`` transposed, the
population's layout: :class:`foxdqn.population.network.MemberQNetwork`), Q float32 ``[P, M, A]``.
What the value stream's :mod:`foxdqn.ops.member_linear`, the advantage stream's ``torch.baddbmm``
(a bias copy and a GEMM: 45 columns are not a width ``member_linear`` is fast at) and
:mod:`foxdqn.ops.dueling_combine` compute in four kernels forward, and their backwards in eight
(the combine's, two GEMMs and a bias sum per stream, the sum of the two dx), for the update of a
dueling population (issue 33: kernels per update; taken where
``foxdqn.population.network.DUELING_HEAD_KERNELS`` is on, the default: the network's forward +
backward 0.71–0.89 of the layers' time on an H100, docs/bench.md#kernels).

Kernels (Triton). Each weight tile is a plain load that feeds ``tl.dot`` (on CUDA it goes from
the software pipeline's swizzled shared memory straight into the operand layout): a tile built in
registers from two loads (a select) or with a row reduction is written to shared memory again, and
for W^A's rows of 45 floats (not 16-byte aligned) Triton 3.6 picks an unswizzled column-major
layout for that round trip, whose reads conflict on one bank (the first version of these
kernels, 2–5 times cuBLAS's time: docs/bench.md#kernels).

* forward, a grid of (blocks of rows, P): a program loops over K in chunks of ``BLOCK_K``, two
  ``tl.dot`` each into float32 accumulators, in increasing order: x's chunk times W^A's
  ``[BLOCK_K, BLOCK_A]`` tile (``BLOCK_A = max(16, next_pow2(A))``), and times a ``[BLOCK_K, 16]``
  tile holding W^V in column 0 (zeros after); then adds the biases in float32 after the products
  (as ``F.linear``) and applies eq. 9 of Wang et al. in the reference's order: ``(V + A) − mean_a A``.
* dx, a grid of (blocks of rows, blocks of K, P): dz = [dQ − Σ_a dQ / A, Σ_a dQ] of the program's
  rows (the combine's backward), then dx = dz · [W^A, W^V]ᵀ, one ``tl.dot`` on the merged
  ``[K, A + 1]`` tile (``A + 1 <= 128``; without a loop this kernel was measured faster than
  cuBLAS's products: docs/bench.md#kernels).
* dW and db, a grid of (blocks of K, P): a program loops over all M rows in chunks of ``BLOCK_R``
  in increasing order, G += xᵀ dQ one ``tl.dot`` a chunk; then the combine's backward from G's
  row sums u = xᵀ Σ_a dQ: dW^A = G − u / A and dW^V = u (the same sums as xᵀ dz, regrouped). The
  first K block's programs also sum dQ's columns over the rows, c, for db^V = Σ_a c and
  db^A = c − db^V / A. The chunks are fixed (not chosen from P or the grid), so member p of P
  equals a population of one bit for bit wherever the forward's tiles agree.

A program reads member p's rows and weights only: members never mix. Any strides of x, the
weights and the biases (no copies). NaN or ±inf in a row propagate into that row's Q (and its
gradients) where the reference's are non-finite (in dW, where the reference has ±inf, the
regrouping G − u / A may give NaN); NaN in W^V or b^V reaches V, so every row's Q, as in the
reference.

Precision: :mod:`foxdqn.ops.mlp_chain`'s rule. Where torch runs float32 CUDA matmuls in TF32 (the
run's default), each ``tl.dot`` operand is rounded to TF32 (to nearest) first; else IEEE float32.
The sums run in another order than cuBLAS's and the combine's kernel, so Q and the gradients equal
:func:`member_dueling_head_reference` to float rounding (about 1e-6 relative in IEEE float32, 1e-3
in TF32).

Capture: device ops only; outputs ``torch.empty`` (from a graph's pool inside a capture).

Source: Wang et al. (2016), "Dueling Network Architectures for Deep Reinforcement Learning",
eq. 9; the Linear layer as ``torch.nn`` defines it; the tiled GEMM of Triton's
matrix-multiplication tutorial, with a member axis.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, float32_problem, resolve_backend
from foxdqn.ops.library import wrap_triton
from foxdqn.ops.member_linear import _tile
from foxdqn.ops.mlp_chain import _prec, _tf32

__all__ = ["member_dueling_head", "member_dueling_head_reference", "member_dueling_head_supported"]

#: Rows per forward program where the grid holds SMALL_GRID programs, else BLOCK_M_SMALL. Not 64: at 64
#: rows Triton 3.6 takes Hopper's wgmma, whose B operand (W^A's tile rounded to TF32 in registers) goes
#: back to shared memory, staged in an unswizzled column-major layout for rows of 45 floats (bank
#: conflicts; the TTGIR compiled for sm_90 on the CPU, docs/bench.md#kernels); at 32, mma.sync's
#: operands load from a swizzled layout.
BLOCK_M = 32
BLOCK_M_SMALL = 32
SMALL_GRID = 264  # two waves of the H200's 132 SMs
BLOCK_K = 64  # K per step of the forward's loop
BLOCK_DX = 64  # dx columns (of K) per program
BLOCK_DW = 32  # dW rows (of K) per program
BLOCK_R = 32  # rows per step of the dW loop: fixed, so the sums' order does not depend on P
#: the forward's software-pipeline stages (its K loop) and warps; with BLOCK_K 64 the fastest of 6
#: settings at 1, 64 and 512 members on an H100 (8.1, 11.9, 162.5 µs against 10.3, 15.5, 195.2 at
#: BLOCK_K 32 and 3 stages: docs/bench.md#launch-constants)
STAGES_FORWARD, WARPS_FORWARD = 2, 4
WARPS_DX = 4
STAGES_DW, WARPS_DW = 3, 4  # the dW kernel's (its loop over rows)
MAX_ACTIONS = 127  # A + 1 columns in one tile of at most 128
MAX_MEMBERS = 65535  # a grid axis


# ----------------------------------------------------------------------------- kernels
@triton.jit
def _weights(wa_ptr, wv_ptr, k, km, cols, A, swak, swan, swvk):
    """The [len(k), BLOCK_A] tile of [W^A, W^V] at rows k: columns < A from W^A, column A from W^V, 0 after."""
    wa = tl.load(wa_ptr + k.to(tl.int64)[:, None] * swak + cols[None, :] * swan,
                 mask=km[:, None] & (cols[None, :] < A), other=0.0)
    wv = tl.load(wv_ptr + k.to(tl.int64) * swvk, mask=km, other=0.0)
    return tl.where(cols[None, :] == A, wv[:, None], wa)


@triton.jit
def _dz(dq_ptr, rows, rm, cols, A, sdqm, sdqa):
    """The combine's backward of dQ's rows ``rows`` (member base pointer ``dq_ptr``): [len(rows),
    BLOCK_A], columns < A: dQ − Σ_a dQ / A; column A: Σ_a dQ; 0 on rows outside. Columns after A
    hold −Σ_a dQ / A: their weights are 0 (dx) and their sums are not stored (dW, db)."""
    g = tl.load(dq_ptr + rows.to(tl.int64)[:, None] * sdqm + cols[None, :] * sdqa,
                mask=rm[:, None] & (cols[None, :] < A), other=0.0)
    s = tl.sum(g, axis=1)
    return tl.where(cols[None, :] == A, s[:, None], g - (s / (A + 0.0))[:, None])


@triton.jit
def _dueling_head_forward_kernel(x_ptr, wv_ptr, bv_ptr, wa_ptr, ba_ptr, q_ptr, M, A, K, sxp, sxm, sxk, swvp, swvk,
                                 sbvp, swap, swak, swan, sbap, sban, PREC: tl.constexpr, BLOCK_M: tl.constexpr,
                                 BLOCK_A: tl.constexpr, BLOCK_K: tl.constexpr):
    # two dots per K step: the advantage stream's tile of W^A, the value stream's [BLOCK_K, 16] tile
    # (W^V in column 0, 0 after); each weight tile a plain load, straight into tl.dot (module docstring)
    p = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_A)
    c16 = tl.arange(0, 16)
    ks = tl.arange(0, BLOCK_K)
    rm, is_a = rows < M, cols < A
    x_base = x_ptr + p * sxp + rows.to(tl.int64)[:, None] * sxm
    wa_base = wa_ptr + p * swap + cols[None, :] * swan
    acc = tl.zeros([BLOCK_M, BLOCK_A], dtype=tl.float32)
    acc_v = tl.zeros([BLOCK_M, 16], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        km = k < K
        a = _tf32(tl.load(x_base + k[None, :] * sxk, mask=rm[:, None] & km[None, :], other=0.0), PREC)
        wa = tl.load(wa_base + k.to(tl.int64)[:, None] * swak, mask=km[:, None] & is_a[None, :], other=0.0)
        wv = tl.load(wv_ptr + p * swvp + k.to(tl.int64)[:, None] * swvk + c16[None, :] * 0,
                     mask=km[:, None] & (c16[None, :] == 0), other=0.0)
        acc = tl.dot(a, _tf32(wa, PREC), acc=acc, input_precision=PREC)
        acc_v = tl.dot(a, _tf32(wv, PREC), acc=acc_v, input_precision=PREC)
    z = acc + tl.load(ba_ptr + p * sbap + cols * sban, mask=is_a, other=0.0)[None, :]
    v = tl.sum(tl.where(c16[None, :] == 0, acc_v, 0.0), axis=1) + tl.load(bv_ptr + p * sbvp)  # 0 · inf columns out
    mean = tl.sum(tl.where(is_a[None, :], z, 0.0), axis=1) / (A + 0.0)
    q = (v[:, None] + z) - mean[:, None]
    offs = (p * M + rows.to(tl.int64))[:, None] * A + cols[None, :]
    tl.store(q_ptr + offs, q, mask=rm[:, None] & is_a[None, :])


@triton.jit
def _dueling_head_dx_kernel(dq_ptr, wv_ptr, wa_ptr, dx_ptr, M, A, K, sdqp, sdqm, sdqa, swvp, swvk, swap, swak, swan,
                            PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_A: tl.constexpr,
                            BLOCK_DX: tl.constexpr):
    p = tl.program_id(2).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    k = tl.program_id(1) * BLOCK_DX + tl.arange(0, BLOCK_DX)
    cols = tl.arange(0, BLOCK_A)
    rm, km = rows < M, k < K
    dz = _dz(dq_ptr + p * sdqp, rows, rm, cols, A, sdqm, sdqa)
    w = _weights(wa_ptr + p * swap, wv_ptr + p * swvp, k, km, cols, A, swak, swan, swvk)
    dx = tl.dot(_tf32(dz, PREC), tl.trans(_tf32(w, PREC)), input_precision=PREC)
    offs = (p * M + rows.to(tl.int64))[:, None] * K + k[None, :]
    tl.store(dx_ptr + offs, dx, mask=rm[:, None] & km[None, :])


@triton.jit
def _dueling_head_dw_kernel(dq_ptr, x_ptr, dwv_ptr, dbv_ptr, dwa_ptr, dba_ptr, M, A, K, sdqp, sdqm, sdqa, sxp, sxm,
                            sxk, PREC: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_DW: tl.constexpr,
                            BLOCK_R: tl.constexpr):
    # G = xᵀ dQ over all rows (dQ's columns < A, 0 after), then the combine's backward from G's
    # row sums u = xᵀ Σ_a dQ: dW^A = G − u / A, dW^V = u (module docstring)
    p = tl.program_id(1).to(tl.int64)
    k = tl.program_id(0) * BLOCK_DW + tl.arange(0, BLOCK_DW)
    cols = tl.arange(0, BLOCK_A)
    km, is_a = k < K, cols < A
    x_base = x_ptr + p * sxp + k.to(tl.int64)[:, None] * sxk
    dq_base = dq_ptr + p * sdqp + cols[None, :] * sdqa
    acc = tl.zeros([BLOCK_DW, BLOCK_A], dtype=tl.float32)
    for r0 in range(0, M, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        rm = rows < M
        xt = tl.load(x_base + rows.to(tl.int64)[None, :] * sxm, mask=km[:, None] & rm[None, :], other=0.0)
        g = tl.load(dq_base + rows.to(tl.int64)[:, None] * sdqm, mask=rm[:, None] & is_a[None, :], other=0.0)
        acc = tl.dot(_tf32(xt, PREC), _tf32(g, PREC), acc=acc, input_precision=PREC)
    u = tl.sum(tl.where(is_a[None, :], acc, 0.0), axis=1)  # G's columns < A (0 · inf columns out)
    tl.store(dwa_ptr + (p * K + k.to(tl.int64))[:, None] * A + cols[None, :], acc - (u / (A + 0.0))[:, None],
             mask=km[:, None] & is_a[None, :])
    tl.store(dwv_ptr + p * K + k, u, mask=km)
    if tl.program_id(0) == 0:  # the biases: c = Σ_rows dQ, db^V = Σ_a c, db^A = c − db^V / A
        c = tl.zeros([BLOCK_A], dtype=tl.float32)
        for r0 in range(0, M, BLOCK_R):
            rows = r0 + tl.arange(0, BLOCK_R)
            g = tl.load(dq_base + rows.to(tl.int64)[:, None] * sdqm, mask=(rows < M)[:, None] & is_a[None, :],
                        other=0.0)
            c += tl.sum(g, axis=0)
        s = tl.sum(c, axis=0)
        tl.store(dba_ptr + p * A + cols, c - s / (A + 0.0), mask=is_a)
        tl.store(dbv_ptr + p, s)


# ----------------------------------------------------------------------------- launches
def _block_a(columns: int) -> int:
    return max(16, triton.next_power_of_2(columns))


def _block_m(members: int, m: int) -> int:
    bm = _tile(m, BLOCK_M)
    return bm if triton.cdiv(m, bm) * members >= SMALL_GRID else min(bm, BLOCK_M_SMALL)


def _forward(x: Tensor, w_v: Tensor, b_v: Tensor, w_a: Tensor, b_a: Tensor) -> Tensor:
    members, m, k = x.shape
    a = w_a.shape[2]
    q = x.new_empty(members, m, a)
    if m:
        bm = _block_m(members, m)
        wrap_triton(_dueling_head_forward_kernel)[(triton.cdiv(m, bm), members)](
            x, w_v, b_v, w_a, b_a, q, m, a, k, x.stride(0), x.stride(1), x.stride(2), w_v.stride(0), w_v.stride(1),
            b_v.stride(0), w_a.stride(0), w_a.stride(1), w_a.stride(2), b_a.stride(0), b_a.stride(2), PREC=_prec(x),
            BLOCK_M=bm, BLOCK_A=_block_a(a), BLOCK_K=_tile(k, BLOCK_K),
            num_warps=WARPS_FORWARD, num_stages=STAGES_FORWARD)
    return q


def _dx(grad_q: Tensor, x: Tensor, w_v: Tensor, w_a: Tensor) -> Tensor:
    members, m, k = x.shape
    a = w_a.shape[2]
    dx = x.new_empty(members, m, k)
    if m and k:
        bm = _block_m(members, m)
        grid = (triton.cdiv(m, bm), triton.cdiv(k, BLOCK_DX), members)
        wrap_triton(_dueling_head_dx_kernel)[grid](
            grad_q, w_v, w_a, dx, m, a, k, grad_q.stride(0), grad_q.stride(1), grad_q.stride(2), w_v.stride(0),
            w_v.stride(1), w_a.stride(0), w_a.stride(1), w_a.stride(2), PREC=_prec(x), BLOCK_M=bm,
            BLOCK_A=_block_a(a + 1), BLOCK_DX=BLOCK_DX, num_warps=WARPS_DX)
    return dx


def _dw(grad_q: Tensor, x: Tensor, num_actions: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    members, m, k = x.shape
    dwv, dbv = x.new_empty(members, k, 1), x.new_empty(members, 1, 1)
    dwa, dba = x.new_empty(members, k, num_actions), x.new_empty(members, 1, num_actions)
    grid = (max(1, triton.cdiv(k, BLOCK_DW)), members)  # k = 0: one program per member writes db
    wrap_triton(_dueling_head_dw_kernel)[grid](
        grad_q, x, dwv, dbv, dwa, dba, m, num_actions, k, grad_q.stride(0), grad_q.stride(1), grad_q.stride(2),
        x.stride(0), x.stride(1), x.stride(2), PREC=_prec(x), BLOCK_A=_block_a(num_actions), BLOCK_DW=BLOCK_DW,
        BLOCK_R=BLOCK_R, num_warps=WARPS_DW, num_stages=STAGES_DW)
    return dwv, dbv, dwa, dba


class _MemberDuelingHead(torch.autograd.Function):
    """Q = the forward kernel's; backward: the dx kernel and the dW / db kernel (module docstring)."""

    @staticmethod
    def forward(ctx, x, w_v, b_v, w_a, b_a):
        ctx.save_for_backward(x, w_v, w_a)
        return _forward(x, w_v, b_v, w_a, b_a)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_q):
        x, w_v, w_a = ctx.saved_tensors
        need_x, *need_params = ctx.needs_input_grad
        dx = _dx(grad_q, x, w_v, w_a) if need_x else None
        params = _dw(grad_q, x, w_a.shape[2]) if any(need_params) else (None,) * 4
        return (dx, *(g if need else None for g, need in zip(params, need_params)))


# ----------------------------------------------------------------------------- checks
def _problem(x, w_v, b_v, w_a, b_a) -> str | None:
    """Why the arguments are outside :func:`member_dueling_head`'s contract, or None."""
    op = "member_dueling_head"
    problem = float32_problem(op, ((name, t, 3) for name, t in (("x", x), ("w_v", w_v), ("b_v", b_v), ("w_a", w_a),
                                                               ("b_a", b_a))))
    if problem:
        return problem
    members, _, k = x.shape
    if not 1 <= members <= MAX_MEMBERS:
        return f"{op}: x must hold 1 to {MAX_MEMBERS} members, got {describe(x)}"
    a = w_a.shape[2]
    if not 1 <= a <= MAX_ACTIONS:
        return f"{op}: w_a must have 1 to {MAX_ACTIONS} actions (columns), got {describe(w_a)}"
    want = {"w_v": (members, k, 1), "b_v": (members, 1, 1), "w_a": (members, k, a), "b_a": (members, 1, a)}
    for name, t in (("w_v", w_v), ("b_v", b_v), ("w_a", w_a), ("b_a", b_a)):
        if tuple(t.shape) != want[name]:
            return f"{op}: {name} must be {list(want[name])} (x's members and width, w_a's actions), got {describe(t)}"
    if len({t.device for t in (x, w_v, b_v, w_a, b_a)}) != 1:
        return f"{op}: x, w_v, b_v, w_a and b_a must be on one device"
    return None


def member_dueling_head_supported(x, w_v, b_v, w_a, b_a) -> bool:
    """Whether :func:`member_dueling_head` takes the arguments: float32 ``[P, M, K]``, ``[P, K, 1]``,
    ``[P, 1, 1]``, ``[P, K, A]``, ``[P, 1, A]`` on one device, 1 <= P <= 65535, 1 <= A <= 127.
    A metadata check only (no device read)."""
    return _problem(x, w_v, b_v, w_a, b_a) is None


# ----------------------------------------------------------------------------- reference
def member_dueling_head_reference(x: Tensor, w_v: Tensor, b_v: Tensor, w_a: Tensor, b_a: Tensor) -> Tensor:
    """Plain torch: V = ``baddbmm(b_v, x, w_v)``, A = ``baddbmm(b_a, x, w_a)``, Q = (V + A) − mean_a A
    (Wang et al. 2016, eq. 9); differentiable by autograd."""
    value = torch.baddbmm(b_v, x, w_v)
    adv = torch.baddbmm(b_a, x, w_a)
    return value + adv - adv.mean(dim=-1, keepdim=True)


# ----------------------------------------------------------------------------- public
def member_dueling_head(x: Tensor, w_v: Tensor, b_v: Tensor, w_a: Tensor, b_a: Tensor, *,
                        backend: str = "auto") -> Tensor:
    """Q_p = V_p + A_p − mean_a A_p of every member's dueling head (Wang et al. 2016, eq. 9), one
    kernel forward and two backward (module docstring).

    Args:
        x: the last hidden layer, float32 ``[P, M, K]``, any strides, 1 <= P <= 65535, M, K >= 0.
        w_v, b_v: the value stream, float32 ``[P, K, 1]`` and ``[P, 1, 1]`` (a member's
            ``nn.Linear.weight`` transposed, its bias), any strides, x's device.
        w_a, b_a: the advantage stream, float32 ``[P, K, A]`` and ``[P, 1, A]``, 1 <= A <= 127.
        backend: ``"auto"`` (the kernels for CUDA tensors, else the reference; the kernels inside
            :func:`foxdqn.ops.backend.cpu_kernels`), ``"triton"`` (CPU tensors need
            TRITON_INTERPRET=1) or ``"torch"`` (:func:`member_dueling_head_reference`).

    Returns:
        Q float32 ``[P, M, A]`` in reward units, contiguous; differentiable w.r.t. every input
        (first order on the kernel path). Equal to the reference to float rounding (module docstring).

    Raises:
        ValueError: outside the contract above (:func:`member_dueling_head_supported` is False), an
            unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    problem = _problem(x, w_v, b_v, w_a, b_a)
    if problem is not None:
        raise ValueError(problem)
    if resolve_backend("member_dueling_head", backend, x) == "torch":
        return member_dueling_head_reference(x, w_v, b_v, w_a, b_a)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, w_v, b_v, w_a, b_a)):
        return _MemberDuelingHead.apply(x, w_v, b_v, w_a, b_a)
    return _forward(x, w_v, b_v, w_a, b_a)
