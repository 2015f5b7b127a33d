"""Implicit Quantile Network head and network.

Dabney, Ostrovski, Silver & Munos (2018), "Implicit Quantile Networks for Distributional
Reinforcement Learning", §3.1. The network maps (s, τ) to the τ-quantile of the return,
Z_τ(s, a) ≈ f(ψ(s) ⊙ φ(τ))_a, with

    φ_j(τ) = ReLU( Σ_{i=0}^{n−1} cos(π i τ) w_ij + b_j ),   j = 1 .. H          (IQN eq. 4)

ψ is the encoder (features of width H), ⊙ the elementwise product and f the layers after the
merge: here one hidden Linear(H, H) + ReLU and an output layer, as the fully connected part of
the paper's network (without it the quantiles would be a single linear read-out of ψ ⊙ φ).

Acting / evaluation: Q(s, a) = (1/K) Σ_k Z_{τ_k}(s, a) with the fixed midpoints
τ_k = (k + 0.5) / K. The paper samples τ̃_k ~ U(0, 1) for each decision (risk-neutral β); the
midpoints are the midpoint-rule estimate of the same integral E[Z] = ∫₀¹ F⁻¹(τ) dτ, they make
``forward`` deterministic (greedy actions and evaluation do not jitter with the τ draw, and no
generator is needed inside it), and they have lower variance for the same K.

Config keys (``head:`` group): ``embedding_dim`` (n, 64 in the paper), ``dueling``,
``num_quantiles_policy`` (K, 32 in the paper).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def check_positive_int(name: str, value) -> None:
    """Raise ValueError naming the parameter ``name`` (e.g. ``"IQNHead: embedding_dim"``) unless
    ``value`` is an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


class CosineEmbedding(nn.Module):
    """IQN eq. 4: τ [B, N] (float32 in [0, 1]) → φ(τ) [B, N, out_dim] (float32, >= 0).

    φ_j(τ) = ReLU(Σ_{i=0}^{n−1} cos(π i τ) w_ij + b_j); ``linear.weight[j, i]`` is w_ij,
    ``linear.bias[j]`` is b_j.

    Args:
        embedding_dim: n >= 1, number of cosine basis functions (``head.embedding_dim``).
        out_dim: H, the width of the state features it multiplies.

    Raises:
        ValueError: ``embedding_dim`` < 1.
    """

    def __init__(self, embedding_dim: int, out_dim: int):
        super().__init__()
        check_positive_int("CosineEmbedding: embedding_dim", embedding_dim)
        self.embedding_dim = embedding_dim
        pi_i = torch.arange(embedding_dim, dtype=torch.float32) * math.pi  # (n,) π·i, i = 0..n−1
        self.register_buffer("pi_i", pi_i, persistent=False)
        self.linear = nn.Linear(embedding_dim, out_dim)

    def forward(self, taus: torch.Tensor) -> torch.Tensor:
        cos = torch.cos(taus[..., None] * self.pi_i)  # (B, N, n)
        return F.relu(self.linear(cos))  # (B, N, H)


class IQNHead(nn.Module):
    """(features [B, H], τ [B, N]) → quantile values [B, N, A] (float32, return units).

    Z_τ(s, ·) = f(ψ(s) ⊙ φ(τ)), f = Linear(H, H) + ReLU, then either Linear(H, A) or, with
    ``dueling``, the dueling combination V_τ(s) + A_τ(s, a) − mean_a' A_τ(s, a') per τ
    (Wang et al. 2016, eq. 9).

    Args:
        in_dim: H, the encoder's ``out_dim``.
        num_actions: A.
        embedding_dim: n, cosine basis size (``head.embedding_dim``, default 64).
        dueling: dueling output (``head.dueling``).

    Raises:
        ValueError: ``embedding_dim`` < 1.
    """

    def __init__(self, in_dim: int, num_actions: int, embedding_dim: int = 64, dueling: bool = False):
        super().__init__()
        self.num_actions = num_actions
        self.dueling = bool(dueling)
        self.embedding = CosineEmbedding(embedding_dim, in_dim)
        self.hidden = nn.Linear(in_dim, in_dim)
        if self.dueling:
            self.value = nn.Linear(in_dim, 1)
            self.advantage = nn.Linear(in_dim, num_actions)
        else:
            self.out = nn.Linear(in_dim, num_actions)

    def forward(self, h: torch.Tensor, taus: torch.Tensor) -> torch.Tensor:
        x = h[:, None, :] * self.embedding(taus)  # (B, N, H) ψ(s) ⊙ φ(τ)
        x = F.relu(self.hidden(x))  # (B, N, H)
        if self.dueling:
            adv = self.advantage(x)  # (B, N, A)
            return self.value(x) + adv - adv.mean(dim=-1, keepdim=True)
        return self.out(x)  # (B, N, A)


class IQNNetwork(nn.Module):
    """Encoder + :class:`IQNHead`.

    ``quantiles(obs, taus)``: obs float32 [B, D], taus float32 [B, N] in [0, 1] →
    Z_τ(s, a) float32 [B, N, A].
    ``forward(obs)``: obs [B, D] → expected Q [B, A] = mean of Z over the K fixed midpoints
    τ_k = (k + 0.5)/K (buffer ``policy_taus`` [K]); deterministic, see the module docstring.

    Args:
        encoder: obs [B, D] → features [B, H], with ``out_dim`` = H.
        head: an :class:`IQNHead` built with ``in_dim`` = H.
        num_quantiles_policy: K >= 1 (``head.num_quantiles_policy``, 32 in the paper).

    Raises:
        ValueError: ``num_quantiles_policy`` < 1.
    """

    def __init__(self, encoder: nn.Module, head: IQNHead, num_quantiles_policy: int = 32):
        super().__init__()
        check_positive_int("IQNNetwork: num_quantiles_policy", num_quantiles_policy)
        self.encoder = encoder
        self.head = head
        self.num_actions = head.num_actions
        self.num_quantiles_policy = num_quantiles_policy
        k = torch.arange(num_quantiles_policy, dtype=torch.float32)
        self.register_buffer("policy_taus", (k + 0.5) / num_quantiles_policy, persistent=False)  # (K,)

    def quantiles(self, obs: torch.Tensor, taus: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(obs), taus)  # (B, N, A)

    def policy_q(self, h: torch.Tensor) -> torch.Tensor:
        """Expected Q [B, A] from encoder features h [B, H] (mean over the K midpoints)."""
        taus = self.policy_taus.expand(h.shape[0], self.num_quantiles_policy)  # (B, K)
        return self.head(h, taus).mean(dim=1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.policy_q(self.encoder(obs))  # (B, A)
