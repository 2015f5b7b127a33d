r"""A population's attention encoder forward without gradient: one kernel per block and one for the pooling.

For member p of P and each of its M observations (a window of W bars of F features, then the A = 2
account features), the forward of :class:`foxdqn.population.attention.MemberAttentionEncoder`
(pre-LN Transformer encoder, Vaswani et al. 2017 §3.1–3.3 with the layer norms in front of each
sublayer, Xiong et al. 2020 Fig. 1(b); docstring of :mod:`foxdqn.nn.attention`):

    x⁰ = bars W_e + b_e + pos                                         [W, C] per observation
    xˡ' = xˡ⁻¹ + proj(MHSA(LN₁(xˡ⁻¹)))                                 (H heads of D = C / H)
    xˡ  = xˡ' + fc₂(GELU(fc₁(LN₂(xˡ'))))                               (fc₁: C → 4C, exact GELU)
    h   = mean over the W tokens of LN_f(x^L)   (or the newest token's)
    out = act(W_o [h | account] + b_o)                                 [C]

with MHSA(u) = concat_h softmax(q_h k_hᵀ / √D) v_h, [q | k | v] = u W_qkv + b_qkv (no mask, no
dropout). Where the module ran this as 8 launches per block (two layer norms, four Linears,
torch's attention kernel, the GELU) and 8 around them (the window's copy, the embedding, the
position add, the final layer norm, the mean, the cat, the output Linear, its activation), the op
runs L + 1:

* the block kernel, one program per (observation, member): the observation's W tokens
  ``[W, C]`` stay in registers through the block: both layer norms, the H heads (q, k, v, the
  W × W scores, their softmax and the weighted sum, each head's slice of proj accumulated), both
  residual adds, and the MLP in chunks of ``BLOCK_HIDDEN`` of its 4C units (fc₁ chunk, GELU, its
  fc₂ product accumulated). The first block's program also embeds the bars, read from the
  observation with its strides (no copy of the window), and adds the positions;
* the pooling kernel, one program per ``BLOCK_SEQ`` observations of a member: LN_f of each
  token, the mean (or the newest token), the output Linear on ``[h | account]`` (the account
  read from the observation) and the activation.

Members never mix (program (s, p) reads member p's weights and observation s only), and a tile
depends on W, F, C and H only, never on P or M: member p of P equals a population of one bit for
bit. Precision: :mod:`foxdqn.ops.mlp_chain`'s rule for every product (TF32-rounded operands where
torch runs float32 CUDA matmuls in TF32, else IEEE float32); sums run in the tile's order, so the
output equals :func:`member_attention_encoder_reference` to float rounding (about 1e-5 relative
in IEEE float32, 1e-3 in TF32). No gradient: in the training forward each block is
:mod:`foxdqn.ops.member_attention_block` (this block kernel, two for its backward), the embedding,
final layer norm, pooling and output Linear the module's layers (:mod:`foxdqn.ops.member_linear`,
:mod:`foxdqn.ops.member_layer_norm`). Capture: device ops only;
outputs ``torch.empty``.

Contract (:func:`member_attention_encoder_supported`): float32 contiguous parameters in the
population's layouts (a Linear's weight ``[P, in, out]``, bias and layer-norm affine ``[P, 1, n]``,
``pos`` ``[P, W, C]``), 1 <= P <= 65535; C a power of two of 16 to 128, D = C / H a power of two
of at least 16, 1 <= W <= 128, 1 <= F <= 16, 1 <= A <= 16, at least one block; pooling ``mean``
or ``last``; activation relu, gelu, tanh or silu. Elsewhere the module's torch path runs.

Errors: ``ValueError`` (``member_attention_encoder: ...``) outside the contract or with an input
that needs a gradient under grad mode; ``RuntimeError`` for backend="triton" on CPU tensors without
TRITON_INTERPRET=1.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.mlp_chain import _prec, _tf32

__all__ = ["ACTIVATION_CODES", "BlockWeights", "member_attention_encoder", "member_attention_encoder_reference",
           "member_attention_encoder_supported"]

#: The output activations the pooling kernel applies (``model.activation``), by code.
ACTIVATION_CODES = {"relu": 0, "gelu": 1, "tanh": 2, "silu": 3}
BLOCK_HIDDEN = 64  #: MLP units per chunk of the block kernel
BLOCK_SEQ = 16  #: observations per program of the pooling kernel
NUM_WARPS = 4
MAX_WINDOW, MAX_FEATURES, MAX_ACCOUNT = 128, 16, 16
MAX_MEMBERS = 65535  #: the grid's second axis


class BlockWeights(NamedTuple):
    """One pre-LN block's parameters, each float32 contiguous: ``ln1_w``, ``ln1_b``, ``ln2_w``,
    ``ln2_b`` ``[P, 1, C]``; ``qkv_w`` ``[P, C, 3C]``, ``qkv_b`` ``[P, 1, 3C]``; ``proj_w``
    ``[P, C, C]``; ``fc1_w`` ``[P, C, 4C]``; ``fc2_w`` ``[P, 4C, C]`` (biases ``[P, 1, out]``);
    ``eps1``, ``eps2`` the two layer norms' ε."""
    ln1_w: Tensor
    ln1_b: Tensor
    qkv_w: Tensor
    qkv_b: Tensor
    proj_w: Tensor
    proj_b: Tensor
    ln2_w: Tensor
    ln2_b: Tensor
    fc1_w: Tensor
    fc1_b: Tensor
    fc2_w: Tensor
    fc2_b: Tensor
    eps1: float
    eps2: float


@triton.jit
def _dot(a, b, acc, PREC: tl.constexpr):
    return tl.dot(_tf32(a, PREC), _tf32(b, PREC), acc=acc, input_precision=PREC)


@triton.jit
def _layer_norm(x, w_ptr, b_ptr, cols, C: tl.constexpr, eps):
    """Each row of x [R, C] normalised (biased variance), times γ plus β (torch's LayerNorm)."""
    mean = tl.sum(x, axis=1) / C
    d = x - mean[:, None]
    rstd = 1.0 / tl.sqrt_rn(tl.sum(d * d, axis=1) / C + eps)
    return d * rstd[:, None] * tl.load(w_ptr + cols)[None, :] + tl.load(b_ptr + cols)[None, :]


@triton.jit
def _block_input(x_ptr, obs_ptr, we_ptr, be_ptr, pos_ptr, bars_ptr, p, s, rows, toks, tm, cols, W, F, sop, som, sof,
                 C: tl.constexpr, EMBED: tl.constexpr, STORE_BARS: tl.constexpr, BLOCK_W: tl.constexpr,
                 BLOCK_F: tl.constexpr, PREC: tl.constexpr):
    """The block's input [BLOCK_W, C] (0 at padded tokens): x's rows, or with EMBED the sequence's bars
    read from the observation times W_e plus b_e plus the positions (the bars also stored [·, BLOCK_F]
    with STORE_BARS, for dW_e)."""
    if EMBED:
        fs = tl.arange(0, BLOCK_F)
        fm = fs < F
        bars = tl.load(obs_ptr + p * sop + s * som + (toks[:, None] * F + fs[None, :]) * sof,
                       mask=tm[:, None] & fm[None, :], other=0.0)
        if STORE_BARS:
            tl.store(bars_ptr + rows[:, None] * BLOCK_F + fs[None, :], bars, mask=tm[:, None])
        we = tl.load(we_ptr + p * F * C + fs[:, None] * C + cols[None, :], mask=fm[:, None], other=0.0)
        x = _dot(bars, we, tl.zeros([BLOCK_W, C], tl.float32), PREC) + tl.load(be_ptr + p * C + cols)[None, :]
        x = x + tl.load(pos_ptr + p * W * C + toks[:, None] * C + cols[None, :], mask=tm[:, None], other=0.0)
    else:
        x = tl.load(x_ptr + rows[:, None] * C + cols[None, :], mask=tm[:, None], other=0.0)
    return x


@triton.jit
def _attention_block_kernel(x_ptr, obs_ptr, we_ptr, be_ptr, pos_ptr, g1_ptr, c1_ptr, wqkv_ptr, bqkv_ptr, wp_ptr, bp_ptr,
                  g2_ptr, c2_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, y_ptr, M, W, F, sop, som, sof, eps1, eps2, scale,
                  EMBED: tl.constexpr, C: tl.constexpr, H: tl.constexpr, D: tl.constexpr, HIDDEN: tl.constexpr,
                  BLOCK_W: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_HIDDEN: tl.constexpr, PREC: tl.constexpr):
    s = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1).to(tl.int64)
    toks = tl.arange(0, BLOCK_W)
    tm = toks < W
    cols = tl.arange(0, C)
    ds = tl.arange(0, D)
    rows = (p * M + s) * W + toks.to(tl.int64)  # the observation's tokens in [P·M·W, C]
    x = _block_input(x_ptr, obs_ptr, we_ptr, be_ptr, pos_ptr, x_ptr, p, s, rows, toks, tm, cols, W, F, sop, som, sof,
                     C, EMBED, False, BLOCK_W, BLOCK_F, PREC)

    # x + proj(MHSA(LN1(x))): each head's q, k, v from its columns of W_qkv, its output's rows of W_proj
    u = _layer_norm(x, g1_ptr + p * C, c1_ptr + p * C, cols, C, eps1)
    attn = tl.zeros([BLOCK_W, C], tl.float32)
    for h in tl.static_range(H):
        wq = wqkv_ptr + p * C * 3 * C + cols[:, None] * (3 * C) + h * D + ds[None, :]
        bq = bqkv_ptr + p * 3 * C + h * D + ds
        q = _dot(u, tl.load(wq), tl.zeros([BLOCK_W, D], tl.float32), PREC) + tl.load(bq)[None, :]
        k = _dot(u, tl.load(wq + C), tl.zeros([BLOCK_W, D], tl.float32), PREC) + tl.load(bq + C)[None, :]
        v = _dot(u, tl.load(wq + 2 * C), tl.zeros([BLOCK_W, D], tl.float32), PREC) + tl.load(bq + 2 * C)[None, :]
        scores = _dot(q, tl.trans(k), tl.zeros([BLOCK_W, BLOCK_W], tl.float32), PREC) * scale
        scores = tl.where(tm[None, :], scores, float("-inf"))
        e = tl.exp(scores - tl.max(scores, axis=1)[:, None])
        a = _dot(e / tl.sum(e, axis=1)[:, None], v, tl.zeros([BLOCK_W, D], tl.float32), PREC)
        wp = tl.load(wp_ptr + p * C * C + (h * D + ds)[:, None] * C + cols[None, :])
        attn = _dot(a, wp, attn, PREC)
    x = x + (attn + tl.load(bp_ptr + p * C + cols)[None, :])

    # x + fc2(GELU(fc1(LN2(x)))), the 4C units in chunks
    u = _layer_norm(x, g2_ptr + p * C, c2_ptr + p * C, cols, C, eps2)
    hs = tl.arange(0, BLOCK_HIDDEN)
    mlp = tl.zeros([BLOCK_W, C], tl.float32)
    for j in tl.static_range(HIDDEN // BLOCK_HIDDEN):
        units = j * BLOCK_HIDDEN + hs
        w1 = tl.load(w1_ptr + p * C * HIDDEN + cols[:, None] * HIDDEN + units[None, :])
        f = _dot(u, w1, tl.zeros([BLOCK_W, BLOCK_HIDDEN], tl.float32), PREC) + tl.load(b1_ptr + p * HIDDEN + units)[None, :]
        f = 0.5 * f * (1.0 + tl.math.erf(f * 0.7071067811865476))  # exact GELU
        mlp = _dot(f, tl.load(w2_ptr + p * HIDDEN * C + units[:, None] * C + cols[None, :]), mlp, PREC)
    x = x + (mlp + tl.load(b2_ptr + p * C + cols)[None, :])
    tl.store(y_ptr + rows[:, None] * C + cols[None, :], x, mask=tm[:, None])


@triton.jit
def _attention_pool_kernel(x_ptr, obs_ptr, g_ptr, c_ptr, wo_ptr, bo_ptr, y_ptr, M, W, A, account, sop, som, sof, eps,
                 C: tl.constexpr, BLOCK_SEQ: tl.constexpr, BLOCK_A: tl.constexpr, MEAN: tl.constexpr,
                 ACT: tl.constexpr, PREC: tl.constexpr):
    p = tl.program_id(1).to(tl.int64)
    seqs = tl.program_id(0).to(tl.int64) * BLOCK_SEQ + tl.arange(0, BLOCK_SEQ)
    sm = seqs < M
    cols = tl.arange(0, C)
    first = (p * M + seqs) * W  # each observation's first token in [P·M·W, C]
    g, c = g_ptr + p * C, c_ptr + p * C
    if MEAN:
        total = tl.zeros([BLOCK_SEQ, C], tl.float32)
        for t in range(0, W):
            x = tl.load(x_ptr + (first + t)[:, None] * C + cols[None, :], mask=sm[:, None], other=0.0)
            total += _layer_norm(x, g, c, cols, C, eps)
        h = total / W
    else:
        x = tl.load(x_ptr + (first + W - 1)[:, None] * C + cols[None, :], mask=sm[:, None], other=0.0)
        h = _layer_norm(x, g, c, cols, C, eps)
    wo = wo_ptr + p * (C + A) * C
    out = _dot(h, tl.load(wo + cols[:, None] * C + cols[None, :]), tl.zeros([BLOCK_SEQ, C], tl.float32), PREC)
    a_ = tl.arange(0, BLOCK_A)
    am = a_ < A
    acct = tl.load(obs_ptr + p * sop + seqs[:, None] * som + (account + a_)[None, :] * sof,
                   mask=sm[:, None] & am[None, :], other=0.0)
    out = _dot(acct, tl.load(wo + (C + a_)[:, None] * C + cols[None, :], mask=am[:, None], other=0.0), out, PREC)
    out += tl.load(bo_ptr + p * C + cols)[None, :]
    if ACT == 0:
        out = tl.where(out < 0, 0.0, out)
    elif ACT == 1:
        out = 0.5 * out * (1.0 + tl.math.erf(out * 0.7071067811865476))
    elif ACT == 2:
        out = 2.0 * tl.sigmoid(2.0 * out) - 1.0
    else:
        out = out * tl.sigmoid(out)
    tl.store(y_ptr + (p * M + seqs)[:, None] * C + cols[None, :], out, mask=sm[:, None])


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _problem(obs, embed_w, embed_b, pos, blocks, ln_f, out_w, out_b, heads, pooling, activation) -> str | None:
    """Why the arguments are outside the contract (module docstring), or None."""
    op = "member_attention_encoder"
    if not isinstance(obs, Tensor) or obs.dim() != 3 or obs.dtype != torch.float32:
        return f"{op}: obs must be a float32 [P, M, D] tensor, got {describe(obs)}"
    if not isinstance(pos, Tensor) or pos.dim() != 3:
        return f"{op}: pos must be a float32 [P, W, C] tensor, got {describe(pos)}"
    p, w, c = pos.shape
    if not 1 <= p <= MAX_MEMBERS:
        return f"{op}: 1 to {MAX_MEMBERS} members (the grid's second axis), got {p}"
    if not isinstance(embed_w, Tensor) or embed_w.dim() != 3:
        return f"{op}: embed_w must be a float32 [P, F, C] tensor, got {describe(embed_w)}"
    f = embed_w.shape[1]
    if obs.shape[0] != p or obs.shape[2] <= w * f:
        return f"{op}: obs must be [{p}, M, {w} × {f} + A] with A >= 1 account features, got {describe(obs)}"
    a = obs.shape[2] - w * f
    if not (_pow2(c) and 16 <= c <= 128) or heads < 1 or c % heads or not (_pow2(c // heads) and c // heads >= 16):
        return f"{op}: width C = {c} with {heads} heads; C a power of two of 16 to 128, C / heads a power of two >= 16"
    if not (1 <= w <= MAX_WINDOW and 1 <= f <= MAX_FEATURES and a <= MAX_ACCOUNT):
        return (f"{op}: window {w}, {f} features a bar, {a} account features; at most {MAX_WINDOW}, {MAX_FEATURES} "
                f"and {MAX_ACCOUNT}")
    if not blocks:
        return f"{op}: needs at least one block, got none"
    if pooling not in ("mean", "last"):
        return f"{op}: pooling must be 'mean' or 'last', got {pooling!r}"
    if activation not in ACTIVATION_CODES:
        return f"{op}: activation must be one of {sorted(ACTIVATION_CODES)}, got {activation!r}"
    shapes = [("embed_w", embed_w, (p, f, c)), ("embed_b", embed_b, (p, 1, c)), ("pos", pos, (p, w, c)),
              ("ln_f weight", ln_f[0], (p, 1, c)), ("ln_f bias", ln_f[1], (p, 1, c)),
              ("out_w", out_w, (p, c + a, c)), ("out_b", out_b, (p, 1, c))]
    for i, b in enumerate(blocks):
        shapes += [(f"blocks[{i}].{name}", t, shape) for name, t, shape in (
            ("ln1_w", b.ln1_w, (p, 1, c)), ("ln1_b", b.ln1_b, (p, 1, c)), ("qkv_w", b.qkv_w, (p, c, 3 * c)),
            ("qkv_b", b.qkv_b, (p, 1, 3 * c)), ("proj_w", b.proj_w, (p, c, c)), ("proj_b", b.proj_b, (p, 1, c)),
            ("ln2_w", b.ln2_w, (p, 1, c)), ("ln2_b", b.ln2_b, (p, 1, c)), ("fc1_w", b.fc1_w, (p, c, 4 * c)),
            ("fc1_b", b.fc1_b, (p, 1, 4 * c)), ("fc2_w", b.fc2_w, (p, 4 * c, c)), ("fc2_b", b.fc2_b, (p, 1, c)))]
    for name, t, shape in shapes:
        if not isinstance(t, Tensor) or t.dtype != torch.float32 or tuple(t.shape) != shape \
                or not t.is_contiguous() or t.device != obs.device:
            return f"{op}: {name} must be a contiguous float32 {list(shape)} tensor on {obs.device}, got {describe(t)}"
    if torch.is_grad_enabled() and (obs.requires_grad or any(t.requires_grad for _, t, _ in shapes)):
        return f"{op}: no gradient: call it under torch.no_grad() or with inputs that need none"
    return None


def member_attention_encoder_supported(obs, embed_w, embed_b, pos, blocks, ln_f, out_w, out_b, heads: int,
                                       pooling: str, activation: str) -> bool:
    """Whether :func:`member_attention_encoder` takes these arguments (a metadata check, no device read)."""
    return _problem(obs, embed_w, embed_b, pos, blocks, ln_f, out_w, out_b, heads, pooling, activation) is None


def _act(name: str, x: Tensor) -> Tensor:
    return {"relu": torch.relu, "gelu": F.gelu, "tanh": torch.tanh, "silu": F.silu}[name](x)


def member_attention_encoder_reference(obs: Tensor, embed_w: Tensor, embed_b: Tensor, pos: Tensor,
                                       blocks: Sequence[BlockWeights], ln_f: tuple[Tensor, Tensor, float],
                                       out_w: Tensor, out_b: Tensor, heads: int, pooling: str,
                                       activation: str) -> Tensor:
    """Plain torch, as :class:`foxdqn.population.attention.MemberAttentionEncoder` computes it
    (``baddbmm``, ``F.layer_norm``, ``F.scaled_dot_product_attention``, ``F.gelu``)."""
    def ln(x, w_, b_, eps):
        return torch.addcmul(b_, F.layer_norm(x, x.shape[-1:], eps=eps), w_)

    p, m = obs.shape[:2]
    _, w, c = pos.shape
    f = embed_w.shape[1]
    x = (torch.baddbmm(embed_b, obs[..., : w * f].reshape(p, m * w, f), embed_w).view(p, m, w, c)
         + pos[:, None]).view(p, m * w, c)
    for b in blocks:
        q, k, v = (t.reshape(p * m, w, heads, c // heads).transpose(1, 2)
                   for t in torch.baddbmm(b.qkv_b, ln(x, b.ln1_w, b.ln1_b, b.eps1), b.qkv_w).split(c, dim=2))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(p, m * w, c)
        x = x + torch.baddbmm(b.proj_b, a, b.proj_w)
        u = F.gelu(torch.baddbmm(b.fc1_b, ln(x, b.ln2_w, b.ln2_b, b.eps2), b.fc1_w))
        x = x + torch.baddbmm(b.fc2_b, u, b.fc2_w)
    x = ln(x, ln_f[0], ln_f[1], ln_f[2]).view(p, m, w, c)
    h = x.mean(dim=2) if pooling == "mean" else x[:, :, -1]
    return _act(activation, torch.baddbmm(out_b, torch.cat([h, obs[..., w * f:]], dim=-1), out_w))


def member_attention_encoder(obs: Tensor, embed_w: Tensor, embed_b: Tensor, pos: Tensor,
                             blocks: Sequence[BlockWeights], ln_f: tuple[Tensor, Tensor, float], out_w: Tensor,
                             out_b: Tensor, heads: int, pooling: str, activation: str, *,
                             backend: str = "auto") -> Tensor:
    """Every member's attention encoder forward, no gradient: features float32 ``[P, M, C]`` (module
    docstring), ``len(blocks) + 1`` kernels.

    Args:
        obs: float32 ``[P, M, W·F + A]`` (any strides): each observation's W bars of F features,
            oldest first, then its A account features.
        embed_w, embed_b: the embedding Linear, ``[P, F, C]`` and ``[P, 1, C]``.
        pos: the learned positions, float32 ``[P, W, C]``.
        blocks: each block's :class:`BlockWeights`, in order.
        ln_f: the final layer norm's (weight ``[P, 1, C]``, bias ``[P, 1, C]``, ε).
        out_w, out_b: the output Linear on ``[h | account]``, ``[P, C + A, C]`` and ``[P, 1, C]``.
        heads: H, attention heads per block.
        pooling: ``"mean"`` over the W tokens or ``"last"`` (the newest token).
        activation: after the output Linear: relu, gelu (exact), tanh or silu.
        backend: ``"auto"`` (the kernels for CUDA tensors, else the reference; the kernels inside
            :func:`foxdqn.ops.backend.cpu_kernels`), ``"triton"`` (CPU tensors need
            TRITON_INTERPRET=1) or ``"torch"`` (:func:`member_attention_encoder_reference`).

    Returns:
        float32 ``[P, M, C]`` contiguous, equal to the reference to float rounding.

    Raises:
        ValueError: outside the contract (module docstring), or an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    problem = _problem(obs, embed_w, embed_b, pos, blocks, ln_f, out_w, out_b, heads, pooling, activation)
    if problem is not None:
        raise ValueError(problem)
    if resolve_backend("member_attention_encoder", backend, obs) == "torch":
        return member_attention_encoder_reference(obs, embed_w, embed_b, pos, blocks, ln_f, out_w, out_b, heads,
                                                  pooling, activation)
    p, m, _ = obs.shape
    _, w, c = pos.shape
    f = embed_w.shape[1]
    y = torch.empty((p, m, c), dtype=torch.float32, device=obs.device)
    if m == 0:
        return y
    prec = _prec(obs)
    block_w = max(16, triton.next_power_of_2(w))
    x = obs  # the first block reads the bars from the observation
    for i, b in enumerate(blocks):
        out = torch.empty((p, m * w, c), dtype=torch.float32, device=obs.device)
        _attention_block_kernel[(m, p)](
            x, obs, embed_w, embed_b, pos, b.ln1_w, b.ln1_b, b.qkv_w, b.qkv_b, b.proj_w, b.proj_b, b.ln2_w, b.ln2_b,
            b.fc1_w, b.fc1_b, b.fc2_w, b.fc2_b, out, m, w, f, *obs.stride(), float(b.eps1), float(b.eps2),
            1.0 / math.sqrt(c // heads), EMBED=i == 0, C=c, H=heads, D=c // heads, HIDDEN=4 * c, BLOCK_W=block_w,
            BLOCK_F=16, BLOCK_HIDDEN=min(BLOCK_HIDDEN, 4 * c), PREC=prec, num_warps=NUM_WARPS)
        x = out
    _attention_pool_kernel[(triton.cdiv(m, BLOCK_SEQ), p)](
        x, obs, ln_f[0], ln_f[1], out_w, out_b, y, m, w, obs.shape[2] - w * f, w * f, *obs.stride(), float(ln_f[2]),
        C=c, BLOCK_SEQ=BLOCK_SEQ, BLOCK_A=16, MEAN=pooling == "mean", ACT=ACTIVATION_CODES[activation], PREC=prec,
        num_warps=NUM_WARPS)
    return y
