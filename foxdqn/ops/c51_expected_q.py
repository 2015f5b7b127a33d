r"""The expected Q of a population's C51 head from its atom logits, in one kernel: the dueling
combine (Rainbow), the softmax over atoms, the product with the support and the sum.

    logits[p, m, a, :] = adv[p, m, a, :]                                        (plain head)
    logits[p, m, a, :] = (v[p, m, :] + adv[p, m, a, :]) − (1/A) Σ_a' adv[p, m, a', :]   (dueling: Hessel et al. 2018)
    Q[p, m, a] = Σ_k softmax_k(logits[p, m, a, :]) · z[p, k]                    (Bellemare et al. 2017, §4)

For member p of P and row m of M: ``adv`` float32 ``[P, M, A, K]`` (the head's output,
:meth:`foxdqn.population.distributional.MemberC51Network.logit_parts`), ``value`` float32
``[P, M, K]`` (the dueling value stream) or None, ``z`` the member's support float32 ``[P, K]``; any
strides. Where :class:`~foxdqn.population.distributional.MemberC51Network` computed Q with torch
ops (with the dueling head: ``+``, ``mean``, ``−``; then ``softmax``, ``*``, ``sum``: 3 to 6
kernels over ``[P, M, A, K]``), its forward without gradient (acting, evaluation) is this one kernel.

Kernel (Triton): a grid of (M rows, P members); program (m, p) loads row m's ``[A, K]`` logits as
one tile (padded to powers of two >= 16, masked), with the dueling head the value row and the
advantages' mean over the A real actions, then per action the softmax over the K real atoms (the
maximum subtracted, as torch's softmax) and its product with z summed, and stores Q's row. Members
never mix: program (m, p) reads only member p's row m and support. Sizes: A·K padded at most
:data:`MAX_TILE` elements (e.g. 45 actions × 51 atoms, or 64 × 256).

Precision: float32 throughout; the sums (the advantages' mean, the softmax's, the expectation's) run
in the tile's order, not torch's, so Q equals :func:`c51_expected_q_reference` to float rounding (a
few ulps), not bit for bit. NaN: a NaN logit makes its action's Q NaN (torch's softmax); with the
dueling head a NaN advantage makes the row's Q NaN.

No gradient: the op has no backward (the collect step and evaluation run it under ``no_grad``).
Capture: device ops only (no host reads), the output is ``torch.empty``. Registered as
``torch.ops.foxdqn.c51_expected_q`` by :func:`foxdqn.ops.library.register_ops`.

Errors: ``ValueError`` (messages start with ``c51_expected_q:``) for arguments outside the contract
(:func:`c51_expected_q_supported` is False: shapes, float32, one device, an [A, K] tile above
:data:`MAX_TILE`, an input requiring grad under grad mode, an unknown backend); ``RuntimeError``
for backend="triton" on CPU tensors without TRITON_INTERPRET=1.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from foxdqn.ops.backend import describe, resolve_backend
from foxdqn.ops.library import device_op, wrap_triton
from foxdqn.ops.mlp_chain import _pad

__all__ = ["MAX_TILE", "c51_expected_q", "c51_expected_q_fits", "c51_expected_q_reference", "c51_expected_q_supported"]

MAX_TILE = 16384  # padded A · K of one row's tile: [64, 256] float32, 64 KiB of registers per program
NUM_WARPS = 4


@triton.jit
def _c51_expected_q_kernel(adv_ptr, v_ptr, z_ptr, q_ptr, ab_ptr, vb_ptr, M, s_ap, s_am, s_aa, s_ak, s_vp, s_vm,
                           s_vk, s_zp, s_zk, A: tl.constexpr, K: tl.constexpr, PA: tl.constexpr, PK: tl.constexpr,
                           DUELING: tl.constexpr, BIAS: tl.constexpr, VALUE_BIAS: tl.constexpr):
    """Q [P, M, A] (contiguous) of member ``program_id(1)``'s row ``program_id(0)``."""
    m = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1).to(tl.int64)
    a = tl.arange(0, PA)
    k = tl.arange(0, PK)
    a_ok = a < A
    k_ok = k < K
    ok = a_ok[:, None] & k_ok[None, :]
    logits = tl.load(adv_ptr + p * s_ap + m * s_am + a[:, None] * s_aa + k[None, :] * s_ak, mask=ok, other=0.0)
    if BIAS:  # member p's bias rows (contiguous [P, A·K] and [P, K])
        logits += tl.load(ab_ptr + (p * A + a[:, None]) * K + k[None, :], mask=ok, other=0.0)
    if DUELING:
        v = tl.load(v_ptr + p * s_vp + m * s_vm + k * s_vk, mask=k_ok, other=0.0)
        if VALUE_BIAS:
            v += tl.load(vb_ptr + p * K + k, mask=k_ok, other=0.0)
        mean = tl.sum(logits, axis=0) / A  # padded actions are 0
        logits = (v[None, :] + logits) - mean[None, :]
    top = tl.where(a_ok, tl.max(tl.where(ok, logits, float("-inf")), axis=1), 0.0)  # padded actions: 0
    e = tl.exp(tl.where(ok, logits - top[:, None], float("-inf")))  # padded entries exp(−inf) = 0
    prob = e / tl.where(a_ok, tl.sum(e, axis=1), 1.0)[:, None]  # padded actions: 0, not 0 / 0
    z = tl.load(z_ptr + p * s_zp + k * s_zk, mask=k_ok, other=0.0)
    q = tl.sum(tl.where(ok, prob * z[None, :], 0.0), axis=1)
    tl.store(q_ptr + (p * M + m) * A + a, q, mask=a_ok)


@device_op("foxdqn::c51_expected_q", mutates_args=())
def _c51_expected_q_op(adv: Tensor, value: Tensor, support: Tensor, dueling: bool, bias: Optional[Tensor],
                       value_bias: Optional[Tensor]) -> Tensor:
    """Allocate Q and launch (arguments checked by :func:`c51_expected_q`); ``value`` is read only
    with ``dueling`` (else any tensor: ``adv``), ``value_bias`` with ``dueling`` and ``bias``."""
    members, rows, actions, atoms = adv.shape
    q = torch.empty((members, rows, actions), dtype=torch.float32, device=adv.device)
    if q.numel() == 0:
        return q
    wrap_triton(_c51_expected_q_kernel)[(rows, members)](
        adv, value, support, q, support if bias is None else bias, support if value_bias is None else value_bias,
        rows, *adv.stride(), *(value.stride() if dueling else (0, 0, 0)), *support.stride(),
        A=actions, K=atoms, PA=_pad(actions), PK=_pad(atoms), DUELING=dueling, BIAS=bias is not None,
        VALUE_BIAS=dueling and value_bias is not None, num_warps=NUM_WARPS)
    return q


def _problem(adv, value, support, bias=None, value_bias=None) -> str | None:
    """Why the arguments are outside the contract, or None."""
    op = "c51_expected_q"
    if not isinstance(adv, Tensor) or adv.dim() != 4 or adv.dtype != torch.float32:
        return f"{op}: adv must be a float32 [P, M, A, K] tensor, got {describe(adv)}"
    members, rows, actions, atoms = adv.shape
    if members < 1 or members > 65535 or actions < 1 or atoms < 1:
        return f"{op}: adv needs 1 to 65535 members, A >= 1 and K >= 1, got {describe(adv)}"
    if not c51_expected_q_fits(actions, atoms):
        return f"{op}: A = {actions} actions × K = {atoms} atoms pad to more than {MAX_TILE} elements"
    if value is not None and (not isinstance(value, Tensor) or tuple(value.shape) != (members, rows, atoms)
                              or value.dtype != torch.float32 or value.device != adv.device):
        return f"{op}: value must be None or a float32 [{members}, {rows}, {atoms}] tensor on {adv.device}, got " \
               f"{describe(value)}"
    if not isinstance(support, Tensor) or tuple(support.shape) != (members, atoms) \
            or support.dtype != torch.float32 or support.device != adv.device:
        return f"{op}: support must be a float32 [{members}, {atoms}] tensor on {adv.device}, got {describe(support)}"
    if value_bias is not None and (bias is None or value is None):
        return f"{op}: value_bias needs bias and value (the dueling head's two layers)"
    for name, t, width in (("bias", bias, actions * atoms), ("value_bias", value_bias, atoms)):
        if t is not None and (
                not isinstance(t, Tensor) or tuple(t.shape) != (members, width) or t.dtype != torch.float32
                or not t.is_contiguous() or t.device != adv.device):
            return f"{op}: {name} must be a contiguous float32 [{members}, {width}] tensor on {adv.device}, " \
                   f"got {describe(t)}"
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (adv, value, support, bias, value_bias)):
        return f"{op}: no gradient: call it under torch.no_grad() or with inputs that need none"
    return None


def c51_expected_q_fits(actions: int, atoms: int) -> bool:
    """Whether one row's A × K logits (padded) fit the kernel's tile, :data:`MAX_TILE` elements."""
    return _pad(actions) * _pad(atoms) <= MAX_TILE


def c51_expected_q_supported(adv, value, support, bias=None, value_bias=None) -> bool:
    """Whether :func:`c51_expected_q` takes the arguments (metadata only, no device read)."""
    return _problem(adv, value, support, bias, value_bias) is None


def c51_expected_q_reference(adv: Tensor, value: Tensor | None, support: Tensor, bias: Tensor | None = None,
                             value_bias: Tensor | None = None) -> Tensor:
    """Plain torch, as :class:`~foxdqn.population.distributional.MemberC51Network` computes Q:
    the biases added (``bias`` ``[P, A·K]`` to each row of ``adv``, ``value_bias`` ``[P, K]`` to
    ``value``), ``v + adv − adv.mean(dim=2)`` (dueling), then ``(softmax(logits, −1) · z).sum(−1)``."""
    if bias is not None:
        adv = adv + bias.view(adv.shape[0], 1, *adv.shape[2:])
        value = value if value_bias is None else value + value_bias[:, None, :]
    logits = adv if value is None else value[:, :, None, :] + adv - adv.mean(dim=2, keepdim=True)
    return (F.softmax(logits, dim=-1) * support[:, None, None, :]).sum(dim=-1)


def c51_expected_q(adv: Tensor, value: Tensor | None, support: Tensor, *, bias: Tensor | None = None,
                   value_bias: Tensor | None = None, backend: str = "auto") -> Tensor:
    """Q float32 ``[P, M, A]`` of a C51 head's atom logits (module docstring), one kernel.

    Args:
        adv: float32 ``[P, M, A, K]``, the head's atom logits (the advantages with a dueling head),
            any strides; 1 <= P <= 65535.
        value: None (plain head), or the dueling head's value stream float32 ``[P, M, K]``.
        support: float32 ``[P, K]``, member p's atoms z_k (any strides).
        bias, value_bias: None, or the head layers' biases that ``adv`` and ``value`` do not hold
            yet (their products by ``bmm``, without ``baddbmm``'s copy of the bias into the output):
            float32 ``[P, A·K]`` and (with ``value``) ``[P, K]``, contiguous; added as the kernel
            loads each row (:class:`foxdqn.ops.c51_loss.C51Biases`). ``value_bias`` None with
            ``bias``: ``value`` holds its bias (the value stream by ``member_linear``'s kernel).
        backend: ``"auto"`` (the kernel for CUDA tensors, else the reference; the kernel inside
            :func:`foxdqn.ops.backend.cpu_kernels`), ``"triton"`` (CPU tensors need
            TRITON_INTERPRET=1) or ``"torch"`` (:func:`c51_expected_q_reference`).

    Returns:
        Q float32 ``[P, M, A]`` contiguous, equal to the reference to float rounding.

    Raises:
        ValueError: outside the contract (module docstring), or an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    problem = _problem(adv, value, support, bias, value_bias)
    if problem is not None:
        raise ValueError(problem)
    if resolve_backend("c51_expected_q", backend, adv) == "torch":
        return c51_expected_q_reference(adv, value, support, bias, value_bias)
    return _c51_expected_q_op(adv, adv if value is None else value, support, value is not None, bias, value_bias)
