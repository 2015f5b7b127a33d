"""Layers with a leading member axis: P independent ``nn.Linear`` / ``nn.LayerNorm`` in one module.

Member p's layer is the classic torch layer of the same shape: a Linear's weight is stored
transposed, ``[P, in, out]``, its bias ``[P, 1, out]``, and all members multiply in one
``torch.baddbmm``, or one Triton kernel with the bias and ReLU in its epilogue where the fused
forwards run (:func:`member_linear`); a LayerNorm normalises each row as
``torch.nn.LayerNorm`` does and applies member p's ``[P, 1, C]`` scale and shift (where the fused
forwards run, one kernel, and one for its backward: :func:`foxdqn.ops.member_layer_norm.member_layer_norm`). Inputs and
outputs are ``[P, M, features]``; members never mix (every op is per member or per row).
:meth:`MemberLinear.stack` / :meth:`MemberLayerNorm.stack` copy P classic layers, and
``member_state(p)`` gives member p's parameters back in the classic layer's ``state_dict`` layout.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from foxdqn.ops import member_layer_norm as member_layer_norm_op
from foxdqn.ops import member_linear as member_linear_op
from foxdqn.ops.backend import fused_forward


def member_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, relu: bool = False,
                  residual: torch.Tensor | None = None) -> torch.Tensor:
    """``x [P, M, in] @ w [P, in, out] + b [P, 1, out]`` for every member, then ``relu`` with ``relu``,
    or added to ``residual`` ``[P, M, out]`` (not with ``relu``): in the kernel's epilogue where the
    kernel runs (:func:`foxdqn.ops.member_linear.member_linear`), else torch's add after the
    product; the same sum either way.

    Where the fused forwards run (:func:`~foxdqn.ops.backend.fused_forward`: CUDA), one kernel
    with the bias and ReLU in its epilogue (:func:`foxdqn.ops.member_linear.member_linear`), where
    ``torch.baddbmm`` launches a bias copy and a GEMM and the ReLU a third kernel, for widths the
    kernel is fast at (:func:`~foxdqn.ops.member_linear.member_linear_preferred`: one output or a
    multiple of 4). Its tile may depend on P (fewer rows per program where the grid would leave
    SMs idle), so on CUDA a member of P equals a population of one to float rounding.

    Else one ``baddbmm`` (one member on CUDA: ``addmm``, whose bias cuBLASLt adds in its epilogue;
    ``baddbmm`` launches a copy of the bias first). On CPU a population of one computes its product as a batch of two
    (:func:`~foxdqn.ops.member_linear.member_batched`: the one-column products of the dueling value
    stream or IQL's V would otherwise round as a GEMV, forward and backward, and a member of P would
    not equal a population of one; P = 1 trains only in tests and references: a group of one job
    runs the single-run path).

    Raises:
        ValueError: ``residual`` with ``relu`` (on every path, as the kernel's op refuses it)."""
    if residual is not None and relu:
        raise ValueError("member_linear: a residual is added to the layer's output without a ReLU (relu=False)")
    if member_linear_kernel_taken(x, w, b):
        return member_linear_op.member_linear(x, w, b, relu, residual=residual, backend="triton")
    if x.is_cuda and x.shape[0] == 1 and x.shape[1] > 1 and x.is_contiguous():
        # one member: addmm with the bias in cuBLASLt's epilogue (one kernel), where baddbmm copies the
        # bias into its output before its GEMM; the squeezes and views cost no launch, forward or backward
        y = torch.addmm(b.view(-1), x.squeeze(0), w.squeeze(0)).unsqueeze(0)
    else:
        y = member_linear_op.member_batched(torch.baddbmm, b, x, w)
    if residual is not None:
        return residual + y
    return torch.relu(y) if relu else y


def member_linear_kernel_taken(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether :func:`member_linear` of these arguments runs its kernel (bias in the epilogue) rather
    than ``baddbmm``: the fused forwards run and the kernel takes and is fast at the width."""
    return fused_forward(x) and member_linear_op.member_linear_supported(x, w, b) \
        and member_linear_op.member_linear_preferred(w.shape[-1])


class _TwoProducts(torch.autograd.Function):
    """(x @ w_a, x @ w_b); backward: dx = g_a w_aᵀ, then g_b w_bᵀ accumulated into it by the second
    GEMM (``baddbmm_``), where autograd would launch both products and an add."""

    @staticmethod
    def forward(ctx, x, w_a, w_b):
        ctx.save_for_backward(x, w_a, w_b)
        return member_product(x, w_a), member_product(x, w_b)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_a, g_b):
        x, w_a, w_b = ctx.saved_tensors
        batched = member_linear_op.member_batched
        dx = dw_a = dw_b = None
        if ctx.needs_input_grad[0]:
            dx = batched(torch.bmm, g_a, w_a.transpose(1, 2))
            if dx.is_cuda or dx.shape[0] > 1:
                dx.baddbmm_(g_b, w_b.transpose(1, 2))
            else:  # a population of one on CPU: its product as a batch of two (member_batched), out of place
                dx = batched(torch.baddbmm, dx, g_b, w_b.transpose(1, 2))
        if ctx.needs_input_grad[1]:
            dw_a = batched(torch.bmm, x.transpose(1, 2), g_a)
        if ctx.needs_input_grad[2]:
            dw_b = batched(torch.bmm, x.transpose(1, 2), g_b)
        return dx, dw_a, dw_b


def member_products(x: torch.Tensor, w_a: torch.Tensor, w_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(:func:`member_product` of ``x`` and ``w_a``, of ``x`` and ``w_b``): two heads on one input
    (a dueling C51 head's advantages and value stream). Forward two ``bmm``; backward four GEMMs,
    the second of x's gradient accumulating into the first's output, one launch fewer than
    autograd's sum of the two. Gradients as autograd's of the two products (float rounding: the
    sum rounded in the GEMM's epilogue)."""
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in (x, w_a, w_b)):
        return member_product(x, w_a), member_product(x, w_b)
    return _TwoProducts.apply(x, w_a, w_b)


def member_product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x [P, M, in] @ w [P, in, out]`` for every member, no bias: one ``bmm``
    (:func:`~foxdqn.ops.member_linear.member_batched`). For a consumer that adds the layer's bias as
    it reads the product (:class:`foxdqn.ops.c51_loss.C51Biases`), where ``baddbmm`` would launch
    a copy of the bias into its output before its GEMM."""
    return member_linear_op.member_batched(torch.bmm, x, w)


def member_linear_pair(x_a: torch.Tensor, x_b: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                       relu: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`member_linear` of ``x_a`` ``[P, M_a, in]`` (with gradient) and of ``x_b`` ``[P, M_b, in]``
    (a constant): where :func:`member_linear` takes its kernel for both, one launch
    (:func:`foxdqn.ops.member_linear.member_linear_pair`, the backward over x_a's rows only); else
    the two calls, x_b's under ``torch.no_grad()``."""
    op = member_linear_op
    if fused_forward(x_a) and op.member_linear_preferred(w.shape[-1]) \
            and op.member_linear_supported(x_a, w, b) and op.member_linear_supported(x_b, w, b):
        return op.member_linear_pair(x_a, x_b, w, b, relu, backend="triton")
    with torch.no_grad():
        y_b = member_linear(x_b, w, b, relu)
    return member_linear(x_a, w, b, relu), y_b


class MemberLinear(nn.Module):
    """P ``nn.Linear``: x float32 ``[P, M, in]`` → ``[P, M, out]``.

    Args:
        weight: float32 ``[P, in, out]`` (each member's ``nn.Linear.weight`` transposed).
        bias: float32 ``[P, 1, out]``.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias)

    @classmethod
    def stack(cls, layers: list[nn.Linear]) -> "MemberLinear":
        """P classic layers of one shape, their parameters copied."""
        return cls(torch.stack([m.weight.detach().t() for m in layers]).contiguous(),
                   torch.stack([m.bias.detach()[None] for m in layers]).contiguous())

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ weight + bias``, or ``residual +`` it (:func:`member_linear`)."""
        return member_linear(x, self.weight, self.bias, residual=residual)

    def member_states(self) -> dict[str, torch.Tensor]:
        """Every member's ``weight`` ``[P, out, in]`` and ``bias`` ``[P, out]`` (views: member p's
        is :meth:`member_state`)."""
        return {"weight": self.weight.detach().transpose(1, 2), "bias": self.bias.detach()[:, 0]}

    def member_state(self, p: int) -> dict[str, torch.Tensor]:
        """Member ``p``'s ``weight`` ``[out, in]`` and ``bias`` ``[out]`` (contiguous copies)."""
        return member_copy(self.member_states(), p)


class MemberLayerNorm(nn.Module):
    """P ``nn.LayerNorm(C)``: x float32 ``[P, M, C]`` → ``[P, M, C]``, each row normalised over its
    C features (``F.layer_norm`` without affine), then ``· weight_p + bias_p``.

    Args:
        weight, bias: float32 ``[P, 1, C]``.
        eps: the classic layers' ε.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias)
        self.eps = eps

    @classmethod
    def stack(cls, layers: list[nn.LayerNorm]) -> "MemberLayerNorm":
        """P classic layer norms of one width and ε, their parameters copied.

        Raises:
            ValueError: layer norms of different ε, or without an elementwise affine with bias.
        """
        if len({m.eps for m in layers}) != 1 or any(m.weight is None or m.bias is None for m in layers):
            raise ValueError("MemberLayerNorm: needs LayerNorms of one ε with an elementwise affine and bias")
        return cls(torch.stack([m.weight.detach()[None] for m in layers]).contiguous(),
                   torch.stack([m.bias.detach()[None] for m in layers]).contiguous(), layers[0].eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused_forward(x) and x.dim() == 3 and x.shape[-1] <= member_layer_norm_op.MAX_WIDTH:
            # one kernel, and one for the backward where a gradient is needed
            return member_layer_norm_op.member_layer_norm(x, self.weight, self.bias, self.eps, backend="triton")
        return torch.addcmul(self.bias, F.layer_norm(x, x.shape[-1:], eps=self.eps), self.weight)

    def member_states(self) -> dict[str, torch.Tensor]:
        """Every member's ``weight`` and ``bias`` ``[P, C]`` (views: member p's is :meth:`member_state`)."""
        return {"weight": self.weight.detach()[:, 0], "bias": self.bias.detach()[:, 0]}

    def member_state(self, p: int) -> dict[str, torch.Tensor]:
        """Member ``p``'s ``weight`` and ``bias`` ``[C]`` (contiguous copies)."""
        return member_copy(self.member_states(), p)


def member_copy(states: dict[str, torch.Tensor], p: int) -> dict[str, torch.Tensor]:
    """Member ``p``'s entry of each ``[P, ...]`` tensor of ``states`` (a ``member_states()`` or
    ``member_state_dicts()``), as a contiguous copy."""
    return {key: t[p].clone(memory_format=torch.contiguous_format) for key, t in states.items()}
