"""Transformer encoder over the trading observation window (pre-LN, learned positions).

The trading observation (:mod:`foxdqn.envs.trading`) is ``[W·F | 2]``: the last ``W`` bars of
``F`` features, flattened row-major with the oldest bar first, then the two account features
(current exposure, unrealised PnL). :class:`AttentionEncoder` reads the window as a sequence of
``W`` tokens::

    x   = obs[:, :W·F].view(B, W, F) @ W_in + b_in + P          # (B, W, width), P learned [W, width]
    x   = x + MHSA(LN(x));  x = x + MLP(LN(x))                  # × layers  (pre-LN block)
    h   = pool_t LN(x)                                          # (B, width): mean over t, or t = W−1
    out = act(Linear([h | obs[:, W·F:]]))                       # (B, width)

The blocks are the Transformer encoder layer of Vaswani et al. 2017 ("Attention Is All You
Need", §3.1–3.3, MLP width 4·width) with layer norm moved in front of each sublayer (pre-LN,
Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture", Fig. 1(b)) and a
final layer norm. There is no causal mask: the whole window is in the past of the decision.

Attention is :func:`torch.nn.functional.scaled_dot_product_attention` (no mask, no dropout inside
it), which picks a kernel from shapes and dtypes on the host and never reads device values:
forward and backward are sync-free and capturable in a CUDA graph in train and eval mode.
``torch.nn.TransformerEncoderLayer`` is not used: in eval mode it may take the "fast path"
(``torch._transformer_encoder_layer_fwd``) whose eligibility tests include tensor-valued checks
and nested-tensor conversion of padding masks.

Dropout (``dropout > 0``, train mode only) is applied to the input embedding, the attention
sublayer output, the MLP hidden layer and the MLP output — not to the attention weights — with
masks drawn from an explicit ``torch.Generator`` (the project's only allowed randomness source):
one ``rand`` per dropout site per forward, so the generator advances by the same amount every
step. To capture a train-mode forward with dropout in a ``torch.cuda.CUDAGraph``, register the
generator first (``graph.register_generator_state(generator)``). A deep copy (the target network)
shares the generator.
"""
from __future__ import annotations

import copy
import math
import numbers

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from foxdqn.nn.mlp import ACTIVATIONS

__all__ = ["AttentionEncoder", "NUM_ACCOUNT_FEATURES"]

NUM_ACCOUNT_FEATURES = 2  # exposure, unrealised PnL (foxdqn.envs.trading observation)


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"AttentionEncoder: {name} must be an int >= 1, got {value!r}")
    return int(value)


def _dropout(x: Tensor, p: float, training: bool, generator: torch.Generator | None) -> Tensor:
    """Inverted dropout with a mask from ``generator`` (identity in eval mode or when p = 0)."""
    if p == 0.0 or not training:
        return x
    if generator is None:
        raise RuntimeError("AttentionEncoder: dropout > 0 in train mode needs a torch.Generator on the "
                           "module's device (constructor argument `generator` or set_generator())")
    keep = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype) >= p
    return x * keep.to(x.dtype) * (1.0 / (1.0 - p))


class _Block(nn.Module):
    """Pre-LN encoder block: x + MHSA(LN(x)), then + MLP(LN(x)). Shapes (B, W, width) → same."""

    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.p = dropout
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: Tensor, generator: torch.Generator | None) -> Tensor:
        B, W, C = x.shape
        p, train = self.p, self.training
        H = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)                          # 3 × (B, W, C)
        q = q.view(B, W, H, C // H).transpose(1, 2)                                # (B, H, W, C/H)
        k = k.view(B, W, H, C // H).transpose(1, 2)
        v = v.view(B, W, H, C // H).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v)                                # (B, H, W, C/H)
        a = a.transpose(1, 2).reshape(B, W, C)
        x = x + _dropout(self.proj(a), p, train, generator)
        h = _dropout(F.gelu(self.fc1(self.ln2(x))), p, train, generator)          # (B, W, 4C)
        return x + _dropout(self.fc2(h), p, train, generator)


class AttentionEncoder(nn.Module):
    """Pre-LN Transformer encoder over the observation window (see the module docstring).

    Args:
        obs_dim: D, must equal ``window * num_features + 2``.
        window: W (``env.window``), bars per observation.
        num_features: F, features per bar.
        width: token width C (``model.width``), also the output size.
        heads: attention heads (``model.heads``); ``width % heads == 0``.
        layers: encoder blocks (``model.layers``, >= 1).
        dropout: dropout probability in ``[0, 1)`` (``model.dropout``); train mode only.
        pooling: ``"mean"`` (average over the W tokens) or ``"last"`` (token of the newest bar)
            (``model.pooling``).
        activation: activation after the output Linear: relu, gelu, tanh, silu
            (``model.activation``).
        generator: ``torch.Generator`` on the module's device, the source of dropout masks
            (needed only when ``dropout > 0`` and the module is in train mode).

    Shapes: ``forward(obs)``: float32 ``[B, D]`` → float32 ``[B, width]``. ``out_dim = width``.

    Raises:
        ValueError: non-positive sizes, ``width % heads != 0``, ``obs_dim != window * num_features + 2``,
            ``dropout`` outside ``[0, 1)``, unknown ``pooling`` or ``activation``, a ``generator`` that
            is not a ``torch.Generator`` (the message names the parameters).
        RuntimeError: forward in train mode with ``dropout > 0`` and no generator.
    """

    def __init__(self, obs_dim: int, window: int, num_features: int, width: int, heads: int, layers: int,
                 dropout: float = 0.0, pooling: str = "mean", activation: str = "relu",
                 generator: torch.Generator | None = None):
        super().__init__()
        window = _positive_int(window, "window")
        num_features = _positive_int(num_features, "num_features")
        width = _positive_int(width, "width")
        heads = _positive_int(heads, "heads")
        layers = _positive_int(layers, "layers")
        obs_dim = _positive_int(obs_dim, "obs_dim")
        if width % heads != 0:
            raise ValueError(f"AttentionEncoder: width={width} must be a multiple of heads={heads}")
        expected = window * num_features + NUM_ACCOUNT_FEATURES
        if obs_dim != expected:
            raise ValueError(
                f"AttentionEncoder: obs_dim must be window * num_features + 2 = "
                f"{window} * {num_features} + 2 = {expected}, got obs_dim={obs_dim}")
        if (isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not math.isfinite(dropout)
                or not 0.0 <= dropout < 1.0):
            raise ValueError(f"AttentionEncoder: dropout must be a number in [0, 1), got {dropout!r}")
        if pooling not in ("mean", "last"):
            raise ValueError(f"AttentionEncoder: pooling must be 'mean' or 'last', got {pooling!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"AttentionEncoder: activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(f"AttentionEncoder: generator must be a torch.Generator, got {type(generator).__name__}")

        self.obs_dim = obs_dim
        self.window = window
        self.num_features = num_features
        self.width = width
        self.heads = heads
        self.pooling = pooling
        self.dropout = float(dropout)
        self.generator = generator
        self.out_dim = width

        self.embed = nn.Linear(num_features, width)
        self.pos = nn.Parameter(torch.randn(window, width) * 0.02)                  # (W, C)
        self.blocks = nn.ModuleList(_Block(width, heads, self.dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.out = nn.Linear(width + NUM_ACCOUNT_FEATURES, width)
        self.act = ACTIVATIONS[activation]()

    def set_generator(self, generator: torch.Generator | None) -> None:
        """Set the dropout generator (e.g. after moving the module to another device)."""
        self.generator = generator

    def __deepcopy__(self, memo):
        # The target network is a deepcopy of the online one: the copy shares the generator
        # (one random stream, registered once with a CUDA graph) and copies everything else.
        if self.generator is not None:
            memo[id(self.generator)] = self.generator
        cls = self.__class__
        new = cls.__new__(cls)
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            new.__dict__[k] = copy.deepcopy(v, memo)
        return new

    def forward(self, obs: Tensor) -> Tensor:
        B = obs.shape[0]
        W, Fn = self.window, self.num_features
        bars = obs[:, : W * Fn].reshape(B, W, Fn)                                   # (B, W, F), oldest first
        account = obs[:, W * Fn:]                                                   # (B, 2)
        gen = self.generator
        x = _dropout(self.embed(bars) + self.pos, self.dropout, self.training, gen)  # (B, W, C)
        for block in self.blocks:
            x = block(x, gen)
        x = self.ln_f(x)
        h = x.mean(dim=1) if self.pooling == "mean" else x[:, -1]                   # (B, C)
        return self.act(self.out(torch.cat([h, account], dim=1)))                   # (B, C)

