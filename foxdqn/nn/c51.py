"""C51 categorical distributional head and network.

Bellemare, Dabney & Munos (2017), "A Distributional Perspective on Reinforcement Learning",
§4: the return distribution Z(s, a) is a categorical over a fixed support of K atoms

    z_k = v_min + k · Δz,   Δz = (v_max − v_min) / (K − 1),   k = 0 .. K−1,
    p_k(s, a) = softmax_k(logits(s, a)),   Q(s, a) = Σ_k p_k(s, a) z_k.

The dueling variant is the one of Rainbow (Hessel et al. 2018, §"Dueling networks"): a value
stream v(s) ∈ R^K and an advantage stream a(s, ·) ∈ R^{A×K} combined per atom *before* the softmax,

    logits_k(s, a) = v_k(s) + a_k(s, a) − (1/A) Σ_a' a_k(s, a').

Config keys (``head:`` group): ``atoms`` (K), ``v_min``, ``v_max`` (return units, the same units
as the n-step reward sum R), ``dueling``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def check_c51_support(atoms: int, v_min: float, v_max: float) -> None:
    """Validate a C51 support.

    Raises:
        ValueError: ``atoms`` not an int >= 2; ``v_min`` / ``v_max`` not finite; ``v_min`` >= ``v_max``
            (the message names the parameter).
    """
    if isinstance(atoms, bool) or not isinstance(atoms, int) or atoms < 2:
        raise ValueError(f"C51Head: atoms must be an int >= 2, got {atoms!r}")
    for name, v in (("v_min", v_min), ("v_max", v_max)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"C51Head: {name} must be a finite number, got {v!r}")
    if not v_min < v_max:
        raise ValueError(f"C51Head: v_min must be < v_max, got v_min={v_min!r}, v_max={v_max!r}")


class C51Head(nn.Module):
    """Features [B, H] → per-action atom logits [B, A, K] (float32).

    Args:
        in_dim: feature size H (the encoder's ``out_dim``).
        num_actions: A.
        atoms: K >= 2 (config ``head.atoms``; 51 in the paper).
        v_min, v_max: support bounds in return units, finite, v_min < v_max
            (``head.v_min`` / ``head.v_max``; ±10 in the paper).
        dueling: Rainbow's dueling streams over logits (``head.dueling``).

    Raises:
        ValueError: invalid ``atoms``, ``v_min`` or ``v_max`` (see :func:`check_c51_support`).
    """

    def __init__(self, in_dim: int, num_actions: int, atoms: int = 51, v_min: float = -10.0,
                 v_max: float = 10.0, dueling: bool = False):
        super().__init__()
        check_c51_support(atoms, v_min, v_max)
        self.num_actions = num_actions
        self.atoms = atoms
        self.v_min = float(v_min)
        self.v_max = float(v_max)
        self.dueling = bool(dueling)
        if self.dueling:
            self.value = nn.Linear(in_dim, atoms)
            self.advantage = nn.Linear(in_dim, num_actions * atoms)
        else:
            self.logits = nn.Linear(in_dim, num_actions * atoms)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        B = h.shape[0]
        if self.dueling:
            v = self.value(h)[:, None, :]  # (B, 1, K)
            adv = self.advantage(h).view(B, self.num_actions, self.atoms)  # (B, A, K)
            return v + adv - adv.mean(dim=1, keepdim=True)  # (B, A, K), Rainbow dueling
        return self.logits(h).view(B, self.num_actions, self.atoms)  # (B, A, K)


class C51Network(nn.Module):
    """Encoder + :class:`C51Head`.

    ``forward(obs)``: obs float32 [B, D] → expected Q float32 [B, A], Q = Σ_k softmax(logits)_k z_k
    (used for acting, evaluation and Double DQN action selection).
    ``logits(obs)``: float32 [B, A, K] unnormalised atom logits.
    Buffer ``support``: float32 [K], z_k = v_min + k Δz (same formula as
    :func:`foxdqn.ops.c51_project.c51_project`; not saved in the state dict, it comes from the config).
    Attributes ``atoms``, ``v_min``, ``v_max``, ``num_actions`` mirror the head.
    """

    def __init__(self, encoder: nn.Module, head: C51Head):
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.atoms = head.atoms
        self.v_min = head.v_min
        self.v_max = head.v_max
        self.num_actions = head.num_actions
        dz = (head.v_max - head.v_min) / (head.atoms - 1)
        support = torch.arange(head.atoms, dtype=torch.float32) * dz + head.v_min  # (K,)
        self.register_buffer("support", support, persistent=False)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(obs))  # (B, A, K)

    def expected_q(self, logits: torch.Tensor) -> torch.Tensor:
        """Q [..., A] = Σ_k softmax(logits [..., A, K])_k z_k (differentiable)."""
        return (F.softmax(logits, dim=-1) * self.support).sum(dim=-1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.expected_q(self.logits(obs))  # (B, A)
