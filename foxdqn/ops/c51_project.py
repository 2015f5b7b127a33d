"""C51 categorical projection of the distributional Bellman target.

Source: Bellemare, Dabney & Munos (2017), "A Distributional Perspective on Reinforcement
Learning", Algorithm 1 (categorical algorithm), lines "Tz_j <- [r + gamma z_j]_{V_min}^{V_max}",
"b_j <- (Tz_j - V_min)/dz", "l <- floor(b_j), u <- ceil(b_j)", "m_l += p_j (u - b_j)",
"m_u += p_j (b_j - l)".

Kernel approach (deterministic, no atomics). Algorithm 1 scatters each source atom j onto its
two neighbours l = floor(b_j) and u = ceil(b_j). The same projection is written as a gather:

    m_i = sum_j p_j * max(0, 1 - |b_j - i|)          ("hat" weight of atom i seen from b_j)

For l < u the hat gives atom l the weight 1 - (b_j - l) = u - b_j and atom u the weight
b_j - l, exactly Algorithm 1; every other atom gets 0. When b_j lands exactly on an atom
(l == u) the hat gives that atom weight 1 and its neighbours 0: the whole p_j goes to that atom
(the usual fix of Algorithm 1, where both terms would be 0 and the mass would be lost). Each
program owns a block of rows and evaluates the K x K hat matrix in register tiles of
[BLOCK_B, BLOCK_I, BLOCK_J] (output atoms i x source atoms j), looping over j (and over i when
K > BLOCK_I), so each output atom is a fixed-order sum in registers: bitwise reproducible.

Float32 rounding. In float32, b_j near atom K - 1 has an ulp of up to 2^-23 (K - 1) (3.6e-5 at
K = 300), so any float32 projection differs from exact arithmetic by about that much times the mass
that moves (the whole row for a terminal transition, where every b_j is the same). To make the
kernel agree with the float32 reference to summation-order noise rather than to that bound, it
rounds every step exactly like the reference's separate torch ops: z_j = fl(fl(j * dz) + v_min),
Tz_j = fl(r + fl(d * z_j)), b_j = fl(fl(Tz_j - v_min) * inv_dz). The multiplies use
``libdevice.mul_rn`` when compiled, which the compiler cannot contract with the following add
into an FMA (a contracted fma(d, z_j, r) rounds once and moves b_j by an ulp at atom boundaries);
the interpreter (numpy) never contracts, so it uses a plain ``*``. The hat weights are then
identical (|b_j - i| and 1 - |b_j - i| are exact for the two neighbours of b_j); only the order of
the final sums differs (CUDA ``scatter_add_`` in the reference is atomic).

Scalar arguments. The float run constants reach the kernel as fp32 from an eager launch but as
fp64 from Inductor (it types Python-float kernel arguments fp64), so the kernel casts them to fp32
first; otherwise fp64 would promote the accumulator inside the loop.

Per-group support. ``v_min`` / ``v_max`` may also be float ``[G]`` device tensors: rows
``g·B/G .. (g+1)·B/G − 1`` (member g of a population, foxdqn/population/objective.py) are projected
onto group g's support. The kernel (``GROUPED``) then reads each row's (v_min, v_max, dz, inv_dz)
from a float32 ``[G, 4]`` table (:func:`support_table`: dz and inv_dz computed in float64 from the
bounds and rounded once, as the launcher rounds its Python floats), so a group's rows get exactly
the values the scalar path gives for the same bounds (float64 tensors) and no row reads another
group's support. The table is made on the device (no host read): capturable.

Edge-case rules (kernel and reference agree):

* b_j = (Tz_j - v_min) * inv_dz with inv_dz = (K - 1) / (v_max - v_min) rounded once to the
  input dtype: a multiply, not a division, in kernel and reference alike (torch on CUDA turns a
  division by a Python scalar into exactly this reciprocal multiply anyway, while the CPU divides;
  one explicit multiply makes the reference device-independent).
* b_j is clamped to [0, K - 1] after that multiply, so a rounding error in inv_dz can never
  index atom K.
* Mass is conserved: every output row sums to its input row sum (up to f32 rounding), also
  for rows that do not sum to 1.
* NaN/Inf: an output row is all-NaN when any p_j of that row is NaN or +-Inf, or any
  unclipped Tz_j = r + d * z_j is NaN (r or d NaN, d = +-Inf with z_j = 0, Inf - Inf).
  r = +-Inf alone is clipped like any other value (all mass at v_max / v_min).
* discounts may be any finite value (0 for terminal transitions: all mass on the atom(s)
  around clip(r)); negative values are projected the same way.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from foxdqn.errors import ConfigError
from foxdqn.ops.backend import INTERPRET, describe, resolve_backend
from foxdqn.ops.library import device_op, wrap_triton

# Register-tile budget (elements of the [BLOCK_B, BLOCK_I, BLOCK_J] hat tile) per program.
_CUDA_TILE = 2048  # default 4 warps -> 16 f32 per thread per live tile
_INTERP_TILE = 1 << 18  # the interpreter runs one numpy op per tile: big tiles are cheaper


# ----------------------------------------------------------------------------- kernel
if INTERPRET:

    @triton.jit
    def _mul_rn(a, b):
        # The interpreter evaluates each op in numpy, rounding it on its own: never contracted.
        return a * b

else:

    @triton.jit
    def _mul_rn(a, b):
        # Round-to-nearest multiply (PTX mul.rn[.ftz].f32) that ptxas/LLVM may not fuse with a
        # following add into an FMA, so a * b + c rounds twice, exactly like two separate torch ops.
        # (.ftz flushes float32 subnormal products to 0: irrelevant for j * dz, d * z_j, b_j.)
        return libdevice.mul_rn(a, b)


@triton.jit
def _c51_project_kernel(
    p_ptr,  # (B, K) f32, row stride stride_pb, unit atom stride
    r_ptr,  # (B,) f32
    d_ptr,  # (B,) f32
    out_ptr,  # (B, K) f32, row stride stride_ob, unit atom stride
    B,
    K,
    stride_pb,
    stride_ob,
    v_min,  # float run constant (fp32 when launched eagerly, fp64 from Inductor)
    v_max,  # float run constant
    dz,  # float (v_max - v_min) / (K - 1)
    inv_dz,  # float (K - 1) / (v_max - v_min)
    k_last,  # float K - 1
    table_ptr,  # GROUPED: (G, 4) f32 rows (v_min, v_max, dz, inv_dz) of each group; else unused
    rows_per_group,  # GROUPED: B / G
    GROUPED: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_B + tl.arange(0, BLOCK_B)  # (BB,)
    row_ok = rows < B
    rows64 = rows.to(tl.int64)
    if GROUPED:  # each row's group's support: (BB, 1) columns
        sup = table_ptr + (rows // rows_per_group).to(tl.int64) * 4
        v_min = tl.load(sup, mask=row_ok, other=0.0)[:, None]
        v_max = tl.load(sup + 1, mask=row_ok, other=1.0)[:, None]
        dz = tl.load(sup + 2, mask=row_ok, other=1.0)[:, None]
        inv_dz = tl.load(sup + 3, mask=row_ok, other=1.0)[:, None]
    else:
        # fp32 in every path (tl.cast also accepts the plain Python float of the interpreter), so no
        # fp64 scalar promotes the loop-carried accumulator.
        v_min = tl.cast(v_min, tl.float32)
        v_max = tl.cast(v_max, tl.float32)
        dz = tl.cast(dz, tl.float32)
        inv_dz = tl.cast(inv_dz, tl.float32)
    k_last = tl.cast(k_last, tl.float32)
    r = tl.load(r_ptr + rows64, mask=row_ok, other=0.0)  # (BB,)
    d = tl.load(d_ptr + rows64, mask=row_ok, other=0.0)  # (BB,)

    for i0 in range(0, K, BLOCK_I):
        ii = i0 + tl.arange(0, BLOCK_I)  # (BI,) output atoms
        i_f = ii.to(tl.float32)
        acc = tl.zeros((BLOCK_B, BLOCK_I), dtype=tl.float32)
        n_bad = tl.zeros((BLOCK_B,), dtype=tl.int32)
        for j0 in range(0, K, BLOCK_J):
            jj = j0 + tl.arange(0, BLOCK_J)  # (BJ,) source atoms
            ok = row_ok[:, None] & (jj < K)[None, :]  # (BB, BJ)
            p = tl.load(p_ptr + rows64[:, None] * stride_pb + jj[None, :], mask=ok, other=0.0)
            if GROUPED:
                z = _mul_rn(jj.to(tl.float32)[None, :], dz) + v_min  # (BB, BJ) each row's support z_j
            else:
                z = (_mul_rn(jj.to(tl.float32), dz) + v_min)[None, :]  # (1, BJ) support z_j, rounded like the reference
            tz = r[:, None] + _mul_rn(d[:, None], z)  # (BB, BJ) Tz_j before clipping
            bad = (tz != tz) | (p != p) | (tl.abs(p) == float("inf"))
            n_bad += tl.sum(tl.where(ok & bad, 1, 0), axis=1)
            tz = tl.minimum(tl.maximum(tz, v_min), v_max)  # clip to [v_min, v_max]
            b = _mul_rn(tz - v_min, inv_dz)  # fractional atom index b_j (not fused into b - i)
            b = tl.minimum(tl.maximum(b, 0.0), k_last)
            # hat weight of output atom i for source atom j: (BB, BI, BJ)
            w = tl.maximum(1.0 - tl.abs(b[:, None, :] - i_f[None, :, None]), 0.0)
            contrib = tl.where(ok[:, None, :], p[:, None, :] * w, 0.0)
            acc += tl.sum(contrib, axis=2)
        res = tl.where(n_bad[:, None] > 0, float("nan"), acc)
        out_ok = row_ok[:, None] & (ii < K)[None, :]
        tl.store(out_ptr + rows64[:, None] * stride_ob + ii[None, :], res, mask=out_ok)


# ----------------------------------------------------------------------------- launcher
def _launch_config(B: int, K: int, interpret: bool) -> tuple[int, int, int]:
    """Return (BLOCK_B, BLOCK_I, BLOCK_J) for a [B, K] projection."""
    k_pow = triton.next_power_of_2(K)
    if interpret:
        block_i = min(k_pow, 256)
        block_j = min(k_pow, 256)
        budget = _INTERP_TILE
    else:
        block_i = min(k_pow, 256)
        block_j = max(1, min(k_pow, 16, _CUDA_TILE // block_i))
        budget = _CUDA_TILE
    block_b = max(1, min(budget // (block_i * block_j), 64, triton.next_power_of_2(B)))
    return block_b, block_i, block_j


def _support_columns(v_min: torch.Tensor, v_max: torch.Tensor, num_atoms: int, dtype: torch.dtype) -> torch.Tensor:
    """``[G, 4]`` of ``dtype``: per group the columns (v_min, v_max, Δz, 1/Δz), computed in float64."""
    lo, hi = v_min.to(torch.float64), v_max.to(torch.float64)
    k_last = float(num_atoms - 1)
    return torch.stack([lo, hi, (hi - lo) / k_last, k_last / (hi - lo)], dim=1).to(dtype)


def support_table(v_min: torch.Tensor, v_max: torch.Tensor, num_atoms: int) -> torch.Tensor:
    """float32 ``[G, 4]``: per group g the columns (v_min, v_max, Δz, 1/Δz) the kernel computes
    with, Δz = (v_max − v_min) / (K − 1) and 1/Δz = (K − 1) / (v_max − v_min) evaluated in float64
    and rounded once to float32, as the scalar path rounds its Python floats. ``v_min``, ``v_max``:
    float ``[G]`` tensors (float64 bounds give exactly the scalar path's values; float32 ones are
    upcast first). Device ops only."""
    return _support_columns(v_min, v_max, num_atoms, torch.float32)


def _c51_project_launch(
    next_probs: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    v_min: float,
    v_max: float,
    blocks: tuple[int, int, int] | None = None,
    table: torch.Tensor | None = None,
) -> torch.Tensor:
    """Allocate the (B, K) output and launch the kernel (``blocks`` overrides the tiling). With
    ``table`` (float32 ``[G, 4]``, :func:`support_table`) row b uses group b // (B / G)'s support
    and ``v_min``/``v_max`` are not read."""
    if next_probs.stride(-1) != 1:
        next_probs = next_probs.contiguous()
    rewards = rewards.contiguous()
    discounts = discounts.contiguous()
    B, K = next_probs.shape
    out = torch.empty((B, K), dtype=torch.float32, device=next_probs.device)
    if B == 0:
        return out
    if blocks is None:
        blocks = _launch_config(B, K, interpret=not next_probs.is_cuda)
    block_b, block_i, block_j = blocks
    grouped = table is not None
    if grouped:
        table = table.contiguous()
        scalars, rows_per_group = (0.0, 1.0, 1.0, 1.0), B // table.shape[0]
    else:
        dz = (v_max - v_min) / (K - 1)
        inv_dz = (K - 1) / (v_max - v_min)
        scalars, rows_per_group = (float(v_min), float(v_max), float(dz), float(inv_dz)), 1
        table = rewards  # not read without GROUPED: any float32 pointer
    grid = (triton.cdiv(B, block_b),)
    wrap_triton(_c51_project_kernel)[grid](
        next_probs, rewards, discounts, out,
        B, K, next_probs.stride(0), out.stride(0),
        *scalars, float(K - 1), table, rows_per_group,
        GROUPED=grouped, BLOCK_B=block_b, BLOCK_I=block_i, BLOCK_J=block_j,
    )
    return out


@device_op("foxdqn::c51_project", mutates_args=())
def _c51_project_op(
    next_probs: torch.Tensor, rewards: torch.Tensor, discounts: torch.Tensor, v_min: float, v_max: float
) -> torch.Tensor:
    # A device_op (foxdqn/ops/library.py): after register_ops() it composes with torch.compile (the
    # kernel is visible to Inductor); with CUDA graph capture always (output allocated here, no host
    # sync). Also runs under TRITON_INTERPRET=1.
    return _c51_project_launch(next_probs, rewards, discounts, v_min, v_max)


@device_op("foxdqn::c51_project_grouped", mutates_args=())
def _c51_project_grouped_op(
    next_probs: torch.Tensor, rewards: torch.Tensor, discounts: torch.Tensor, table: torch.Tensor
) -> torch.Tensor:
    # The same kernel with a support per group of rows (a population's members), read from the
    # float32 [G, 4] table on the device: no host read, capturable.
    return _c51_project_launch(next_probs, rewards, discounts, 0.0, 1.0, table=table)


# ----------------------------------------------------------------------------- reference
def _check_support(num_atoms: int, v_min: float, v_max: float) -> None:
    if num_atoms < 2:
        raise ConfigError(f"c51_project: num_atoms (K) must be >= 2, got {num_atoms}")
    if torch.compiler.is_compiling():
        # Dynamo may trace v_min / v_max as symbolic floats and cannot put math.isfinite of one in
        # a graph (a graph break under fullgraph=True); the bounds are checked on eager calls.
        return
    if not (math.isfinite(v_min) and math.isfinite(v_max)):
        raise ConfigError(f"c51_project: v_min and v_max must be finite, got v_min={v_min}, v_max={v_max}")
    if not v_min < v_max:
        raise ConfigError(f"c51_project: v_min must be < v_max, got v_min={v_min}, v_max={v_max}")


def _check_inputs(next_probs: torch.Tensor, rewards: torch.Tensor, discounts: torch.Tensor) -> None:
    if next_probs.dim() != 2:
        raise ValueError(f"c51_project: next_probs must be [B, K], got shape {tuple(next_probs.shape)}")
    B = next_probs.shape[0]
    for name, t in (("rewards", rewards), ("discounts", discounts)):
        if tuple(t.shape) != (B,):
            raise ValueError(f"c51_project: {name} must have shape [{B}], got {tuple(t.shape)}")
        if t.device != next_probs.device:
            raise ValueError(f"c51_project: {name} is on {t.device}, next_probs on {next_probs.device}")


def _grouped(next_probs: torch.Tensor, v_min, v_max) -> bool:
    """Whether the bounds are ``[G]`` tensors (a support per group of rows); checks them then (the
    values are not read: no host sync), else the Python-float bounds."""
    tensors = [isinstance(v, torch.Tensor) for v in (v_min, v_max)]
    if not any(tensors):
        _check_support(next_probs.shape[1], v_min, v_max)
        return False
    B = next_probs.shape[0]
    if not all(tensors) or v_min.shape != v_max.shape or v_min.dim() != 1 or v_min.shape[0] < 1 \
            or B % v_min.shape[0] or not v_min.is_floating_point() or not v_max.is_floating_point():
        raise ValueError(f"c51_project: v_min and v_max must both be floats, or both float [G] tensors with G "
                         f"dividing B={B}; got {describe(v_min)} and {describe(v_max)}")
    for name, t in (("v_min", v_min), ("v_max", v_max)):
        if t.device != next_probs.device:
            raise ValueError(f"c51_project: {name} is on {t.device}, next_probs on {next_probs.device}")
    if next_probs.shape[1] < 2:
        raise ConfigError(f"c51_project: num_atoms (K) must be >= 2, got {next_probs.shape[1]}")
    return True


def c51_project_reference(
    next_probs: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    v_min: float | torch.Tensor,
    v_max: float | torch.Tensor,
) -> torch.Tensor:
    """Plain-torch C51 projection (Bellemare et al. 2017, Algorithm 1), vectorised with scatter_add.

    Same contract as :func:`c51_project`; works for any floating dtype and device. On CUDA
    ``scatter_add_`` uses atomics, so this reference is not bitwise deterministic there.
    """
    _check_inputs(next_probs, rewards, discounts)
    B, K = next_probs.shape
    p = next_probs
    atoms = torch.arange(K, device=p.device, dtype=p.dtype)
    if _grouped(p, v_min, v_max):  # row b: its group's (v_min, v_max, dz, inv_dz) as (B, 1) columns
        g = v_min.shape[0]
        rows = _support_columns(v_min, v_max, K, p.dtype)[:, None, :].expand(g, B // g, 4).reshape(B, 4)
        v_min, v_max, dz, inv_dz = rows[:, 0:1], rows[:, 1:2], rows[:, 2:3], rows[:, 3:4]
        z = atoms * dz + v_min  # (B, K) each row's support
    else:
        dz = (v_max - v_min) / (K - 1)
        inv_dz = (K - 1) / (v_max - v_min)
        z = (atoms * dz + v_min)[None, :]  # (1, K) support
    tz = rewards[:, None] + discounts[:, None] * z  # (B, K) Tz_j before clipping
    bad = torch.isnan(tz).any(dim=1) | ~torch.isfinite(p).all(dim=1)  # (B,) NaN rows
    tz = tz.clamp(v_min, v_max)  # Tz_j <- [r + d z_j] clipped
    b = ((tz - v_min) * inv_dz).clamp(0, K - 1)  # b_j in [0, K-1]; one multiply, like the kernel
    b = torch.where(torch.isnan(b), torch.zeros_like(b), b)  # NaN rows: keep indices valid
    lo = b.floor()
    hi = b.ceil()
    on_atom = (lo == hi).to(p.dtype)  # b_j exactly on an atom: whole p_j to l
    m = torch.zeros_like(p)
    m.scatter_add_(1, lo.long(), p * (hi - b) + p * on_atom)  # m_l += p_j (u - b_j)
    m.scatter_add_(1, hi.long(), p * (b - lo))  # m_u += p_j (b_j - l)
    return torch.where(bad[:, None], torch.full_like(m, float("nan")), m)


# ----------------------------------------------------------------------------- public
def c51_project(
    next_probs: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    v_min: float | torch.Tensor,
    v_max: float | torch.Tensor,
    backend: str = "auto",
) -> torch.Tensor:
    """Project the distributional Bellman target onto the fixed C51 support.

    Bellemare, Dabney & Munos (2017), Algorithm 1. Support z_i = v_min + i * dz,
    dz = (v_max - v_min) / (K - 1), i = 0..K-1. For each row:
    Tz_j = clip(r + d * z_j, v_min, v_max), b_j = (Tz_j - v_min) / dz (computed as a multiply
    by (K - 1) / (v_max - v_min) rounded to float32; clamped to [0, K-1]),
    l = floor(b_j), u = ceil(b_j); m_l += p_j (u - b_j), m_u += p_j (b_j - l); when l == u
    (b_j exactly on an atom) the whole p_j goes to that atom.

    Args:
        next_probs: (B, K) float32 probabilities of the next state's selected action (rows
            normally sum to 1; any row sum is conserved). Unit stride along K.
        rewards: (B,) float32 (n-step discounted) rewards, in return units.
        discounts: (B,) float32 gamma^n, 0 where the episode terminated.
        v_min, v_max: support bounds in return units. Python floats (run constants, baked into a
            captured graph; need v_min < v_max, both finite: checked on eager calls, skipped while
            torch.compile traces), or float ``[G]`` tensors on the rows' device with G dividing B:
            a support per group of B/G consecutive rows (a population's members, member-major
            rows; float64 gives each group exactly the values its bounds as Python floats give,
            :func:`support_table`). Tensor bounds are not read on the host (no sync): the caller
            guarantees finite bounds with v_min < v_max (the config does, ``head.v_min`` /
            ``head.v_max``).
        backend: "auto" (Triton for CUDA tensors, reference for CPU), "triton" (on CPU needs
            TRITON_INTERPRET=1 before import), or "torch" (reference).

    Returns:
        (B, K) float32 projected target distribution m (new tensor). A row is all-NaN when any
        of its p_j is NaN/Inf or any unclipped Tz_j is NaN. No gradient (targets are constants).

    Raises:
        ConfigError (a ValueError): K < 2 ("num_atoms"), v_min >= v_max or non-finite bounds
            (float bounds).
        ValueError: wrong shapes/devices, tensor bounds that are not both float [G] with G dividing
            B, non-float32 input for the Triton backend, unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check_inputs(next_probs, rewards, discounts)
    grouped = _grouped(next_probs, v_min, v_max)
    if resolve_backend("c51_project", backend, next_probs) == "torch":
        return c51_project_reference(next_probs, rewards, discounts, v_min, v_max)
    for name, t in (("next_probs", next_probs), ("rewards", rewards), ("discounts", discounts)):
        if t.dtype != torch.float32:
            raise ValueError(f"c51_project: {name} must be float32 for the Triton backend, got {t.dtype}")
    if grouped:
        return _c51_project_grouped_op(next_probs, rewards, discounts,
                                       support_table(v_min, v_max, next_probs.shape[1]))
    return _c51_project_op(next_probs, rewards, discounts, float(v_min), float(v_max))
