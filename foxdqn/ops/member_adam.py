"""Adam step of one parameter tensor of a population: P members, each with its own lr, eps, step
count and skip flag, in one kernel launch.

Not used in training any more: :class:`foxdqn.population.optim.MemberAdam` steps all its tensors
with :func:`foxdqn.ops.adam_step.adam_step_` (``members=P``, one launch per 8 tensors, the step
counts included). This op is kept with its tests and ``bench/ops/bench_member_adam.py``.

Source: Kingma & Ba 2015, "Adam: A Method for Stochastic Optimization", Algorithm 1, as
``torch.optim.Adam`` computes it with ``amsgrad=False, weight_decay=0, maximize=False``
(``torch/optim/adam.py``, ``_single_tensor_adam``). The caller increments ``step`` for the
members it does not skip, once per update, before calling this op for each parameter tensor. Per member ``p`` with ``t = step[p]`` (the count after that
increment) and every element of its slice ``param[p]``::

    if skip[p] != 0: nothing changes for member p
    m  ← lerp(m, g, 1 - beta1)                                 # exp_avg.lerp_(grad, 1 - beta1)
    v  ← v * beta2 + (1 - beta2) * g * g                       # exp_avg_sq.mul_(beta2).addcmul_(...)
    bc1 = 1 - beta1**t;   bc2 = 1 - beta2**t
    step_size = lr[p] / bc1;   bc2_sqrt = sqrt(bc2)
    denom = sqrt(v) / bc2_sqrt + eps[p]
    param ← param + (-step_size) * m / denom                   # param.addcdiv_(m, denom, value=-step_size)

Precision, as in torch's default (non-capturable) branch, where ``t`` is a Python number: the
per-member scalars ``bc1``, ``bc2``, ``step_size`` and ``bc2_sqrt`` are computed in float64 and
rounded to float32 once, where they meet the float32 tensors; ``1 - beta1``, ``beta2`` and
``1 - beta2`` are rounded to float32 likewise. The element-wise lines run in float32 in the order
written (``lerp`` with torch's two-sided formula: ``m + w*(g - m)`` for ``w < 0.5``, else
``g - (g - m)*(1 - w)``; ``(-step_size * m) / denom`` then ``+ param``). torch's capturable branch
(``step`` a device tensor) computes the scalars in float32 instead, which moves ``beta2**t`` by up
to about ``t * 6e-8`` relative; this op keeps float64 there although ``step`` lives on the device.

The reference (:func:`member_adam_reference`) is torch ops over the whole ``[P, ...]`` tensor and
agrees with ``torch.optim.Adam(foreach=False)`` run per member bit for bit on CPU (as seen with
torch 2.14; not promised across versions). The Triton kernel evaluates the same expressions with
correctly rounded float32 division and square root (``tl.div_rn``, ``tl.sqrt_rn``); it matches the
reference to a few float32 ulps, not bit for bit: torch's CPU lerp uses a fused multiply-add, the
interpreter does not, and the GPU compiler may fuse a multiply and an add (as nvcc does in torch's
CUDA kernels).

Skipped members (``skip[p] != 0``): their ``param``, ``exp_avg`` and ``exp_avg_sq`` slices are
not written at all (bit for bit unchanged, whatever their ``grad`` holds, NaN included).
"""
from __future__ import annotations

import math
import struct

import torch
import triton
import triton.language as tl

from foxdqn.ops.backend import resolve_backend

BLOCK = 1024  # elements of one member's slice per program
MAX_MEMBERS = 65535  # the members run on grid axis 1, which CUDA limits to 65535


# ---------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def _member_adam_kernel(
    param_ptr, grad_ptr, exp_avg_ptr, exp_avg_sq_ptr,  # [P, n] float32
    step_ptr, lr_ptr, eps_ptr, skip_ptr,  # [P] float32
    n,  # elements per member
    w1, beta2, w2,  # float32: 1 - beta1, beta2, 1 - beta2
    LOG_BETA1: tl.constexpr, LOG_BETA2: tl.constexpr,  # float64 log(beta) (-inf for beta = 0)
    LERP_SMALL: tl.constexpr,  # w1 < 0.5: torch's lerp branch
    BLOCK: tl.constexpr,
):
    member = tl.program_id(1)
    n_live = tl.where(tl.load(skip_ptr + member) == 0.0, n, 0)  # a skipped member's slice: no reads, no writes
    # per-member scalars in float64 (constexpr floats would be float32 in expressions: tl.full); a
    # skipped member may still have step 0: t = 1 keeps its unused scalars finite
    f64 = tl.float64
    t = tl.where(n_live > 0, tl.load(step_ptr + member).to(f64), 1.0)
    bc1 = 1.0 - tl.exp(t * tl.full([], LOG_BETA1, f64))
    bc2 = 1.0 - tl.exp(t * tl.full([], LOG_BETA2, f64))
    neg_step_size = (-(tl.load(lr_ptr + member).to(f64) / bc1)).to(tl.float32)
    bc2_sqrt = tl.sqrt(bc2).to(tl.float32)
    eps = tl.load(eps_ptr + member)

    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_live
    idx = member.to(tl.int64) * n + offs
    p = tl.load(param_ptr + idx, mask=mask, other=0.0)
    g = tl.load(grad_ptr + idx, mask=mask, other=0.0)
    m = tl.load(exp_avg_ptr + idx, mask=mask, other=0.0)
    v = tl.load(exp_avg_sq_ptr + idx, mask=mask, other=0.0)

    if LERP_SMALL:
        m = m + w1 * (g - m)
    else:
        m = g - (g - m) * (1.0 - w1)
    v = v * beta2
    v = v + (w2 * g) * g
    denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
    p = tl.div_rn(neg_step_size * m, denom) + p

    tl.store(exp_avg_ptr + idx, m, mask=mask)
    tl.store(exp_avg_sq_ptr + idx, v, mask=mask)
    tl.store(param_ptr + idx, p, mask=mask)


# ---------------------------------------------------------------------------------------------
# Launcher (registered with torch.library so it composes with torch.compile / graph capture)
# ---------------------------------------------------------------------------------------------
def _log_beta(beta: float) -> float:
    return math.log(beta) if beta > 0.0 else -math.inf


def _f32(x: float) -> float:
    """``x`` rounded to float32 (to nearest, as torch rounds a Python scalar meeting a float32
    tensor), on the host without a tensor."""
    return struct.unpack("f", struct.pack("f", x))[0]


@torch.library.triton_op("foxdqn::member_adam", mutates_args={"param", "exp_avg", "exp_avg_sq"})
def _member_adam_op(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                    step: torch.Tensor, lr: torch.Tensor, eps: torch.Tensor, skip: torch.Tensor,
                    beta1: float, beta2: float) -> None:
    members = param.shape[0]
    n = param.numel() // members
    w1 = _f32(1.0 - beta1)
    torch.library.wrap_triton(_member_adam_kernel)[(triton.cdiv(n, BLOCK), members)](
        param, grad, exp_avg, exp_avg_sq, step, lr, eps, skip, n,
        w1, _f32(beta2), _f32(1.0 - beta2),
        LOG_BETA1=_log_beta(beta1), LOG_BETA2=_log_beta(beta2), LERP_SMALL=abs(w1) < 0.5,
        BLOCK=BLOCK, num_warps=4,
    )


# ---------------------------------------------------------------------------------------------
# Reference (plain torch; the CPU path)
# ---------------------------------------------------------------------------------------------
def member_adam_reference(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                          step: torch.Tensor, lr: torch.Tensor, eps: torch.Tensor, skip: torch.Tensor,
                          beta1: float, beta2: float) -> None:
    """Plain-torch reference of :func:`member_adam_` (same arguments, same in-place writes).

    Device ops only (no host reads): capturable. The update is computed out of place and written
    back with ``torch.where``, so skipped members keep their values bit for bit.
    """
    members = param.shape[0]
    col = (members,) + (1,) * (param.dim() - 1)  # [P] -> [P, 1, ...], broadcast over each slice
    t = step.to(torch.float64)
    bc1 = 1.0 - torch.pow(beta1, t)
    bc2 = 1.0 - torch.pow(beta2, t)
    neg_step_size = (lr.to(torch.float64) / bc1).neg().to(torch.float32).view(col)
    bc2_sqrt = bc2.sqrt().to(torch.float32).view(col)

    m = torch.lerp(exp_avg, grad, 1.0 - beta1)
    v = (exp_avg_sq * beta2).addcmul_(grad, grad, value=1.0 - beta2)
    denom = (v.sqrt() / bc2_sqrt).add_(eps.view(col))
    p = torch.addcdiv(param, neg_step_size * m, denom)

    keep = (skip != 0).view(col)
    exp_avg.copy_(torch.where(keep, exp_avg, m))
    exp_avg_sq.copy_(torch.where(keep, exp_avg_sq, v))
    param.copy_(torch.where(keep, param, p))


# ---------------------------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------------------------
def _describe(t) -> str:
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{t.dtype} {list(t.shape)}{'' if t.is_contiguous() else ' (not contiguous)'} on {t.device}"


def _check_args(param, grad, exp_avg, exp_avg_sq, step, lr, eps, skip, beta1, beta2) -> None:
    f32 = torch.float32
    if (not isinstance(param, torch.Tensor) or param.dim() < 1 or param.dtype != f32
            or not param.is_contiguous()):
        raise ValueError(f"member_adam_: param must be a contiguous float32 tensor [P, ...], got {_describe(param)}")
    members, dev = param.shape[0], param.device
    if members > MAX_MEMBERS:
        raise ValueError(f"member_adam_: param has {members} members; at most {MAX_MEMBERS} are supported")
    if param.numel() >= 2**31:
        raise ValueError(f"member_adam_: param has {param.numel()} elements; at most 2**31 - 1 are supported")
    for name, t in (("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        if (not isinstance(t, torch.Tensor) or t.shape != param.shape or t.dtype != f32 or not t.is_contiguous()
                or t.device != dev):
            raise ValueError(f"member_adam_: {name} must be a contiguous float32 tensor of param's shape "
                             f"{list(param.shape)} on {dev}, got {_describe(t)}")
    for name, t in (("step", step), ("lr", lr), ("eps", eps), ("skip", skip)):
        if (not isinstance(t, torch.Tensor) or tuple(t.shape) != (members,) or t.dtype != f32
                or not t.is_contiguous() or t.device != dev):
            raise ValueError(f"member_adam_: {name} must be a contiguous float32 tensor [P] = [{members}] on {dev}, "
                             f"got {_describe(t)}")
    for name, b in (("beta1", beta1), ("beta2", beta2)):
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0.0 <= b < 1.0:
            raise ValueError(f"member_adam_: {name} must be a float in [0, 1), got {b!r}")


def member_adam_(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                 step: torch.Tensor, lr: torch.Tensor, eps: torch.Tensor, skip: torch.Tensor,
                 beta1: float, beta2: float, *, backend: str = "auto") -> None:
    """One Adam step of one parameter tensor for every member at once, in place (rules and
    precision in the module docstring; Kingma & Ba 2015, Algorithm 1, as ``torch.optim.Adam``).

    Device ops only (no host reads): capturable in a CUDA graph. One kernel launch (grid: blocks
    of one member's slice x members).

    Args (all tensors on one device):
        param: float32 ``[P, ...]`` contiguous, member ``p``'s weights are ``param[p]``; updated.
        grad: float32, param's shape, contiguous: the gradient (not modified).
        exp_avg, exp_avg_sq: float32, param's shape, contiguous: Adam's first and second moment
            estimates (zero before the first update); updated.
        step: float32 ``[P]``: each member's update count AFTER this update's increment (>= 1 for
            a member that is not skipped; the caller increments it, not this op).
        lr: float32 ``[P]``: learning rates (>= 0; not checked: device values).
        eps: float32 ``[P]``: the term added to the denominator (> 0 as a rule; not checked).
        skip: float32 ``[P]``: any value but 0.0 (1.0 by convention; NaN too) leaves member
            ``p``'s param, exp_avg and exp_avg_sq untouched.
        beta1, beta2: Python floats in [0, 1), shared by all members (torch's ``betas``).
        backend: "auto" (Triton for CUDA tensors, torch reference for CPU), "triton", "torch".

    Raises:
        ValueError: wrong dtype, shape, layout or device of an argument, P > 65535, 2**31 or
            more elements, a beta outside [0, 1), or an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check_args(param, grad, exp_avg, exp_avg_sq, step, lr, eps, skip, beta1, beta2)
    args = (param, grad, exp_avg, exp_avg_sq, step, lr, eps, skip, float(beta1), float(beta2))
    if resolve_backend("member_adam_", backend, param) == "torch":
        member_adam_reference(*args)
    elif param.numel() > 0:
        _member_adam_op(*args)
