r"""A small ReLU MLP (1 to 4 Linear layers, every width <= 128) in one kernel, its backward in two.

    h_0 = x,   z_i = h_{i-1} W_iᵀ + b_i,   h_i = relu(z_i)  (i < n),   y = z_n         (forward)
    dz_n = dy,   dz_i = (dz_{i+1} W_{i+1}) ⊙ 1{h_i > 0}                                (backward 1)
    dW_i = dz_iᵀ h_{i-1},   db_i = Σ_rows dz_i                                         (backward 2)

x float32 [B, D_0], W_i [D_i, D_{i-1}] (``nn.Linear.weight``), b_i [D_i]: ``nn.Linear`` and
``nn.ReLU`` as :class:`foxdqn.nn.mlp.MLPEncoder` and :class:`foxdqn.nn.heads.QHead` stack them
(the plain Q head of Mnih et al. 2015), so a whole Q network such as ``cartpole_cleanrl``'s
4 → 120 → 84 → 2 is one launch forward, where ``nn.Linear`` + :mod:`foxdqn.ops.linear_relu` are
one cuBLAS GEMM per layer, and two launches backward, where autograd runs about four kernels per
layer (threshold_backward, the dx and dW GEMMs, split-K reduce, bias sum).

Kernels (Triton):

* forward, a grid over blocks of ``BLOCK_M`` rows: each program loads its rows of x and runs the
  whole chain in registers with ``tl.dot`` (every width padded to a power of two >= 16, masked
  loads; padded columns stay exactly 0 through the chain), writes y and, when a gradient will be
  needed, the post-ReLU activations h_1 .. h_{n-1} (float32 [B, D_i], allocated per call like any
  autograd saved tensor: inside a CUDA-graph capture they come from the graph's pool), or, launched
  with its action epilogue, each row's ε-greedy action in place of y
  (:mod:`foxdqn.ops.mlp_chain_epsilon_greedy`); compiled without multiply-add contraction
  (``enable_fp_fusion=False``) either way, so that both launches compute the same Q;
* backward 1, the same row grid: dz_{n-1} .. dz_1 from dy, the saved h_i and the weights;
* backward 2, one program per (layer, tile of ``BLOCK_N`` output units): dW_i and db_i of its
  units, looping over the row blocks in a fixed order, so every call gives the same bits (no
  atomics; no split-K reduction). Two kernels rather than one because dW_i needs every row's dz_i:
  a single kernel would need a grid-wide barrier or atomics (not deterministic).

Registration: a ``torch.autograd.Function``, differentiable w.r.t. the weights and biases (first
order). x gets no gradient (the observations of a Q network): when ``x.requires_grad`` the op runs
:func:`mlp_chain_reference`, and autograd differentiates that. Without a gradient to compute
(``torch.no_grad()``, or no weight or bias requiring grad: the target network, the collect step's
forward) the forward kernel saves nothing. Capturable in a CUDA graph: device ops only, no host
reads, no host→device copies; shapes and the TF32 choice are read from tensor metadata and torch's
flags at launch.

Precision: torch runs these GEMMs (``F.linear`` and autograd's ``mm``) in TF32 on CUDA when
float32 matmuls may use it (``torch.set_float32_matmul_precision("high")``, the run's default:
``matmul_precision`` in foxdqn/config/schema.py; :func:`tf32_enabled`); the kernels then use
``tl.dot(input_precision="tf32")`` on operands rounded to TF32 first (to nearest, ties away from
zero: Triton's TF32 dot would otherwise drop the low 13 mantissa bits, a truncation biased toward
0, as its ``tl.dot`` documentation warns), else ``"ieee"`` (float32 FMA). Either way the sums run
in another order than cuBLAS's (the kernel's tiles; no split-K), so the results equal the
reference to float rounding, not bit for bit: about 1e-6 relative in IEEE float32, about 1e-3 in
TF32 (10 mantissa bits per operand). A pre-activation within that rounding of 0 can fall on the
other side of the ReLU in the two paths, which moves that row's whole dz (TF32 makes this common
at a few hundred rows; compare gradients in IEEE float32, or layer by layer, as the tests do).
The biases are added in float32 after the product, and db is a float32 sum, as in torch. In
Triton's interpreter (CPU tests) ``tl.dot`` is a numpy float32 matmul; the TF32 rounding of the
operands runs there too.

NaN: relu keeps a NaN (``torch.relu``'s rule), and its gradient passes where h_i is NaN
(autograd's ``threshold_backward``: 0 only where h_i <= 0).

Source: the chain rule of the Linear and ReLU layers, as autograd applies it (docs/design/hot_loop.md
lists the kernels of one iteration).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.argmax import tile_argmax
from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.epsilon_greedy import RANDOM_BITS, _act, _schedule_row

__all__ = ["MAX_LAYERS", "MAX_WIDTH", "launch_forward", "mlp_chain", "mlp_chain_reference", "mlp_chain_supported",
           "tf32_enabled"]

MAX_LAYERS = 4  # Linear layers of one chain
MAX_WIDTH = 128  # largest D_i: a [BLOCK_M, 128] activation tile and a [128, 128] weight tile per program
BLOCK_N = 16  # output units per program of the weight-gradient kernel (an H200 sweep: docs/bench.md#launch-constants)
BLOCK_R = 32  # rows per step of the weight-gradient kernel's loop (the same sweep)
NUM_WARPS = 8  # warps per program of the three kernels (fewer are several times slower on the H200: the same sweep)


# ---------------------------------------------------------------------------------------------
# Triton kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def _tf32(v, PREC: tl.constexpr):
    """``v`` rounded to TF32 (10 mantissa bits; to nearest, ties away from zero; NaN kept) when
    PREC is "tf32", else unchanged."""
    if PREC == "tf32":
        bits = v.to(tl.uint32, bitcast=True)
        r = ((bits + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
        v = tl.where(v == v, r, v)
    return v


@triton.jit
def _load_rows(ptr, rows, ok, D: tl.constexpr, P: tl.constexpr):
    """Rows ``rows`` of a row-major [B, D] float32 array as a [len(rows), P] tile, 0 outside."""
    cols = tl.arange(0, P)
    return tl.load(ptr + rows[:, None] * D + cols[None, :], mask=ok[:, None] & (cols[None, :] < D), other=0.0)


@triton.jit
def _store_rows(ptr, v, rows, ok, D: tl.constexpr, P: tl.constexpr):
    cols = tl.arange(0, P)
    tl.store(ptr + rows[:, None] * D + cols[None, :], v, mask=ok[:, None] & (cols[None, :] < D))


@triton.jit
def _load_weight(w_ptr, O: tl.constexpr, I: tl.constexpr, PO: tl.constexpr, PI: tl.constexpr):
    """W [O, I] row-major as a [PO, PI] tile, 0 outside."""
    o = tl.arange(0, PO)
    i = tl.arange(0, PI)
    return tl.load(w_ptr + o[:, None] * I + i[None, :], mask=(o[:, None] < O) & (i[None, :] < I), other=0.0)


@triton.jit
def _linear(h, w_ptr, b_ptr, I: tl.constexpr, O: tl.constexpr, PI: tl.constexpr, PO: tl.constexpr,
            PREC: tl.constexpr):
    """h [BM, PI] (0 beyond I) → h Wᵀ + b [BM, PO] (0 beyond O) for W [O, I], b [O]."""
    # Wᵀ loaded as a [PI, PO] tile (element (i, o) at i + o·I), not W transposed in registers with
    # tl.trans, which measured slower on the H200 (docs/bench.md#launch-constants)
    i = tl.arange(0, PI)
    o = tl.arange(0, PO)
    wt = tl.load(w_ptr + o[None, :] * I + i[:, None], mask=(i[:, None] < I) & (o[None, :] < O), other=0.0)
    b = tl.load(b_ptr + o, mask=o < O, other=0.0)
    return tl.dot(_tf32(h, PREC), _tf32(wt, PREC), input_precision=PREC) + b[None, :]


@triton.jit
def _relu(z):
    return tl.where(z < 0, 0.0, z)  # NaN stays NaN (torch.relu)


@triton.jit
def _mlp_forward_kernel(x_ptr, y_ptr, w1, b1, w2, b2, w3, b3, w4, b4, h1_ptr, h2_ptr, h3_ptr,
                        step_ptr, start_ptr, end_ptr, duration_ptr, u_ptr, B,
                        L: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr,
                        D3: tl.constexpr, D4: tl.constexpr, P0: tl.constexpr, P1: tl.constexpr,
                        P2: tl.constexpr, P3: tl.constexpr, P4: tl.constexpr, DL: tl.constexpr,
                        PL: tl.constexpr, BLOCK_M: tl.constexpr, SAVE: tl.constexpr, PREC: tl.constexpr,
                        ACT: tl.constexpr, RANDOM_BITS: tl.constexpr):
    """x [B, D0] → y [B, DL] through L layers; with SAVE also h_1 .. h_{L-1} (post-ReLU). ACT:
    instead of y, the ε-greedy action of each row (int64 [B] at y_ptr; one schedule, u [1, 2, B]:
    :mod:`foxdqn.ops.mlp_chain_epsilon_greedy`)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    ok = rows < B
    if ACT:  # the schedule and the uniforms, loaded while the chain runs
        step, start, end, duration = _schedule_row(step_ptr, start_ptr, end_ptr, duration_ptr, 0)
        u_explore = tl.load(u_ptr + rows, mask=ok, other=1.0)
        u_action = tl.load(u_ptr + B + rows, mask=ok, other=0.0)
    z = _linear(_load_rows(x_ptr, rows, ok, D0, P0), w1, b1, D0, D1, P0, P1, PREC)
    if L > 1:
        h = _relu(z)
        if SAVE:
            _store_rows(h1_ptr, h, rows, ok, D1, P1)
        z = _linear(h, w2, b2, D1, D2, P1, P2, PREC)
    if L > 2:
        h = _relu(z)
        if SAVE:
            _store_rows(h2_ptr, h, rows, ok, D2, P2)
        z = _linear(h, w3, b3, D2, D3, P2, P3, PREC)
    if L > 3:
        h = _relu(z)
        if SAVE:
            _store_rows(h3_ptr, h, rows, ok, D3, P3)
        z = _linear(h, w4, b4, D3, D4, P3, P4, PREC)
    if ACT:
        cols = tl.arange(0, PL)
        _, greedy = tile_argmax(z, cols, (cols < DL)[None, :], DL)
        tl.store(y_ptr + rows, _act(greedy, step, start, end, duration, u_explore, u_action, DL, RANDOM_BITS),
                 mask=ok)
    else:
        _store_rows(y_ptr, z, rows, ok, DL, PL)


@triton.jit
def _back(g, w_ptr, h_ptr, dz_ptr, rows, ok, I: tl.constexpr, O: tl.constexpr, PI: tl.constexpr,
          PO: tl.constexpr, PREC: tl.constexpr):
    """dz_{i+1} [BM, PO] → dz_i = (dz_{i+1} W_{i+1}) ⊙ 1{h_i > 0} [BM, PI], stored to dz_ptr; W_{i+1}
    [O, I], h_i [B, I]. 0 where h_i <= 0 (threshold_backward: a NaN h_i passes the gradient)."""
    t = tl.dot(_tf32(g, PREC), _tf32(_load_weight(w_ptr, O, I, PO, PI), PREC), input_precision=PREC)
    dz = tl.where(_load_rows(h_ptr, rows, ok, I, PI) <= 0, 0.0, t)
    _store_rows(dz_ptr, dz, rows, ok, I, PI)
    return dz


@triton.jit
def _mlp_dz_kernel(dy_ptr, w2, w3, w4, h1_ptr, h2_ptr, h3_ptr, g1_ptr, g2_ptr, g3_ptr, B,
                   L: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr, D3: tl.constexpr,
                   D4: tl.constexpr, P0: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr, P3: tl.constexpr,
                   P4: tl.constexpr, DL: tl.constexpr, PL: tl.constexpr, BLOCK_M: tl.constexpr, PREC: tl.constexpr):
    """dy [B, DL] and the saved h_i → dz_i [B, D_i] for i = L-1 .. 1 (L >= 2)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    ok = rows < B
    g = _load_rows(dy_ptr, rows, ok, DL, PL)
    if L > 3:
        g = _back(g, w4, h3_ptr, g3_ptr, rows, ok, D3, D4, P3, P4, PREC)
    if L > 2:
        g = _back(g, w3, h2_ptr, g2_ptr, rows, ok, D2, D3, P2, P3, PREC)
    if L > 1:
        g = _back(g, w2, h1_ptr, g1_ptr, rows, ok, D1, D2, P1, P2, PREC)


@triton.jit
def _wgrad(pid, START: tl.constexpr, T: tl.constexpr, h_ptr, g_ptr, dw_ptr, db_ptr, B, I: tl.constexpr,
           O: tl.constexpr, PI: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr, PREC: tl.constexpr):
    """Program ``pid`` in [START, START + T): units [t·BN, (t+1)·BN) of one layer (t = pid − START),
    dW [O, I] = dzᵀ h and db [O] = Σ_rows dz over every row block in order; dz [B, O], h [B, I]."""
    t = pid - START
    if (t >= 0) & (t < T):
        n = t * BN + tl.arange(0, BN)
        n_ok = n < O
        i = tl.arange(0, PI)
        i_ok = i < I
        acc = tl.zeros([BN, PI], dtype=tl.float32)
        db = tl.zeros([BN], dtype=tl.float32)
        for r0 in range(0, B, BR):
            r = r0 + tl.arange(0, BR).to(tl.int64)
            r_ok = r < B
            gt = tl.load(g_ptr + r[None, :] * O + n[:, None], mask=n_ok[:, None] & r_ok[None, :], other=0.0)
            h = tl.load(h_ptr + r[:, None] * I + i[None, :], mask=r_ok[:, None] & i_ok[None, :], other=0.0)
            acc = tl.dot(_tf32(gt, PREC), _tf32(h, PREC), acc=acc, input_precision=PREC)  # [BN, BR] @ [BR, PI]
            db += tl.sum(gt, axis=1)
        tl.store(dw_ptr + n[:, None] * I + i[None, :], acc, mask=n_ok[:, None] & i_ok[None, :])
        tl.store(db_ptr + n, db, mask=n_ok)


@triton.jit
def _mlp_wgrad_kernel(x_ptr, h1_ptr, h2_ptr, h3_ptr, g1_ptr, g2_ptr, g3_ptr, g4_ptr, dw1, db1, dw2, db2, dw3,
                      db3, dw4, db4, B, L: tl.constexpr, D0: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr,
                      D3: tl.constexpr, D4: tl.constexpr, P0: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr,
                      P3: tl.constexpr, P4: tl.constexpr, DL: tl.constexpr, PL: tl.constexpr, N1: tl.constexpr,
                      N2: tl.constexpr, N3: tl.constexpr, N4: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr,
                      T3: tl.constexpr, T4: tl.constexpr, BR: tl.constexpr, PREC: tl.constexpr):
    """dW_i, db_i of every layer: layer i has T_i programs of N_i units; g_i = dz_i (g_L = dy)."""
    pid = tl.program_id(0)
    _wgrad(pid, 0, T1, x_ptr, g1_ptr, dw1, db1, B, D0, D1, P0, N1, BR, PREC)
    if L > 1:
        _wgrad(pid, T1, T2, h1_ptr, g2_ptr, dw2, db2, B, D1, D2, P1, N2, BR, PREC)
    if L > 2:
        _wgrad(pid, T1 + T2, T3, h2_ptr, g3_ptr, dw3, db3, B, D2, D3, P2, N3, BR, PREC)
    if L > 3:
        _wgrad(pid, T1 + T2 + T3, T4, h3_ptr, g4_ptr, dw4, db4, B, D3, D4, P3, N4, BR, PREC)


# ---------------------------------------------------------------------------------------------
# launchers
# ---------------------------------------------------------------------------------------------
def tf32_enabled() -> bool:
    """Whether torch runs float32 CUDA matmuls in TF32 now: ``torch.backends.cuda.matmul.fp32_precision``
    is "tf32" (set by ``torch.set_float32_matmul_precision("high" | "medium")``, or by the legacy
    ``torch.backends.cuda.matmul.allow_tf32 = True``; read through the new flag because torch >= 2.9
    refuses ``get_float32_matmul_precision()`` once both APIs were used); torch < 2.9: ``allow_tf32``."""
    matmul = torch.backends.cuda.matmul
    try:
        return matmul.fp32_precision == "tf32"
    except AttributeError:  # torch < 2.9
        return bool(matmul.allow_tf32)


def _pad(d: int) -> int:
    return max(16, triton.next_power_of_2(d))


def _block_m(rows: int) -> int:
    """Rows per program of the row-grid kernels: 16 (the smallest ``tl.dot`` tile) while that gives
    at most 264 programs (2 per H200 multiprocessor), then 32; a program loads every weight once."""
    return 16 if rows <= 16 * 264 else 32


def _layout(dims: list[int]) -> dict:
    """Constexpr widths D0..D4 and padded widths P0..P4 (unused layers: 1 and 16), DL/PL of y."""
    padded = dims + [1] * (MAX_LAYERS + 1 - len(dims))
    meta = {f"D{i}": d for i, d in enumerate(padded)}
    meta.update({f"P{i}": _pad(d) for i, d in enumerate(padded)})
    meta.update(L=len(dims) - 1, DL=dims[-1], PL=_pad(dims[-1]))
    return meta


def _prec(t: Tensor) -> str:
    return "tf32" if t.is_cuda and tf32_enabled() else "ieee"


def _fill(ts, k: int, filler: Tensor) -> list:
    """``ts`` padded to ``k`` entries with ``filler``: the pointer passed for a layer the kernel skips."""
    return [*ts, *([filler] * (k - len(ts)))]


def _forward(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor], save: bool, prec: str):
    """Launch the forward kernel: y [B, D_n], and the list h_1 .. h_{n-1} (empty unless ``save``)."""
    rows = x.shape[0]
    dims = [x.shape[1]] + [w.shape[0] for w in weights]
    y = x.new_empty(rows, dims[-1])
    hs = [x.new_empty(rows, d) for d in dims[1:-1]] if save else []
    launch_forward(x, weights, biases, y, hs, prec)
    return y, hs


def launch_forward(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor], out: Tensor,
                   hs: Sequence[Tensor] = (), prec: str = "ieee",
                   schedule: tuple[Tensor, Tensor, Tensor, Tensor, Tensor] | None = None) -> None:
    """Launch the forward kernel on checked arguments: y into ``out`` (float32 ``[B, D_n]``) and the
    post-ReLU activations into ``hs`` (saved when given), or with ``schedule`` = (step, start, end,
    duration, u) the ε-greedy actions into ``out`` (int64 ``[B]``:
    :func:`foxdqn.ops.mlp_chain_epsilon_greedy.mlp_chain_epsilon_greedy`)."""
    rows = x.shape[0]
    if not rows:
        return
    dims = [x.shape[1]] + [w.shape[0] for w in weights]
    wb = zip(_fill(weights, MAX_LAYERS, weights[0]), _fill(biases, MAX_LAYERS, biases[0]))
    act = schedule if schedule is not None else (out,) * 5  # unused pointers without the ε-greedy epilogue
    block_m = _block_m(rows)
    _mlp_forward_kernel[(triton.cdiv(rows, block_m),)](
        x, out, *(t for pair in wb for t in pair), *_fill(list(hs), MAX_LAYERS - 1, out), *act, rows,
        **_layout(dims), BLOCK_M=block_m, SAVE=bool(hs), PREC=prec, ACT=schedule is not None,
        RANDOM_BITS=RANDOM_BITS, num_warps=NUM_WARPS,
        enable_fp_fusion=False)  # both launches: the ε schedule's roundings, and Q the same bits in both


def _backward(x: Tensor, weights: Sequence[Tensor], hs: Sequence[Tensor], dy: Tensor, prec: str):
    """Launch the dz kernel (two layers or more) and the dW / db kernel: the lists dW_i, db_i."""
    rows, n = x.shape[0], len(weights)
    dims = [x.shape[1]] + [w.shape[0] for w in weights]
    meta = _layout(dims)
    gs = [x.new_empty(rows, d) for d in dims[1:-1]] + [dy]  # dz_1 .. dz_{n-1}, then dz_n = dy
    if rows and n > 1:
        block_m = _block_m(rows)
        _mlp_dz_kernel[(triton.cdiv(rows, block_m),)](
            dy, *_fill(weights[1:], MAX_LAYERS - 1, dy), *_fill(hs, MAX_LAYERS - 1, dy),
            *_fill(gs[:-1], MAX_LAYERS - 1, dy), rows, **meta, BLOCK_M=block_m, PREC=prec, num_warps=NUM_WARPS)
    dws = [torch.empty_like(w) for w in weights]
    dbs = [x.new_empty(d) for d in dims[1:]]
    units = {f"N{i}": min(BLOCK_N, meta[f"P{i}"]) for i in range(1, MAX_LAYERS + 1)}  # per program
    tiles = {f"T{i}": triton.cdiv(dims[i], units[f"N{i}"]) if i <= n else 0 for i in range(1, MAX_LAYERS + 1)}
    dw_db = zip(_fill(dws, MAX_LAYERS, dy), _fill(dbs, MAX_LAYERS, dy))
    _mlp_wgrad_kernel[(sum(tiles.values()),)](
        x, *_fill(hs, MAX_LAYERS - 1, x), *_fill(gs, MAX_LAYERS, dy), *(t for pair in dw_db for t in pair), rows,
        **meta, **units, **tiles, BR=BLOCK_R, PREC=prec, num_warps=NUM_WARPS)
    return dws, dbs


class _MLPChain(torch.autograd.Function):
    """y = forward kernel(x, W, b) (saving h_1 .. h_{n-1}); backward: the dz and the dW / db kernels."""

    @staticmethod
    def forward(ctx, x, n, *params):
        weights, biases = params[:n], params[n:]
        ctx.n, ctx.prec = n, _prec(x)
        y, hs = _forward(x, weights, biases, save=True, prec=ctx.prec)
        ctx.save_for_backward(x, *weights, *hs)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_y):
        n, saved = ctx.n, ctx.saved_tensors
        dws, dbs = _backward(saved[0], saved[1:n + 1], saved[n + 1:], grad_y.contiguous(), ctx.prec)
        need = ctx.needs_input_grad[2:]
        return (None, None, *(g if need[i] else None for i, g in enumerate([*dws, *dbs])))


# ---------------------------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------------------------
def _problem(x, weights, biases, op: str = "mlp_chain") -> str | None:
    """Why (x, weights, biases) is outside :func:`mlp_chain`'s contract, or None; the message starts
    with ``op`` (an op that takes mlp_chain's arguments names itself)."""
    if not isinstance(x, Tensor):
        return f"{op}: x must be a tensor, got {describe(x)}"
    if not isinstance(weights, (list, tuple)) or not isinstance(biases, (list, tuple)):
        return f"{op}: weights and biases must be lists of tensors, got {type(weights).__name__} and " \
               f"{type(biases).__name__}"
    n = len(weights)
    if not 1 <= n <= MAX_LAYERS or len(biases) != n:
        return f"{op}: weights must hold 1 to {MAX_LAYERS} layers and biases one per layer, got {n} weights and " \
               f"{len(biases)} biases"
    if x.dim() != 2 or x.dtype != torch.float32 or not x.is_contiguous():
        return f"{op}: x must be a contiguous float32 [B, D0] tensor, got {describe(x)}"
    width = x.shape[1]
    for i, (w, b) in enumerate(zip(weights, biases)):
        if not isinstance(w, Tensor) or w.dim() != 2 or w.shape[1] != width or w.dtype != torch.float32 \
                or not w.is_contiguous() or w.device != x.device:
            return f"{op}: weights[{i}] must be a contiguous float32 [D{i + 1}, {width}] tensor on {x.device}, " \
                   f"got {describe(w)}"
        if not isinstance(b, Tensor) or tuple(b.shape) != (w.shape[0],) or b.dtype != torch.float32 \
                or not b.is_contiguous() or b.device != x.device:
            return f"{op}: biases[{i}] must be a contiguous float32 [{w.shape[0]}] tensor on {x.device}, " \
                   f"got {describe(b)}"
        width = w.shape[0]
    dims = [x.shape[1]] + [w.shape[0] for w in weights]
    for i, d in enumerate(dims):
        if not 1 <= d <= MAX_WIDTH:
            what = "x" if i == 0 else f"weights[{i - 1}]"
            return f"{op}: every width must be 1 to {MAX_WIDTH}, got D{i} = {d} ({what})"
    return None


def mlp_chain_supported(x, weights, biases) -> bool:
    """Whether :func:`mlp_chain` takes ``(x, weights, biases)``: 1 to 4 layers, float32 contiguous
    tensors on one device with chained shapes, every width (D_0 .. D_n) 1 to 128. A metadata check
    only (no device read); callers fall back to their own layers when it is False."""
    return _problem(x, weights, biases) is None


def _check(x, weights, biases) -> None:
    problem = _problem(x, weights, biases)
    if problem is not None:
        raise ValueError(problem)


# ---------------------------------------------------------------------------------------------
# reference and public op
# ---------------------------------------------------------------------------------------------
def mlp_chain_reference(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor]) -> Tensor:
    """Plain-torch :func:`mlp_chain` (same arguments and result): ``F.linear`` per layer with
    ``torch.relu`` between them, differentiable by autograd (w.r.t. x too)."""
    _check(x, weights, biases)
    h = x
    for i, (w, b) in enumerate(zip(weights, biases)):
        h = F.linear(h, w, b)
        if i < len(weights) - 1:
            h = torch.relu(h)
    return h


def mlp_chain(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor], *, backend: str = "auto") -> Tensor:
    """y = L_n(relu(... relu(L_1(x)))), L_i(h) = h W_iᵀ + b_i: forward one kernel, backward two.

    Args:
        x: the input (observations), float32 ``[B, D_0]``, contiguous, any B >= 0. Gets no
            gradient: with ``x.requires_grad`` the op runs :func:`mlp_chain_reference`.
        weights: ``[W_1, ..., W_n]``, 1 <= n <= 4, W_i float32 ``[D_i, D_{i-1}]`` contiguous
            (``nn.Linear.weight``), on x's device; every D_i (and D_0) 1 to 128.
        biases: ``[b_1, ..., b_n]``, b_i float32 ``[D_i]`` contiguous (``nn.Linear.bias``).
        backend: ``"auto"`` (the Triton kernels for CUDA tensors, else the reference),
            ``"triton"`` (CPU tensors need TRITON_INTERPRET=1) or ``"torch"``
            (:func:`mlp_chain_reference`).

    Returns:
        y float32 ``[B, D_n]``, differentiable w.r.t. every weight and bias that requires grad (the
        kernel path: first order only). Equal to the reference to float rounding (module
        docstring: TF32 when torch's float32 matmuls use it, summation order).

    Raises:
        ValueError: outside the contract above (:func:`mlp_chain_supported` is False: more than 4
            layers, a width above 128, a dtype other than float32, a non-contiguous or misshapen
            tensor, mixed devices), or an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check(x, weights, biases)
    if resolve_backend("mlp_chain", backend, x) == "torch" or x.requires_grad:
        return mlp_chain_reference(x, weights, biases)
    params = [*weights, *biases]
    if torch.is_grad_enabled() and any(p.requires_grad for p in params):
        return _MLPChain.apply(x, len(weights), *params)
    return _forward(x, weights, biases, save=False, prec=_prec(x))[0]
