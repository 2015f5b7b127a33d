r"""ε-greedy actions straight from a plain ReLU MLP Q network's weights: :mod:`foxdqn.ops.mlp_chain`'s
forward and :mod:`foxdqn.ops.epsilon_greedy` in one kernel.

    action[m] = epsilon_greedy(mlp_chain(x, weights, biases)[m], step, start[0], end[0], duration[0], u[0, :, m])

For row m of B: the Q row of :func:`~foxdqn.ops.mlp_chain.mlp_chain` (1 to 4 Linear layers, every
width <= 128, the same precision rule) is computed in registers and never stored; the action is
:func:`~foxdqn.ops.epsilon_greedy.epsilon_greedy`'s rule on it with one group (G = 1, one network,
one linear ε schedule): explore where ``u[0, 0, m] < ε``, then the random action of ``u[0, 1, m]``,
else the first index of the row's maximum (NaN largest, torch.argmax's rule). Watkins & Dayan's
ε-greedy with the linear ε decay of Mnih et al. 2015; the plain Q head of Mnih et al. 2015.

Equal to ``epsilon_greedy(mlp_chain(...))``: the kernel is mlp_chain's forward, launched with its
action epilogue (the same code computes Q, compiled without multiply-add contraction in both
launches, as epsilon_greedy is), and the epilogue is epsilon_greedy's (shared ``@triton.jit``
helpers: schedule, explore test, random action, argmax).
Against the plain-torch reference (:func:`mlp_chain_epsilon_greedy_reference`) the actions agree
wherever the reference's Q and the kernel's have the same argmax: they differ by float rounding
(:mod:`foxdqn.ops.mlp_chain`: TF32, summation order), so a near tie can pick another action.

The collect step of a network whose forward is mlp_chain's (:class:`foxdqn.nn.qnet.QNetwork` with
a ReLU :class:`~foxdqn.nn.mlp.MLPEncoder` and a plain :class:`~foxdqn.nn.heads.QHead`, e.g.
``cartpole_cleanrl``'s 4 → 120 → 84 → 2) acts through this op (:func:`foxdqn.step.act.act`): one
kernel for the forward and the selection, where :func:`~foxdqn.ops.mlp_chain.mlp_chain` then
:func:`~foxdqn.ops.epsilon_greedy.epsilon_greedy` are two, and Q ([B, A] float32) is neither
written nor read back.

No gradient: the actions are integers, and the kernel saves nothing (whatever the grad mode).
Capture: device ops only (no host reads of tensor data), the output is ``torch.empty``.

Errors: ``ValueError`` (messages start with ``mlp_chain_epsilon_greedy:``) for arguments outside
mlp_chain's contract (the message names the argument as mlp_chain's does) or epsilon_greedy's with
G = 1 (step 0-d int64; start, end, duration contiguous float32 ``[1]``; u contiguous float32
``[1, 2, B]``; one device); ``RuntimeError`` for backend="triton" on CPU tensors without
TRITON_INTERPRET=1.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from foxdqn.ops.backend import resolve_backend
from foxdqn.ops.epsilon_greedy import check_schedule, epsilon_greedy_reference
from foxdqn.ops.mlp_chain import _prec, _problem, launch_forward, mlp_chain_reference

__all__ = ["mlp_chain_epsilon_greedy", "mlp_chain_epsilon_greedy_reference"]

OP = "mlp_chain_epsilon_greedy"


def _check_all(x, weights, biases, step, start, end, duration, u) -> None:
    problem = _problem(x, weights, biases, OP)
    if problem is not None:
        raise ValueError(problem)
    if isinstance(start, Tensor) and start.dim() == 1 and start.shape[0] != 1:
        raise ValueError(f"{OP}: start, end and duration must hold one schedule (G = 1, one network), "
                         f"got G = {start.shape[0]}")
    check_schedule(OP, x.shape[0], "x", x.device, step, start, end, duration, u)


def mlp_chain_epsilon_greedy_reference(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor], *,
                                       step: Tensor, start: Tensor, end: Tensor, duration: Tensor,
                                       u: Tensor) -> Tensor:
    """Plain torch (the spec): :func:`~foxdqn.ops.epsilon_greedy.epsilon_greedy_reference` of
    :func:`~foxdqn.ops.mlp_chain.mlp_chain_reference`'s Q. Same arguments, result and errors as
    :func:`mlp_chain_epsilon_greedy`."""
    _check_all(x, weights, biases, step, start, end, duration, u)
    with torch.no_grad():
        q = mlp_chain_reference(x, weights, biases)
    return epsilon_greedy_reference(q, step, start, end, duration, u)


def mlp_chain_epsilon_greedy(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor], *, step: Tensor,
                             start: Tensor, end: Tensor, duration: Tensor, u: Tensor,
                             backend: str = "auto") -> Tensor:
    """ε-greedy actions of a plain ReLU MLP Q network's rows, one kernel (module docstring).

    Args:
        x, weights, biases: as :func:`foxdqn.ops.mlp_chain.mlp_chain` (x float32 ``[B, D_0]``
            contiguous; 1 to 4 layers, ``W_i`` float32 ``[D_i, D_{i-1}]``, ``b_i`` ``[D_i]``, every
            width 1 to 128; the last width is the actions A).
        step: int64 0-d, the schedule's counter (env steps).
        start, end: float32 ``[1]`` contiguous, ε at step 0 and from ``duration`` on.
        duration: float32 ``[1]`` contiguous, steps of the linear part (>= 1 by the callers' clamp).
        u: float32 ``[1, 2, B]`` contiguous uniforms in [0, 1): ``u[0, 0]`` the explore tests,
            ``u[0, 1]`` the random actions.
        backend: "auto" (the kernel for CUDA tensors, else the reference), "triton" (CPU tensors
            need TRITON_INTERPRET=1), "torch" (:func:`mlp_chain_epsilon_greedy_reference`).

    Returns:
        int64 ``[B]`` actions in ``[0, A)``.

    Raises:
        ValueError: outside mlp_chain's or epsilon_greedy's argument contract (the message names
            the argument), G != 1, an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check_all(x, weights, biases, step, start, end, duration, u)
    if resolve_backend(OP, backend, x) == "torch":
        return mlp_chain_epsilon_greedy_reference(x, weights, biases, step=step, start=start, end=end,
                                                  duration=duration, u=u)
    action = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
    launch_forward(x, weights, biases, action, prec=_prec(x), schedule=(step, start, end, duration, u))
    return action
