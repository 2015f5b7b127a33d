"""torch.argmax's rule inside Triton kernels: the first NaN of a row, else the first column of its
maximum, as one reduction of (value, column) pairs.

Shared by :mod:`foxdqn.ops.epsilon_greedy` (the greedy action), :mod:`foxdqn.ops.q_forward` (its
ε-greedy epilogue) and :mod:`foxdqn.ops.dqn_td_loss` (Double DQN's selection by the online net).
Their interpreter tests compare the picks with ``torch.argmax`` on NaN, ±inf, ±0 and ties
(``tests/ops/test_epsilon_greedy.py``, ``test_q_forward_epsilon_greedy.py``, ``test_dqn_td_loss.py``).
"""
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["argmax_combine", "tile_argmax"]


@triton.jit
def argmax_combine(v1, i1, v2, i2):
    """torch.argmax's pick of two (value, column) candidates: a NaN over any number (the first
    NaN of two), else the larger value, ties to the smaller column."""
    nan1 = v1 != v1
    nan2 = v2 != v2
    first = i1 < i2
    take1 = (nan1 & (~nan2 | first)) | (~nan1 & ~nan2 & ((v1 > v2) | ((v1 == v2) & first)))
    return tl.where(take1, v1, v2), tl.where(take1, i1, i2)


@triton.jit
def tile_argmax(v, cols, valid, A):
    """Per row of a tile ``v [R, C]`` (columns ``cols [C]``, entries where ``valid`` is False
    ignored): its value and column under torch.argmax's rule (the first NaN, else the first
    column of the maximum), in one reduction. A row with no valid entry gives (-inf, ``A``)."""
    vals = tl.where(valid, v, float("-inf"))
    idx = tl.where(valid, cols[None, :], A) + tl.zeros(v.shape, tl.int32)
    return tl.reduce((vals, idx), 1, argmax_combine)
