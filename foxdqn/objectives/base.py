"""What every objective returns, and the base class the update step calls.

An objective turns a replay :class:`~foxdqn.replay.buffer.Batch` into a scalar loss (all its terms
included), an unweighted |TD| signal per sample for prioritized replay, and the detached Q values
of the sampled states for the Q-value monitor. It keeps references to the online and target
networks; parameters it owns itself (IQL's value network) are listed by :meth:`extra_parameters`
and trained by the same fused Adam, and their target copies by :meth:`polyak_pairs`.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class LossOutput(NamedTuple):
    """loss: float32 0-d, Σ_b weight_b · per_sample_b / B plus extra terms;
    td_abs: float32 [B] detached, unweighted |TD| (the PER priority signal);
    q_values: float32 [B, A] detached expected Q of the sampled states (monitor)."""

    loss: Tensor
    td_abs: Tensor
    q_values: Tensor


class Objective(torch.nn.Module):
    """Base class. Subclasses implement ``forward(batch) -> LossOutput``."""

    def __init__(self, online: torch.nn.Module, target: torch.nn.Module):
        super().__init__()
        # plain attributes, not submodules: the networks are owned by the training state
        self.__dict__["online"] = online
        self.__dict__["target"] = target

    def extra_parameters(self) -> list:
        return []

    def polyak_pairs(self) -> list:
        return []


def weighted_mean(per_sample: Tensor, weight: Tensor) -> Tensor:
    """Σ_b weight_b · per_sample_b / B over the last axis: float32 0-d for one run's ``[B]``, ``[P]``
    for a population's ``[P, B]`` (member p's mean of its own B samples; members never mix).
    ``weight``: float32 of ``per_sample``'s number of elements (a population's ``[P·B]`` rows,
    member-major, are viewed as ``[P, B]``). For ``[B]`` the mean over the last axis is the mean
    over all elements (the same reduction, the same bits)."""
    return (per_sample * weight.view_as(per_sample)).mean(dim=-1)
