r"""ε-greedy actions of P small ReLU MLP Q networks, one per member, straight from their weights:
:mod:`foxdqn.ops.member_mlp_chain`'s forward and :mod:`foxdqn.ops.epsilon_greedy` in one kernel.

    action[p·M + m] = epsilon_greedy(member_mlp_chain(x, weights, biases)[p, m], step, start[p], end[p],
                                     duration[p], u[p, :, m])

For member p of P and row m of M: the Q row of :func:`~foxdqn.ops.member_mlp_chain.member_mlp_chain`
(1 to 4 Linear layers, every width <= 128, the population's layout, the same precision rule) is
computed in registers and never stored; the action is
:func:`~foxdqn.ops.epsilon_greedy.epsilon_greedy`'s rule on it with one group per member (G = P,
one linear ε schedule each): explore where ``u[p, 0, m] < ε_p``, then the random action of
``u[p, 1, m]``, else the first index of the row's maximum (NaN largest, torch.argmax's rule).
Watkins & Dayan's ε-greedy with the linear ε decay of Mnih et al. 2015; the plain Q head of Mnih
et al. 2015.

Equal to ``epsilon_greedy(member_mlp_chain(...))``: the kernel is member_mlp_chain's forward,
launched with its action epilogue (the same code computes Q, compiled without multiply-add
contraction in every launch, as epsilon_greedy is), and the epilogue is the population heads'
(:func:`foxdqn.ops.epsilon_greedy.store_member_actions`). Against the plain-torch reference
(:func:`member_mlp_chain_epsilon_greedy_reference`) the actions agree wherever the reference's Q
and the kernel's have the same argmax: they differ by float rounding (TF32, summation order), so a
near tie can pick another action.

The collect step of a population whose network is a plain Q head's ReLU MLP of widths <= 128
(:class:`foxdqn.population.network.MemberQNetwork`, ``chain_args``; ``cartpole_cleanrl``'s 4 → 120
→ 84 → 2) acts through this op (:func:`foxdqn.step.act.act`): one kernel where the chain's forward
and epsilon_greedy are two (it replaced
:func:`~foxdqn.ops.q_forward_epsilon_greedy.q_forward_epsilon_greedy` there, slower at every
measured size: docs/bench.md#kernels).

No gradient: the actions are integers, and the kernel saves nothing (whatever the grad mode).
Capture: device ops only (no host reads of tensor data), the output is ``torch.empty``.

Errors: ``ValueError`` (messages start with ``member_mlp_chain_epsilon_greedy:``) for arguments
outside member_mlp_chain's contract or epsilon_greedy's with G = P (step 0-d int64; start, end,
duration contiguous float32 ``[P]``; u contiguous float32 ``[P, 2, M]``; one device);
``RuntimeError`` for backend="triton" on CPU tensors without TRITON_INTERPRET=1.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from foxdqn.ops.backend import resolve_backend
from foxdqn.ops.epsilon_greedy import check_member_schedule, epsilon_greedy_reference
from foxdqn.ops.member_mlp_chain import _forward, _prec, _problem, member_mlp_chain_reference

__all__ = ["member_mlp_chain_epsilon_greedy", "member_mlp_chain_epsilon_greedy_reference"]

OP = "member_mlp_chain_epsilon_greedy"


def _check_all(x, weights, biases, step, start, end, duration, u) -> None:
    problem = _problem(x, weights, biases, OP)
    if problem is not None:
        raise ValueError(problem)
    check_member_schedule(OP, x, step, start, end, duration, u)


def member_mlp_chain_epsilon_greedy_reference(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor], *,
                                              step: Tensor, start: Tensor, end: Tensor, duration: Tensor,
                                              u: Tensor) -> Tensor:
    """Plain torch (the spec): :func:`~foxdqn.ops.epsilon_greedy.epsilon_greedy_reference` of
    :func:`~foxdqn.ops.member_mlp_chain.member_mlp_chain_reference`'s Q, its members' rows in order.
    Same arguments, result and errors as :func:`member_mlp_chain_epsilon_greedy`."""
    _check_all(x, weights, biases, step, start, end, duration, u)
    with torch.no_grad():
        q = member_mlp_chain_reference(x, weights, biases)
    return epsilon_greedy_reference(q.reshape(-1, q.shape[-1]), step, start, end, duration, u)


def member_mlp_chain_epsilon_greedy(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor], *,
                                    step: Tensor, start: Tensor, end: Tensor, duration: Tensor, u: Tensor,
                                    backend: str = "auto") -> Tensor:
    """ε-greedy actions of every member's rows, one kernel (module docstring).

    Args:
        x, weights, biases: as :func:`foxdqn.ops.member_mlp_chain.member_mlp_chain` (x float32
            ``[P, M, D_0]``, each member's rows contiguous; 1 to 4 layers, ``W_i`` float32
            ``[P, D_{i-1}, D_i]``, ``b_i`` ``[P, 1, D_i]``, every width 1 to 128; the last width is
            the actions A).
        step: int64 0-d, the schedule's counter (env steps).
        start, end: float32 ``[P]`` contiguous, ε at step 0 and from ``duration`` on, per member.
        duration: float32 ``[P]`` contiguous, steps of the linear part (>= 1 by the callers' clamp).
        u: float32 ``[P, 2, M]`` contiguous uniforms in [0, 1): ``u[p, 0]`` the explore tests,
            ``u[p, 1]`` the random actions of member p's rows.
        backend: "auto" (the kernel for CUDA tensors, else the reference; the kernel inside
            :func:`foxdqn.ops.backend.cpu_kernels`), "triton" (CPU tensors need TRITON_INTERPRET=1),
            "torch" (:func:`member_mlp_chain_epsilon_greedy_reference`).

    Returns:
        int64 ``[P·M]`` actions in ``[0, A)``, member-major.

    Raises:
        ValueError: outside member_mlp_chain's or epsilon_greedy's argument contract (the message
            names the argument), G != P, an unknown backend.
        RuntimeError: backend="triton" on CPU tensors without TRITON_INTERPRET=1.
    """
    _check_all(x, weights, biases, step, start, end, duration, u)
    if resolve_backend(OP, backend, x) == "torch":
        return member_mlp_chain_epsilon_greedy_reference(x, weights, biases, step=step, start=start, end=end,
                                                         duration=duration, u=u)
    return _forward(x, weights, biases, save=False, prec=_prec(x), schedule=(step, start, end, duration, u))[0]
