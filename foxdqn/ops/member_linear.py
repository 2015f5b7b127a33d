r"""P Linear layers, one per member, with the bias and an optional ReLU in the GEMM's epilogue: one kernel.

    y_p = x_p W_p + b_p          or, with ``relu``,   y_p = relu(x_p W_p + b_p)        (p = 0 .. P − 1)
    or, with a ``residual`` r,   y_p = r_p + (x_p W_p + b_p)

x float32 ``[P, M, K]``, W ``[P, K, N]`` (each member's ``nn.Linear.weight`` transposed, the
population's layout: :class:`foxdqn.population.network.MemberQNetwork`), b ``[P, 1, N]``, y
float32 ``[P, M, N]``. What ``torch.baddbmm(b, x, W)`` (then ``torch.relu``) computes as two or
three kernels on CUDA: the bias broadcast copied into the output, the batched GEMM, the ReLU. A
population's layer of any width takes this op where :mod:`foxdqn.ops.member_mlp_chain` (a whole
network of widths <= 128) does not apply: the 256-wide encoders of the trading experiments, the
C51 / IQN / branching heads (issue 33: kernels per update).

Kernel (Triton): a grid of (blocks of ``BLOCK_M`` rows, blocks of ``BLOCK_N`` columns, P
members); program (r, c, p) reads member p's rows and weights only (members never mix) and loops
over K in chunks of ``BLOCK_K``, each chunk one ``tl.dot`` into a float32 accumulator, in
increasing order. The bias is added in float32 after the products (as ``F.linear`` does), then
the ReLU (``relu(NaN)`` is NaN, as ``torch.relu``), or the residual r added last. With
``group_mean`` G (no gradient) a program's rows hold whole groups of G and it stores each group's
mean (the tile's rows of the group summed, times 1/G) instead of the rows. Any strides (no
copies of x, W, b or r). The tile depends on the grid's size (:func:`_tiles`: fewer rows per program where the grid would
leave SMs idle), so member p of P and a population of one may take different tiles, whose MMA
sums may round differently on a GPU (as :mod:`foxdqn.ops.member_mlp_chain`'s).

Precision: :mod:`foxdqn.ops.mlp_chain`'s rule. Where torch runs float32 CUDA matmuls in TF32 (the
run's default), each operand is rounded to TF32 (to nearest) before ``tl.dot(input_precision="tf32")``;
else IEEE float32. The sums run in another order than cuBLAS's, so y equals
:func:`member_linear_reference` to float rounding (about 1e-6 relative in IEEE float32, 1e-3 in TF32).

Backward (:class:`_MemberLinear`): autograd's for ``baddbmm`` (+ ``relu``): dz = dy · 1{y > 0}
and db = Σ_rows dz (one kernel, :func:`foxdqn.ops.relu_bias_grad.relu_bias_grad`; db = Σ_rows dy
without the ReLU), dx = dz Wᵀ and dW = xᵀ dz (``torch.bmm``, cuBLAS), each only when needed; with
:data:`FUSED_BACKWARD` (off: slower than this on an H200, docs/bench.md) all of it in one launch
(:func:`foxdqn.ops.member_linear_grads.member_linear_grads`).

The pair (:func:`member_linear_pair`): the same layer of two sets of rows, x_a ``[P, M_a, K]`` and
x_b ``[P, M_b, K]`` (any strides each), in one launch: the grid's row blocks are x_a's, then
x_b's (a program reads and writes one part: its pointers and strides chosen per program), y_a and
y_b are separate contiguous outputs. y_a carries the gradient (its backward is the one above, over
x_a's rows only), y_b is a constant (no zeros are made for its gradient): the online network's rows
of s and s' where s' only selects the Double DQN target's action (C51, IQN), or IQL's V(s) and
V(s'), in half the launches of two calls and without the doubled backward of a stacked pass
(foxdqn.objectives.dqn_forward). The tile is chosen for both parts together, so each part equals
:func:`member_linear` of its rows alone to float rounding.

Capture: device ops only; outputs ``torch.empty`` (from a graph's pool inside a capture).

Source: the Linear layer and ReLU (Nair & Hinton 2010) as ``torch.nn`` defines them; the tiled
GEMM of Triton's matrix-multiplication tutorial, with a member axis.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, float32_problem, fused_forward, resolve_backend
from foxdqn.ops.library import wrap_triton
from foxdqn.ops.member_linear_grads import member_linear_grads
from foxdqn.ops.mlp_chain import _prec, _tf32
from foxdqn.ops.relu_bias_grad import relu_bias_grad

__all__ = ["group_mean_fits", "member_batched", "member_linear", "member_linear_pair", "member_linear_pair_reference",
           "member_linear_preferred", "member_linear_reference", "member_linear_supported"]

BLOCK_M = 128  # most rows per program (the tiles from an H200 sweep: docs/bench.md#launch-constants)
BLOCK_N = 64  # most columns per program
BLOCK_K = 32  # K per step of a program's loop
NUM_WARPS = 4
NUM_STAGES = 3
SMALL_GRID = 264  # fewer programs than this (two waves of the H200's 132 SMs) at BLOCK_M rows: ...
BLOCK_M_SMALL = 32  # ... BLOCK_M_SMALL rows per program instead, in NUM_STAGES_SMALL stages
NUM_STAGES_SMALL = 4
MAX_MEMBERS = 65535  # the grid's third axis
#: the backward as one launch (ops/member_linear_grads.py) where the fused kernels run, in place of
#: the ReLU mask with the bias sum and torch's two batched GEMMs: off (slower at 4 of 6 bench sizes on an H200)
FUSED_BACKWARD = False


@triton.jit
def _member_linear_kernel(xa_ptr, xb_ptr, w_ptr, b_ptr, ya_ptr, yb_ptr, r_ptr, MA, MB, NA, N, K, sxpa, sxma, sxka,
                          sxpb, sxmb, sxkb, swp, swk, swn, sbp, sbn, srp, srm, srn, RELU: tl.constexpr,
                          RESIDUAL: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, GROUP: tl.constexpr):
    # row blocks 0 .. NA-1 are part a's (x_a -> y_a), the others part b's (x_b -> y_b; MB = 0: none)
    p = tl.program_id(2).to(tl.int64)
    pid = tl.program_id(0)
    in_b = pid >= NA
    M = tl.where(in_b, MB, MA)
    rows = tl.where(in_b, pid - NA, pid) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    rm, cm = rows < M, cols < N
    sxp, sxm, sxk = tl.where(in_b, sxpb, sxpa), tl.where(in_b, sxmb, sxma), tl.where(in_b, sxkb, sxka)
    x_base = tl.where(in_b, xb_ptr, xa_ptr) + p * sxp + rows.to(tl.int64)[:, None] * sxm
    w_base = w_ptr + p * swp + cols[None, :] * swn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        km = k < K
        a = tl.load(x_base + k[None, :] * sxk, mask=rm[:, None] & km[None, :], other=0.0)
        w = tl.load(w_base + k.to(tl.int64)[:, None] * swk, mask=km[:, None] & cm[None, :], other=0.0)
        acc = tl.dot(_tf32(a, PREC), _tf32(w, PREC), acc=acc, input_precision=PREC)
    acc += tl.load(b_ptr + p * sbp + cols * sbn, mask=cm, other=0.0)[None, :]
    if RELU:
        acc = tl.where(acc < 0, 0.0, acc)  # relu; a NaN stays NaN
    if RESIDUAL:  # r + (x W + b), one part only: the same sum as torch's add of the two
        acc += tl.load(r_ptr + p * srp + rows.to(tl.int64)[:, None] * srm + cols[None, :] * srn,
                       mask=rm[:, None] & cm[None, :], other=0.0)
    if GROUP > 1:  # the mean of each GROUP consecutive rows (one part, M a multiple of GROUP)
        mean = tl.sum(tl.reshape(tl.where(rm[:, None], acc, 0.0), [BLOCK_M // GROUP, GROUP, BLOCK_N]), axis=1)
        mean = mean * (1.0 / GROUP)  # GROUP a power of two: the division's bits
        groups = pid * (BLOCK_M // GROUP) + tl.arange(0, BLOCK_M // GROUP)
        gm = groups < M // GROUP
        offs = (p * (M // GROUP) + groups.to(tl.int64))[:, None] * N + cols[None, :]
        tl.store(ya_ptr + offs, mean, mask=gm[:, None] & cm[None, :])
    else:
        offs = (p * M + rows.to(tl.int64))[:, None] * N + cols[None, :]
        tl.store(tl.where(in_b, yb_ptr, ya_ptr) + offs, acc, mask=rm[:, None] & cm[None, :])


def _tile(d: int, most: int) -> int:
    return min(most, max(16, triton.next_power_of_2(d)))


def _tiles(members: int, m: int, n: int, k: int, rows: int | None = None) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, stages) of a launch of ``m`` rows per part (``rows`` in all,
    default ``m``): BLOCK_M rows per program, or BLOCK_M_SMALL where that grid would hold fewer
    than SMALL_GRID programs (a population of one: 8 programs of 128 rows for 256 × 256 leave most
    SMs idle) or where W's rows are not 16-byte aligned (``n % 4 != 0``: at 128 rows Triton 3.6
    takes Hopper's wgmma, whose B operand, W's tile rounded to TF32 in registers, goes back to
    shared memory through an unswizzled column-major layout for such rows, with bank conflicts;
    at 32 rows mma.sync's operands load from a swizzled layout: the TTGIR compiled for sm_90)."""
    rows = m if rows is None else rows
    bm, bn, bk = _tile(m, BLOCK_M), _tile(n, BLOCK_N), _tile(k, BLOCK_K)
    if n % 4 != 0 or triton.cdiv(rows, bm) * triton.cdiv(n, bn) * members < SMALL_GRID:
        return _tile(m, BLOCK_M_SMALL), bn, bk, NUM_STAGES_SMALL
    return bm, bn, bk, NUM_STAGES


def _launch(x: Tensor, w: Tensor, b: Tensor, relu: bool, x_b: Tensor | None = None,
            residual: Tensor | None = None, group: int = 1) -> Tensor | tuple[Tensor, Tensor]:
    """y = the kernel's (x, w, b, relu): float32 [P, M, N], contiguous; with ``x_b`` (float32
    [P, M_b, K]) the rows of both in one launch, ``(y of x, y of x_b)``, each contiguous; with
    ``residual`` (float32 [P, M, N], no ``x_b``, no ReLU) ``residual + x W + b``; with ``group``
    (:func:`group_mean_fits`, no ``x_b`` or residual) the mean of each ``group`` rows, [P, M/group, N]."""
    members, m, k = x.shape
    n = w.shape[2]
    mb = 0 if x_b is None else x_b.shape[1]
    y = x.new_empty(members, m // group, n)
    y_b = x.new_empty(members, mb, n) if x_b is not None else y
    xb = x if x_b is None else x_b
    r = y if residual is None else residual
    if (m or mb) and n:
        bm, bn, bk, stages = _tiles(members, max(m, mb), n, k, m + mb)
        bm = max(bm, group)  # whole groups in a program's rows
        na = triton.cdiv(m, bm)
        grid = (na + triton.cdiv(mb, bm), triton.cdiv(n, bn), members)
        wrap_triton(_member_linear_kernel)[grid](
            x, xb, w, b, y, y_b, r, m, mb, na, n, k, x.stride(0), x.stride(1), x.stride(2), xb.stride(0),
            xb.stride(1), xb.stride(2), w.stride(0), w.stride(1), w.stride(2), b.stride(0), b.stride(2), r.stride(0),
            r.stride(1), r.stride(2), RELU=relu, RESIDUAL=residual is not None, PREC=_prec(x), BLOCK_M=bm,
            BLOCK_N=bn, BLOCK_K=bk, GROUP=group, num_warps=NUM_WARPS, num_stages=stages)
    return y if x_b is None else (y, y_b)


def member_batched(op, *tensors: Tensor) -> Tensor:
    """``op(*tensors)`` of tensors with a leading member axis (``torch.bmm``, ``torch.baddbmm``); on
    CPU a batch of one computed as a batch of two (a discarded copy of itself): torch's CPU product
    of a batch of one is an ``addmm``, whose one-column or one-row products go to a GEMV that rounds
    otherwise than the batched GEMM every larger P gets, so a member of P would not equal a
    population of one (:func:`foxdqn.population.layers.member_linear`)."""
    if tensors[0].shape[0] == 1 and not tensors[0].is_cuda:
        return op(*(torch.cat([t, t]) for t in tensors))[:1]
    return op(*tensors)


class _MemberLinear(torch.autograd.Function):
    """y = the kernel's; backward as autograd's for baddbmm (+ relu), module docstring."""

    @staticmethod
    def forward(ctx, x, w, b, relu, residual):
        y = _launch(x, w, b, relu, residual=residual)
        ctx.relu = relu
        ctx.save_for_backward(x, w, y if relu else None)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_y):
        x, w, y = ctx.saved_tensors
        dx, dw, db, _ = _backward(ctx, grad_y, x, w, y, *ctx.needs_input_grad[:3])
        return dx, dw, db, None, grad_y if ctx.needs_input_grad[4] else None  # the residual's: dy itself


class _MemberLinearPair(torch.autograd.Function):
    """(y_a, y_b) of the rows of x_a and x_b in one launch; backward over x_a's rows only, as
    :class:`_MemberLinear`'s (y_b is a constant)."""

    @staticmethod
    def forward(ctx, x_a, x_b, w, b, relu):
        y_a, y_b = _launch(x_a, w, b, relu, x_b)
        ctx.relu = relu
        ctx.mark_non_differentiable(y_b)
        ctx.set_materialize_grads(False)  # y_b's gradient stays None: no zeros launched for it
        ctx.save_for_backward(x_a, w, y_a if relu else None)
        return y_a, y_b

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_a, grad_b):
        if grad_a is None:  # y_a reached no loss (grads are not materialised): nothing to add
            return None, None, None, None, None
        x_a, w, y_a = ctx.saved_tensors
        dx, dw, db, _ = _backward(ctx, grad_a, x_a, w, y_a, ctx.needs_input_grad[0], *ctx.needs_input_grad[2:4])
        return dx, None, dw, db, None


def _backward(ctx, grad_y, x, w, y, need_x, need_w, need_b):
    """(dx, dw, db, None) of one layer's rows (autograd's for baddbmm + relu; the module docstring)."""
    if FUSED_BACKWARD and fused_forward(grad_y):  # one launch
        return (*member_linear_grads(x, w, grad_y, y if ctx.relu else None, need_x=need_x, need_w=need_w,
                                     need_b=need_b, backend="triton"), None)
    if ctx.relu:  # dz and db in one kernel
        dz, db = relu_bias_grad(grad_y, y)
    else:
        dz, db = grad_y, (grad_y.sum(1, keepdim=True) if need_b else None)
    dx = member_batched(torch.bmm, dz, w.transpose(1, 2)) if need_x else None
    dw = member_batched(torch.bmm, x.transpose(1, 2), dz) if need_w else None
    return dx, dw, db if need_b else None, None


def _problem(x, w, b) -> str | None:
    """Why (x, w, b) is outside :func:`member_linear`'s contract, or None."""
    op = "member_linear"
    problem = float32_problem(op, (("x", x, 3), ("w", w, 3), ("b", b, 3)))
    if problem:
        return problem
    members, _, k = x.shape
    if not 1 <= members <= MAX_MEMBERS:
        return f"{op}: x must hold 1 to {MAX_MEMBERS} members, got {describe(x)}"
    if tuple(w.shape[:2]) != (members, k):
        return f"{op}: w must be [{members}, {k}, N] (x's members and width), got {describe(w)}"
    if tuple(b.shape) != (members, 1, w.shape[2]):
        return f"{op}: b must be [{members}, 1, {w.shape[2]}], got {describe(b)}"
    if not (x.device == w.device == b.device):
        return f"{op}: x, w and b must be on one device, got {x.device}, {w.device} and {b.device}"
    return None


def member_linear_preferred(n: int) -> bool:
    """Whether the kernel beats ``torch.baddbmm`` (+ ``relu``) on CUDA for ``n`` output columns:
    ``n == 1`` or a multiple of 4. With TF32 rounding, a W whose rows are not 16-byte aligned
    (``n % 4 != 0``: a C51 head's 45 × 51 columns) is read so slowly that the one kernel takes
    5 times cuBLAS's bias copy + GEMM (docs/bench.md#launch-constants); callers keep baddbmm there."""
    return n == 1 or n % 4 == 0


def member_linear_supported(x, w, b) -> bool:
    """Whether :func:`member_linear` takes ``(x, w, b)``: float32 ``[P, M, K]``, ``[P, K, N]``,
    ``[P, 1, N]`` on one device, 1 <= P <= 65535. A metadata check only (no device read)."""
    return _problem(x, w, b) is None


def member_linear_reference(x: Tensor, w: Tensor, b: Tensor, relu: bool = False, *,
                            residual: Tensor | None = None, group_mean: int = 1) -> Tensor:
    """Plain torch: ``torch.baddbmm(b, x, w)``, then ``torch.relu`` with ``relu``, or ``residual +``
    it; with ``group_mean`` > 1 the mean of each ``group_mean`` consecutive rows (``Tensor.mean``);
    differentiable by autograd."""
    y = torch.baddbmm(b, x, w)
    if residual is not None:
        y = residual + y
    elif relu:
        y = torch.relu(y)
    return y if group_mean == 1 else y.view(y.shape[0], -1, group_mean, y.shape[2]).mean(dim=2)


def group_mean_fits(m: int, group: int) -> bool:
    """Whether the kernel's epilogue takes the mean of ``group`` consecutive rows of ``m``: a power
    of two of at most :data:`BLOCK_M` that divides m (a program's rows then hold whole groups)."""
    return 1 <= group <= BLOCK_M and group & (group - 1) == 0 and m % group == 0


def _residual_problem(x: Tensor, w: Tensor, residual, relu: bool) -> str | None:
    """Why ``residual`` does not go with (x, w, relu) in :func:`member_linear`, or None."""
    if residual is None:
        return None
    shape = (x.shape[0], x.shape[1], w.shape[2])
    if not isinstance(residual, Tensor) or residual.dtype != torch.float32 or tuple(residual.shape) != shape \
            or residual.device != x.device:
        return f"member_linear: residual must be a float32 {list(shape)} tensor on {x.device}, got {describe(residual)}"
    if relu:
        return "member_linear: a residual is added to the layer's output without a ReLU (relu=False)"
    return None


def member_linear(x: Tensor, w: Tensor, b: Tensor, relu: bool = False, *, residual: Tensor | None = None,
                  group_mean: int = 1, backend: str = "auto") -> Tensor:
    """y_p = x_p W_p + b_p (then ReLU with ``relu``, or ``r_p +`` it with ``residual``) for every
    member p, one kernel forward.

    Args:
        x: float32 ``[P, M, K]``, any strides, 1 <= P <= 65535, M, K >= 0.
        w: float32 ``[P, K, N]`` (a member's ``nn.Linear.weight`` transposed), any strides, x's device.
        b: float32 ``[P, 1, N]``.
        relu: apply the ReLU after the bias.
        residual: None, or r float32 ``[P, M, N]`` (any strides, x's device; not with ``relu``),
            added after the bias in the kernel's epilogue: a pre-LN Transformer block's
            ``x + proj(...)`` (:mod:`foxdqn.population.attention`), bit for bit the sum
            ``r + member_linear(x, w, b)`` that torch's add would form, one launch fewer.
            Its gradient is dy.
        group_mean: G >= 1 dividing M (not with ``residual``): y is the mean of each G consecutive
            rows of the layer's output, ``[P, M/G, N]`` (IQN's expected Q over its K policy
            fractions, :meth:`foxdqn.population.distributional.MemberIQNNetwork.policy_q`). Without a
            gradient and where :func:`group_mean_fits`, in the kernel's epilogue (the sum of a tile's
            rows of a group, times 1/G): one launch where ``Tensor.mean`` is a second; else the layer,
            then ``Tensor.mean``.
        backend: ``"auto"`` (the kernel for CUDA tensors, else the reference; the kernel inside
            :func:`foxdqn.ops.backend.cpu_kernels`), ``"triton"`` (CPU tensors need
            TRITON_INTERPRET=1) or ``"torch"`` (:func:`member_linear_reference`).

    Returns:
        y float32 ``[P, M, N]`` (``[P, M/G, N]`` with ``group_mean``), contiguous; differentiable
        w.r.t. x, w and b (first order on the kernel path). Equal to the reference to float
        rounding (module docstring).

    Raises:
        ValueError: outside the contract above (:func:`member_linear_supported` is False; a
            residual of another shape, dtype or device, or with ``relu``; a ``group_mean`` that is
            not a divisor of M, or with a residual), an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    problem = _problem(x, w, b) or _residual_problem(x, w, residual, relu)
    if problem is None and (group_mean < 1 or x.shape[1] % group_mean or (group_mean > 1 and residual is not None)):
        problem = (f"member_linear: group_mean must be a divisor >= 1 of x's {x.shape[1]} rows, without a "
                   f"residual, got {group_mean}")
    if problem is not None:
        raise ValueError(problem)
    if resolve_backend("member_linear", backend, x) == "torch":
        return member_linear_reference(x, w, b, relu, residual=residual, group_mean=group_mean)
    grads = [t is not None and t.requires_grad for t in (x, w, b, residual)]
    if torch.is_grad_enabled() and any(grads):
        y = _MemberLinear.apply(x, w, b, bool(relu), residual)
    elif group_mean_fits(x.shape[1], group_mean):
        return _launch(x, w, b, bool(relu), residual=residual, group=group_mean)
    else:
        y = _launch(x, w, b, bool(relu), residual=residual)
    return y if group_mean == 1 else y.view(y.shape[0], -1, group_mean, y.shape[2]).mean(dim=2)


def member_linear_pair_reference(x_a: Tensor, x_b: Tensor, w: Tensor, b: Tensor,
                                 relu: bool = False) -> tuple[Tensor, Tensor]:
    """Plain torch: :func:`member_linear_reference` of ``x_a``, and of ``x_b`` without gradient."""
    with torch.no_grad():
        y_b = member_linear_reference(x_b, w, b, relu)
    return member_linear_reference(x_a, w, b, relu), y_b


def member_linear_pair(x_a: Tensor, x_b: Tensor, w: Tensor, b: Tensor, relu: bool = False, *,
                       backend: str = "auto") -> tuple[Tensor, Tensor]:
    """:func:`member_linear` of two sets of rows of the same members' layer in one launch: the
    rows of s with gradient and of s' without (a Double DQN target's online pass, IQL's V(s')),
    where two calls launch twice.

    Args:
        x_a: float32 ``[P, M_a, K]``, any strides: the rows whose outputs carry a gradient.
        x_b: float32 ``[P, M_b, K]``, any strides, x_a's device: the rows whose outputs are constants.
        w, b, relu, backend: as :func:`member_linear`.

    Returns:
        ``(y_a [P, M_a, N], y_b [P, M_b, N])``, float32, contiguous: y_a differentiable w.r.t. x_a,
        w and b (first order; its backward covers x_a's rows only, as :func:`member_linear`'s of
        x_a), y_b a constant. Each equal to :func:`member_linear` of its rows to float rounding (the
        tile is chosen for both parts together, module docstring).

    Raises:
        ValueError: x_a or x_b outside :func:`member_linear`'s contract, an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    for x in (x_a, x_b):
        problem = _problem(x, w, b)
        if problem is not None:
            raise ValueError(problem)
    if x_a.device != x_b.device:
        raise ValueError(f"member_linear: x_a and x_b must be on one device, got {x_a.device} and {x_b.device}")
    if resolve_backend("member_linear", backend, x_a) == "torch":
        return member_linear_pair_reference(x_a, x_b, w, b, relu)
    if torch.is_grad_enabled() and (x_a.requires_grad or w.requires_grad or b.requires_grad):
        return _MemberLinearPair.apply(x_a, x_b, w, b, bool(relu))
    return _launch(x_a, w, b, bool(relu), x_b)
