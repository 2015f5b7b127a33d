r"""A population's pre-LN attention block with its gradient: one kernel forward, two backward.

For member p of P and each of its M sequences of W tokens (x float32 ``[P, M·W, C]``), the block of
:class:`foxdqn.population.attention.MemberAttentionBlock` (pre-LN Transformer encoder block,
Vaswani et al. 2017 §3.1–3.3 with the layer norms in front of each sublayer, Xiong et al. 2020
Fig. 1(b); :mod:`foxdqn.ops.member_attention_encoder` gives the math)::

    u₁ = LN₁(x),  [q | k | v] = u₁ W_qkv + b_qkv,  a = concat_h softmax(q_h k_hᵀ / √D) v_h
    x₁ = x + a W_p + b_p
    u₂ = LN₂(x₁),  z = u₂ W₁ + b₁,  g = GELU(z)   (exact)
    y  = x₁ + g W₂ + b₂

Where the module runs this with autograd as 8 kernels forward and about 26 backward (two layer
norms, four Linears with their split-K GEMMs and bias sums, torch's attention forward and backward,
the GELU, the residual adds), the op runs:

* forward: :mod:`foxdqn.ops.member_attention_encoder`'s block kernel (one program per sequence and
  member, the W tokens in registers through the block); only x is kept for the backward;
* backward, kernel 1, one program per (sequence, member): the block's forward again from x (the
  layer norms' statistics, each head's q, k, v and softmax, x₁, u₂), then the chain rule back
  through it: the MLP in chunks of ``BLOCK_HIDDEN`` of its 4C units (dg = dy W₂ᵀ, dz = dg ⊙
  GELU'(z), du₂ += dz W₁ᵀ), LN₂'s backward, each head's attention backward (dP = da_h v_hᵀ,
  dS = P ⊙ (dP − rowsum(P ⊙ dP)), dq = dS k / √D, dk = dSᵀ q / √D, dv = Pᵀ da_h), LN₁'s
  backward, and dx = dx₁ + LN₁'s input gradient. It stores dx and, for the weight gradients, each
  Linear's input and output gradient row by row (u₁ and [dq | dk | dv], a and dx₁, u₂ and dz,
  g and dy) and its sequence's parts of the layer norms' dγ = Σ du ⊙ x̂ and dβ = Σ du;
* backward, kernel 2: the block's weight and bias gradients in one launch, dW = Σ_rows inputᵀ ·
  output gradient for the four Linears (:func:`foxdqn.ops.member_linear_grads._dw_tile`'s tiles over
  slices of the rows, the last slice program of a tile summing the slices in order) and the four
  layer-norm vectors (one program each summing the sequences' parts in order), each gradient
  contiguous in its parameter's layout (a strided one would cost a copy in autograd's accumulation).

The encoder's first block takes the observations instead of x (``embed``): both kernels compute
x⁰ = bars W_e + b_e + pos from the observation's window (read with its strides); the first stores
the bars, the second adds W_e's gradient (Σ barsᵀ dx⁰ over the rows, its bias Σ dx⁰) and the
positions' (Σ over the sequences of dx⁰, ``POS_COLS`` of the W·C values a program). The loops over
heads and chunks are dynamic: unrolled, the compiler kept too many tiles live and spilled 310
registers (docs/bench.md, "Each attention block one kernel forward and two backward").

Every tile and every order of summation depends on W, C, H and M only, never on P: member p of P
gets the bits of a population of one, and a second call the same bits. Precision:
:mod:`foxdqn.ops.mlp_chain`'s rule for every product (TF32-rounded operands where torch runs float32
CUDA matmuls in TF32, else IEEE float32), so the output and the gradients equal
:func:`member_attention_block_reference`'s (autograd through the module's math) to float rounding.

Contract (:func:`member_attention_block_supported`): x float32 ``[P, M·W, C]`` contiguous (or with
``embed`` the observations ``[P, M, W·F + A]``, M >= 1, 1 <= F <= 16), the
weights as :class:`~foxdqn.ops.member_attention_encoder.BlockWeights` (contiguous float32 in the
population's layouts), 1 <= P <= 65535, C a power of two of 16 to 128 and D = C / H a power of two
of at least 16, 1 <= W <= 128. Capture: device ops only; the weight kernel's parts and tickets
(:func:`foxdqn.ops.tensor_list.group_scratch`) are made on an eager call before a capture; the
backward's row buffers are ``torch.empty``.

Errors: ``ValueError`` (``member_attention_block: ...``) outside the contract; ``RuntimeError`` for
backend="triton" on CPU tensors without TRITON_INTERPRET=1.

Source: the chain rule through the block (layer norm: Ba et al. 2016; softmax attention's backward
as in Dao et al. 2022, Alg. 2, without tiling; GELU: Hendrycks & Gimpel 2016).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.member_attention_encoder import BLOCK_HIDDEN, MAX_MEMBERS, MAX_WINDOW, NUM_WARPS, BlockWeights, \
    _attention_block_kernel, _block_input, _dot, _pow2
from foxdqn.ops.member_linear_grads import BLOCK_R, _dw_tile, plan
from foxdqn.ops.mlp_chain import _prec
from foxdqn.ops.tensor_list import group_scratch, sum_of_parts

__all__ = ["member_attention_block", "member_attention_block_reference", "member_attention_block_supported"]

LN_SUM = 16  #: sequences' parts a step of a layer-norm vector's sum
BACKWARD_WARPS = 4  #: warps of a program of the backward's first kernel
BLOCK_F = 16  #: features of a bar, at most (the embedding's tile)
POS_COLS = 256  #: of the positions' W·C gradient values, a program's


@triton.jit
def _ln_stats(x, C: tl.constexpr, eps):
    """x̂ and 1/σ of each row of x [R, C] (biased variance, torch's LayerNorm)."""
    d = x - (tl.sum(x, axis=1) / C)[:, None]
    rstd = 1.0 / tl.sqrt_rn(tl.sum(d * d, axis=1) / C + eps)
    return d * rstd[:, None], rstd


@triton.jit
def _ln_backward(du, xh, rstd, gamma, C: tl.constexpr):
    """The input gradient of u = x̂ γ + β from du [R, C]: (dx̂ − mean(dx̂) − x̂ mean(dx̂ ⊙ x̂)) / σ."""
    dxh = du * gamma[None, :]
    return rstd[:, None] * (dxh - (tl.sum(dxh, axis=1) / C)[:, None] - xh * (tl.sum(dxh * xh, axis=1) / C)[:, None])


@triton.jit
def _head(u, wqkv, bqkv, h, cols, ds, tm, scale, C: tl.constexpr, D: tl.constexpr, BLOCK_W: tl.constexpr,
          PREC: tl.constexpr):
    """Head h's q, k, v [BLOCK_W, D] and softmax P [BLOCK_W, BLOCK_W] (0 at padded keys)."""
    wq = wqkv + cols[:, None] * (3 * C) + h * D + ds[None, :]
    q = _dot(u, tl.load(wq), tl.zeros([BLOCK_W, D], tl.float32), PREC) + tl.load(bqkv + h * D + ds)[None, :]
    k = _dot(u, tl.load(wq + C), tl.zeros([BLOCK_W, D], tl.float32), PREC) + tl.load(bqkv + C + h * D + ds)[None, :]
    v = _dot(u, tl.load(wq + 2 * C), tl.zeros([BLOCK_W, D], tl.float32), PREC) \
        + tl.load(bqkv + 2 * C + h * D + ds)[None, :]
    scores = _dot(q, tl.trans(k), tl.zeros([BLOCK_W, BLOCK_W], tl.float32), PREC) * scale
    scores = tl.where(tm[None, :], scores, float("-inf"))
    e = tl.exp(scores - tl.max(scores, axis=1)[:, None])
    return q, k, v, e / tl.sum(e, axis=1)[:, None]


@triton.jit
def _attention_block_backward_kernel(
        x_ptr, obs_ptr, we_ptr, be_ptr, pos_ptr, bars_ptr, dy_ptr, g1_ptr, c1_ptr, wqkv_ptr, bqkv_ptr, wp_ptr, bp_ptr,
        g2_ptr, c2_ptr, w1_ptr, b1_ptr, w2_ptr, dx_ptr, u1_ptr, dqkv_ptr, a_ptr, dx1_ptr, u2_ptr, dz_ptr, g_ptr,
        ln_ptr, M, W, F, sop, som, sof, eps1, eps2, scale, EMBED: tl.constexpr, C: tl.constexpr, H: tl.constexpr,
        D: tl.constexpr, HIDDEN: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_F: tl.constexpr,
        BLOCK_HIDDEN: tl.constexpr, PREC: tl.constexpr):
    """Sequence ``program_id(0)`` of member ``program_id(1)`` (module docstring, backward kernel 1).
    Row buffers [P·M·W, n] contiguous (n = C, 3C or 4C; bars BLOCK_F); ln parts [P·M, 4C]: dγ₁, dβ₁,
    dγ₂, dβ₂. With EMBED the input is embedded from the observation (:func:`_block_input`) and dx is
    the gradient of the embedded input."""
    s = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1).to(tl.int64)
    toks = tl.arange(0, BLOCK_W)
    tm = toks < W
    cols = tl.arange(0, C)
    ds = tl.arange(0, D)
    rows = (p * M + s) * W + toks.to(tl.int64)
    rc = rows[:, None] * C + cols[None, :]
    mask = tm[:, None]
    wqkv, bqkv = wqkv_ptr + p * C * 3 * C, bqkv_ptr + p * 3 * C
    wp = wp_ptr + p * C * C
    w1, w2 = w1_ptr + p * C * HIDDEN, w2_ptr + p * HIDDEN * C
    gamma1, gamma2 = tl.load(g1_ptr + p * C + cols), tl.load(g2_ptr + p * C + cols)

    # the forward again: x1 = x + attention, u2 = LN2(x1); u1 and a (each head's output) stored for the
    # weights; dynamic loops over heads and chunks (unrolled, the compiler's live tiles spill)
    x = _block_input(x_ptr, obs_ptr, we_ptr, be_ptr, pos_ptr, bars_ptr, p, s, rows, toks, tm, cols, W, F, sop, som,
                     sof, C, EMBED, True, BLOCK_W, BLOCK_F, PREC)
    xh1, rstd1 = _ln_stats(x, C, eps1)
    u1 = xh1 * gamma1[None, :] + tl.load(c1_ptr + p * C + cols)[None, :]
    tl.store(u1_ptr + rc, u1, mask=mask)
    attn = tl.zeros([BLOCK_W, C], tl.float32)
    for h in range(H):
        q, k, v, pr = _head(u1, wqkv, bqkv, h, cols, ds, tm, scale, C, D, BLOCK_W, PREC)
        a = _dot(pr, v, tl.zeros([BLOCK_W, D], tl.float32), PREC)
        tl.store(a_ptr + rows[:, None] * C + h * D + ds[None, :], a, mask=mask)
        attn = _dot(a, tl.load(wp + (h * D + ds)[:, None] * C + cols[None, :]), attn, PREC)
    x1 = x + (attn + tl.load(bp_ptr + p * C + cols)[None, :])
    xh2, rstd2 = _ln_stats(x1, C, eps2)
    u2 = xh2 * gamma2[None, :] + tl.load(c2_ptr + p * C + cols)[None, :]
    tl.store(u2_ptr + rc, u2, mask=mask)

    # y = x1 + GELU(u2 W1 + b1) W2 + b2: dz = (dy W2ᵀ) ⊙ GELU'(z), du2 = dz W1ᵀ, chunk by chunk
    dy = tl.load(dy_ptr + rc, mask=mask, other=0.0)
    hs = tl.arange(0, BLOCK_HIDDEN)
    du2 = tl.zeros([BLOCK_W, C], tl.float32)
    for j in range(HIDDEN // BLOCK_HIDDEN):
        units = j * BLOCK_HIDDEN + hs
        w1c = tl.load(w1 + cols[:, None] * HIDDEN + units[None, :])  # [C, BLOCK_HIDDEN]
        z = _dot(u2, w1c, tl.zeros([BLOCK_W, BLOCK_HIDDEN], tl.float32), PREC) \
            + tl.load(b1_ptr + p * HIDDEN + units)[None, :]
        cdf = 0.5 * (1.0 + tl.math.erf(z * 0.7071067811865476))
        ru = rows[:, None] * HIDDEN + units[None, :]
        tl.store(g_ptr + ru, z * cdf, mask=mask)
        w2t = tl.load(w2 + units[None, :] * C + cols[:, None])  # W2's chunk transposed, [C, BLOCK_HIDDEN]
        dg = _dot(dy, w2t, tl.zeros([BLOCK_W, BLOCK_HIDDEN], tl.float32), PREC)
        dz = dg * (cdf + z * tl.exp(-0.5 * z * z) * 0.3989422804014327)
        tl.store(dz_ptr + ru, dz, mask=mask)
        du2 = _dot(dz, tl.trans(w1c), du2, PREC)
    du2 = tl.where(mask, du2, 0.0)
    dx1 = dy + _ln_backward(du2, xh2, rstd2, gamma2, C)
    tl.store(dx1_ptr + rc, dx1, mask=mask)
    ln = ln_ptr + (p * M + s) * 4 * C + cols  # this sequence's parts of dγ = Σ du ⊙ x̂ and dβ = Σ du
    tl.store(ln + 2 * C, tl.sum(du2 * xh2, axis=0))
    tl.store(ln + 3 * C, tl.sum(du2, axis=0))

    # x1 = x + a W_p + b_p: each head's da = dx1 W_pᵀ (its rows), then the softmax attention's backward
    du1 = tl.zeros([BLOCK_W, C], tl.float32)
    for h in range(H):
        q, k, v, pr = _head(u1, wqkv, bqkv, h, cols, ds, tm, scale, C, D, BLOCK_W, PREC)
        da = _dot(dx1, tl.load(wp + (h * D + ds)[None, :] * C + cols[:, None]),
                  tl.zeros([BLOCK_W, D], tl.float32), PREC)  # [BLOCK_W, D]
        dv = _dot(tl.trans(pr), da, tl.zeros([BLOCK_W, D], tl.float32), PREC)
        dpr = _dot(da, tl.trans(v), tl.zeros([BLOCK_W, BLOCK_W], tl.float32), PREC)
        dsc = pr * (dpr - tl.sum(pr * dpr, axis=1)[:, None]) * scale
        dq = _dot(dsc, k, tl.zeros([BLOCK_W, D], tl.float32), PREC)
        dk = _dot(tl.trans(dsc), q, tl.zeros([BLOCK_W, D], tl.float32), PREC)
        at = rows[:, None] * (3 * C) + h * D + ds[None, :]
        tl.store(dqkv_ptr + at, dq, mask=mask)
        tl.store(dqkv_ptr + at + C, dk, mask=mask)
        tl.store(dqkv_ptr + at + 2 * C, dv, mask=mask)
        wt = wqkv + cols[None, :] * (3 * C) + h * D + ds[:, None]  # W_q's head columns transposed, [D, C]
        du1 = _dot(dq, tl.load(wt), du1, PREC)
        du1 = _dot(dk, tl.load(wt + C), du1, PREC)
        du1 = _dot(dv, tl.load(wt + 2 * C), du1, PREC)
    du1 = tl.where(mask, du1, 0.0)
    x = _block_input(x_ptr, obs_ptr, we_ptr, be_ptr, pos_ptr, bars_ptr, p, s, rows, toks, tm, cols, W, F, sop, som,
                     sof, C, EMBED, False, BLOCK_W, BLOCK_F, PREC)  # again: not kept live
    xh1, rstd1 = _ln_stats(x, C, eps1)
    tl.store(dx_ptr + rc, dx1 + _ln_backward(du1, xh1, rstd1, gamma1, C), mask=mask)
    tl.store(ln, tl.sum(du1 * xh1, axis=0))
    tl.store(ln + C, tl.sum(du1, axis=0))


@triton.jit
def _attention_block_weights_kernel(
        u1_ptr, dqkv_ptr, a_ptr, dx1_ptr, u2_ptr, dz_ptr, g_ptr, dy_ptr, ln_ptr,
        dwqkv_ptr, dbqkv_ptr, dwp_ptr, dbp_ptr, dw1_ptr, db1_ptr, dw2_ptr, db2_ptr, dln_ptr,
        part_ptr, ticket_ptr, bars_ptr, dx_ptr, dwe_ptr, dbe_ptr, dpos_ptr, M, T, F, S, SLICE, E1, E2, E3, E4, E5,
        TWN1, TW1, TWN2, TW2, TWN3, TW3, TWN4, TW4, TWN5, TW5, PO2, PO3, PO4, PO5, KO2, KO3, KO4, KO5, WC,
        C: tl.constexpr, HIDDEN: tl.constexpr, PREC: tl.constexpr, WK1: tl.constexpr, WN1: tl.constexpr,
        WK2: tl.constexpr, WN2: tl.constexpr, WK3: tl.constexpr, WN3: tl.constexpr, WK4: tl.constexpr,
        WN4: tl.constexpr, WK5: tl.constexpr, WN5: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_R: tl.constexpr,
        LN_SUM: tl.constexpr, POS_COLS: tl.constexpr):
    """Program ``program_id(0)`` of member ``program_id(1)`` (module docstring, backward kernel 2):
    programs [0, E1) W_qkv's tile slices, [E1, E2) W_p's, [E2, E3) W₁'s, [E3, E4) W₂'s, then with an
    embedding [E4, E5) W_e's (the bars [P, T, BLOCK_F] and dx) and the positions' gradient
    (Σ over the sequences of dx, POS_COLS of its W·C values a program), then four summing the
    layer norms' parts (dγ₁, dβ₁, dγ₂, dβ₂ in dln [4, P, C]). PO·/KO·: each Linear's first part row
    and ticket in the scratch."""
    p = tl.program_id(1).to(tl.int64)
    pid = tl.program_id(0)
    sxp = T * C
    if pid < E1:
        _dw_tile(pid, p, u1_ptr, dqkv_ptr, dqkv_ptr, dwqkv_ptr, dbqkv_ptr, part_ptr, ticket_ptr, T, C, 3 * C,
                 sxp, C, 1, TWN1, TW1, S, SLICE, False, PREC, True, True, WK1, WN1, BLOCK_R)
    elif pid < E2:
        _dw_tile(pid - E1, p, a_ptr, dx1_ptr, dx1_ptr, dwp_ptr, dbp_ptr, part_ptr + PO2, ticket_ptr + KO2, T, C, C,
                 sxp, C, 1, TWN2, TW2, S, SLICE, False, PREC, True, True, WK2, WN2, BLOCK_R)
    elif pid < E3:
        _dw_tile(pid - E2, p, u2_ptr, dz_ptr, dz_ptr, dw1_ptr, db1_ptr, part_ptr + PO3, ticket_ptr + KO3, T, C,
                 HIDDEN, sxp, C, 1, TWN3, TW3, S, SLICE, False, PREC, True, True, WK3, WN3, BLOCK_R)
    elif pid < E4:
        _dw_tile(pid - E3, p, g_ptr, dy_ptr, dy_ptr, dw2_ptr, db2_ptr, part_ptr + PO4, ticket_ptr + KO4, T, HIDDEN,
                 C, T * HIDDEN, HIDDEN, 1, TWN4, TW4, S, SLICE, False, PREC, True, True, WK4, WN4, BLOCK_R)
    elif pid < E5:
        _dw_tile(pid - E4, p, bars_ptr, dx_ptr, dx_ptr, dwe_ptr, dbe_ptr, part_ptr + PO5, ticket_ptr + KO5, T, F,
                 C, T * BLOCK_F, BLOCK_F, 1, TWN5, TW5, S, SLICE, False, PREC, True, True, WK5, WN5, BLOCK_R)
    elif pid < E5 + tl.cdiv(WC, POS_COLS):
        _sequence_sum(dx_ptr, dpos_ptr + p * WC, p * M, M, WC, (pid - E5) * POS_COLS, LN_SUM, POS_COLS)
    else:
        which = pid - E5 - tl.cdiv(WC, POS_COLS)  # dγ₁, dβ₁, dγ₂, dβ₂
        _sequence_sum(ln_ptr + which * C, dln_ptr + (which * tl.num_programs(1) + p) * C, p * M, M, 4 * C, 0,
                      LN_SUM, C)


@triton.jit
def _sequence_sum(part_ptr, out_ptr, first, count, stride, col0, SUM: tl.constexpr, WIDTH: tl.constexpr):
    """out[col0 + j] = Σ_k part[first + k, col0 + j] over the ``count`` sequences' rows (in order), for
    the j < WIDTH with col0 + j < stride (a helper per branch: the compiler wants one type a name)."""
    at = col0 + tl.arange(0, WIDTH)
    tl.store(out_ptr + at, sum_of_parts(part_ptr, first, count, stride, at, at < stride, SUM, WIDTH), mask=at < stride)


def _problem(x, weights, sequences, heads, embed=None) -> str | None:
    """Why the arguments are outside the contract (module docstring), or None."""
    op = "member_attention_block"
    if embed is not None:
        return _embed_problem(x, weights, sequences, heads, embed)
    if not isinstance(x, Tensor) or x.dim() != 3 or x.dtype != torch.float32 or not x.is_contiguous():
        return f"{op}: x must be a contiguous float32 [P, M·W, C] tensor, got {describe(x)}"
    p, rows, c = x.shape
    if not isinstance(sequences, int) or sequences < 1 or rows % sequences:
        return f"{op}: x's {rows} rows must be M sequences of W tokens, got M = {sequences!r}"
    return _weights_problem(x, weights, p, rows // sequences, c, heads)


def _embed_problem(obs, weights, sequences, heads, embed) -> str | None:
    op = "member_attention_block"
    if not isinstance(embed, tuple) or len(embed) != 3 or not all(isinstance(t, Tensor) for t in embed) \
            or embed[0].dim() != 3 or embed[2].dim() != 3:
        return f"{op}: embed must be (W_e [P, F, C], b_e [P, 1, C], pos [P, W, C]), got {type(embed).__name__}"
    we, be, pos = embed
    p, w, c = pos.shape
    f = we.shape[1]
    if not isinstance(sequences, int) or sequences < 1:
        return f"{op}: at least one observation a member, got M = {sequences!r}"
    if not isinstance(obs, Tensor) or obs.dtype != torch.float32 or obs.dim() != 3 or obs.shape[0] != p \
            or obs.shape[2] < w * f or obs.shape[1] != sequences:
        return f"{op}: with embed, x must be the float32 observations [{p}, {sequences}, {w} × {f} + A], got " \
               f"{describe(obs)}"
    if not 1 <= f <= BLOCK_F:
        return f"{op}: 1 to {BLOCK_F} features a bar, got {f}"
    for name, t, shape in (("W_e", we, (p, f, c)), ("b_e", be, (p, 1, c))):
        if t.dtype != torch.float32 or tuple(t.shape) != shape or not t.is_contiguous() or t.device != obs.device:
            return f"{op}: embed's {name} must be a contiguous float32 {list(shape)} tensor, got {describe(t)}"
    if pos.dtype != torch.float32 or not pos.is_contiguous() or pos.device != obs.device:
        return f"{op}: embed's pos must be a contiguous float32 [P, W, C] tensor, got {describe(pos)}"
    return _weights_problem(obs, weights, p, w, c, heads)


def _weights_problem(x, weights, p, w, c, heads) -> str | None:
    op = "member_attention_block"
    if not 1 <= p <= MAX_MEMBERS:
        return f"{op}: 1 to {MAX_MEMBERS} members (the grid's second axis), got {p}"
    if not 1 <= w <= MAX_WINDOW:
        return f"{op}: 1 to {MAX_WINDOW} tokens a sequence, got {w}"
    if not (_pow2(c) and 16 <= c <= 128) or heads < 1 or c % heads or not (_pow2(c // heads) and c // heads >= 16):
        return f"{op}: width C = {c} with {heads} heads; C a power of two of 16 to 128, C / heads a power of two >= 16"
    if not isinstance(weights, BlockWeights):
        return f"{op}: weights must be a BlockWeights, got {type(weights).__name__}"
    for name, shape in (("ln1_w", (p, 1, c)), ("ln1_b", (p, 1, c)), ("qkv_w", (p, c, 3 * c)), ("qkv_b", (p, 1, 3 * c)),
                        ("proj_w", (p, c, c)), ("proj_b", (p, 1, c)), ("ln2_w", (p, 1, c)), ("ln2_b", (p, 1, c)),
                        ("fc1_w", (p, c, 4 * c)), ("fc1_b", (p, 1, 4 * c)), ("fc2_w", (p, 4 * c, c)),
                        ("fc2_b", (p, 1, c))):
        t = getattr(weights, name)
        if not isinstance(t, Tensor) or t.dtype != torch.float32 or tuple(t.shape) != shape \
                or not t.is_contiguous() or t.device != x.device:
            return f"{op}: weights.{name} must be a contiguous float32 {list(shape)} tensor on {x.device}, got " \
                   f"{describe(t)}"
    return None


def member_attention_block_supported(x, weights, sequences, heads, embed=None) -> bool:
    """Whether :func:`member_attention_block` takes these arguments (a metadata check, no device read)."""
    return _problem(x, weights, sequences, heads, embed) is None


def member_attention_block_reference(x: Tensor, weights: BlockWeights, sequences: int, heads: int,
                                     embed: tuple[Tensor, Tensor, Tensor] | None = None) -> Tensor:
    """Plain torch, as :class:`foxdqn.population.attention.MemberAttentionBlock` computes it
    (``baddbmm``, ``F.layer_norm``, ``F.scaled_dot_product_attention``, ``F.gelu``), with ``embed``
    the encoder's embedding first; autograd gives its gradients."""
    b = weights
    if embed is not None:
        we, be, pos = embed
        p, w, c = pos.shape
        f = we.shape[1]
        x = (torch.baddbmm(be, x[..., : w * f].reshape(p, sequences * w, f), we).view(p, sequences, w, c)
             + pos[:, None]).view(p, sequences * w, c)
    p, rows, c = x.shape

    def ln(t, w_, b_, eps):
        return torch.addcmul(b_, F.layer_norm(t, t.shape[-1:], eps=eps), w_)

    q, k, v = (t.reshape(p * sequences, rows // sequences, heads, c // heads).transpose(1, 2)
               for t in torch.baddbmm(b.qkv_b, ln(x, b.ln1_w, b.ln1_b, b.eps1), b.qkv_w).split(c, dim=2))
    a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(p, rows, c)
    x = x + torch.baddbmm(b.proj_b, a, b.proj_w)
    return x + torch.baddbmm(b.fc2_b, F.gelu(torch.baddbmm(b.fc1_b, ln(x, b.ln2_w, b.ln2_b, b.eps2), b.fc1_w)), b.fc2_w)


def _launch_shape(x: Tensor, sequences: int, heads: int) -> dict:
    p, rows, c = x.shape
    w = rows // sequences
    return dict(C=c, H=heads, D=c // heads, HIDDEN=4 * c, BLOCK_W=max(16, triton.next_power_of_2(w)),
                BLOCK_HIDDEN=min(BLOCK_HIDDEN, 4 * c), PREC=_prec(x))


def _input_args(x: Tensor, embed: tuple | None, sequences: int) -> tuple:
    """(x, obs, W_e, b_e, pos, W, F, obs strides) of the kernels, for x [P, M·W, C] or with embed."""
    if embed is None:
        return (x, x, x, x, x, x.shape[1] // sequences, 1, 0, 0, 0)
    we, be, pos = embed
    return (x, x, we, be, pos, pos.shape[1], we.shape[1], *x.stride())


def _forward(x: Tensor, b: BlockWeights, sequences: int, heads: int, embed: tuple | None) -> Tensor:
    p, c = x.shape[0], b.ln1_w.shape[-1]
    inp, obs, we, be, pos, w, f, sop, som, sof = _input_args(x, embed, sequences)
    y = x.new_empty(p, sequences * w, c)
    _attention_block_kernel[(sequences, p)](
        inp, obs, we, be, pos, b.ln1_w, b.ln1_b, b.qkv_w, b.qkv_b, b.proj_w, b.proj_b, b.ln2_w, b.ln2_b,
        b.fc1_w, b.fc1_b, b.fc2_w, b.fc2_b, y, sequences, w, f, sop, som, sof, float(b.eps1), float(b.eps2),
        1.0 / math.sqrt(c // heads), EMBED=embed is not None, BLOCK_F=BLOCK_F, num_warps=NUM_WARPS,
        **_launch_shape(y, sequences, heads))
    return y


def _backward(x: Tensor, dy: Tensor, b: BlockWeights, sequences: int, heads: int,
              embed: tuple | None) -> tuple[Tensor, ...]:
    """(dx or None, d ln1_w, d ln1_b, d qkv_w, d qkv_b, d proj_w, d proj_b, d ln2_w, d ln2_b, d fc1_w,
    d fc1_b, d fc2_w, d fc2_b, then with embed d W_e, d b_e, d pos): the two kernels of the module
    docstring."""
    p, t, c = dy.shape
    hidden = 4 * c
    new = dy.new_empty
    inp, obs, we, be, pos, w, f, sop, som, sof = _input_args(x, embed, sequences)
    dx, u1, a, dx1, u2 = new(p, t, c), new(p, t, c), new(p, t, c), new(p, t, c), new(p, t, c)
    dqkv, dz, g = new(p, t, 3 * c), new(p, t, hidden), new(p, t, hidden)
    ln = new(p, sequences, 4 * c)
    bars = new(p, t, BLOCK_F) if embed is not None else dy
    shape = _launch_shape(dy, sequences, heads)
    _attention_block_backward_kernel[(sequences, p)](
        inp, obs, we, be, pos, bars, dy, b.ln1_w, b.ln1_b, b.qkv_w, b.qkv_b, b.proj_w, b.proj_b, b.ln2_w, b.ln2_b,
        b.fc1_w, b.fc1_b, b.fc2_w, dx, u1, dqkv, a, dx1, u2, dz, g, ln, sequences, w, f, sop, som, sof,
        float(b.eps1), float(b.eps2), 1.0 / math.sqrt(c // heads), EMBED=embed is not None, BLOCK_F=BLOCK_F,
        num_warps=BACKWARD_WARPS, **shape)

    grads = [new(p, c, 3 * c), new(p, 1, 3 * c), new(p, c, c), new(p, 1, c), new(p, c, hidden), new(p, 1, hidden),
             new(p, hidden, c), new(p, 1, c)]
    egrads = [new(p, f, c), new(p, 1, c), new(p, w, c)] if embed is not None else [dy, dy, dy]
    dln = new(4, p, 1, c)  # each vector's gradient contiguous (a strided one: a copy in autograd's accumulation)
    layers = [(c, 3 * c), (c, c), (c, hidden), (hidden, c), (f, c)]  # (K, N) of W_qkv, W_p, W1, W2, W_e
    plans = [plan(t, k, n) for k, n in layers]  # the slices depend on T only: one S for all
    tiles = [(triton.cdiv(n, pl["WN"]), triton.cdiv(k, pl["WK"]) * triton.cdiv(n, pl["WN"]))
             for (k, n), pl in zip(layers, plans)]
    if embed is None:
        tiles[4] = (tiles[4][0], 0)  # no W_e programs
    s_, slice_ = plans[0]["S"], plans[0]["SLICE"]
    ends, part_rows, ticket_rows, end, prow, krow = [], [], [], 0, 0, 0
    for (twn, tw), pl in zip(tiles, plans):
        end += tw * s_
        ends.append(end)
        part_rows.append(prow)
        ticket_rows.append(krow)
        prow += p * tw * s_ * (pl["WK"] * pl["WN"] + pl["WN"])
        krow += p * tw
    pos_programs = triton.cdiv(w * c, POS_COLS) if embed is not None else 0
    parts, tickets = group_scratch("member_attention_block", dy.device, prow, krow) if s_ > 1 else (dy, dy)
    _attention_block_weights_kernel[(end + pos_programs + 4, p)](
        u1, dqkv, a, dx1, u2, dz, g, dy, ln, *grads, dln, parts, tickets, bars, dx, *egrads, sequences, t, f, s_,
        slice_, *ends, *(v for pair in tiles for v in pair), *part_rows[1:], *ticket_rows[1:],
        w * c if embed is not None else 0, C=c, HIDDEN=hidden, PREC=shape["PREC"],
        **{f"W{kn}{i + 1}": pl[f"W{kn}"] for i, pl in enumerate(plans) for kn in "KN"}, BLOCK_F=BLOCK_F,
        BLOCK_R=BLOCK_R, LN_SUM=LN_SUM, POS_COLS=POS_COLS, num_warps=NUM_WARPS)
    dg1, db1_, dg2, db2_ = dln
    dwqkv, dbqkv, dwp, dbp, dw1, db1, dw2, db2 = grads
    out = (None if embed is not None else dx, dg1, db1_, dwqkv, dbqkv, dwp, dbp, dg2, db2_, dw1, db1, dw2, db2)
    return out + (tuple(egrads) if embed is not None else ())


class _MemberAttentionBlock(torch.autograd.Function):
    """y = the block (one kernel); the backward's two kernels give the gradients of x (or of the
    embedding's W_e, b_e and positions) and of the 12 weights."""

    @staticmethod
    def forward(ctx, x, sequences, heads, eps1, eps2, embedded, *tensors):
        b = BlockWeights(*tensors[:12], eps1, eps2)
        embed = tuple(tensors[12:]) if embedded else None
        ctx.save_for_backward(x, *tensors)
        ctx.block = (sequences, heads, eps1, eps2, embedded)
        return _forward(x, b, sequences, heads, embed)

    @staticmethod
    def backward(ctx, dy):
        x, *tensors = ctx.saved_tensors
        sequences, heads, eps1, eps2, embedded = ctx.block
        grads = _backward(x, dy.contiguous(), BlockWeights(*tensors[:12], eps1, eps2), sequences, heads,
                          tuple(tensors[12:]) if embedded else None)
        return (grads[0], None, None, None, None, None, *grads[1:])


def member_attention_block(x: Tensor, weights: BlockWeights, sequences: int, heads: int, *,
                           embed: tuple[Tensor, Tensor, Tensor] | None = None, backend: str = "auto") -> Tensor:
    """P pre-LN attention blocks, y float32 ``[P, M·W, C]`` (module docstring): one kernel, and two
    for the backward.

    Args:
        x: float32 ``[P, M·W, C]`` contiguous, each member's M sequences of W tokens; with ``embed``
            the observations float32 ``[P, M, W·F + A]`` (any strides), whose W bars of F features
            the block embeds first: x⁰ = bars W_e + b_e + pos (the first block of
            :mod:`foxdqn.ops.member_attention_encoder`).
        weights: the block's :class:`~foxdqn.ops.member_attention_encoder.BlockWeights`.
        sequences: M.
        heads: H, attention heads (D = C / H each).
        embed: None, or (W_e ``[P, F, C]``, b_e ``[P, 1, C]``, pos ``[P, W, C]``), float32 contiguous,
            F <= 16; they get gradients, the observations none.
        backend: ``"auto"`` (the kernels for CUDA tensors, else the reference; the kernels inside
            :func:`foxdqn.ops.backend.cpu_kernels`), ``"triton"`` (CPU tensors need
            TRITON_INTERPRET=1) or ``"torch"`` (:func:`member_attention_block_reference`).

    Returns:
        y float32 ``[P, M·W, C]`` contiguous, equal to the reference to float rounding;
        differentiable w.r.t. x (without embed), the 12 weight tensors and the embedding's (first order).

    Raises:
        ValueError: outside the contract (module docstring), or an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    problem = _problem(x, weights, sequences, heads, embed)
    if problem is not None:
        raise ValueError(problem)
    if resolve_backend("member_attention_block", backend, x) == "torch":
        return member_attention_block_reference(x, weights, sequences, heads, embed)
    tensors = tuple(weights[:12]) + (tuple(embed) if embed is not None else ())
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, *tensors)):
        return _MemberAttentionBlock.apply(x, sequences, heads, float(weights.eps1), float(weights.eps2),
                                           embed is not None, *tensors)
    return _forward(x, weights, sequences, heads, embed)
