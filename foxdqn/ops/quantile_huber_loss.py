"""Quantile Huber loss of IQN / QR-DQN, with a forward and a backward Triton kernel.

Sources: Dabney, Ostrovski, Silver & Munos (2018), "Implicit Quantile Networks for
Distributional RL", eq. 3; Dabney, Rowland, Bellemare & Munos (2018, AAAI), "Distributional RL
with Quantile Regression" (QR-DQN), eq. 9-10.

For each sample b, online quantiles theta_i (i < N) at fractions tau_i and target samples
T_j (j < N'):

    delta_ij = T_j - theta_i
    L_k(d)   = d^2 / 2 if |d| <= k else k (|d| - k / 2)                     (Huber, QR-DQN eq. 10)
    rho_ij   = |tau_i - 1{delta_ij < 0}| * L_k(delta_ij) / k                (QR-DQN eq. 10)
    loss_b   = sum_i (1/N') sum_j rho_ij                                    (IQN eq. 3)

kappa = 0 is the plain quantile-regression loss rho_ij = |tau_i - 1{delta_ij < 0}| * |delta_ij|
(QR-DQN eq. 9, the kappa -> 0 limit of L_k / k); it is a separate compile-time branch of the
kernels, not a division by zero.

Gradient (backward kernel), with psi_k(d) = dL_k(d)/dd / k = clamp(d / k, -1, 1)
(kappa = 0: sign(d), 0 at d = 0):

    dloss_b / dtheta_i = -(1/N') sum_j |tau_i - 1{delta_ij < 0}| * psi_k(delta_ij)

The indicator is piecewise constant (no gradient through it). Only ``quantiles`` gets a
gradient: ``target_quantiles`` and ``taus`` are treated as constants (the reference detaches
them too, so both backends agree).

Registration: two ops (:mod:`foxdqn.ops.library`), ``foxdqn::quantile_huber_loss`` (forward) and
``foxdqn::quantile_huber_loss_backward``, joined by ``register_autograd`` on the forward op. The
ops allocate their outputs outside the kernels and never touch the host, so the pair composes
with CUDA graph capture (forward and backward are plain kernel launches on the current stream)
and, after :func:`foxdqn.ops.library.register_ops`, with ``torch.compile`` (AOTAutograd sees
``torch.ops.foxdqn.quantile_huber_loss``, an op with a registered derivative whose backward is
itself a registered op; Inductor sees both Triton kernels). Eager calls run the same launchers
and derivative through one ``autograd.Function``.
Double backward is not supported.

A kappa per group of rows: ``kappa`` may be a float ``[G]`` tensor (G dividing B): rows
``g·B/G .. (g+1)·B/G − 1`` (member g of a population, foxdqn/population/objective.py) use kappa_g.
The kernels (``GROUPED``) then load each row's kappa and select, per row, the kappa = 0 or the
kappa > 0 expression above (1 replaces a zero divisor in the branch not taken), so a group's rows
equal the float-kappa path's bit for bit and no row reads another group's kappa.

Scalar arguments: kappa and 1/N' reach the kernels as fp32 from an eager launch but as fp64 from
Inductor (it types Python-float kernel arguments fp64); the kernels cast them to fp32 first.

NaN/Inf: the kernels evaluate the same IEEE expressions as the reference, so a NaN in a row's
quantiles, targets or taus makes that row's loss NaN (+-Inf deltas give +Inf). In the gradient,
entry (b, i) is NaN when delta_bij is NaN for some j or tau_bi is NaN (NaN propagates through
psi). The reference's autograd agrees for kappa > 0; for kappa = 0 torch's ``abs`` backward uses
sgn(NaN) = 0 and drops the NaN from the gradient (the loss is NaN in both).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from foxdqn.errors import ConfigError
from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.library import device_op, wrap_triton

_CUDA_TILE = 2048  # elements of the [BLOCK_B, BLOCK_I, BLOCK_J] pairwise tile (default 4 warps)
_INTERP_TILE = 1 << 17  # the interpreter runs one numpy op per tile: big tiles are cheaper


# ----------------------------------------------------------------------------- kernels
@triton.jit
def _qhl_fwd_kernel(
    q_ptr,  # (B, N) f32 online quantiles theta, unit stride along N
    t_ptr,  # (B, NT) f32 target samples T, unit stride along NT
    tau_ptr,  # (B, N) f32 quantile fractions, unit stride along N (row stride may be 0)
    loss_ptr,  # (B,) f32 out
    B,
    N,
    NT,
    stride_qb,
    stride_tb,
    stride_taub,
    kappa,  # float > 0 (unused when KAPPA_ZERO or GROUPED); fp32 from an eager launch, fp64 from Inductor
    inv_nt,  # float 1 / N'
    kappa_ptr,  # GROUPED: (G,) f32 kappa of each group of rows; else unused
    rows_per_group,  # GROUPED: B / G
    KAPPA_ZERO: tl.constexpr,
    GROUPED: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    # fp32 in every path (tl.cast also takes the interpreter's plain Python float): an fp64
    # scalar would promote the loop-carried accumulator to fp64.
    kappa = tl.cast(kappa, tl.float32)
    inv_nt = tl.cast(inv_nt, tl.float32)
    pid = tl.program_id(0)
    rows = pid * BLOCK_B + tl.arange(0, BLOCK_B)  # (BB,)
    row_ok = rows < B
    rows64 = rows.to(tl.int64)
    if GROUPED:  # each row's group's kappa, (BB, 1, 1); 1 stands in for 0 as a divisor
        kappa = tl.load(kappa_ptr + rows // rows_per_group, mask=row_ok, other=1.0)[:, None, None]
        kappa_div = tl.where(kappa == 0.0, 1.0, kappa)
    total = tl.zeros((BLOCK_B,), dtype=tl.float32)
    for i0 in range(0, N, BLOCK_I):
        ii = i0 + tl.arange(0, BLOCK_I)
        mi = row_ok[:, None] & (ii < N)[None, :]  # (BB, BI)
        q = tl.load(q_ptr + rows64[:, None] * stride_qb + ii[None, :], mask=mi, other=0.0)
        tau = tl.load(tau_ptr + rows64[:, None] * stride_taub + ii[None, :], mask=mi, other=0.0)
        acc = tl.zeros((BLOCK_B, BLOCK_I), dtype=tl.float32)
        for j0 in range(0, NT, BLOCK_J):
            jj = j0 + tl.arange(0, BLOCK_J)
            mj = row_ok[:, None] & (jj < NT)[None, :]  # (BB, BJ)
            t = tl.load(t_ptr + rows64[:, None] * stride_tb + jj[None, :], mask=mj, other=0.0)
            delta = t[:, None, :] - q[:, :, None]  # (BB, BI, BJ) delta_ij = T_j - theta_i
            weight = tl.abs(tau[:, :, None] - tl.where(delta < 0.0, 1.0, 0.0))
            adelta = tl.abs(delta)
            if GROUPED:  # L_k(delta) / k where the row's k > 0, |delta| where it is 0
                lk = tl.where(kappa == 0.0, adelta,
                              tl.where(adelta <= kappa, 0.5 * delta * delta / kappa_div, adelta - 0.5 * kappa))
            elif KAPPA_ZERO:
                lk = adelta  # quantile regression: |delta|
            else:
                # L_k(delta) / k
                lk = tl.where(adelta <= kappa, 0.5 * delta * delta / kappa, adelta - 0.5 * kappa)
            valid = mi[:, :, None] & mj[:, None, :]
            acc += tl.sum(tl.where(valid, weight * lk, 0.0), axis=2)
        total += tl.sum(acc, axis=1)
    tl.store(loss_ptr + rows64, total * inv_nt, mask=row_ok)


@triton.jit
def _qhl_bwd_kernel(
    g_ptr,  # (B,) f32 upstream gradient dL/dloss_b
    q_ptr,
    t_ptr,
    tau_ptr,
    gq_ptr,  # (B, N) f32 out, contiguous
    B,
    N,
    NT,
    stride_qb,
    stride_tb,
    stride_taub,
    kappa,  # float, as in the forward kernel
    inv_nt,
    kappa_ptr,  # as in the forward kernel
    rows_per_group,
    KAPPA_ZERO: tl.constexpr,
    GROUPED: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    kappa = tl.cast(kappa, tl.float32)
    inv_nt = tl.cast(inv_nt, tl.float32)
    pid = tl.program_id(0)
    rows = pid * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    rows64 = rows.to(tl.int64)
    if GROUPED:  # as in the forward kernel
        kappa = tl.load(kappa_ptr + rows // rows_per_group, mask=row_ok, other=1.0)[:, None, None]
        kappa_div = tl.where(kappa == 0.0, 1.0, kappa)
    g = tl.load(g_ptr + rows64, mask=row_ok, other=0.0)  # (BB,)
    for i0 in range(0, N, BLOCK_I):
        ii = i0 + tl.arange(0, BLOCK_I)
        mi = row_ok[:, None] & (ii < N)[None, :]
        q = tl.load(q_ptr + rows64[:, None] * stride_qb + ii[None, :], mask=mi, other=0.0)
        tau = tl.load(tau_ptr + rows64[:, None] * stride_taub + ii[None, :], mask=mi, other=0.0)
        acc = tl.zeros((BLOCK_B, BLOCK_I), dtype=tl.float32)
        for j0 in range(0, NT, BLOCK_J):
            jj = j0 + tl.arange(0, BLOCK_J)
            mj = row_ok[:, None] & (jj < NT)[None, :]
            t = tl.load(t_ptr + rows64[:, None] * stride_tb + jj[None, :], mask=mj, other=0.0)
            delta = t[:, None, :] - q[:, :, None]
            weight = tl.abs(tau[:, :, None] - tl.where(delta < 0.0, 1.0, 0.0))
            if GROUPED:  # the row's kappa > 0: clamp(delta / k, -1, 1); 0: sign(delta) (NaN stays NaN)
                sign = tl.where(delta > 0.0, 1.0, tl.where(delta < 0.0, -1.0, tl.where(delta != delta, delta, 0.0)))
                psi = tl.where(kappa == 0.0, sign,
                               tl.where(delta > kappa, 1.0, tl.where(delta < -kappa, -1.0, delta / kappa_div)))
            elif KAPPA_ZERO:
                # sign(delta); 0 at delta == 0; NaN stays NaN
                psi = tl.where(delta > 0.0, 1.0, tl.where(delta < 0.0, -1.0, tl.where(delta != delta, delta, 0.0)))
            else:
                # clamp(delta / k, -1, 1) written with where so that NaN propagates
                psi = tl.where(delta > kappa, 1.0, tl.where(delta < -kappa, -1.0, delta / kappa))
            valid = mi[:, :, None] & mj[:, None, :]
            acc += tl.sum(tl.where(valid, weight * psi, 0.0), axis=2)
        gq = -(g * inv_nt)[:, None] * acc  # d delta / d theta = -1
        tl.store(gq_ptr + rows64[:, None] * N + ii[None, :], gq, mask=mi)


# ----------------------------------------------------------------------------- launchers
def _launch_config(B: int, N: int, NT: int, interpret: bool) -> tuple[int, int, int]:
    """Return (BLOCK_B, BLOCK_I, BLOCK_J) for a [B, N] x [B, N'] loss."""
    if interpret:
        block_i = min(triton.next_power_of_2(N), 128)
        block_j = min(triton.next_power_of_2(NT), 128)
        budget = _INTERP_TILE
    else:
        block_i = min(triton.next_power_of_2(N), 64)
        block_j = min(triton.next_power_of_2(NT), 32)
        budget = _CUDA_TILE
    block_b = max(1, min(budget // (block_i * block_j), 128, triton.next_power_of_2(B)))
    return block_b, block_i, block_j


def _unit_inner(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _kappa_args(kappa: float, kappas: torch.Tensor | None, rows: int, unused: torch.Tensor) -> tuple[tuple, dict]:
    """The kernels' kappa arguments ``(kappa, kappa_ptr, rows_per_group)`` and constexprs: a
    float kappa (``kappa_ptr`` is ``unused``, never read), or with ``kappas`` (float32 ``[G]``) a
    kappa per group of ``rows / G`` rows."""
    if kappas is not None:
        return (1.0, kappas.contiguous(), rows // kappas.shape[0]), dict(KAPPA_ZERO=False, GROUPED=True)
    return (float(kappa) if kappa > 0 else 1.0, unused, 1), dict(KAPPA_ZERO=kappa == 0, GROUPED=False)


def _qhl_forward_launch(
    quantiles: torch.Tensor,
    target_quantiles: torch.Tensor,
    taus: torch.Tensor,
    kappa: float,
    blocks: tuple[int, int, int] | None = None,
    kappas: torch.Tensor | None = None,
) -> torch.Tensor:
    """Allocate loss (B,) and launch the forward kernel (``blocks`` overrides the tiling; ``kappas``:
    float32 ``[G]``, a kappa per group of rows, then ``kappa`` is not read)."""
    q, t, tau = _unit_inner(quantiles), _unit_inner(target_quantiles), _unit_inner(taus)
    B, N = q.shape
    NT = t.shape[1]
    loss = torch.empty((B,), dtype=torch.float32, device=q.device)
    if B == 0:
        return loss
    if blocks is None:
        blocks = _launch_config(B, N, NT, interpret=not q.is_cuda)
    block_b, block_i, block_j = blocks
    (k, k_ptr, per_group), flags = _kappa_args(kappa, kappas, B, loss)
    wrap_triton(_qhl_fwd_kernel)[(triton.cdiv(B, block_b),)](
        q, t, tau, loss,
        B, N, NT, q.stride(0), t.stride(0), tau.stride(0),
        k, 1.0 / NT, k_ptr, per_group,
        **flags, BLOCK_B=block_b, BLOCK_I=block_i, BLOCK_J=block_j,
    )
    return loss


def _qhl_backward_launch(
    grad_loss: torch.Tensor,
    quantiles: torch.Tensor,
    target_quantiles: torch.Tensor,
    taus: torch.Tensor,
    kappa: float,
    blocks: tuple[int, int, int] | None = None,
    kappas: torch.Tensor | None = None,
) -> torch.Tensor:
    """Allocate grad_quantiles (B, N) and launch the backward kernel (``kappas`` as the forward's)."""
    g = grad_loss.contiguous()  # autograd often hands an expanded (stride 0) gradient
    q, t, tau = _unit_inner(quantiles), _unit_inner(target_quantiles), _unit_inner(taus)
    B, N = q.shape
    NT = t.shape[1]
    grad_q = torch.empty((B, N), dtype=torch.float32, device=q.device)
    if B == 0:
        return grad_q
    if blocks is None:
        blocks = _launch_config(B, N, NT, interpret=not q.is_cuda)
    block_b, block_i, block_j = blocks
    (k, k_ptr, per_group), flags = _kappa_args(kappa, kappas, B, g)
    wrap_triton(_qhl_bwd_kernel)[(triton.cdiv(B, block_b),)](
        g, q, t, tau, grad_q,
        B, N, NT, q.stride(0), t.stride(0), tau.stride(0),
        k, 1.0 / NT, k_ptr, per_group,
        **flags, BLOCK_B=block_b, BLOCK_I=block_i, BLOCK_J=block_j,
    )
    return grad_q


@device_op("foxdqn::quantile_huber_loss", mutates_args=())
def _qhl_op(quantiles: torch.Tensor, target_quantiles: torch.Tensor, taus: torch.Tensor, kappa: float,
            kappas: Optional[torch.Tensor] = None) -> torch.Tensor:
    # Also runs on CPU tensors under TRITON_INTERPRET=1 (the tests use that path). ``kappas``: None
    # (one kappa), or float32 [G], a kappa per group of rows (a population's members).
    return _qhl_forward_launch(quantiles, target_quantiles, taus, kappa, kappas=kappas)


@device_op("foxdqn::quantile_huber_loss_backward", mutates_args=())
def _qhl_backward_op(
    grad_loss: torch.Tensor, quantiles: torch.Tensor, target_quantiles: torch.Tensor, taus: torch.Tensor, kappa: float,
    kappas: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    return _qhl_backward_launch(grad_loss, quantiles, target_quantiles, taus, kappa, kappas=kappas)


def _qhl_setup_context(ctx, inputs, output):
    quantiles, target_quantiles, taus, kappa, kappas = inputs
    ctx.save_for_backward(quantiles, target_quantiles, taus, kappas)
    ctx.kappa = kappa


def _qhl_backward(ctx, grad_loss):
    quantiles, target_quantiles, taus, kappas = ctx.saved_tensors
    grad_q = None
    if ctx.needs_input_grad[0]:
        grad_q = _qhl_backward_op(grad_loss, quantiles, target_quantiles, taus, ctx.kappa, kappas)
    return grad_q, None, None, None, None  # targets, taus and kappas are constants


_qhl_op.register_autograd(_qhl_backward, setup_context=_qhl_setup_context)


# ----------------------------------------------------------------------------- reference
def _check_kappa(kappa: float) -> None:
    if torch.compiler.is_compiling():
        # Dynamo traces a Python-float kappa as a symbolic float and cannot put math.isfinite of
        # one in a graph (a graph break under fullgraph=True); kappa is checked on eager calls.
        return
    if not (math.isfinite(kappa) and kappa >= 0):
        raise ConfigError(f"quantile_huber_loss: kappa must be a finite float >= 0, got {kappa}")


def _check_inputs(quantiles: torch.Tensor, target_quantiles: torch.Tensor, taus: torch.Tensor) -> None:
    if quantiles.dim() != 2 or target_quantiles.dim() != 2:
        raise ValueError(
            "quantile_huber_loss: quantiles and target_quantiles must be [B, N] and [B, N'], got "
            f"{tuple(quantiles.shape)} and {tuple(target_quantiles.shape)}"
        )
    B, N = quantiles.shape
    if target_quantiles.shape[0] != B or target_quantiles.shape[1] < 1 or N < 1:
        raise ValueError(
            f"quantile_huber_loss: target_quantiles must be [{B}, N' >= 1] and N >= 1, got "
            f"quantiles {tuple(quantiles.shape)}, target_quantiles {tuple(target_quantiles.shape)}"
        )
    if tuple(taus.shape) != (B, N):
        raise ValueError(f"quantile_huber_loss: taus must have shape [{B}, {N}], got {tuple(taus.shape)}")
    for name, t in (("target_quantiles", target_quantiles), ("taus", taus)):
        if t.device != quantiles.device:
            raise ValueError(f"quantile_huber_loss: {name} is on {t.device}, quantiles on {quantiles.device}")


def _grouped_kappa(quantiles: torch.Tensor, kappa) -> bool:
    """Whether ``kappa`` is a ``[G]`` tensor (a kappa per group of rows); checks it then (its values
    are not read: no host sync), else the float."""
    if not isinstance(kappa, torch.Tensor):
        _check_kappa(kappa)
        return False
    B = quantiles.shape[0]
    if kappa.dim() != 1 or kappa.shape[0] < 1 or B % kappa.shape[0] or not kappa.is_floating_point():
        raise ValueError(f"quantile_huber_loss: kappa must be a float, or a float [G] tensor with G dividing B={B}; "
                         f"got {describe(kappa)}")
    if kappa.device != quantiles.device:
        raise ValueError(f"quantile_huber_loss: kappa is on {kappa.device}, quantiles on {quantiles.device}")
    return True


def quantile_huber_loss_reference(
    quantiles: torch.Tensor, target_quantiles: torch.Tensor, taus: torch.Tensor, kappa: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """Plain-torch quantile Huber loss (IQN eq. 3, QR-DQN eq. 9-10), differentiable by autograd.

    Same contract as :func:`quantile_huber_loss`; any floating dtype (float64 for gradcheck).
    ``target_quantiles`` and ``taus`` are detached: only ``quantiles`` receives a gradient.
    """
    _check_inputs(quantiles, target_quantiles, taus)
    grouped = _grouped_kappa(quantiles, kappa)
    target = target_quantiles.detach()
    tau = taus.detach()
    delta = target[:, None, :] - quantiles[:, :, None]  # (B, N, N') delta_ij = T_j - theta_i
    weight = (tau[:, :, None] - (delta.detach() < 0).to(delta.dtype)).abs()  # |tau_i - 1{delta<0}|
    if grouped:  # row b: its group's kappa (B, 1, 1); kappa 0 rows: |delta| (1 divides there: no NaN gradient)
        g = kappa.shape[0]
        k = kappa.detach().to(delta.dtype)[:, None].expand(g, delta.shape[0] // g).reshape(-1, 1, 1)
        huber = torch.where(delta.abs() <= k, 0.5 * delta * delta, k * (delta.abs() - 0.5 * k))
        elem = torch.where(k == 0, delta.abs(), huber / torch.where(k == 0, torch.ones_like(k), k))
    elif kappa == 0:
        elem = delta.abs()  # quantile regression loss (QR-DQN eq. 9)
    else:
        huber = torch.where(delta.abs() <= kappa, 0.5 * delta * delta, kappa * (delta.abs() - 0.5 * kappa))
        elem = huber / kappa  # L_k / k (QR-DQN eq. 10)
    return (weight * elem).mean(dim=2).sum(dim=1)  # sum over i, mean over j (IQN eq. 3)


# ----------------------------------------------------------------------------- public
def quantile_huber_loss(
    quantiles: torch.Tensor,
    target_quantiles: torch.Tensor,
    taus: torch.Tensor,
    kappa: float | torch.Tensor = 1.0,
    backend: str = "auto",
) -> torch.Tensor:
    """Per-sample quantile Huber loss of IQN / QR-DQN.

    loss_b = sum_i (1/N') sum_j |tau_i - 1{delta_ij < 0}| * L_kappa(delta_ij) / kappa with
    delta_ij = target_j - quantile_i (IQN eq. 3; QR-DQN eq. 10). kappa = 0 gives the plain
    quantile regression loss |tau_i - 1{delta_ij < 0}| * |delta_ij| (QR-DQN eq. 9).

    Args:
        quantiles: (B, N) float32 online quantile values theta_tau_i(s, a) (return units);
            the only input that receives a gradient.
        target_quantiles: (B, N') float32 target samples r + gamma^n theta'_tau'_j (should be
            detached; treated as constants either way).
        taus: (B, N) float32 quantile fractions in (0, 1) (a broadcast (N,) -> (B, N) view with
            row stride 0 is fine); treated as constants.
        kappa: Huber threshold in return units, >= 0: a Python float (a run constant; checked
            on eager calls, not while torch.compile traces), or a float ``[G]`` tensor on the
            rows' device with G dividing B, a kappa per group of B/G consecutive rows (a
            population's members, member-major rows; float32 in the kernels, each group's rows
            then equal the float path's for the same kappa bit for bit). Tensor values are not
            read on the host (no sync): the caller guarantees finite values >= 0 (the config
            does, ``head.kappa``); a group's kappa 0 is the quantile regression loss.
        backend: "auto" (Triton for CUDA tensors, reference for CPU), "triton" (on CPU needs
            TRITON_INTERPRET=1 before import), or "torch" (reference).

    Returns:
        (B,) float32 per-sample loss (new tensor); differentiable w.r.t. ``quantiles`` (the
        Triton backend uses the backward kernel). Reduce (mean, or importance-weighted for PER)
        outside. NaN in a row's inputs gives a NaN loss for that row.

    Raises:
        ConfigError (a ValueError): a float kappa negative or non-finite.
        ValueError: wrong shapes/devices, a tensor kappa that is not float [G] with G dividing B,
            non-float32 input for the Triton backend, unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check_inputs(quantiles, target_quantiles, taus)
    grouped = _grouped_kappa(quantiles, kappa)
    if resolve_backend("quantile_huber_loss", backend, quantiles) == "torch":
        return quantile_huber_loss_reference(quantiles, target_quantiles, taus, kappa)
    for name, t in (("quantiles", quantiles), ("target_quantiles", target_quantiles), ("taus", taus)):
        if t.dtype != torch.float32:
            raise ValueError(f"quantile_huber_loss: {name} must be float32 for the Triton backend, got {t.dtype}")
    if grouped:
        return _qhl_op(quantiles, target_quantiles.detach(), taus.detach(), 1.0, kappa.detach().to(torch.float32))
    return _qhl_op(quantiles, target_quantiles.detach(), taus.detach(), float(kappa))
