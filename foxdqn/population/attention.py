"""P attention encoders in one module: :class:`foxdqn.nn.attention.AttentionEncoder` with a member axis.

Member p's encoder is the classic pre-LN Transformer encoder over the trading observation window
(Vaswani et al. 2017, §3.1–3.3, with layer norm in front of each sublayer, Xiong et al. 2020,
Fig. 1(b); module docstring of :mod:`foxdqn.nn.attention`), with the same parameters and the same
math: the W bars of each observation are tokens, embedded by a Linear plus learned positions,
passed through the blocks (multi-head self-attention, then a GELU MLP of width 4·C, each added to
its input), normalised, pooled (mean over the tokens or the newest one) and, with the two account
features, mapped by the output Linear and activation. Every Linear is a
:class:`~foxdqn.population.layers.MemberLinear` (one ``baddbmm`` for all members), every layer norm
a :class:`~foxdqn.population.layers.MemberLayerNorm`, the positions are ``[P, W, C]``, and the
attention is one ``scaled_dot_product_attention`` over the ``P·M`` sequences (no mask, no dropout,
as the classic module's). Members never mix: member p's features read only its parameters and
observations. Where the fused forwards run (:func:`foxdqn.ops.backend.fused_forward`), the encoder
without gradient is :func:`foxdqn.ops.member_attention_encoder.member_attention_encoder` (one kernel
per block and one for the pooling), and each block with a gradient to come is
:func:`foxdqn.ops.member_attention_block.member_attention_block` (one kernel, two for its backward;
the first with the embedding and positions inside).

:meth:`MemberAttentionEncoder.stack` copies P classic encoders (so member p starts from the weights a
single run of its seed builds); :meth:`MemberAttentionEncoder.member_state_dict` gives member p's
parameters back under the classic encoder's ``state_dict`` keys. Dropout is not supported (no
config sets ``AttentionEncoder``'s ``dropout``: it stays 0).
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from foxdqn.nn.attention import AttentionEncoder
from foxdqn.nn.mlp import ACTIVATIONS
from foxdqn.nn.qnet import forward_hooked
from foxdqn.ops import member_attention_block as block_op
from foxdqn.ops import member_attention_encoder as encoder_op
from foxdqn.ops.backend import fused_forward
from foxdqn.population.layers import MemberLayerNorm, MemberLinear, member_copy

#: The activation of each ``model.activation`` class (the fused forward's names).
_ACTIVATION_NAMES = {cls: name for name, cls in ACTIVATIONS.items()}

#: The classic block's layers, each a Linear or a LayerNorm (foxdqn.nn.attention._Block).
_BLOCK_LAYERS = ("ln1", "qkv", "proj", "ln2", "fc1", "fc2")


def _stack(layers: list[nn.Module]) -> nn.Module:
    return (MemberLinear if isinstance(layers[0], nn.Linear) else MemberLayerNorm).stack(layers)


class MemberAttentionBlock(nn.Module):
    """P pre-LN blocks: x float32 ``[P, M·W, C]`` (M sequences of W tokens per member) → the same
    shape, ``x + proj(MHSA(ln1(x)))``, then ``+ fc2(GELU(fc1(ln2(x))))``. Submodules are named as
    the classic block's (``ln1``, ``qkv``, ``proj``, ``ln2``, ``fc1``, ``fc2``)."""

    def __init__(self, layers: dict[str, nn.Module], heads: int):
        super().__init__()
        for name in _BLOCK_LAYERS:
            self.add_module(name, layers[name])
        self.heads = heads

    def forward(self, x: torch.Tensor, sequences: int) -> torch.Tensor:
        weights = self._fused_weights(x, sequences)
        if weights is not None:  # one kernel, two for the backward (foxdqn.ops.member_attention_block)
            return block_op.member_attention_block(x, weights, sequences, self.heads, backend="triton")
        p, rows, c = x.shape
        w, h = rows // sequences, self.heads
        q, k, v = (t.reshape(p * sequences, w, h, c // h).transpose(1, 2)  # (P·M, H, W, C/H)
                   for t in self.qkv(self.ln1(x)).split(c, dim=2))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(p, rows, c)
        x = self.proj(a, residual=x)  # x + proj(a): the residual added in the layer's kernel
        return self.fc2(F.gelu(self.fc1(self.ln2(x))), residual=x)

    def weights(self) -> encoder_op.BlockWeights:
        """The block's parameters as the fused ops take them."""
        return encoder_op.BlockWeights(self.ln1.weight, self.ln1.bias, self.qkv.weight, self.qkv.bias,
                                       self.proj.weight, self.proj.bias, self.ln2.weight, self.ln2.bias,
                                       self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias,
                                       self.ln1.eps, self.ln2.eps)

    def _fused_weights(self, x: torch.Tensor, sequences: int, embed: tuple | None = None,
                       hooked: tuple[nn.Module, ...] = ()) -> encoder_op.BlockWeights | None:
        """:meth:`weights` where :func:`foxdqn.ops.member_attention_block.member_attention_block` runs
        for ``x`` (and ``embed``), else None (the layers run): the fused forwards do not run
        (:func:`~foxdqn.ops.backend.fused_forward`), a forward hook would run in one of the block's
        modules or in ``hooked`` (:func:`foxdqn.nn.qnet.forward_hooked`), or the op does not take
        the sizes."""
        if not fused_forward(x) or forward_hooked([self, *hooked]):
            return None
        weights = self.weights()
        supported = block_op.member_attention_block_supported(x, weights, sequences, self.heads, embed)
        return weights if supported else None


class MemberAttentionEncoder(nn.Module):
    """P attention encoders: obs float32 ``[P, M, D]`` (D = W·F + 2) → features float32 ``[P, M, C]``.

    Build it with :meth:`stack`. Parameters (module names as the classic encoder's): ``embed``
    (Linear F → C), ``pos`` ``[P, W, C]``, ``blocks.i`` (:class:`MemberAttentionBlock`), ``ln_f``,
    ``out`` (Linear C + 2 → C). ``out_dim`` = C.
    """

    def __init__(self, embed: MemberLinear, pos: torch.Tensor, blocks: list[MemberAttentionBlock],
                 ln_f: MemberLayerNorm, out: MemberLinear, window: int, num_features: int, pooling: str,
                 act: nn.Module):
        super().__init__()
        self.embed = embed
        self.pos = nn.Parameter(pos)
        self.blocks = nn.ModuleList(blocks)
        self.ln_f = ln_f
        self.out = out
        self.act = act
        self.window, self.num_features, self.pooling = window, num_features, pooling
        self.out_dim = pos.shape[-1]

    @classmethod
    def stack(cls, encoders: list[AttentionEncoder]) -> "MemberAttentionEncoder":
        """P classic encoders of one architecture, their parameters copied.

        Raises:
            ValueError: encoders of different sizes, pooling or activation, or with dropout > 0.
        """
        first = encoders[0]
        shape = [(e.window, e.num_features, e.width, e.heads, len(e.blocks), e.pooling, type(e.act), e.obs_dim)
                 for e in encoders]
        if len(set(shape)) != 1:
            raise ValueError(f"MemberAttentionEncoder: needs AttentionEncoders of one architecture, got {shape}")
        if any(e.dropout > 0 for e in encoders):
            raise ValueError("MemberAttentionEncoder: dropout > 0 is not supported")
        blocks = [MemberAttentionBlock({name: _stack([getattr(e.blocks[i], name) for e in encoders])
                                        for name in _BLOCK_LAYERS}, first.heads) for i in range(len(first.blocks))]
        pos = torch.stack([e.pos.detach() for e in encoders]).contiguous()
        return cls(_stack([e.embed for e in encoders]), pos, blocks, _stack([e.ln_f for e in encoders]),
                   _stack([e.out for e in encoders]), first.window, first.num_features, first.pooling,
                   copy.deepcopy(first.act))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        fused = self._fused_args(obs)
        if fused is not None:  # no gradient where the fused forwards run: len(blocks) + 1 kernels
            return encoder_op.member_attention_encoder(*fused, backend="triton")
        p, m = obs.shape[:2]
        w, f, c = self.window, self.num_features, self.out_dim
        bars = obs[..., : w * f].reshape(p, m * w, f)  # (P, M·W, F), oldest bar first
        account = obs[..., w * f:]  # (P, M, 2)
        blocks = list(self.blocks)
        embed = (self.embed.weight, self.embed.bias, self.pos)
        first = blocks[0]._fused_weights(obs, m, embed, (self.embed,)) if blocks else None
        if first is not None:  # the embedding inside the first block's kernels
            x = block_op.member_attention_block(obs, first, m, blocks[0].heads, embed=embed, backend="triton")
            blocks = blocks[1:]
        else:
            x = (self.embed(bars).view(p, m, w, c) + self.pos[:, None]).view(p, m * w, c)
        for block in blocks:
            x = block(x, m)
        x = self.ln_f(x).view(p, m, w, c)
        h = x.mean(dim=2) if self.pooling == "mean" else x[:, :, -1]  # (P, M, C)
        return self.act(self.out(torch.cat([h, account], dim=-1)))

    def _fused_args(self, obs: torch.Tensor) -> tuple | None:
        """The arguments of :func:`foxdqn.ops.member_attention_encoder.member_attention_encoder` for
        ``obs``, or None where the module's torch path runs: a gradient is needed, the fused forwards
        do not run (:func:`~foxdqn.ops.backend.fused_forward`), a forward hook would run in one of
        its modules (:func:`foxdqn.nn.qnet.forward_hooked`: the kernels would skip it), or the op
        does not take the sizes."""
        if torch.is_grad_enabled() or not fused_forward(obs) or forward_hooked([self]):
            return None
        act = _ACTIVATION_NAMES.get(type(self.act))
        if act is None or getattr(self.act, "approximate", "none") != "none":
            return None
        blocks = [b.weights() for b in self.blocks]
        args = (obs, self.embed.weight, self.embed.bias, self.pos, blocks,
                (self.ln_f.weight, self.ln_f.bias, self.ln_f.eps), self.out.weight, self.out.bias,
                self.blocks[0].heads if blocks else 1, self.pooling, act)
        return args if encoder_op.member_attention_encoder_supported(*args) else None

    def pruned_matrices(self) -> list[tuple[nn.Parameter, bool]]:
        """(weight, transposed) of what a single run's magnitude pruner prunes (the classic
        encoder's parameters of 2 or more dimensions), in its parameter order (a module's own
        parameters before its children's): ``pos`` ``[P, W, C]`` (transposed False: member p's
        slice is the classic layout), ``embed.weight``, each
        block's ``qkv``, ``proj``, ``fc1`` and ``fc2`` weights, ``out.weight`` (MemberLinear weights
        ``[P, in, out]``, transposed True: the classic ``[out, in]`` transposed;
        :class:`foxdqn.population.pruning.MemberPruner`). Layer norms and biases are vectors: never pruned."""
        blocks = [(getattr(block, name).weight, True) for block in self.blocks for name in ("qkv", "proj", "fc1", "fc2")]
        return [(self.pos, False), (self.embed.weight, True), *blocks, (self.out.weight, True)]

    def member_state_dicts(self) -> dict[str, torch.Tensor]:
        """Every member's parameters under the classic :class:`AttentionEncoder`'s ``state_dict``
        keys (``embed.weight``, ``pos``, ``blocks.0.qkv.bias``, ...), each with a leading member
        axis ``[P, ...]`` (views: member p's is :meth:`member_state_dict`)."""
        out = {"pos": self.pos.detach()}
        for name, module in self.named_modules():
            if isinstance(module, (MemberLinear, MemberLayerNorm)):
                out.update({f"{name}.{key}": t for key, t in module.member_states().items()})
        return out

    def member_state_dict(self, p: int) -> dict[str, torch.Tensor]:
        """Member ``p``'s parameters under the classic :class:`AttentionEncoder`'s ``state_dict``
        keys (contiguous copies)."""
        return member_copy(self.member_state_dicts(), p)

