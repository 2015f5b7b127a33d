"""Adam for population parameters, per member (:class:`MemberAdam`).

Every tensor here has a leading member axis ``[P, ...]``; member ``p``'s slices of all the
tensors are its own network's (see :mod:`foxdqn.population`). :class:`MemberAdam` does for every
member what ``torch.optim.Adam`` does for one network (Kingma & Ba 2015, Algorithm 1; no amsgrad,
no weight decay), with ``[P]`` learning rates, eps values and step counts, a ``[P]`` skip flag
(the population's ``found_inf``) and an optional ``[P]`` gradient multiplier (the clip coefficient
of :func:`foxdqn.ops.grad_norm.grad_norm_coefficient` with ``members=P``, the per-member form of
``torch.nn.utils.clip_grad_norm_``). Its step is :func:`foxdqn.ops.adam_step.adam_step_` with
``members=P``: one kernel launch per 8 parameter tensors on CUDA, the step counts included.

All of it runs device ops only (no host reads), so it can be captured in a CUDA graph
(docs/design/hot_loop.md#the-contract).
"""
from __future__ import annotations

from typing import Sequence

import torch

from foxdqn.ops.adam_step import adam_step_
from foxdqn.ops.target_lerp import TargetFollow
from foxdqn.ops.backend import describe, resolve_backend

F32 = torch.float32


def _check_member_tensors(where: str, name: str, tensors) -> tuple[int, torch.device]:
    """``tensors`` is a non-empty list of contiguous float32 ``[P, ...]`` tensors on one device;
    returns ``(P, device)``. Raises ValueError naming ``where`` and ``name[i]``."""
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)) or not tensors:
        raise ValueError(f"{where}: {name} must be a non-empty list of float32 tensors [P, ...], "
                         f"got {describe(tensors) if isinstance(tensors, torch.Tensor) else tensors!r}")
    first = tensors[0]
    for i, t in enumerate(tensors):
        if (not isinstance(t, torch.Tensor) or t.dim() < 1 or t.dtype != F32 or not t.is_contiguous()
                or t.shape[0] != first.shape[0] or t.device != first.device):
            ref = (f"[{first.shape[0]}, ...] on {first.device} (as {name}[0])"
                   if i > 0 and isinstance(first, torch.Tensor) and first.dim() >= 1 else "[P, ...]")
            raise ValueError(f"{where}: {name}[{i}] must be a contiguous float32 tensor {ref}, got {describe(t)}")
    return first.shape[0], first.device


def _check_member_vector(where: str, name: str, t, members: int, device: torch.device) -> None:
    if (not isinstance(t, torch.Tensor) or tuple(t.shape) != (members,) or t.dtype != F32 or t.device != device
            or not t.is_contiguous()):
        raise ValueError(f"{where}: {name} must be a float32 tensor [P] = [{members}] on {device}, contiguous, "
                         f"got {describe(t)}")


def _as_member_vector(name: str, value, members: int, device: torch.device) -> torch.Tensor:
    """A fresh contiguous float32 ``[P]`` tensor on ``device`` from a number, a sequence of P
    numbers or a ``[P]`` tensor; finite and >= 0 (read on the host once, at construction)."""
    if isinstance(value, bool):
        raise ValueError(f"MemberAdam: {name} must be a number, P numbers or a tensor [P], got {value!r}")
    if isinstance(value, (int, float)):
        out = torch.full((members,), float(value), dtype=F32, device=device)
    else:
        try:
            out = torch.as_tensor(value, dtype=F32).to(device).clone(memory_format=torch.contiguous_format)
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"MemberAdam: {name} must be a number, P numbers or a tensor [P], got {value!r}") from None
        if tuple(out.shape) != (members,):
            raise ValueError(f"MemberAdam: {name} must have one value per member ([{members}]), "
                             f"got shape {list(out.shape)}")
    if not bool(torch.isfinite(out).all()) or bool((out < 0).any()):
        raise ValueError(f"MemberAdam: {name} must be finite and >= 0 for every member, got {out.tolist()}")
    return out


class MemberAdam:
    """Adam for population parameters: every member has its own lr, eps, moments and step count.

    Member ``p`` follows ``torch.optim.Adam(amsgrad=False, weight_decay=0, maximize=False)`` on
    its own slices ``param[p]`` with ``lr[p]`` and ``eps[p]`` (the rule, its rounding, the skip
    and the step counts' advance: :mod:`foxdqn.ops.adam_step`, which matches torch's fused CUDA
    Adam; torch's CPU Adam differs from it by a few float32 ulps per step). The betas are Python
    floats shared by all members (they are compiled into the kernel; a per-member beta is not
    supported).

    Capture: all state (moments, step counts) is created here, zero, before any CUDA-graph
    capture; :meth:`zero_grad` creates missing grads as zeros and otherwise zeroes them in place,
    so the grad tensors keep their storage from one replay to the next. Change ``lr`` and ``eps``
    in place (``opt.lr.copy_(...)``, ``opt.lr[p] = ...``), never rebind them.

    Attributes:
        params: the ``[P, ...]`` float32 contiguous parameters (the caller's tensors).
        lr, eps: float32 ``[P]`` on the params' device, the optimizer's own tensors.
        betas: ``(beta1, beta2)``, floats in [0, 1).
        steps: float32 ``[P]``, each member's count of updates not skipped (exact up to 2**24).
        exp_avg, exp_avg_sq: one float32 tensor per param, its shape: the moment estimates.
        members: P.
        last_good: with ``keep_last_good``, one float32 tensor per param, its shape: each member's
            weights from before its last applied step (Adam's kernel stores them, ``prior`` of
            :func:`~foxdqn.ops.adam_step.adam_step_`; a skipped member's stay), else None.
    """

    def __init__(self, params: Sequence[torch.Tensor], lr, eps=1e-8, betas: tuple[float, float] = (0.9, 0.999),
                 *, backend: str = "auto", keep_last_good: bool = False) -> None:
        """
        Args:
            params: non-empty sequence of contiguous float32 ``[P, ...]`` tensors on one device
                (leaf tensors whose ``.grad`` backward fills), one P for all.
            lr: learning rate(s) >= 0: a number (all members), P numbers or a ``[P]`` tensor (copied).
            eps: the denominator term(s) >= 0, likewise (torch's default 1e-8).
            betas: ``(beta1, beta2)``, each in [0, 1) (torch's default (0.9, 0.999)).
            backend: "auto" (Triton for CUDA tensors, torch reference for CPU), "triton", "torch".
            keep_last_good: keep :attr:`last_good` (``guard.keep_last_good``: one more copy of the weights).

        Raises:
            ValueError: a param that is not contiguous float32 ``[P, ...]`` with the first one's P
                and device; lr or eps not one finite value >= 0 per member; a beta outside [0, 1);
                an unknown backend.
            RuntimeError: backend="triton" on CPU params without TRITON_INTERPRET=1.
        """
        self.params = list(params) if not isinstance(params, torch.Tensor) else params
        members, device = _check_member_tensors("MemberAdam", "params", self.params)
        if (not isinstance(betas, (tuple, list)) or len(betas) != 2
                or any(isinstance(b, bool) or not isinstance(b, (int, float)) or not 0.0 <= b < 1.0 for b in betas)):
            raise ValueError(f"MemberAdam: betas must be two floats in [0, 1), got {betas!r}")
        resolve_backend("MemberAdam", backend, self.params[0])
        self.members = members
        self.backend = backend
        self.betas = (float(betas[0]), float(betas[1]))
        self.lr = _as_member_vector("lr", lr, members, device)
        self.eps = _as_member_vector("eps", eps, members, device)
        self.steps = torch.zeros(members, dtype=F32, device=device)
        self.exp_avg = [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in self.params]
        self.last_good = [p.detach().clone(memory_format=torch.contiguous_format) for p in self.params] \
            if keep_last_good else None

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Set every param's grad to zero in place (a missing grad, None, is created as zeros), or
        with ``set_to_none`` drop them: the next backward then writes each grad instead of adding
        into a zeroed one (no fill and no add kernels; docs/design/update.md#accumulation says why
        that is safe under a CUDA graph)."""
        if set_to_none:
            for p in self.params:
                p.grad = None
            return
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        torch._foreach_zero_([p.grad for p in self.params])

    @torch.no_grad()
    def step(self, skip: torch.Tensor, grad_scale: torch.Tensor | None = None,
             follow: TargetFollow | None = None) -> None:
        """One Adam update of every member whose ``skip`` is 0.0, from the params' grads.

        :func:`~foxdqn.ops.adam_step.adam_step_` with ``members=P`` and :attr:`steps` as the one
        count shared by all params: one kernel launch per 8 params on CUDA, which also advances
        ``steps`` by 1 where ``skip == 0``. A member with any other ``skip`` (1.0 by convention;
        NaN too) keeps its params, moments and step count bit for bit. With ``grad_scale``, member
        ``p``'s gradients are multiplied by ``grad_scale[p]`` as they are read (the clip
        coefficient of :func:`foxdqn.ops.grad_norm.grad_norm_coefficient`); the ``.grad`` tensors
        are not modified. With ``follow``, the target networks' update in the same launch
        (:class:`~foxdqn.ops.target_lerp.TargetFollow`: what ``target_lerp_`` toward the params
        would do after the step, bit for bit). Device ops only.

        Args:
            skip: float32 ``[P]`` on the params' device, contiguous.
            grad_scale: None, or float32 ``[P]`` on the params' device, contiguous.
            follow: None, or the targets (one per param, in order) and their update's arguments.

        Raises:
            ValueError: ``skip`` or ``grad_scale`` not such a tensor, or a param without a grad
                (call :meth:`zero_grad` before the first backward); a grad that is not
                contiguous float32 of its param's shape (from :func:`~foxdqn.ops.adam_step.adam_step_`).
        """
        device = self.steps.device
        _check_member_vector("MemberAdam.step", "skip", skip, self.members, device)
        if grad_scale is not None:
            _check_member_vector("MemberAdam.step", "grad_scale", grad_scale, self.members, device)
        for i, p in enumerate(self.params):
            if p.grad is None:
                raise ValueError(f"MemberAdam.step: params[{i}] has no grad; call zero_grad() before backward "
                                 "(it creates the grads as zeros)")
        beta1, beta2 = self.betas
        adam_step_(self.params, [p.grad for p in self.params], self.exp_avg, self.exp_avg_sq, [self.steps],
                   lr=self.lr, beta1=beta1, beta2=beta2, eps=self.eps, grad_scale=grad_scale, skip=skip,
                   members=self.members, prior=self.last_good, follow=follow, backend=self.backend)

    def restore_last_good(self, p: int) -> None:
        """Put member ``p``'s :attr:`last_good` weights back into its slices of the params (after its
        halt, before its checkpoint); the other members are untouched. No-op without the copy."""
        if self.last_good is None:
            return
        with torch.no_grad():
            for param, kept in zip(self.params, self.last_good):
                param[p].copy_(kept[p])

    def _state(self) -> dict[str, torch.Tensor]:
        out = {"step": self.steps, "lr": self.lr, "eps": self.eps}
        for i, (m, v) in enumerate(zip(self.exp_avg, self.exp_avg_sq)):
            out[f"exp_avg.{i}"] = m
            out[f"exp_avg_sq.{i}"] = v
        return out

    def state_dict(self) -> dict[str, torch.Tensor]:
        """A snapshot of the optimizer as a plain dict of tensors (copies, on the params' device).

        Keys: ``step``, ``lr``, ``eps`` (float32 ``[P]``), ``betas`` (float64 ``[2]``), and per
        param ``i`` ``exp_avg.i`` and ``exp_avg_sq.i`` (float32, the param's shape).
        """
        out = {k: t.detach().clone() for k, t in self._state().items()}
        out["betas"] = torch.tensor(self.betas, dtype=torch.float64, device=self.steps.device)
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy a :meth:`state_dict` into this optimizer's own tensors, in place (a captured graph
        keeps reading them). ``lr`` and ``eps`` are restored too. Reads ``betas`` on the host.

        Raises:
            ValueError: ``state`` is not a dict with exactly the keys of :meth:`state_dict`; a
                tensor of another dtype or shape than this optimizer's; betas other than this
                optimizer's.
        """
        own = self._state()
        if not isinstance(state, dict):
            raise ValueError(f"MemberAdam.load_state_dict: expected a dict of tensors, got {type(state).__name__}")
        missing = sorted((set(own) | {"betas"}) - set(state))
        unexpected = sorted(set(state) - (set(own) | {"betas"}))
        if missing or unexpected:
            raise ValueError(f"MemberAdam.load_state_dict: missing keys {missing}, unexpected keys {unexpected} "
                             f"(this optimizer has {len(self.params)} params)")
        betas = state["betas"]
        if (not isinstance(betas, torch.Tensor) or tuple(betas.shape) != (2,)
                or tuple(betas.tolist()) != self.betas):
            got = betas.tolist() if isinstance(betas, torch.Tensor) else betas
            raise ValueError(f"MemberAdam.load_state_dict: betas {got} in the state, this optimizer has "
                             f"{list(self.betas)}")
        for key, t in own.items():
            src = state[key]
            if not isinstance(src, torch.Tensor) or src.dtype != t.dtype or src.shape != t.shape:
                raise ValueError(f"MemberAdam.load_state_dict: {key} must be {t.dtype} {list(t.shape)}, "
                                 f"got {describe(src)}")
        with torch.no_grad():
            for key, t in own.items():
                t.copy_(state[key])
