r"""P small ReLU MLPs (1 to 4 Linear layers, every width <= 128), one per member, in one kernel; the
backward in two. :mod:`foxdqn.ops.mlp_chain` with a member axis.

Per member p (members never mix: member p's outputs and gradients read only member p's rows and
parameters):

    h_0 = x_p,   z_i = h_{i-1} W_i + b_i,   h_i = relu(z_i)  (i < n),   y_p = z_n       (forward)
    dz_n = dy_p,   dz_i = (dz_{i+1} W_{i+1}ᵀ) ⊙ 1{h_i > 0}                              (backward 1)
    dW_i = h_{i-1}ᵀ dz_i,   db_i = Σ_rows dz_i                                          (backward 2)

x float32 [P, B, D_0], W_i [P, D_{i-1}, D_i], b_i [P, 1, D_i]: the population's layout
(:class:`foxdqn.population.network.MemberQNetwork`, :func:`foxdqn.population.layers.member_linear`:
each member's ``nn.Linear.weight`` transposed, its bias with a row axis; one ``torch.baddbmm`` per
layer there). ``cartpole_cleanrl``'s 4 → 120 → 84 → 2 for all P members is one launch forward,
where the layers run a batched GEMM per layer and a ReLU per hidden layer, and two launches
backward, where autograd runs about five kernels per layer (threshold_backward, the dx and dW
batched GEMMs, the bias sum, accumulation adds).

Kernels (Triton), mlp_chain's with a member grid axis:

* forward, a grid of (blocks of ``BLOCK_M`` rows, P members): program (r, p) loads member p's rows
  r·BLOCK_M .. and runs the whole chain in registers with ``tl.dot`` (widths padded to powers of two
  >= 16, masked loads; padded columns stay exactly 0), writes y and, when a gradient will be
  needed, the post-ReLU activations h_1 .. h_{n-1} (float32 [P, B, D_i], allocated per call like
  any autograd saved tensor). With 3 layers or more on a grid of at least :data:`MIN_PROGRAMS`
  programs (many members), layers 2 and 3 run :data:`CHUNK_N` units of layer 2 at a time, each
  chunk of h_2 contracted at once with its rows of W_3 (no [128, 128] weight tile or whole h_2
  held: no register spills, as :mod:`foxdqn.ops.q_forward`'s head loop); layer 3's sums then run
  over the chunks in order. Launched with its action epilogue, it stores
  each row's ε-greedy action in place of y
  (:mod:`foxdqn.ops.member_mlp_chain_epsilon_greedy`); every launch is compiled without
  multiply-add contraction (``enable_fp_fusion=False``), so that both compute the same Q;
* backward 1, the same grid: dz_{n-1} .. dz_1 of its rows from dy, the saved h_i and W_i (dz_2
  and dz_1 by chunks of :data:`CHUNK_N_DZ` units of layer 2, on the forward's rule);
* backward 2, a grid of (tiles, P members): program (t, p) computes dW_i and db_i of one tile of
  ``BLOCK_N`` output units of one layer of member p, looping over member p's row blocks in a fixed
  order (no atomics, no split-K), so every call gives the same bits. With a ``norm``
  (:class:`ChainGradNorm`) each program also stores the sum of its tile's squares and takes one
  ticket of its member (an atomic counter); the member's last program finishes the norm.

The split (:func:`member_mlp_chain_split`, the Double DQN pair ``[s; s']`` of each member): the
same forward launch over all B rows writes rows < S to y and the others to y2, saves the
activations of rows < S only, and the two backward kernels run over those S rows: y2 gets no
gradient, as the loss gives the s' rows none.

``BLOCK_M`` is the largest power of two from 16 (a forward that saves nothing:
:data:`MIN_BLOCK_M_NO_SAVE`, 32, whose 16-row variant compiles for 20 s on Triton 3.6) to
:data:`MAX_BLOCK_M` rows (the dz kernel: :data:`MAX_BLOCK_M_DZ`; no more than B needs) that still
gives at least :data:`MIN_PROGRAMS` programs; ``BLOCK_N`` likewise up to :data:`MAX_BLOCK_N`
units: few members get mlp_chain's small tiles, many members larger tiles (fewer re-reads of the
weights and of h_i). All are module
constants read at each launch, with :data:`NUM_WARPS` (4 here, where mlp_chain's one network
takes 8).

Registration: a ``torch.autograd.Function``, differentiable w.r.t. the weights and biases (first
order). x gets no gradient (the observations): when ``x.requires_grad`` the op runs
:func:`member_mlp_chain_reference`, which autograd differentiates. Without a gradient to compute
(``torch.no_grad()``, or no weight or bias requiring grad: the target network) the forward kernel
saves nothing. Capturable in a CUDA graph: device ops only, no host reads; shapes, strides and the
TF32 choice are read from tensor metadata and torch's flags at launch. A backward with a ``norm``
takes its partials and tickets from :func:`foxdqn.ops.tensor_list.group_scratch`, made or grown
by an eager call: capture it after one eager backward of at least its members × programs (a
warm-up does that), and do not run two such backwards at once on two streams.

Precision: mlp_chain's rule (its module docstring): ``tl.dot(input_precision="tf32")`` on operands
rounded to TF32 (to nearest) where torch's float32 CUDA matmuls use TF32
(:func:`foxdqn.ops.mlp_chain.tf32_enabled`), else ``"ieee"``; the sums run in the kernel's tile
order, not cuBLAS's, so the results equal the reference (``torch.baddbmm``) to float rounding, not
bit for bit: about 1e-6 relative in IEEE float32, about 1e-3 in TF32. A pre-activation within that
rounding of 0 can fall on the other side of the ReLU in the two paths (compare gradients in IEEE
float32 or layer by layer). Biases are added in float32 after the product; db is a float32 sum.

NaN: relu keeps a NaN (``torch.relu``), and its gradient passes where h_i is NaN (autograd's
``threshold_backward``: 0 only where h_i <= 0); a NaN in member p's rows or weights reaches no
other member.

Source: the chain rule of the Linear and ReLU layers, as autograd applies it to ``baddbmm`` +
``relu`` (:func:`member_mlp_chain_reference`).
"""
from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.epsilon_greedy import RANDOM_BITS, store_member_actions
from foxdqn.ops.grad_norm import CLIP_EPS, FINISH_LANES, finish_member
from foxdqn.ops.mlp_chain import (MAX_LAYERS, MAX_WIDTH, _fill, _layout, _load_rows, _load_weight, _prec, _relu,
                                  _store_rows, _tf32)
from foxdqn.ops.tensor_list import check_member_vector, group_scratch, last_of_group

__all__ = ["MAX_LAYERS", "MAX_MEMBERS", "MAX_WIDTH", "ChainGradNorm", "member_mlp_chain", "member_mlp_chain_reference",
           "member_mlp_chain_split", "member_mlp_chain_supported"]

MAX_MEMBERS = 65535  # P: the second grid axis (CUDA's limit on grid dimension y)
MAX_BLOCK_M = 128  # most rows per program of the forward kernel (an H200 sweep: docs/bench.md#launch-constants)
MAX_BLOCK_M_DZ = 64  # most rows per program of the dz kernel (the same sweep)
MAX_BLOCK_N = 32  # most output units per program of the weight-gradient kernel (the same sweep)
MIN_PROGRAMS = 264  # tiles shrink (to 16) while a grid has fewer programs: 2 per H200 multiprocessor
#: fewest rows per program of a forward that saves nothing (the target network's): Triton 3.6 takes
#: 20-23 s to compile that variant at 16 TF32 rows on the H200, 3.7 s at 32 (docs/bench.md#start-up)
MIN_BLOCK_M_NO_SAVE = 32
BLOCK_R = 32  # rows per step of the weight-gradient kernel's loop (mlp_chain's)
NUM_WARPS = 4  # warps per program of the three kernels (the same sweep; mlp_chain's one network takes 8)
#: layer-2 units per step of the forward's chunked layers 2 and 3 (3 layers or more, a grid of at
#: least MIN_PROGRAMS programs; 0: whole layers always) and the forward's pipelining stages (an
#: H200 sweep at P = 512; the chunks slower at P = 1: docs/bench.md#launch-constants)
CHUNK_N = 32
NUM_STAGES_FORWARD = 2
#: the same for the dz kernel's chunked dz_2 and dz_1
CHUNK_N_DZ = 32
NUM_STAGES_DZ = 2


# ---------------------------------------------------------------------------------------------
# Triton kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def _linear(h, w_ptr, b_ptr, I: tl.constexpr, O: tl.constexpr, PI: tl.constexpr, PO: tl.constexpr,
            PREC: tl.constexpr):
    """h [BM, PI] (0 beyond I) → h W + b [BM, PO] (0 beyond O) for one member's W [I, O], b [O]."""
    o = tl.arange(0, PO)
    b = tl.load(b_ptr + o, mask=o < O, other=0.0)
    w = _load_weight(w_ptr, I, O, PI, PO)
    return tl.dot(_tf32(h, PREC), _tf32(w, PREC), input_precision=PREC) + b[None, :]


@triton.jit
def _chunked_pair(h, w2, b2, w3, h2_ptr, rows, head, D1: tl.constexpr, D2: tl.constexpr, D3: tl.constexpr,
                  P1: tl.constexpr, P3: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr,
                  SAVE: tl.constexpr, PREC: tl.constexpr):
    """h_1 [BM, P1] → h_2 W_3 [BM, P3] (W_3's bias not added), h_2 = relu(h_1 W_2 + b_2) computed
    ``CHUNK`` units at a time and each chunk at once contracted with its rows of W_3 (saved to h2_ptr
    [S, D2] with SAVE): no [P1, P2] weight tile and no whole h_2 held. One member's W_2 [D1, D2],
    b_2 [D2], W_3 [D2, D3]."""
    hr = _tf32(h, PREC)
    i = tl.arange(0, P1)
    o = tl.arange(0, P3)
    acc = tl.zeros([BLOCK_M, P3], dtype=tl.float32)
    for j0 in range(0, D2, CHUNK):
        j = j0 + tl.arange(0, CHUNK)
        j_ok = j < D2
        w2c = tl.load(w2 + i[:, None] * D2 + j[None, :], mask=(i[:, None] < D1) & j_ok[None, :], other=0.0)
        b2c = tl.load(b2 + j, mask=j_ok, other=0.0)
        h2 = _relu(tl.dot(hr, _tf32(w2c, PREC), input_precision=PREC) + b2c[None, :])
        if SAVE:
            tl.store(h2_ptr + rows[:, None] * D2 + j[None, :], h2, mask=head[:, None] & j_ok[None, :])
        w3c = tl.load(w3 + j[:, None] * D3 + o[None, :], mask=j_ok[:, None] & (o[None, :] < D3), other=0.0)
        acc = tl.dot(_tf32(h2, PREC), _tf32(w3c, PREC), acc=acc, input_precision=PREC)
    return acc


@triton.jit
def _member_forward_kernel(x_ptr, x_sp, y_ptr, y2_ptr, w1, b1, w2, b2, w3, b3, w4, b4, h1_ptr, h2_ptr, h3_ptr, B,
                           S, step_ptr, start_ptr, end_ptr, duration_ptr, u_ptr, L: tl.constexpr, D0: tl.constexpr,
                           D1: tl.constexpr, D2: tl.constexpr, D3: tl.constexpr, D4: tl.constexpr, P0: tl.constexpr,
                           P1: tl.constexpr, P2: tl.constexpr, P3: tl.constexpr, P4: tl.constexpr, DL: tl.constexpr,
                           PL: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, SAVE: tl.constexpr,
                           SPLIT: tl.constexpr, ACT: tl.constexpr, RANDOM_BITS: tl.constexpr, PREC: tl.constexpr):
    """Member ``program_id(1)``'s rows of block ``program_id(0)``: x [P, B, D0] (member stride
    ``x_sp``) → y [P, S, DL] (rows < S) through L layers; with SAVE also h_1 .. h_{L-1} [P, S, D_i]
    of those rows; with SPLIT the rows >= S → y2 [P, B − S, DL] (nothing saved). S = B without a
    split. CHUNK > 0 (L >= 3): layers 2 and 3 by :func:`_chunked_pair`. ACT: instead of y, the
    ε-greedy action of each row (int64 [P·B] at y_ptr) under member p's schedule and uniforms
    ``u [P, 2, B]`` (:func:`foxdqn.ops.epsilon_greedy.store_member_actions`)."""
    p = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    ok = rows < B
    head = ok & (rows < S)
    z = _linear(_load_rows(x_ptr + p * x_sp, rows, ok, D0, P0), w1 + p * (D0 * D1), b1 + p * D1,
                D0, D1, P0, P1, PREC)
    if L > 1:
        h = _relu(z)
        if SAVE:
            _store_rows(h1_ptr + p * S * D1, h, rows, head, D1, P1)
        if L > 2 and CHUNK > 0:
            o3 = tl.arange(0, P3)
            z = _chunked_pair(h, w2 + p * (D1 * D2), b2 + p * D2, w3 + p * (D2 * D3), h2_ptr + p * S * D2, rows,
                              head, D1, D2, D3, P1, P3, BLOCK_M, CHUNK, SAVE, PREC) \
                + tl.load(b3 + p * D3 + o3, mask=o3 < D3, other=0.0)[None, :]
        else:
            z = _linear(h, w2 + p * (D1 * D2), b2 + p * D2, D1, D2, P1, P2, PREC)
            if L > 2:
                h = _relu(z)
                if SAVE:
                    _store_rows(h2_ptr + p * S * D2, h, rows, head, D2, P2)
                z = _linear(h, w3 + p * (D2 * D3), b3 + p * D3, D2, D3, P2, P3, PREC)
    if L > 3:
        h = _relu(z)
        if SAVE:
            _store_rows(h3_ptr + p * S * D3, h, rows, head, D3, P3)
        z = _linear(h, w4 + p * (D3 * D4), b4 + p * D4, D3, D4, P3, P4, PREC)
    if ACT:
        cols = tl.arange(0, PL)
        store_member_actions(z, cols, cols < DL, DL, y_ptr, rows, ok, p, B, step_ptr, start_ptr, end_ptr,
                             duration_ptr, u_ptr, RANDOM_BITS)
    else:
        _store_rows(y_ptr + p * S * DL, z, rows, head, DL, PL)
        if SPLIT:
            _store_rows(y2_ptr + p * (B - S) * DL, z, rows - S, ok & (rows >= S), DL, PL)


@triton.jit
def _back(g, w_ptr, h_ptr, dz_ptr, rows, ok, I: tl.constexpr, O: tl.constexpr, PI: tl.constexpr,
          PO: tl.constexpr, PREC: tl.constexpr):
    """dz_{i+1} [BM, PO] → dz_i = (dz_{i+1} W_{i+1}ᵀ) ⊙ 1{h_i > 0} [BM, PI], stored to dz_ptr; one
    member's W_{i+1} [I, O] (read as Wᵀ [PO, PI]: element (o, i) at i·O + o), h_i [B, I]. 0 where
    h_i <= 0 (threshold_backward: a NaN h_i passes the gradient)."""
    o = tl.arange(0, PO)
    i = tl.arange(0, PI)
    wt = tl.load(w_ptr + i[None, :] * O + o[:, None], mask=(o[:, None] < O) & (i[None, :] < I), other=0.0)
    t = tl.dot(_tf32(g, PREC), _tf32(wt, PREC), input_precision=PREC)
    dz = tl.where(_load_rows(h_ptr, rows, ok, I, PI) <= 0, 0.0, t)
    _store_rows(dz_ptr, dz, rows, ok, I, PI)
    return dz


@triton.jit
def _back_chunked_pair(g, w2, w3, h1_ptr, h2_ptr, g1_ptr, g2_ptr, rows, ok, D1: tl.constexpr, D2: tl.constexpr,
                       D3: tl.constexpr, P1: tl.constexpr, P3: tl.constexpr, BLOCK_M: tl.constexpr,
                       CHUNK: tl.constexpr, PREC: tl.constexpr):
    """dz_3 [BM, P3] → dz_2 (stored to g2_ptr [B, D2], ``CHUNK`` units at a time) and dz_1 (stored
    to g1_ptr [B, D1]): each chunk dz_2[:, j] = (dz_3 W_3ᵀ)[:, j] ⊙ 1{h_2[:, j] > 0} contracted at
    once with W_2ᵀ's rows j (:func:`_chunked_pair`'s order backward). One member's W_2 [D1, D2],
    W_3 [D2, D3], h_1 [B, D1], h_2 [B, D2]."""
    gr = _tf32(g, PREC)
    i = tl.arange(0, P1)
    o = tl.arange(0, P3)
    acc = tl.zeros([BLOCK_M, P1], dtype=tl.float32)
    for j0 in range(0, D2, CHUNK):
        j = j0 + tl.arange(0, CHUNK)
        j_ok = j < D2
        w3t = tl.load(w3 + j[None, :] * D3 + o[:, None], mask=(o[:, None] < D3) & j_ok[None, :], other=0.0)
        h2 = tl.load(h2_ptr + rows[:, None] * D2 + j[None, :], mask=ok[:, None] & j_ok[None, :], other=0.0)
        dz2 = tl.where(h2 <= 0, 0.0, tl.dot(gr, _tf32(w3t, PREC), input_precision=PREC))
        tl.store(g2_ptr + rows[:, None] * D2 + j[None, :], dz2, mask=ok[:, None] & j_ok[None, :])
        w2t = tl.load(w2 + i[None, :] * D2 + j[:, None], mask=j_ok[:, None] & (i[None, :] < D1), other=0.0)
        acc = tl.dot(_tf32(dz2, PREC), _tf32(w2t, PREC), acc=acc, input_precision=PREC)
    dz1 = tl.where(_load_rows(h1_ptr, rows, ok, D1, P1) <= 0, 0.0, acc)
    _store_rows(g1_ptr, dz1, rows, ok, D1, P1)


@triton.jit
def _member_dz_kernel(dy_ptr, w2, w3, w4, h1_ptr, h2_ptr, h3_ptr, g1_ptr, g2_ptr, g3_ptr, B,
                      L: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr, D3: tl.constexpr,
                      D4: tl.constexpr, P0: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr, P3: tl.constexpr,
                      P4: tl.constexpr, DL: tl.constexpr, PL: tl.constexpr, BLOCK_M: tl.constexpr,
                      CHUNK: tl.constexpr, PREC: tl.constexpr):
    """Member ``program_id(1)``'s rows of block ``program_id(0)``: dy [P, B, DL] and the saved h_i
    → dz_i [P, B, D_i] for i = L-1 .. 1 (L >= 2); CHUNK > 0 (L >= 3): dz_2 and dz_1 by
    :func:`_back_chunked_pair`."""
    p = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    ok = rows < B
    g = _load_rows(dy_ptr + p * B * DL, rows, ok, DL, PL)
    if L > 3:
        g = _back(g, w4 + p * (D3 * D4), h3_ptr + p * B * D3, g3_ptr + p * B * D3, rows, ok, D3, D4, P3, P4, PREC)
    if L > 2 and CHUNK > 0:
        _back_chunked_pair(g, w2 + p * (D1 * D2), w3 + p * (D2 * D3), h1_ptr + p * B * D1, h2_ptr + p * B * D2,
                           g1_ptr + p * B * D1, g2_ptr + p * B * D2, rows, ok, D1, D2, D3, P1, P3, BLOCK_M, CHUNK,
                           PREC)
    else:
        if L > 2:
            g = _back(g, w3 + p * (D2 * D3), h2_ptr + p * B * D2, g2_ptr + p * B * D2, rows, ok, D2, D3, P2, P3,
                      PREC)
        if L > 1:
            g = _back(g, w2 + p * (D1 * D2), h1_ptr + p * B * D1, g1_ptr + p * B * D1, rows, ok, D1, D2, P1, P2,
                      PREC)


@triton.jit
def _wgrad(pid, START: tl.constexpr, T: tl.constexpr, h_ptr, g_ptr, dw_ptr, db_ptr, B, I: tl.constexpr,
           O: tl.constexpr, PI: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr, PREC: tl.constexpr):
    """Program ``pid`` in [START, START + T): units [t·BN, (t+1)·BN) of one layer of one member
    (t = pid − START), dW [I, O] = hᵀ dz and db [O] = Σ_rows dz over every row block in order; that
    member's dz [B, O], h [B, I] (rows at any pointer: h_0 = x). Returns the float32 sum of the
    squares of the dW and db entries it stored (0 for a program outside the layer)."""
    t = pid - START
    squares = tl.zeros([], dtype=tl.float32)
    if (t >= 0) & (t < T):
        n = t * BN + tl.arange(0, BN)
        n_ok = n < O
        i = tl.arange(0, PI)
        i_ok = i < I
        acc = tl.zeros([PI, BN], dtype=tl.float32)
        db = tl.zeros([BN], dtype=tl.float32)
        for r0 in range(0, B, BR):
            r = r0 + tl.arange(0, BR).to(tl.int64)
            r_ok = r < B
            ht = tl.load(h_ptr + r[None, :] * I + i[:, None], mask=i_ok[:, None] & r_ok[None, :], other=0.0)
            g = tl.load(g_ptr + r[:, None] * O + n[None, :], mask=r_ok[:, None] & n_ok[None, :], other=0.0)
            acc = tl.dot(_tf32(ht, PREC), _tf32(g, PREC), acc=acc, input_precision=PREC)  # [PI, BR] @ [BR, BN]
            db += tl.sum(g, axis=0)
        tl.store(dw_ptr + i[:, None] * O + n[None, :], acc, mask=i_ok[:, None] & n_ok[None, :])
        tl.store(db_ptr + n, db, mask=n_ok)
        squares = tl.sum(tl.sum(acc * acc, axis=1), axis=0) + tl.sum(db * db, axis=0)  # padding: exact zeros
    return squares


@triton.jit
def _member_wgrad_kernel(x_ptr, x_sp, h1_ptr, h2_ptr, h3_ptr, g1_ptr, g2_ptr, g3_ptr, g4_ptr, dw1, db1, dw2, db2,
                         dw3, db3, dw4, db4, B, L: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr,
                         D2: tl.constexpr, D3: tl.constexpr, D4: tl.constexpr, P0: tl.constexpr, P1: tl.constexpr,
                         P2: tl.constexpr, P3: tl.constexpr, P4: tl.constexpr, DL: tl.constexpr, PL: tl.constexpr,
                         N1: tl.constexpr, N2: tl.constexpr, N3: tl.constexpr, N4: tl.constexpr, T1: tl.constexpr,
                         T2: tl.constexpr, T3: tl.constexpr, T4: tl.constexpr, BR: tl.constexpr,
                         PREC: tl.constexpr, part_ptr, tickets_ptr, max_norm_ptr, total_ptr, coef_ptr,
                         NORM: tl.constexpr, EPS: tl.constexpr, RB: tl.constexpr):
    """dW_i, db_i of member ``program_id(1)``: layer i has T_i programs of N_i units along
    ``program_id(0)``; g_i = dz_i (g_L = dy), each [P, B, D_i]; x [P, B, D0] at member stride x_sp.
    With NORM each program stores its sum of squares at column ``program_id(0)`` of member p's row
    of ``part [P, T1 + T2 + T3 + T4]`` and takes a ticket of member p; the last finishes member p's
    norm and clip coefficient (:func:`foxdqn.ops.grad_norm.finish_member`)."""
    pid = tl.program_id(0)
    p = tl.program_id(1).to(tl.int64)
    squares = _wgrad(pid, 0, T1, x_ptr + p * x_sp, g1_ptr + p * B * D1, dw1 + p * (D0 * D1), db1 + p * D1, B, D0,
                     D1, P0, N1, BR, PREC)
    if L > 1:  # a program is in one layer: the other layers add exact zeros
        squares += _wgrad(pid, T1, T2, h1_ptr + p * B * D1, g2_ptr + p * B * D2, dw2 + p * (D1 * D2), db2 + p * D2,
                          B, D1, D2, P1, N2, BR, PREC)
    if L > 2:
        squares += _wgrad(pid, T1 + T2, T3, h2_ptr + p * B * D2, g3_ptr + p * B * D3, dw3 + p * (D2 * D3),
                          db3 + p * D3, B, D2, D3, P2, N3, BR, PREC)
    if L > 3:
        squares += _wgrad(pid, T1 + T2 + T3, T4, h3_ptr + p * B * D3, g4_ptr + p * B * D4, dw4 + p * (D3 * D4),
                          db4 + p * D4, B, D3, D4, P3, N4, BR, PREC)
    if NORM:
        tiles = T1 + T2 + T3 + T4
        tl.store(part_ptr + p * tiles + pid, squares)
        if last_of_group(tickets_ptr + p, tiles):
            finish_member(p, part_ptr, tiles, max_norm_ptr, total_ptr, coef_ptr, EPS, RB)
            tl.store(tickets_ptr + p, 0)


# ---------------------------------------------------------------------------------------------
# launchers
# ---------------------------------------------------------------------------------------------
def _block_m(rows: int, members: int, most: int | None = None, least: int = 16) -> int:
    """Rows per program of a row-grid kernel (module docstring): the largest power of two from
    ``least`` (16, or MIN_BLOCK_M_NO_SAVE for a forward that saves nothing) to ``most`` (default
    MAX_BLOCK_M, the forward's; the dz kernel passes MAX_BLOCK_M_DZ) that B needs and that leaves at
    least MIN_PROGRAMS programs (``least`` at the least)."""
    block = min(MAX_BLOCK_M if most is None else most, max(least, triton.next_power_of_2(rows)))
    while block > least and members * triton.cdiv(rows, block) < MIN_PROGRAMS:
        block //= 2
    return block


def _chunk(units: int, layers: int, grid: tuple[int, int]) -> int:
    """The CHUNK constexpr of a row-grid launch: ``units`` (the module's CHUNK_N or CHUNK_N_DZ) for
    3 layers or more on a grid of at least MIN_PROGRAMS programs, else 0 (whole layers)."""
    return units if layers >= 3 and grid[0] * grid[1] >= MIN_PROGRAMS else 0


def _units(dims: list[int], members: int, meta: dict) -> dict:
    """Output units per program of each layer's weight gradient (``N1`` .. ``N4``, unused layers 16):
    the largest power of two <= MAX_BLOCK_N and the padded width that leaves at least
    MIN_PROGRAMS programs in the grid (16 at the least)."""
    n = len(dims) - 1
    block = MAX_BLOCK_N
    while block > 16 and members * sum(triton.cdiv(d, min(block, meta[f"P{i + 1}"]))
                                       for i, d in enumerate(dims[1:])) < MIN_PROGRAMS:
        block //= 2
    return {f"N{i}": min(block, meta[f"P{i}"]) if i <= n else 16 for i in range(1, MAX_LAYERS + 1)}


def _forward(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor], save: bool, prec: str,
             split: int | None = None, schedule: tuple | None = None):
    """Launch the forward kernel: y [P, S, D_n] (S = ``split``, default B), the list h_1 .. h_{n-1}
    of those rows (empty unless ``save``) and y2 [P, B − S, D_n] of the other rows (None without a
    ``split``); with ``schedule`` = (step, start, end, duration, u) (no save, no split) y is the
    int64 [P·B] ε-greedy actions instead."""
    members, rows = x.shape[0], x.shape[1]
    head = rows if split is None else split
    dims = [x.shape[2]] + [w.shape[2] for w in weights]
    if schedule is None:
        y = x.new_empty(members, head, dims[-1])
    else:
        y = torch.empty(members * rows, dtype=torch.int64, device=x.device)
    y2 = None if split is None else x.new_empty(members, rows - head, dims[-1])
    hs = [x.new_empty(members, head, d) for d in dims[1:-1]] if save else []
    if rows:
        block_m = _block_m(rows, members, least=16 if save else MIN_BLOCK_M_NO_SAVE)
        wb = zip(_fill(weights, MAX_LAYERS, weights[0]), _fill(biases, MAX_LAYERS, biases[0]))
        sched = schedule if schedule is not None else (x,) * 5  # unread pointers without ACT
        grid = (triton.cdiv(rows, block_m), members)
        _member_forward_kernel[grid](
            x, x.stride(0), y, y if y2 is None else y2, *(t for pair in wb for t in pair),
            *_fill(hs, MAX_LAYERS - 1, x), rows, head, *sched, **_layout(dims), BLOCK_M=block_m,
            CHUNK=_chunk(CHUNK_N, len(weights), grid), SAVE=save, SPLIT=split is not None,
            ACT=schedule is not None, RANDOM_BITS=RANDOM_BITS, PREC=prec, num_warps=NUM_WARPS,
            num_stages=NUM_STAGES_FORWARD,
            enable_fp_fusion=False)  # every launch: the ε schedule's roundings, and Q the same bits with or without it
    return y, hs, y2


def _backward(x: Tensor, weights: Sequence[Tensor], hs: Sequence[Tensor], dy: Tensor, prec: str,
              tile_rows: int | None = None, norm: ChainGradNorm | None = None):
    """Launch the dz kernel (two layers or more) and the dW / db kernel: the lists dW_i [P, D_{i-1},
    D_i] and db_i [P, 1, D_i]. ``tile_rows``: the rows the dz tile is chosen for (default x's B; the
    split passes the forward's, so that its dz rows are computed in the whole op's tiles: the same
    bits on a GPU, where the MMA instructions depend on the tile). ``norm``: the dW / db kernel also
    writes each member's gradient norm and clip coefficient into it (:class:`ChainGradNorm`)."""
    members, rows, n = x.shape[0], x.shape[1], len(weights)
    dims = [x.shape[2]] + [w.shape[2] for w in weights]
    meta = _layout(dims)
    gs = [x.new_empty(members, rows, d) for d in dims[1:-1]] + [dy]  # dz_1 .. dz_{n-1}, then dz_n = dy
    if rows and n > 1:
        block_m = _block_m(rows if tile_rows is None else tile_rows, members, MAX_BLOCK_M_DZ)
        grid = (triton.cdiv(rows, block_m), members)
        _member_dz_kernel[grid](
            dy, *_fill(weights[1:], MAX_LAYERS - 1, dy), *_fill(hs, MAX_LAYERS - 1, dy),
            *_fill(gs[:-1], MAX_LAYERS - 1, dy), rows, **meta, BLOCK_M=block_m,
            CHUNK=_chunk(CHUNK_N_DZ, n, grid), PREC=prec, num_warps=NUM_WARPS, num_stages=NUM_STAGES_DZ)
    dws = [torch.empty_like(w) for w in weights]
    dbs = [x.new_empty(members, 1, d) for d in dims[1:]]
    units = _units(dims, members, meta)
    tiles = {f"T{i}": triton.cdiv(dims[i], units[f"N{i}"]) if i <= n else 0 for i in range(1, MAX_LAYERS + 1)}
    dw_db = zip(_fill(dws, MAX_LAYERS, dy), _fill(dbs, MAX_LAYERS, dy))
    programs = sum(tiles.values())
    names = ("part_ptr", "tickets_ptr", "max_norm_ptr", "total_ptr", "coef_ptr")
    if norm is None:
        sums = dict.fromkeys(names, dy)  # unread pointers without NORM
    else:
        partials, tickets = group_scratch("member_mlp_chain/norm", dy.device, members * programs, members)
        sums = dict(zip(names, (partials, tickets, norm.max_norm, norm.total, norm.coef)))
    _member_wgrad_kernel[(programs, members)](
        x, x.stride(0), *_fill(hs, MAX_LAYERS - 1, x), *_fill(gs, MAX_LAYERS, dy), *(t for pair in dw_db for t in pair),
        rows, **meta, **units, **tiles, BR=BLOCK_R, PREC=prec, **sums, NORM=norm is not None, EPS=CLIP_EPS,
        RB=FINISH_LANES, num_warps=NUM_WARPS,
        enable_fp_fusion=norm is None)  # with the norm each square rounded to float32, as grad_norm's
    if norm is not None:
        norm.backwards += 1
    return dws, dbs


class ChainGradNorm:
    """Where the backward of :func:`member_mlp_chain` / :func:`member_mlp_chain_split` also leaves
    each member's global gradient norm and ``clip_grad_norm_``'s clip coefficient, computed by its
    dW / db kernel (no launch of its own, no second read of the gradients).

    Per member p, over every dW_i[p] and db_i[p] that backward computes (the whole chain's
    gradient, also of a weight or bias that requires no grad: the norm
    :func:`foxdqn.ops.grad_norm.grad_norm_coefficient` gives of those tensors, by its rule and to
    a few float32 ulps, not bit for bit: the squares, each rounded to float32, are summed per
    weight-gradient program with ``tl.sum``, then the programs' sums by grad_norm's
    ``finish_member`` order, 64 lanes by program index, then a tree)::

        total[p] = sqrt_rn(Σ dW² + Σ db²),   coef[p] = min(1, max_norm[p] / (total[p] + 1e-6))

    The programs' tiles widen with the member count (``_units``), so a member's total may differ
    in its last bits between populations of other sizes, as the GPU's tiles already make its
    gradients differ (docs/design/population.md); the same P and shapes give the same bits.

    Attributes:
        max_norm: float32 ``[P]`` (0-d or ``[1]`` for P = 1), the bound (``optim.grad_clip``), read.
        total, coef: float32 of max_norm's shape, written by each backward.
        backwards: host count of the backward passes that wrote them (the caller resets it): a
            caller that reads total and coef as the norm of its ``.grad`` checks it is 1 (one
            backward, whose gradients are the whole ``.grad``). The reference path
            (``backend="torch"``, ``x.requires_grad``) and a backward with no gradient for y write
            nothing and do not count.

    Raises:
        ValueError: tensors of another dtype, shape or device.
    """

    __slots__ = ("max_norm", "total", "coef", "backwards")

    def __init__(self, max_norm: Tensor, members: int):
        op = "ChainGradNorm"
        check_member_vector(op, "max_norm", max_norm, members, max_norm.device)
        self.max_norm = max_norm
        self.total = torch.zeros_like(max_norm)
        self.coef = torch.zeros_like(max_norm)
        self.backwards = 0

    def check(self, x: Tensor) -> None:
        """Raise ValueError unless this norm fits the op's ``x`` ``[P, B, D0]`` (members and device)."""
        check_member_vector("member_mlp_chain", "norm.max_norm", self.max_norm, x.shape[0], x.device)


class _MemberMLPChain(torch.autograd.Function):
    """y = forward kernel(x, W, b), saving h_1 .. h_{n-1}; with a split row S (not None) the rows >= S
    go to a second output y2, a constant, and only the rows < S are saved. Backward: the dz and the
    dW / db kernels over the saved rows (dz in the tiles of the forward's rows)."""

    @staticmethod
    def forward(ctx, x, n, split, norm, *params):
        weights, biases = params[:n], params[n:]
        ctx.n, ctx.prec, ctx.rows, ctx.norm = n, _prec(x), x.shape[1], norm
        y, hs, y2 = _forward(x, weights, biases, save=True, prec=ctx.prec, split=split)
        ctx.save_for_backward(x if split is None else x.narrow(1, 0, split), *weights, *hs)
        ctx.set_materialize_grads(False)  # y2's gradient is never read: no zeros made for it
        if split is None:
            return y
        ctx.mark_non_differentiable(y2)
        return y, y2

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_y, *_grad_y2):
        n, saved = ctx.n, ctx.saved_tensors
        if grad_y is None:
            return (None,) * (4 + 2 * n)
        dws, dbs = _backward(saved[0], saved[1:n + 1], saved[n + 1:], grad_y.contiguous(), ctx.prec, ctx.rows,
                             norm=ctx.norm)
        need = ctx.needs_input_grad[4:]
        return (None, None, None, None, *(g if need[i] else None for i, g in enumerate([*dws, *dbs])))


# ---------------------------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------------------------
def _rows_contiguous(x: Tensor) -> bool:
    """``x`` [P, B, D0] of contiguous ``[B, D0]`` members at any member stride >= 0 (the halves of
    a stacked pair ``[P, 2, B, D0]``)."""
    return x.is_contiguous() or (x[0].is_contiguous() and x.stride(0) >= 0)


def _problem(x, weights, biases, op: str = "member_mlp_chain") -> str | None:
    """Why (x, weights, biases) is outside :func:`member_mlp_chain`'s contract, or None (messages
    prefixed ``op``)."""
    if not isinstance(x, Tensor):
        return f"{op}: x must be a tensor, got {describe(x)}"
    if not isinstance(weights, (list, tuple)) or not isinstance(biases, (list, tuple)):
        return f"{op}: weights and biases must be lists of tensors, got {type(weights).__name__} and " \
               f"{type(biases).__name__}"
    n = len(weights)
    if not 1 <= n <= MAX_LAYERS or len(biases) != n:
        return f"{op}: weights must hold 1 to {MAX_LAYERS} layers and biases one per layer, got {n} weights and " \
               f"{len(biases)} biases"
    if x.dim() != 3 or x.dtype != torch.float32 or not 1 <= x.shape[0] <= MAX_MEMBERS or not _rows_contiguous(x):
        return f"{op}: x must be a float32 [P, B, D0] tensor of contiguous members, 1 <= P <= {MAX_MEMBERS}, " \
               f"got {describe(x)}"
    members, width = x.shape[0], x.shape[2]
    for i, (w, b) in enumerate(zip(weights, biases)):
        if not isinstance(w, Tensor) or w.dim() != 3 or w.shape[:2] != (members, width) \
                or w.dtype != torch.float32 or not w.is_contiguous() or w.device != x.device:
            return f"{op}: weights[{i}] must be a contiguous float32 [{members}, {width}, D{i + 1}] tensor on " \
                   f"{x.device}, got {describe(w)}"
        if not isinstance(b, Tensor) or tuple(b.shape) != (members, 1, w.shape[2]) or b.dtype != torch.float32 \
                or not b.is_contiguous() or b.device != x.device:
            return f"{op}: biases[{i}] must be a contiguous float32 [{members}, 1, {w.shape[2]}] tensor on " \
                   f"{x.device}, got {describe(b)}"
        width = w.shape[2]
    dims = [x.shape[2]] + [w.shape[2] for w in weights]
    for i, d in enumerate(dims):
        if not 1 <= d <= MAX_WIDTH:
            what = "x" if i == 0 else f"weights[{i - 1}]"
            return f"{op}: every width must be 1 to {MAX_WIDTH}, got D{i} = {d} ({what})"
    return None


def member_mlp_chain_supported(x, weights, biases) -> bool:
    """Whether :func:`member_mlp_chain` takes ``(x, weights, biases)``: 1 to 4 layers, float32
    tensors on one device in the population's layout with chained shapes, every width (D_0 .. D_n)
    1 to 128, 1 to 65535 members. A metadata check only (no device read); callers fall back to
    their own layers when it is False."""
    return _problem(x, weights, biases) is None


def _check(x, weights, biases) -> None:
    problem = _problem(x, weights, biases)
    if problem is not None:
        raise ValueError(problem)


# ---------------------------------------------------------------------------------------------
# reference and public op
# ---------------------------------------------------------------------------------------------
def member_mlp_chain_reference(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor]) -> Tensor:
    """Plain-torch :func:`member_mlp_chain` (same arguments and result): ``torch.baddbmm`` per layer
    with ``torch.relu`` between them, differentiable by autograd (w.r.t. x too)."""
    _check(x, weights, biases)
    h = x
    for i, (w, b) in enumerate(zip(weights, biases)):
        h = torch.baddbmm(b, h, w)
        if i < len(weights) - 1:
            h = torch.relu(h)
    return h


def member_mlp_chain(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor], *,
                     norm: ChainGradNorm | None = None, backend: str = "auto") -> Tensor:
    """y_p = L_n(relu(... relu(L_1(x_p)))), L_i(h) = h W_i[p] + b_i[p], for every member p: forward
    one kernel, backward two.

    Args:
        x: the input (observations), float32 ``[P, B, D_0]``, 1 <= P <= 65535, any B >= 0; each
            member's ``[B, D_0]`` contiguous, the member stride any (a half of a stacked
            ``[P, 2, B, D_0]`` pair). Gets no gradient: with ``x.requires_grad`` the op runs
            :func:`member_mlp_chain_reference`.
        weights: ``[W_1, ..., W_n]``, 1 <= n <= 4, W_i float32 ``[P, D_{i-1}, D_i]`` contiguous
            (:class:`~foxdqn.population.network.MemberQNetwork`'s), on x's device; every D_i (and
            D_0) 1 to 128.
        biases: ``[b_1, ..., b_n]``, b_i float32 ``[P, 1, D_i]`` contiguous.
        norm: None, or a :class:`ChainGradNorm` of P members on x's device, into which the
            kernels' backward also writes each member's gradient norm and clip coefficient.
        backend: ``"auto"`` (the Triton kernels for CUDA tensors, else the reference; the kernels
            inside :func:`foxdqn.ops.backend.cpu_kernels`), ``"triton"`` (CPU tensors need
            TRITON_INTERPRET=1) or ``"torch"`` (:func:`member_mlp_chain_reference`).

    Returns:
        y float32 ``[P, B, D_n]`` (contiguous), differentiable w.r.t. every weight and bias that
        requires grad (the kernel path: first order only). Equal to the reference to float
        rounding (module docstring). Member p's rows of y and its gradients read only member p's
        rows, weights and biases.

    Raises:
        ValueError: outside the contract above (:func:`member_mlp_chain_supported` is False: more
            than 4 layers, a width above 128, a dtype other than float32, non-contiguous members,
            a misshapen tensor, mixed devices), or an unknown backend; a ``norm`` of another
            member count or device.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check(x, weights, biases)
    if norm is not None:
        norm.check(x)
    if resolve_backend("member_mlp_chain", backend, x) == "torch" or x.requires_grad:
        return member_mlp_chain_reference(x, weights, biases)
    params = [*weights, *biases]
    if torch.is_grad_enabled() and any(p.requires_grad for p in params):
        return _MemberMLPChain.apply(x, len(weights), None, norm, *params)
    return _forward(x, weights, biases, save=False, prec=_prec(x))[0]


def member_mlp_chain_split(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor], grad_rows: int, *,
                           norm: ChainGradNorm | None = None, backend: str = "auto") -> tuple[Tensor, Tensor]:
    """:func:`member_mlp_chain` of every row of ``x`` in one forward launch, differentiable only
    through each member's first ``grad_rows`` rows: the Double DQN pair ``[s; s']`` of a member,
    where the loss gives the s' rows no gradient (:func:`foxdqn.objectives.dqn_forward.dqn_forward`).
    The forward saves the activations of those rows only, and the backward's two kernels work on
    them only: half the rows of :func:`member_mlp_chain` on the stacked pair, the same values.

    Args:
        x, weights, biases, norm, backend: as :func:`member_mlp_chain`.
        grad_rows: S, ``0 <= S <= B``, the rows of each member that get a gradient.

    Returns:
        ``(y, y2)``: y float32 ``[P, S, D_n]``, rows ``0 .. S − 1`` of each member, differentiable
        as :func:`member_mlp_chain`'s y; y2 float32 ``[P, B − S, D_n]``, rows ``S .. B − 1``, no
        gradient (a constant, as if computed under ``torch.no_grad()``). Both equal the rows of
        :func:`member_mlp_chain`'s y bit for bit (the same launch over the same B rows), and the
        weight gradients equal its gradients for a y whose rows >= S get none (the sums skip rows
        whose gradient is exactly 0). The reference (``backend="torch"``, CPU, ``x.requires_grad``):
        :func:`member_mlp_chain_reference` of x, its rows >= S detached.

    Raises:
        ValueError: as :func:`member_mlp_chain`; ``grad_rows`` not an integer in ``[0, B]``.
        RuntimeError: as :func:`member_mlp_chain`.
    """
    _check(x, weights, biases)
    if isinstance(grad_rows, bool) or not isinstance(grad_rows, int) or not 0 <= grad_rows <= x.shape[1]:
        raise ValueError(f"member_mlp_chain_split: grad_rows must be an integer in [0, B] = [0, {x.shape[1]}], "
                         f"got {grad_rows!r}")
    if norm is not None:
        norm.check(x)
    if resolve_backend("member_mlp_chain", backend, x) == "torch" or x.requires_grad:
        y = member_mlp_chain_reference(x, weights, biases)
        return y[:, :grad_rows], y[:, grad_rows:].detach()
    params = [*weights, *biases]
    if torch.is_grad_enabled() and any(p.requires_grad for p in params):
        return _MemberMLPChain.apply(x, len(weights), grad_rows, norm, *params)
    y, _, y2 = _forward(x, weights, biases, save=False, prec=_prec(x), split=grad_rows)
    return y, y2
