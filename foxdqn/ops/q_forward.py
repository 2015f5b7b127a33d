r"""The no-gradient forward of an MLP Q network (1 or 2 hidden ReLU layers, a plain or dueling head) in one kernel.

    h_0 = x,   h_i = relu(h_{i-1} W_iᵀ + b_i)   (i = 1 .. n, n = 1 or 2 hidden layers)
    Q = h_n W_qᵀ + b_q                                                     (plain head, Mnih et al. 2015)
    V = h_n w_vᵀ + b_v,   Adv = h_n W_aᵀ + b_a,   Q = (V + Adv) − mean_a Adv  (dueling, Wang et al. 2016 eq. 9)

Per member p of P (``P = 1``: one network) and row m of M: x float32 ``[P, M, D_0]`` (``[M, D_0]``
for P = 1), Q float32 ``[P, M, A]`` (``[M, A]``). ``weights`` lists the layers input to output as
:class:`foxdqn.population.network.MemberQNetwork` stacks them: ``[W_1, (W_2), W_q]``, or
``[W_1, (W_2), w_v, W_a]`` with ``dueling`` (value before advantage); ``biases`` the matching
biases. Two layouts, read through strides (no copies):

* ``nn.Linear``'s, P = 1 (:class:`foxdqn.nn.qnet.QNetwork` of :class:`foxdqn.nn.mlp.MLPEncoder`
  and :class:`foxdqn.nn.heads.QHead` / :class:`foxdqn.nn.heads.DuelingHead`): W ``[out, in]``,
  b ``[out]``;
* the population's (``MemberQNetwork``): W ``[P, in, out]``, b ``[P, 1, out]``.

Widths: D_0 >= 1 (any: the first layer loops over it), hidden widths 1 to :data:`MAX_WIDTH` (256),
A 1 to :data:`MAX_ACTIONS` (64), w_v one output. ``eurusd_dqn``'s 162 → 256 → 256 → dueling 45
is one launch here, where the modules run six kernels (a cuBLAS GEMM per Linear, cuBLASLt's bias
+ ReLU epilogue on the hidden ones, :mod:`foxdqn.ops.dueling_combine`).

Kernel (Triton), a grid of (blocks of :data:`BLOCK_M` rows, P members); program (r, p) reads only
member p's weights and rows (members never mix):

* layer 1, looped over D_0 in chunks of :data:`BLOCK_K` columns: acc [BLOCK_M, H_1 padded] +=
  x chunk [BLOCK_M, BLOCK_K] · W_1ᵀ chunk [BLOCK_K, H_1 padded] (both loaded from global memory,
  masked), then h_1 = relu(acc + b_1), kept in registers;
* one hidden layer: the head contracts h_1 whole (``tl.dot`` with W_aᵀ or W_qᵀ [H_1, A padded]);
  the value is the row sum of h_1 ⊙ w_v (a float32 reduction, not a product of tiles);
* two hidden layers: a loop over chunks j of :data:`BLOCK_N` units of layer 2, h_2[:, j] =
  relu(h_1 · W_2ᵀ[:, j] + b_2[j]), accumulated straight into the head (Adv += h_2[:, j] ·
  W_aᵀ[j, :], V += Σ h_2[:, j] ⊙ w_v[j]): h_2 is never held whole, and no weight tile is larger
  than [H_1, BLOCK_N] (64 KiB at 256 × 64) or [H_1, A] (64 KiB at 256 × 64, one hidden layer);
* the head's bias, then the dueling combine over the A real actions, Q stored; or, for
  :func:`foxdqn.ops.q_forward_epsilon_greedy.q_forward_epsilon_greedy`, the row's ε-greedy
  action from Q in registers (Q is not stored).

Every width is padded to a power of two >= 16 (``tl.dot``'s smallest tile) with masked loads;
padded units are set to exactly 0 after each ReLU (also in a row whose x holds an inf or NaN), so
they add nothing; the dueling mean sums the A real columns only. ``BLOCK_M``, ``BLOCK_K``,
``BLOCK_N``, ``NUM_WARPS`` (population layout), ``NUM_WARPS_LINEAR`` (nn.Linear layout),
``NUM_STAGES`` are module constants read at each launch (a sweep may set them on the module). They are sized for the H200's shared memory; on a GPU where they raise
Triton's ``OutOfResources`` at the first launch (before any graph capture: the first calls are
eager), the op launches with :data:`SMALL_TILES` there from then on.

Precision: the rule of :mod:`foxdqn.ops.mlp_chain`. Where torch runs float32 CUDA matmuls in TF32
(``torch.set_float32_matmul_precision("high")``, the run's default; :func:`tf32_enabled`) every
``tl.dot`` takes operands rounded to TF32 first (to nearest, ties away from zero: mlp_chain's
``_tf32``; Triton's TF32 dot alone would truncate) with ``input_precision="tf32"``, else
``"ieee"`` (float32 FMA). The value's row sum is float32 products then sums in both (a
[BLOCK_M, H] ⊙ [H] reduction, no tensor cores; the kernel is compiled without multiply-add
contraction, ``enable_fp_fusion=False``, which the ε schedule of the action epilogue needs, so
that Q and the actions come from one compilation rule). Biases are added in float32 after the products, as ``F.linear``
does. The sums run in another order than cuBLAS's (the K chunks, the j chunks of the two-layer
head), so the result equals :func:`q_forward_reference` to float rounding, not bit for bit: about
1e-6 relative in IEEE float32, about 1e-3 in TF32. In Triton's interpreter (CPU tests) ``tl.dot``
is a numpy float32 matmul; the TF32 rounding of the operands runs there too. NaN: relu keeps NaN
(``torch.relu``), so a NaN in a row of x makes that row of Q NaN and no other.

No gradient: the op has no backward. It runs where autograd needs none: under ``torch.no_grad()``
or ``torch.inference_mode()`` (the collect step, evaluation), or with grad mode on when no input
requires grad (the target network's frozen weights). With grad mode on and any of x, the weights
or the biases requiring grad it raises ``ValueError`` naming that argument, rather than return a
Q that autograd could not differentiate.

Capture: device ops only (no host reads of tensor data, no host→device copies); the output is
``torch.empty`` (inside a CUDA-graph capture it comes from the graph's pool); shapes, strides and
the TF32 choice are read from tensor metadata and torch's flags at launch (a captured graph keeps
the choice of its capture). Registered as ``torch.ops.foxdqn.q_forward`` by
:func:`foxdqn.ops.library.register_ops` (for ``torch.compile``, which reads the TF32 choice when it
compiles the graph: the launcher runs then, Dynamo does not trace torch's precision getter).

Errors: ``ValueError`` for anything outside the contract (:func:`q_forward_supported` is False for
it): a width above 256, A above 64, 0 or 3+ hidden layers, a dtype other than float32, x not
of contiguous rows, misshapen or mixed-layout weights or biases, mixed devices, an input requiring grad
under grad mode, an unknown backend; ``RuntimeError`` for backend="triton" on CPU tensors without
TRITON_INTERPRET=1.

Sources: Mnih et al. (2015), "Human-level control through deep reinforcement learning" (the MLP Q
network with a linear Q head); Wang et al. (2016), "Dueling Network Architectures for Deep
Reinforcement Learning", eq. 9 (the combine).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.errors import OutOfResources

from foxdqn.ops.backend import INTERPRET, describe, resolve_backend
from foxdqn.ops.argmax import tile_argmax
from foxdqn.ops.epsilon_greedy import RANDOM_BITS, _act, _schedule_row
from foxdqn.ops.library import device_op, wrap_triton
from foxdqn.ops.mlp_chain import _pad, _prec, _relu, _tf32, tf32_enabled

__all__ = ["MAX_ACTIONS", "MAX_HIDDEN", "MAX_WIDTH", "launch_q_forward", "q_forward", "q_forward_reference",
           "q_forward_supported", "tf32_enabled"]

MAX_WIDTH = 256  # largest hidden width: h_1 is a [BLOCK_M, 256] register tile per program
MAX_ACTIONS = 64  # largest A: the head's accumulator [BLOCK_M, 64]
MAX_HIDDEN = 2  # hidden layers (1 or 2)

# Launch constants (read from the module at each launch: a sweep script may set them), chosen by
# sweeps on the H200 at eurusd_dqn's sizes (docs/bench.md#launch-constants). One network's
# nn.Linear layout takes 8 warps: with 4, its [32, 256] tiles spill.
BLOCK_M = 32  # rows per program (>= 16, a power of two): 128 programs for 4,096 rows
BLOCK_K = 64  # columns of x (and rows of W_1ᵀ) per step of layer 1's loop: a [64, 256] W_1ᵀ chunk, 64 KiB
BLOCK_N = 64  # layer-2 units per step of the head loop: a [256, 64] W_2ᵀ tile (64 KiB) and a [64, 64] head tile
NUM_WARPS = 4  # warps per program, population layout ([P, in, out] weights)
NUM_WARPS_LINEAR = 8  # warps per program, nn.Linear layout ([out, in] weights: one network)
NUM_STAGES = 3  # software-pipelining stages of the two loops (Triton's default)
#: (BLOCK_K, BLOCK_N, num_stages) used on a device where the constants above raised Triton's
#: OutOfResources (less shared memory than the H200's 227 KiB): [256, 32] weight tiles, 2 stages
SMALL_TILES = (32, 32, 2)
_FITS: dict = {}  # device → SMALL_TILES once the module's tiles did not fit there (kept for the process)


# ---------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def _q_forward_kernel(x_ptr, q_ptr, M, x_sp,
                      w1, b1, w2, b2, wv, bv, wh, bh,
                      step_ptr, start_ptr, end_ptr, duration_ptr, u_ptr,
                      w1_sp, w1_so, w1_si, b1_sp, b1_so,
                      w2_sp, w2_so, w2_si, b2_sp, b2_so,
                      wv_sp, wv_si, bv_sp,
                      wh_sp, wh_so, wh_si, bh_sp, bh_so,
                      D0: tl.constexpr, H1: tl.constexpr, H2: tl.constexpr, A: tl.constexpr,
                      P1: tl.constexpr, PA: tl.constexpr, DEPTH: tl.constexpr, DUELING: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
                      ACT: tl.constexpr, RANDOM_BITS: tl.constexpr):
    """x [P, M, D0] (rows contiguous, member p's at ``p·x_sp``) → q [P, M, A] contiguous for
    member ``program_id(1)``'s rows ``program_id(0)``. Weight element (p, o, i) of a layer at ``p·sp + o·so + i·si``, bias
    element (p, o) at ``p·sp + o·so`` (sp = 0: one network). wh, bh: W_a, b_a (dueling) or W_q, b_q.
    ACT: instead of Q, the ε-greedy action (int64 [P, M] at q_ptr) of each row under member p's
    schedule (step, start[p], end[p], duration[p]) and uniforms u[p, 0 | 1, row]
    (:mod:`foxdqn.ops.epsilon_greedy`'s rule; :mod:`foxdqn.ops.q_forward_epsilon_greedy`)."""
    p = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    ok = rows < M
    row0 = p * M + rows  # row index into [P·M, ·]

    # ---- layer 1: acc [BLOCK_M, P1] over D0 in chunks of BLOCK_K
    w1 += p * w1_sp
    n1 = tl.arange(0, P1)
    n1_ok = n1 < H1
    x_rows = x_ptr + p * x_sp + rows * D0
    acc = tl.zeros([BLOCK_M, P1], dtype=tl.float32)
    for k0 in range(0, D0, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < D0
        xc = tl.load(x_rows[:, None] + k[None, :], mask=ok[:, None] & k_ok[None, :], other=0.0)
        wt = tl.load(w1 + k[:, None] * w1_si + n1[None, :] * w1_so, mask=k_ok[:, None] & n1_ok[None, :], other=0.0)
        acc = tl.dot(_tf32(xc, PREC), _tf32(wt, PREC), acc=acc, input_precision=PREC)
    bias1 = tl.load(b1 + p * b1_sp + n1 * b1_so, mask=n1_ok, other=0.0)
    h1 = tl.where(n1_ok[None, :], _relu(acc + bias1[None, :]), 0.0)  # padded units exactly 0
    h1r = _tf32(h1, PREC)

    # ---- the head (and layer 2, chunk by chunk)
    a = tl.arange(0, PA)
    a_ok = a < A
    wh += p * wh_sp
    wv += p * wv_sp
    if DEPTH == 1:
        wht = tl.load(wh + n1[:, None] * wh_si + a[None, :] * wh_so, mask=n1_ok[:, None] & a_ok[None, :], other=0.0)
        out = tl.dot(h1r, _tf32(wht, PREC), input_precision=PREC)
        if DUELING:
            wvt = tl.load(wv + n1 * wv_si, mask=n1_ok, other=0.0)
            value = tl.sum(h1 * wvt[None, :], axis=1)
    else:
        w2 += p * w2_sp
        out = tl.zeros([BLOCK_M, PA], dtype=tl.float32)
        value = tl.zeros([BLOCK_M], dtype=tl.float32)
        for j0 in range(0, H2, BLOCK_N):
            j = j0 + tl.arange(0, BLOCK_N)
            j_ok = j < H2
            w2t = tl.load(w2 + n1[:, None] * w2_si + j[None, :] * w2_so, mask=n1_ok[:, None] & j_ok[None, :],
                          other=0.0)
            bias2 = tl.load(b2 + p * b2_sp + j * b2_so, mask=j_ok, other=0.0)
            z2 = tl.dot(h1r, _tf32(w2t, PREC), input_precision=PREC) + bias2[None, :]
            h2 = tl.where(j_ok[None, :], _relu(z2), 0.0)
            wht = tl.load(wh + j[:, None] * wh_si + a[None, :] * wh_so, mask=j_ok[:, None] & a_ok[None, :], other=0.0)
            out = tl.dot(_tf32(h2, PREC), _tf32(wht, PREC), acc=out, input_precision=PREC)
            if DUELING:
                wvt = tl.load(wv + j * wv_si, mask=j_ok, other=0.0)
                value += tl.sum(h2 * wvt[None, :], axis=1)
    out += tl.load(bh + p * bh_sp + a * bh_so, mask=a_ok, other=0.0)[None, :]
    if DUELING:
        value += tl.load(bv + p * bv_sp)
        mean = tl.sum(tl.where(a_ok[None, :], out, 0.0), axis=1) / A  # over the A real actions
        out = (value[:, None] + out) - mean[:, None]
    if ACT:
        step, start, end, duration = _schedule_row(step_ptr, start_ptr, end_ptr, duration_ptr, p)
        u_row = u_ptr + p * (2 * M) + rows
        u_explore = tl.load(u_row, mask=ok, other=1.0)
        u_action = tl.load(u_row + M, mask=ok, other=0.0)
        _, greedy = tile_argmax(out, a, a_ok[None, :], A)
        tl.store(q_ptr + row0, _act(greedy, step, start, end, duration, u_explore, u_action, A, RANDOM_BITS), mask=ok)
    else:
        tl.store(q_ptr + row0[:, None] * A + a[None, :], out, mask=ok[:, None] & a_ok[None, :])


# ---------------------------------------------------------------------------------------------
# launcher (a device_op: register_ops() registers it with torch.library, foxdqn/ops/library.py)
# ---------------------------------------------------------------------------------------------
def _strides(w: Tensor, b: Tensor) -> tuple[int, int, int, int, int]:
    """(member, out, in) strides of a weight and (member, out) of its bias, either layout."""
    if w.dim() == 2:  # nn.Linear: W [out, in], b [out]
        return 0, w.stride(0), w.stride(1), 0, b.stride(0)
    return w.stride(0), w.stride(2), w.stride(1), b.stride(0), b.stride(2)  # [P, in, out], [P, 1, out]


def _out_features(w: Tensor) -> int:
    return w.shape[0] if w.dim() == 2 else w.shape[2]


@device_op("foxdqn::q_forward", mutates_args=())
def _q_forward_op(x: Tensor, weights: list[Tensor], biases: list[Tensor], dueling: bool) -> Tensor:
    """Allocate Q and launch the kernel (arguments checked by :func:`q_forward`). The TF32 choice is
    read here, at each eager launch; under ``torch.compile`` when the graph is compiled (the
    launcher runs as Python then: Dynamo cannot trace torch's matmul-precision getter)."""
    q = torch.empty((*x.shape[:-1], _out_features(weights[-1])), dtype=torch.float32, device=x.device)
    launch_q_forward(x, weights, biases, dueling, q)
    return q


def launch_q_forward(x: Tensor, weights: list[Tensor], biases: list[Tensor], dueling: bool, out: Tensor,
                     schedule: tuple[Tensor, Tensor, Tensor, Tensor, Tensor] | None = None) -> None:
    """Launch the kernel on checked arguments, writing Q into ``out`` (float32 ``[..., M, A]``), or
    with ``schedule`` = (step, start, end, duration, u) the ε-greedy actions into ``out`` (int64
    ``[P·M]``: :func:`foxdqn.ops.q_forward_epsilon_greedy.q_forward_epsilon_greedy`)."""
    depth = len(weights) - (2 if dueling else 1)
    num_actions = _out_features(weights[-1])
    members = x.shape[0] if x.dim() == 3 else 1
    rows, d0 = x.shape[-2], x.shape[-1]
    if rows == 0 or members == 0:
        return
    h1 = _out_features(weights[0])
    h2 = _out_features(weights[1]) if depth == 2 else 1
    w1, b1 = weights[0], biases[0]
    w2, b2 = (weights[1], biases[1]) if depth == 2 else (w1, b1)  # unused pointers when depth == 1
    wh, bh = weights[-1], biases[-1]
    wv, bv = (weights[-2], biases[-2]) if dueling else (wh, bh)
    s1, s2, sv, sh = _strides(w1, b1), _strides(w2, b2), _strides(wv, bv), _strides(wh, bh)
    act = schedule if schedule is not None else (out,) * 5  # unused pointers without the ε-greedy epilogue
    block_m = BLOCK_M  # the module's launch constants, read now (a sweep may have set them)
    warps = NUM_WARPS if w1.dim() == 3 else NUM_WARPS_LINEAR
    x_sp = x.stride(0) if x.dim() == 3 else 0  # a member stride of its own: e.g. a half of a stacked pair
    args = (x, out, rows, x_sp, w1, b1, w2, b2, wv, bv, wh, bh, *act, *s1, *s2, sv[0], sv[2], sv[3], *sh)
    meta = dict(D0=d0, H1=h1, H2=h2, A=num_actions, P1=_pad(h1), PA=_pad(num_actions), DEPTH=depth,
                DUELING=dueling, BLOCK_M=block_m, PREC=_prec(x), ACT=schedule is not None, RANDOM_BITS=RANDOM_BITS,
                num_warps=warps, enable_fp_fusion=False)  # no multiply-add contraction: the ε schedule's roundings
    tiles = _FITS.get(x.device, (BLOCK_K, BLOCK_N, NUM_STAGES))
    try:
        _launch((triton.cdiv(rows, block_m), members), args, meta, tiles, d0, h2)
    except OutOfResources:  # this GPU's shared memory is smaller than the H200's: smaller weight tiles
        if tiles == SMALL_TILES:
            raise
        _FITS[x.device] = SMALL_TILES
        _launch((triton.cdiv(rows, block_m), members), args, meta, SMALL_TILES, d0, h2)


def _launch(grid, args, meta, tiles, d0: int, h2: int) -> None:
    """One launch of the kernel with ``tiles`` = (BLOCK_K, BLOCK_N, num_stages)."""
    block_k, block_n, stages = tiles
    wrap_triton(_q_forward_kernel)[grid](*args, BLOCK_K=min(block_k, _pad(d0)), BLOCK_N=min(block_n, _pad(h2)),
                                         num_stages=stages, **meta)


# ---------------------------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------------------------
def _layer_names(depth: int, dueling: bool) -> list[str]:
    return [f"W_{i + 1}" for i in range(depth)] + (["w_v", "W_a"] if dueling else ["W_q"])


def _rows_contiguous(x: Tensor) -> bool:
    """``x`` is contiguous, or ``[P, M, D0]`` whose members are contiguous ``[M, D0]`` blocks at any
    member stride (the halves of a stacked pair ``[P, 2, M, D0]``)."""
    if x.is_contiguous():
        return True
    return x.dim() == 3 and x[0].is_contiguous() and x.stride(0) >= 0


def _problem(x, weights, biases, dueling, op: str = "q_forward") -> str | None:
    """Why the arguments are outside :func:`q_forward`'s shape, dtype and device contract, or None
    (the gradient rule is :func:`_grad_problem`'s; where the kernel can run, :func:`q_forward_supported`'s).
    ``op``: the name the message starts with."""
    if not isinstance(x, Tensor):
        return f"{op}: x must be a tensor, got {describe(x)}"
    if not isinstance(dueling, bool):
        return f"{op}: dueling must be a bool, got {type(dueling).__name__}"
    if not isinstance(weights, (list, tuple)) or not isinstance(biases, (list, tuple)):
        return f"{op}: weights and biases must be lists of tensors, got {type(weights).__name__} and " \
               f"{type(biases).__name__}"
    heads = 2 if dueling else 1
    depth = len(weights) - heads
    if not 1 <= depth <= MAX_HIDDEN or len(biases) != len(weights):
        want = "w_v and W_a" if dueling else "W_q"
        return f"{op}: weights must hold 1 or 2 hidden layers and the head ({want}), biases one per weight: got " \
               f"{len(weights)} weights and {len(biases)} biases (dueling={dueling})"
    if x.dim() not in (2, 3) or x.dtype != torch.float32 or not _rows_contiguous(x):
        return f"{op}: x must be a float32 [P, M, D0] or [M, D0] tensor with contiguous rows of D0 values " \
               f"(contiguous [M, D0]; [P, M, D0] of any member stride), got {describe(x)}"
    members = x.shape[0] if x.dim() == 3 else 1
    if x.shape[-1] < 1:
        return f"{op}: x must have D0 >= 1 features, got {describe(x)}"
    if not isinstance(weights[0], Tensor) or weights[0].dim() not in (2, 3):
        return f"{op}: weights[0] must be a float32 [H1, D0] (nn.Linear) or [P, D0, H1] (population) tensor, " \
               f"got {describe(weights[0])}"
    population = weights[0].dim() == 3
    if not population and members != 1:
        return f"{op}: x has P = {members} members, the nn.Linear layout of weights[0] ({describe(weights[0])}) " \
               "holds one network: use the population layout [P, in, out]"
    names = _layer_names(depth, dueling)
    width = x.shape[-1]
    for i, (w, b) in enumerate(zip(weights, biases)):
        if not isinstance(w, Tensor) or w.dim() != (3 if population else 2):
            layout = f"[{members}, in, out]" if population else "[out, in]"
            return f"{op}: weights[{i}] ({names[i]}) must be a float32 {layout} tensor like weights[0], " \
                   f"got {describe(w)}"
        out = _out_features(w)
        shape = (members, width, out) if population else (out, width)
        if tuple(w.shape) != shape or w.dtype != torch.float32 or w.device != x.device:
            want = f"[{members}, {width}, out]" if population else f"[out, {width}]"
            return f"{op}: weights[{i}] ({names[i]}) must be a float32 {want} tensor on {x.device}, got {describe(w)}"
        if dueling and i == len(weights) - 2 and out != 1:
            return f"{op}: weights[{i}] (w_v) must have one output, got {describe(w)}"
        bshape = (members, 1, out) if population else (out,)
        if not isinstance(b, Tensor) or tuple(b.shape) != bshape or b.dtype != torch.float32 or b.device != x.device:
            return f"{op}: biases[{i}] ({names[i]}) must be a float32 {list(bshape)} tensor on {x.device}, " \
                   f"got {describe(b)}"
        if i < depth:
            if not 1 <= out <= MAX_WIDTH:
                return f"{op}: every hidden width must be 1 to {MAX_WIDTH}, got {out} (weights[{i}], {names[i]})"
            width = out
    num_actions = _out_features(weights[-1])
    if not 1 <= num_actions <= MAX_ACTIONS:
        return f"{op}: the actions A must be 1 to {MAX_ACTIONS}, got {num_actions} " \
               f"(weights[{len(weights) - 1}], {names[-1]})"
    return None


def _grad_problem(x, weights, biases, op: str = "q_forward") -> str | None:
    """The argument autograd would need a gradient through (grad mode on and it requires grad), or None."""
    if not torch.is_grad_enabled():
        return None
    named = [("x", x), *((f"weights[{i}]", w) for i, w in enumerate(weights)),
             *((f"biases[{i}]", b) for i, b in enumerate(biases))]
    for name, t in named:
        if t.requires_grad:
            return f"{op}: {name} requires grad with grad mode on, and the op has no backward: call it under " \
                   "torch.no_grad() (or inference_mode), or with tensors that need no gradient"
    return None


def q_forward_supported(x, weights, biases, dueling) -> bool:
    """Whether :func:`q_forward` runs its kernel on these arguments: x a float32 ``[P, M, D0]``
    (each member's rows contiguous, any member stride) / contiguous ``[M, D0]`` tensor on CUDA (or on the CPU under TRITON_INTERPRET=1), weights
    and biases of one layout (module docstring) on its device, 1 or 2 hidden layers of width <= 256,
    A <= 64, and no gradient to be needed (grad mode off, or no input requiring grad). Host
    metadata only (no device read); callers fall back to their modules when it is False."""
    if _problem(x, weights, biases, dueling) is not None:
        return False
    if not (x.is_cuda or (INTERPRET and x.device.type == "cpu")):
        return False
    return _grad_problem(x, weights, biases) is None


def _check(x, weights, biases, dueling, op: str = "q_forward") -> None:
    problem = _problem(x, weights, biases, dueling, op)
    if problem is not None:
        raise ValueError(problem)


# ---------------------------------------------------------------------------------------------
# reference and public op
# ---------------------------------------------------------------------------------------------
def q_forward_reference(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor], *, dueling: bool) -> Tensor:
    """Plain-torch :func:`q_forward` (same arguments and result; the spec): ``F.linear`` (nn.Linear
    layout) or ``torch.baddbmm`` (population layout) per layer, ``torch.relu`` after the hidden
    ones, and the dueling combine ``(V + Adv) − Adv.mean(-1)`` written out, as QNetwork's modules
    and MemberQNetwork compute it. Checks the shape contract; differentiable by autograd (the
    kernel's no-gradient rule does not apply here)."""
    _check(x, weights, biases, dueling)
    population = weights[0].dim() == 3

    def linear(h, w, b):
        return torch.baddbmm(b, h, w) if population else F.linear(h, w, b)

    h = x.unsqueeze(0) if population and x.dim() == 2 else x
    depth = len(weights) - (2 if dueling else 1)
    for w, b in zip(weights[:depth], biases[:depth]):
        h = torch.relu(linear(h, w, b))
    if dueling:
        value = linear(h, weights[-2], biases[-2])  # [..., M, 1]
        adv = linear(h, weights[-1], biases[-1])  # [..., M, A]
        q = value + adv - adv.mean(dim=-1, keepdim=True)  # Wang et al. 2016 eq. 9
    else:
        q = linear(h, weights[-1], biases[-1])
    return q.reshape(*x.shape[:-1], q.shape[-1])


def q_forward(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor], *, dueling: bool,
              backend: str = "auto") -> Tensor:
    """Q values of an MLP Q network (1 or 2 hidden ReLU layers, plain or dueling head), no gradient, one kernel.

    Args:
        x: observations, float32 ``[P, M, D0]`` (P members: each member's ``[M, D0]``
            contiguous, at any member stride, e.g. a half ``pair[:, 0]`` of a stacked pair
            ``[P, 2, M, D0]``) or contiguous ``[M, D0]`` (one network), any M >= 0, D0 >= 1.
        weights: ``[W_1, (W_2), W_q]``, or with ``dueling`` ``[W_1, (W_2), w_v, W_a]``: all
            ``nn.Linear.weight`` ``[out, in]`` (P = 1) or all population ``[P, in, out]``
            (:class:`~foxdqn.population.network.MemberQNetwork`'s); float32, any strides, on x's
            device; hidden widths 1 to 256, A (W_q's or W_a's outputs) 1 to 64, w_v one output.
        biases: the matching ``[out]`` or ``[P, 1, out]`` float32 tensors (any strides).
        dueling: the head is the dueling pair (value, advantage) combined by Wang et al. 2016 eq. 9.
        backend: ``"auto"`` (the kernel for CUDA tensors, else the reference), ``"triton"`` (CPU
            tensors need TRITON_INTERPRET=1) or ``"torch"`` (:func:`q_forward_reference`).

    Returns:
        Q float32 contiguous ``[P, M, A]`` (``[M, A]`` for a 2-D x), needing no gradient. Equal
        to the reference to float rounding (module docstring: TF32 when torch's float32 matmuls
        use it, summation order).

    Raises:
        ValueError: outside the contract above (a width above 256, A above 64, 0 or more than 2
            hidden layers, a dtype other than float32, an x of non-contiguous rows or misshapen, misshapen
            weights or biases or mixed layouts, mixed devices), grad mode on with any input
            requiring grad (the op has no backward; the message names the argument), an unknown
            backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check(x, weights, biases, dueling)
    problem = _grad_problem(x, weights, biases)
    if problem is not None:
        raise ValueError(problem)
    if resolve_backend("q_forward", backend, x) == "torch":
        return q_forward_reference(x, weights, biases, dueling=dueling)
    return _q_forward_op(x, list(weights), list(biases), dueling)
