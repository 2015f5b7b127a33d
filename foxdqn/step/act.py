"""The collect step's action selection: ε-greedy actions of a Q network's observations.

One kernel where the network's forward is one of the fused ops':

* :func:`foxdqn.ops.q_forward.q_forward`'s (the network says so by a ``q_forward_args(obs)``
  method: :class:`foxdqn.nn.qnet.QNetwork` or :class:`foxdqn.population.network.MemberQNetwork`
  with a dueling head): :func:`foxdqn.ops.q_forward_epsilon_greedy.q_forward_epsilon_greedy`;
* :func:`foxdqn.ops.member_mlp_chain.member_mlp_chain`'s (an ``acting_chain_args(obs)`` method:
  a population's plain Q head on a ReLU MLP of widths <= 128, one schedule per member):
  :func:`foxdqn.ops.member_mlp_chain_epsilon_greedy.member_mlp_chain_epsilon_greedy`;
* a population's distributional or branching head, with :data:`HEAD_KERNELS` (the network has a
  ``fused_epsilon_greedy`` method, which returns the actions, or None where it does not apply: its
  encoder's layers, then one kernel for the head and the selection, e.g.
  :func:`foxdqn.ops.c51_epsilon_greedy.c51_epsilon_greedy`);
* :func:`foxdqn.ops.mlp_chain.mlp_chain`'s (a ``fused_chain(obs)`` method: :class:`~foxdqn.nn.qnet.QNetwork`
  with a ReLU MLP and a plain Q head, one schedule):
  :func:`foxdqn.ops.mlp_chain_epsilon_greedy.mlp_chain_epsilon_greedy`.

Otherwise the network's forward, then :func:`foxdqn.ops.epsilon_greedy.epsilon_greedy`. All give
the same actions for the same Q (docs/design/hot_loop.md#device-resident-values). With a switch
penalty (``action.switch_margin`` > 0, :mod:`foxdqn.actions.switch`) the unfused path always: the
greedy part is the argmax of Q minus the penalty; the random actions are unchanged.
"""
from __future__ import annotations

import torch
from torch import nn

from foxdqn.ops.epsilon_greedy import epsilon_greedy
from foxdqn.ops.member_mlp_chain_epsilon_greedy import member_mlp_chain_epsilon_greedy
from foxdqn.ops.mlp_chain_epsilon_greedy import mlp_chain_epsilon_greedy
from foxdqn.ops.q_forward_epsilon_greedy import q_forward_epsilon_greedy

#: Whether a C51, IQN or branching population acts through its head's fused kernel
#: (``fused_epsilon_greedy``). Off: on the H200 those kernels are slower than the layers and the
#: ε-greedy kernel they replace, at every shipped size (one collect step of ``eurusd_rainbowish``
#: at 4,096 envs 1.27 ms against 0.31; docs/bench.md#kernels); they stay, tested, until tuned.
HEAD_KERNELS = False


def act(net: nn.Module, obs: torch.Tensor, step: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
        duration: torch.Tensor, u: torch.Tensor, backend: str = "auto",
        penalty: torch.Tensor | None = None) -> torch.Tensor:
    """ε-greedy actions, int64 ``[N]`` (``N = P·M``, member-major), of ``net`` on ``obs``.

    Args:
        net: a Q network, ``obs → Q`` float ``[..., A]``.
        obs: its input, ``[M, D]`` (one network) or ``[P, M, D]`` (a population's members).
        step, start, end, duration, u: :func:`~foxdqn.ops.epsilon_greedy.epsilon_greedy`'s
            schedule and uniforms (``start`` etc. ``[G]``, ``u`` float32 ``[G, 2, N // G]``).
        backend: "auto", "triton" or "torch", passed to the op; "torch" always runs the network's
            forward and the reference selection.
        penalty: None, or float32 ``[N, A]`` subtracted from Q before the ε-greedy selection (the
            switch penalty, :class:`foxdqn.actions.switch.SwitchPenalty`): the network's forward,
            then :func:`~foxdqn.ops.epsilon_greedy.epsilon_greedy` of ``Q − penalty`` (no fused
            kernel).

    Returns:
        int64 ``[N]`` actions in ``[0, A)``.

    Raises:
        ValueError: what :func:`~foxdqn.ops.epsilon_greedy.epsilon_greedy` raises for its
            arguments (or the fused op for the same ones).

    Call it under ``torch.no_grad()`` (the fused paths need no gradient; the network says when they
    apply, and only for ``G`` = the members of ``obs``: one schedule per member). Device ops
    only: capturable.
    """
    if penalty is not None:
        q = net(obs)
        q = q.reshape(-1, q.shape[-1]) - penalty
        return epsilon_greedy(q, step, start, end, duration, u, backend=backend)
    groups = start.shape[0] if start.dim() == 1 else 0
    head_act = getattr(net, "fused_epsilon_greedy", None) if HEAD_KERNELS else None
    if head_act is not None and backend != "torch" and obs.dim() == 3 and groups == obs.shape[0]:
        action = head_act(obs, step, start, end, duration, u)
        if action is not None:
            return action
    fused = getattr(net, "q_forward_args", None)
    args = fused(obs) if backend != "torch" and fused is not None else None
    if args is not None and groups == (obs.shape[0] if obs.dim() == 3 else 1):
        weights, biases, dueling = args
        return q_forward_epsilon_greedy(obs, weights, biases, dueling=dueling, step=step, start=start, end=end,
                                        duration=duration, u=u, backend="triton")
    member_chain = getattr(net, "acting_chain_args", None)
    chain = member_chain(obs) if backend != "torch" and member_chain is not None else None
    if chain is not None and obs.dim() == 3 and groups == obs.shape[0]:
        return member_mlp_chain_epsilon_greedy(obs, *chain, step=step, start=start, end=end, duration=duration, u=u,
                                               backend="triton")
    chain = net.fused_chain(obs) if backend != "torch" and hasattr(net, "fused_chain") else None
    if chain is not None and groups == 1:
        return mlp_chain_epsilon_greedy(obs, *chain, step=step, start=start, end=end, duration=duration, u=u,
                                        backend="triton")
    q = net(obs)
    return epsilon_greedy(q.reshape(-1, q.shape[-1]), step, start, end, duration, u, backend=backend)
