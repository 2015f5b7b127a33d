"""The network forwards a (Double) DQN loss needs: online Q of s, online Q of s', target Q of s'.

Shared by :class:`foxdqn.objectives.dqn.DQNObjective` (one run, batch ``[B, D]``) and
:func:`foxdqn.population.objective.member_dqn_loss` (P members, batch ``[P·B, D]`` member-major).
The results are laid out for :func:`foxdqn.ops.dqn_td_loss.dqn_td_loss`.

With Double DQN (van Hasselt, Guez & Silver 2016, eq. 4) the online network is evaluated on s
(with gradient) and on s' (for the argmax only). Two ways, the same loss and gradients up to float
rounding:

* ``stack=True``: ONE online forward of the stacked ``[2B, D]`` batch (per member ``[2B, D]``):
  the replay's stacked pair when ``obs``/``next_obs`` are its halves
  (:func:`foxdqn.ops.replay_gather.stacked_pair`, no copy), else a concatenation. Fewer, larger
  kernels; the s' rows pass through autograd (the loss gives them zero gradient), so the backward
  works on 2B rows and the forward keeps 2B rows of activations. Exact only for networks that
  compute each row on its own and draw no random numbers in their forward (every online network
  foxdqn builds: the GEMMs see 2B rows instead of B and may round differently, which can flip an
  argmax only between Q values equal to rounding).
  A member network with ``forward_split`` (:meth:`foxdqn.population.network.MemberQNetwork.forward_split`:
  the fused MLP chain) runs the stacked batch in one launch but returns Q of s (with gradient) and
  of s' (a constant) apart, its backward and saved activations covering the s rows only; the loss
  then takes them as two tensors (``q``, ``q_next_online``), the values the same bits.
* ``stack=False``: two online forwards, s with gradient, s' under ``torch.no_grad()``: the
  backward and the saved activations cover B rows. Chosen for image encoders
  (:class:`foxdqn.nn.nature_cnn.NatureCNNEncoder`), where the doubled convolution backward and
  activation memory outweigh the saved launches (``model.encoder=nature_cnn``).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import Tensor

from foxdqn.device.side_stream import beside
from foxdqn.ops.replay_gather import stacked_pair

__all__ = ["DQNForward", "dqn_forward"]


class DQNForward(NamedTuple):
    """Q values of one (Double) DQN loss evaluation (float32; A actions; leading ``[P]`` for members).

    q: online Q with gradient, ``dqn_td_loss``'s ``q``: ``[B, A]`` of s, or ``[2B, A]`` (s rows,
        then s' rows) when stacked (not with ``forward_split``: then ``[B, A]``).
    q_s: online Q of s with gradient, ``[B, A]`` (a view of ``q``).
    q_next_online: online Q of s' without gradient ``[B, A]`` (Double DQN, not stacked or
        ``forward_split``), else None.
    q_next_target: target Q of s' without gradient ``[B, A]``.
    """

    q: Tensor
    q_s: Tensor
    q_next_online: Tensor | None
    q_next_target: Tensor


def dqn_forward(online: Callable[[Tensor], Tensor], target: Callable[[Tensor], Tensor], obs: Tensor,
                next_obs: Tensor, *, double: bool, stack: bool = True, members: int | None = None,
                branch: torch.cuda.Stream | None = None) -> DQNForward:
    """Run the online and target networks for a (Double) DQN loss (module docstring).

    Args:
        online, target: networks obs → Q float32 (``[B, D] → [B, A]``; with ``members``
            ``[P, B, D] → [P, B, A]``).
        obs, next_obs: s and s', ``[B, D]`` (one run) or ``[P·B, D]`` / ``[P, B, D]`` member-major
            (``members=P``), the replay's obs dtype.
        double: Double DQN: the online network also evaluates s'; False: only s.
        stack: with ``double``, one online forward of the stacked [s; s'] batch; False: two.
        members: P for a population batch (reshaped to ``[P, B, D]``); None for one run.
        branch: a second CUDA stream of the batch's device: the target network's forward runs on
            it beside the online forward(s) (:func:`foxdqn.device.side_stream.beside`; in a CUDA
            graph, two branches joined before the result is returned). The same kernels on the
            same inputs: the same bits as without it. None: one after the other on the current
            stream (the CPU, or no stream given). The stream must be used through ``beside`` only.

    Returns:
        :class:`DQNForward`; with ``members`` every tensor has the leading ``[P]`` axis.
    """
    pair = stacked_pair(obs, next_obs) if double and stack else None  # before any reshape: views only
    if pair is not None and members is not None and pair.shape[0] != members:
        pair = None  # a [1, 2, P·B, D] pair (decoded state codes) is not member-major: concatenate
    if members is not None:
        d = obs.shape[-1]
        obs, next_obs = obs.view(members, -1, d), next_obs.view(members, -1, d)
        axis = 1
    else:
        axis = 0

    def target_forward() -> Tensor:
        with torch.no_grad():
            return target(next_obs)

    def online_forward() -> tuple[Tensor, Tensor, Tensor | None]:
        rows = obs.shape[axis]
        if double and stack:
            if pair is not None:
                both = pair.view(members, -1, pair.shape[-1]) if members is not None else pair.view(2 * rows, -1)
            else:
                both = torch.cat([obs, next_obs], dim=axis)
            split = getattr(online, "forward_split", None)
            parts = split(both, rows) if split is not None and members is not None else None
            if parts is not None:  # one forward launch; the backward covers the s rows only
                return parts[0], parts[0], parts[1]
            q = online(both)  # rows of s, then of s' (per member)
            return q, q.narrow(axis, 0, rows), None
        q = online(obs)
        q_next_online = None
        if double:
            with torch.no_grad():
                q_next_online = online(next_obs)
        return q, q, q_next_online

    q_next_target, (q, q_s, q_next_online) = beside(branch, target_forward, online_forward)
    return DQNForward(q, q_s, q_next_online, q_next_target)
