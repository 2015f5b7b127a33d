r"""ε-greedy actions straight from an MLP Q network's weights: :mod:`foxdqn.ops.q_forward` and
:mod:`foxdqn.ops.epsilon_greedy` in one kernel.

    action[p·M + m] = epsilon_greedy(q_forward(x, weights, biases)[p, m], step, start[p], end[p], duration[p],
                                     u[p, :, m])

For member p of P (P = 1: one network) and row m of M: the Q row of :func:`~foxdqn.ops.q_forward.q_forward`
(same shapes, layouts, widths and precision rule) is computed in registers and never stored; the
action is :func:`~foxdqn.ops.epsilon_greedy.epsilon_greedy`'s rule on it, with G = P groups (one
linear ε schedule per member): explore where ``u[p, 0, m] < ε_p``, then the random action of
``u[p, 1, m]``, else the first index of the row's maximum (NaN largest, torch.argmax's rule).
Watkins & Dayan's ε-greedy with the linear ε decay of Mnih et al. 2015; Q network as in
:mod:`foxdqn.ops.q_forward` (Mnih et al. 2015; Wang et al. 2016, eq. 9).

Equal to ``epsilon_greedy(q_forward(...))``: the kernel is q_forward's, launched with its action
epilogue (the same code computes Q, compiled without multiply-add contraction in both launches),
and the epilogue is epsilon_greedy's (shared ``@triton.jit`` helpers: schedule, explore test,
random action, argmax). Against the plain-torch reference (:func:`q_forward_epsilon_greedy_reference`)
the actions agree wherever the reference's Q and the kernel's have the same argmax: they differ by
float rounding (:mod:`foxdqn.ops.q_forward`), so a near tie can pick another action.

The collect step of a network whose forward is q_forward's (:class:`foxdqn.nn.qnet.QNetwork`
with a dueling head, :class:`foxdqn.population.network.MemberQNetwork`) acts through this op
(:func:`foxdqn.step.act.act`): one kernel for the forward and the selection, where
:func:`~foxdqn.ops.q_forward.q_forward` then :func:`~foxdqn.ops.epsilon_greedy.epsilon_greedy` are
two, and Q ([N, A] float32) is neither written nor read back.

Capture: device ops only (no host reads of tensor data), the output is ``torch.empty``.
Registered as ``torch.ops.foxdqn.q_forward_epsilon_greedy`` by :func:`foxdqn.ops.library.register_ops`.

Errors: ``ValueError`` (messages start with ``q_forward_epsilon_greedy:``) for arguments outside
q_forward's contract or
epsilon_greedy's (step 0-d int64; start, end, duration contiguous float32 ``[P]``; u contiguous
float32 ``[P, 2, M]``; one device), and for grad mode on with an input requiring grad;
``RuntimeError`` for backend="triton" on CPU tensors without TRITON_INTERPRET=1.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from foxdqn.ops.backend import resolve_backend
from foxdqn.ops.epsilon_greedy import check_schedule, epsilon_greedy_reference
from foxdqn.ops.library import device_op
from foxdqn.ops.q_forward import _check, _grad_problem, launch_q_forward, q_forward_reference

__all__ = ["q_forward_epsilon_greedy", "q_forward_epsilon_greedy_reference"]


@device_op("foxdqn::q_forward_epsilon_greedy", mutates_args=())
def _q_forward_epsilon_greedy_op(x: Tensor, weights: list[Tensor], biases: list[Tensor], dueling: bool, step: Tensor,
                                 start: Tensor, end: Tensor, duration: Tensor, u: Tensor) -> Tensor:
    action = torch.empty(x.shape[:-1].numel(), dtype=torch.int64, device=x.device)
    launch_q_forward(x, weights, biases, dueling, action, schedule=(step, start, end, duration, u))
    return action


def _check_all(x, weights, biases, dueling, step, start, end, duration, u) -> None:
    op = "q_forward_epsilon_greedy"
    _check(x, weights, biases, dueling, op)
    members = x.shape[0] if x.dim() == 3 else 1
    if isinstance(start, Tensor) and start.dim() == 1 and start.shape[0] != members:
        raise ValueError(f"{op}: start, end and duration must hold one schedule per member (G = P = {members}), "
                         f"got G = {start.shape[0]}")
    check_schedule(op, members * x.shape[-2], "x", x.device, step, start, end, duration, u)
    problem = _grad_problem(x, weights, biases, op)
    if problem is not None:
        raise ValueError(problem)


def q_forward_epsilon_greedy_reference(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor], *,
                                       dueling: bool, step: Tensor, start: Tensor, end: Tensor, duration: Tensor,
                                       u: Tensor) -> Tensor:
    """Plain torch (the spec): :func:`~foxdqn.ops.epsilon_greedy.epsilon_greedy_reference` of
    :func:`~foxdqn.ops.q_forward.q_forward_reference`'s Q, rows member-major ``[P·M, A]``. Same
    arguments, result and errors as :func:`q_forward_epsilon_greedy` (also the no-gradient rule:
    the actions are integers, nothing to differentiate)."""
    _check_all(x, weights, biases, dueling, step, start, end, duration, u)
    with torch.no_grad():
        q = q_forward_reference(x, weights, biases, dueling=dueling)
    return epsilon_greedy_reference(q.reshape(-1, q.shape[-1]), step, start, end, duration, u)


def q_forward_epsilon_greedy(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor], *, dueling: bool,
                             step: Tensor, start: Tensor, end: Tensor, duration: Tensor, u: Tensor,
                             backend: str = "auto") -> Tensor:
    """ε-greedy actions of an MLP Q network's rows, one kernel (module docstring).

    Args:
        x, weights, biases, dueling: as :func:`foxdqn.ops.q_forward.q_forward` (x float32
            ``[P, M, D0]`` or ``[M, D0]``; weights and biases of one layout; 1 or 2 hidden ReLU
            layers of width <= 256; A <= 64).
        step: int64 0-d, the schedules' counter (env steps).
        start, end: float32 ``[P]`` contiguous, ε at step 0 and from ``duration`` on, per member.
        duration: float32 ``[P]`` contiguous, steps of the linear part (>= 1 by the callers' clamp).
        u: float32 ``[P, 2, M]`` contiguous uniforms in [0, 1): ``u[p, 0]`` the explore tests,
            ``u[p, 1]`` the random actions of member p's rows.
        backend: "auto" (the kernel for CUDA tensors, else the reference), "triton" (CPU tensors
            need TRITON_INTERPRET=1), "torch" (:func:`q_forward_epsilon_greedy_reference`).

    Returns:
        int64 ``[P·M]`` actions in ``[0, A)``, member-major (row p·M + m).

    Raises:
        ValueError: outside q_forward's or epsilon_greedy's argument contract (the message names
            the argument), G != P, grad mode on with an input requiring grad, an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check_all(x, weights, biases, dueling, step, start, end, duration, u)
    if resolve_backend("q_forward_epsilon_greedy", backend, x) == "torch":
        return q_forward_epsilon_greedy_reference(x, weights, biases, dueling=dueling, step=step, start=start,
                                                  end=end, duration=duration, u=u)
    return _q_forward_epsilon_greedy_op(x, list(weights), list(biases), dueling, step, start, end, duration, u)
