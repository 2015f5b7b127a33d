r"""Action branching (BDQ): Tavakoli, Pardo & Kormushev 2018, "Action Branching Architectures for
Deep Reinforcement Learning" (AAAI 2018).

A trading action is three sub-actions (:mod:`foxdqn.execution.orders`): exposure (5), order type (3)
and urgency (3). Instead of one output per combination, the network has one branch per
dimension ``d`` on a shared representation; with the dueling aggregation (paper eq. 1, the
"mean advantage" variant)::

    Q_d(s, a_d) = V(s) + ( A_d(s, a_d) − (1/n_d) Σ_{a'} A_d(s, a') )        # [B, n_d] per branch

and without it (``dueling=False``) ``Q_d(s, a_d) = A_d(s, a_d)``.

Joint Q over the 45 factored actions
------------------------------------
The rest of the framework acts, evaluates and monitors with ``argmax`` over ``forward(obs)``
``[B, A]``. :class:`BranchingNetwork` exposes the 45 joint actions
``a = exposure·9 + order_type·3 + urgency`` with the value

    Q(s, a) = (1/D) Σ_d Q_d(s, a_d),      D = 3,

the same mean over branches as the paper's TD target (eq. 6). Because the sum is separable,
``max_a Q(s, a) = (1/D) Σ_d max_{a_d} Q_d(s, a_d)``, attained exactly on the product of the
per-branch argmax sets; the index order is lexicographic in ``(a_1, a_2, a_3)``, so the first
maximiser over 45 (what ``torch.argmax`` returns on ties) is the combination of the first
maximisers of each branch. Hence ``argmax_a Q(s, a) = compose(argmax Q_1, argmax Q_2, argmax
Q_3)`` — in exact arithmetic. In floating point the sum rounds monotonically, so the joint
argmax is always a per-branch-greedy combination up to rounding ties (two combinations whose
sums round to the same float); :meth:`BranchingNetwork.greedy` composes the per-branch
argmaxes directly when that distinction matters.
"""
from __future__ import annotations

import numbers
from typing import Sequence

import torch
from torch import Tensor, nn

__all__ = ["BranchingHead", "BranchingNetwork", "combine_branches", "compose_branches", "factor_branches"]


def _strides(branch_sizes: Sequence[int]) -> list[int]:
    """Row-major strides: the last branch varies fastest (urgency for (5, 3, 3): 9, 3, 1)."""
    strides, s = [], 1
    for n in reversed(branch_sizes):
        strides.append(s)
        s *= n
    return strides[::-1]


def factor_branches(action: Tensor, branch_sizes: Sequence[int]) -> list[Tensor]:
    """Joint action index → per-branch indices (row-major, first branch slowest).

    Args:
        action: int64 ``[B]``, values in ``0..prod(branch_sizes)-1`` (not range-checked).
        branch_sizes: ``(n_1, ..., n_D)``.

    Returns:
        list of D int64 ``[B]`` tensors, ``a_d`` in ``0..n_d-1``. For ``(5, 3, 3)`` this equals
        :func:`foxdqn.execution.orders.factor`. Device ops only.
    """
    out = []
    rest = action
    for stride in _strides(branch_sizes):
        a_d = torch.div(rest, stride, rounding_mode="floor")
        out.append(a_d)
        rest = rest - a_d * stride
    return out


def compose_branches(branch_actions: Sequence[Tensor], branch_sizes: Sequence[int]) -> Tensor:
    """Inverse of :func:`factor_branches`: ``Σ_d a_d · stride_d`` (int64 ``[B]``)."""
    out = None
    for a_d, stride in zip(branch_actions, _strides(branch_sizes)):
        term = a_d * stride
        out = term if out is None else out + term
    return out


def combine_branches(branch_q: Sequence[Tensor]) -> Tensor:
    """Joint Q ``[B, Π n_d]`` = ``(1/D) Σ_d Q_d(s, a_d)`` laid out row-major (first branch slowest).

    Args:
        branch_q: D tensors ``[B, n_d]``, or ``[..., n_d]`` of any leading shape (a population's
            ``[P, B, n_d]``: joint Q ``[P, B, Π n_d]``, each row's own sum).
    """
    D = len(branch_q)
    lead = list(branch_q[0].shape[:-1])
    total = None
    for d, q in enumerate(branch_q):
        shape = lead + [1] * D
        shape[len(lead) + d] = q.shape[-1]
        q = q.reshape(shape)                                                 # (B, 1.., n_d, ..1)
        total = q if total is None else total + q                            # broadcast → (B, n_1, .., n_D)
    return (total / D).reshape(*lead, -1)


class BranchingHead(nn.Module):
    """Per-branch Q values from shared features (BDQ, paper eq. 1 with ``dueling=True``).

    Args:
        in_dim: H, size of the shared features (the encoder's ``out_dim``).
        branch_sizes: ``(n_1, .., n_D)``, sub-actions per branch; trading: (5, 3, 3) =
            (exposure, order type, urgency).
        dueling: shared state value V(s) plus mean-subtracted per-branch advantages (eq. 1);
            ``False``: each branch outputs Q_d directly.
        branch_hidden: 0 (default): each branch (and V) is one Linear on the shared features;
            ``> 0``: one hidden Linear+ReLU layer of this width per branch and for V, like the
            branch-specific hidden layers of the paper's network (``head.branch_hidden``).

    Shapes: ``forward(h)``: float32 ``[B, H]`` → list of D float32 ``[B, n_d]``.

    Raises:
        ValueError: an empty ``branch_sizes``, a size < 1 or a negative ``branch_hidden`` (the
            message names the parameter).
    """

    def __init__(self, in_dim: int, branch_sizes: Sequence[int] = (5, 3, 3), dueling: bool = True,
                 branch_hidden: int = 0):
        super().__init__()
        sizes = tuple(branch_sizes)
        if not sizes or any(isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1 for n in sizes):
            raise ValueError(f"BranchingHead: branch_sizes must be a non-empty list of ints >= 1, "
                             f"got {branch_sizes!r}")
        if isinstance(branch_hidden, bool) or not isinstance(branch_hidden, numbers.Integral) or branch_hidden < 0:
            raise ValueError(f"BranchingHead: branch_hidden must be an int >= 0, got {branch_hidden!r}")
        self.branch_sizes = tuple(int(n) for n in sizes)
        self.dueling = bool(dueling)
        self.num_actions = 1
        for n in self.branch_sizes:
            self.num_actions *= n

        def stream(out: int) -> nn.Module:
            if branch_hidden == 0:
                return nn.Linear(in_dim, out)
            return nn.Sequential(nn.Linear(in_dim, branch_hidden), nn.ReLU(), nn.Linear(branch_hidden, out))

        self.branches = nn.ModuleList(stream(n) for n in self.branch_sizes)
        self.value = stream(1) if self.dueling else None

    def forward(self, h: Tensor) -> list[Tensor]:
        outs = [branch(h) for branch in self.branches]                      # D × (B, n_d)
        if not self.dueling:
            return outs
        v = self.value(h)                                                    # (B, 1)
        return [v + adv - adv.mean(dim=1, keepdim=True) for adv in outs]     # eq. 1


class BranchingNetwork(nn.Module):
    """BDQ network: encoder + :class:`BranchingHead`.

    Methods:
        branch_q(obs): float32 ``[B, D_obs]`` → list of D float32 ``[B, n_d]`` (Q_d per branch).
        forward(obs): float32 ``[B, D_obs]`` → float32 ``[B, Π n_d]`` joint Q
            ``(1/D) Σ_d Q_d(s, a_d)`` at index ``Σ_d a_d · stride_d`` (trading: 45 actions,
            ``exposure·9 + order_type·3 + urgency``); see the module docstring for why its
            argmax is the per-branch argmaxes combined.
        greedy(obs): int64 ``[B]``, per-branch argmaxes composed into the joint index.
    """

    def __init__(self, encoder: nn.Module, head: BranchingHead):
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.branch_sizes = head.branch_sizes
        self.num_actions = head.num_actions

    def branch_q(self, obs: Tensor) -> list[Tensor]:
        return self.head(self.encoder(obs))

    def forward(self, obs: Tensor) -> Tensor:
        return combine_branches(self.branch_q(obs))

    def greedy(self, obs: Tensor) -> Tensor:
        return compose_branches([q.argmax(dim=1) for q in self.branch_q(obs)], self.branch_sizes)
