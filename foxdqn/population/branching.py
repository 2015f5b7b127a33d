"""P action-branching networks in one module: the BDQ head with a member axis (``action.mode=branching``).

Member p's network is the classic :class:`foxdqn.nn.branching.BranchingNetwork` (Tavakoli, Pardo &
Kormushev 2018, eq. 1: a shared state value V(s) plus mean-subtracted advantages per branch) of an
MLP or attention encoder, with the layers of :class:`~foxdqn.population.network.MemberQNetwork`
(weights ``[P, in, out]``, one ``torch.baddbmm`` per layer for all members): the branches' Linears
(exposure 5, order type 3, urgency 3), then the value Linear. Its joint Q over the 45 factored
actions is the classic one, ``(1/D) Σ_d Q_d(s, a_d)`` (:func:`foxdqn.nn.branching.combine_branches`
with the member axis; without a gradient where the fused kernels run, one kernel after the heads'
Linears, :func:`foxdqn.ops.branching_joint_q.branching_joint_q`), which acting, evaluation, the
ensembles and the monitors read; the loss reads the heads' outputs
(:meth:`MemberBranchingNetwork.head_outputs`, :func:`foxdqn.population.objective.member_branching_loss`).
Members never mix: every op is per member or per row.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from foxdqn.nn.branching import BranchingNetwork, combine_branches
from foxdqn.ops.branching_epsilon_greedy import (MAX_ACTIONS, MAX_BRANCHES, MAX_WIDTH,
                                                 branching_epsilon_greedy)
from foxdqn.ops.backend import fused_forward
from foxdqn.ops.branching_joint_q import branching_joint_q
from foxdqn.ops.member_heads import member_heads, member_heads_supported
from foxdqn.population.network import MemberQNetwork, stack_encoder, stack_linears

#: The branches' and the value's Linear layers through ops/member_heads.py where the fused forwards run
#: (1 launch forward and 2 backward, against 7 and 15 on CUDA through the layers: the branches' widths 5
#: and 3 take ``torch.baddbmm``).
BRANCH_HEAD_KERNELS = True


class MemberBranchingNetwork(MemberQNetwork):
    """P BDQ networks: obs float32 ``[P, M, D]`` → joint Q float32 ``[P, M, Π n_d]``.

    ``branch_q(obs)``: D float32 ``[P, M, n_d]``, ``V + A_d − mean A_d`` per branch (the classic
    head's dueling aggregation; ``dueling`` False: ``A_d``).

    Args:
        weights, biases, activation, prefixes, member_encoder: as :class:`MemberQNetwork` (the head's
            layers: ``branches.0`` .. ``branches.{D−1}``, then with ``dueling`` ``value``).
        dueling: the head has the shared value stream.
        branch_sizes: ``(n_1, .., n_D)`` (trading: (5, 3, 3)).
    """

    def __init__(self, weights: list[torch.Tensor], biases: list[torch.Tensor], activation: str, dueling: bool,
                 prefixes: list[str], branch_sizes: tuple[int, ...], member_encoder: nn.Module | None = None):
        super().__init__(weights, biases, activation, dueling, prefixes, member_encoder)
        self.branch_sizes = tuple(branch_sizes)
        self.num_actions = math.prod(self.branch_sizes)

    @classmethod
    def from_networks(cls, nets: list[BranchingNetwork], activation: str) -> "MemberBranchingNetwork":
        """Stack P classic branching networks of one architecture (their weights are copied).

        Raises:
            ValueError: a network that is not a BranchingNetwork of an MLP or attention encoder, or
                one whose branches have hidden layers (``BranchingHead(branch_hidden > 0)``, which
                no config builds).
        """
        weights, biases, prefixes = stack_linears(nets, (BranchingNetwork,))
        head = nets[0].head
        if any(not isinstance(stream, nn.Linear) for stream in head.branches):
            raise ValueError("MemberBranchingNetwork: needs branches of one Linear each (branch_hidden=0)")
        return cls(weights, biases, activation, head.dueling, prefixes, head.branch_sizes, stack_encoder(nets))

    def q_forward_args(self, obs: torch.Tensor) -> None:
        """None: the fused Q kernels compute a scalar head's Q, not the branches' mean."""
        return None

    def fused_epsilon_greedy(self, obs: torch.Tensor, step: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
                             duration: torch.Tensor, u: torch.Tensor) -> torch.Tensor | None:
        """The collect step's ε-greedy joint actions int64 ``[P·M]`` of obs ``[P, M, D]`` (one
        schedule per member, :func:`foxdqn.step.act.act`'s arguments): the encoder's layers, then
        the branches, the value, the joint Q and the selection in one kernel
        (:func:`foxdqn.ops.branching_epsilon_greedy.branching_epsilon_greedy`); None where the fused
        kernels do not run (:meth:`fusable`) or the sizes exceed the kernel's (H <= 256, at most
        3 branches, Π n_d <= 64)."""
        e, d = self.encoder_layers, len(self.branch_sizes)
        if (not self.fusable(obs) or d > MAX_BRANCHES or self.num_actions > MAX_ACTIONS
                or self.weights[e].shape[1] > MAX_WIDTH):
            return None
        h = self.encoder(obs).contiguous()
        value = [self.weights[-1], self.biases[-1]] if self.dueling else []
        return branching_epsilon_greedy(h, list(self.weights[e:e + d]), list(self.biases[e:e + d]), value, step=step,
                                        start=start, end=end, duration=duration, u=u, backend="triton")

    def head_outputs(self, obs: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """The head's raw outputs of obs ``[P, M, D]``: (the branches' A_d, D float32 ``[P, M, n_d]``;
        V(s) float32 ``[P, M, 1]``, None without ``dueling``): what
        :func:`foxdqn.ops.branching_loss.branching_loss` reads."""
        h = self.encoder(obs)
        e, d = self.encoder_layers, len(self.branch_sizes)
        weights, biases = list(self.weights[e:]), list(self.biases[e:])  # the branches, then the value
        if BRANCH_HEAD_KERNELS and fused_forward(h) and member_heads_supported(h, weights, biases):
            outs = member_heads(h, weights, biases, backend="triton")
            return outs[:d], (outs[d] if self.dueling else None)
        outs = [self.layer(e + i, h) for i in range(d)]
        return outs, (self.layer(-1, h) if self.dueling else None)

    def branch_q(self, obs: torch.Tensor) -> list[torch.Tensor]:
        """Per-branch Q, D float32 ``[P, M, n_d]``, of obs ``[P, M, D]`` (the classic head's, BDQ eq. 1)."""
        outs, v = self.head_outputs(obs)
        if v is None:
            return outs
        return [v + adv - adv.mean(dim=-1, keepdim=True) for adv in outs]

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.fusable(obs) and len(self.branch_sizes) <= MAX_BRANCHES:
            adv, value = self.head_outputs(obs)  # no gradient needed: the aggregation and joint Q one kernel
            return branching_joint_q(adv, value, backend="triton")
        return combine_branches(self.branch_q(obs))
