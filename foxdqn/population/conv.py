"""The Nature-CNN encoder with a member axis: P conv stacks in one module (``model.encoder=nature_cnn``).

Member p's encoder is the classic :class:`foxdqn.nn.nature_cnn.NatureCNNEncoder` (Mnih et al. 2015,
Methods: conv 32 8×8/4, conv 64 4×4/2, conv 64 3×3/1, each with a ReLU, then the fully connected
``model.hidden`` layers with ReLUs). Its convolution weights are stored with a leading member axis,
``[P, out, in, k, k]`` and biases ``[P, out]`` (so every multi-tensor op of the update reads member
p's slice as it reads a Linear's), its fully connected layers as
:class:`~foxdqn.population.layers.MemberLinear` (``[P, in, out]``, one ``baddbmm`` each).

A convolution of all members (:func:`member_conv2d`) is, on CUDA, one grouped convolution
(``groups=P``) over the members' feature maps concatenated in channels, ``[M, P·C, H, W]``: one
launch per layer for all members. On CPU it is one convolution per member of that member's
``[M, C, H, W]``: oneDNN picks its algorithm by the channel count, and a grouped convolution of the
first layer (P·4 input channels) rounds otherwise for each P (seen for P ≥ 2 in the weight
gradient, P ≥ 3 in the output), while one member's own convolution has the shapes of a population
of one's whatever P is, so member p of P equals its population of one bit for bit on CPU
(docs/design/population.md, contract 4). Members never mix.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from foxdqn.nn.nature_cnn import NatureCNNEncoder
from foxdqn.population.layers import MemberLinear, member_copy


def member_conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, stride: int,
                  grouped: bool | None = None) -> torch.Tensor:
    """Member p's ``F.conv2d(x_p, weight[p], bias[p], stride)`` for every member.

    Args:
        x: float32 ``[M, P·C_in, H, W]``, member p's maps in channels ``p·C_in .. (p+1)·C_in − 1``.
        weight: float32 ``[P, C_out, C_in, k, k]``.  bias: float32 ``[P, C_out]``.
        stride: the convolution's stride (no padding, as the classic encoder's).
        grouped: one grouped convolution (``groups=P``) or one convolution per member; None: grouped
            on CUDA, per member on CPU (module docstring).

    Returns:
        float32 ``[M, P·C_out, H', W']``, member p's maps in channels ``p·C_out .. (p+1)·C_out − 1``.

    Raises:
        ValueError: ``x``'s channels are not P times the weight's input channels.
    """
    p, c_out, c_in = weight.shape[:3]
    if x.dim() != 4 or x.shape[1] != p * c_in:
        raise ValueError(f"member_conv2d: x must be [M, P*C_in, H, W] = [M, {p * c_in}, H, W] for {p} members of "
                         f"{c_in} input channels, got {list(x.shape)}")
    if x.is_cuda if grouped is None else grouped:
        return F.conv2d(x, weight.reshape(p * c_out, c_in, *weight.shape[3:]), bias.reshape(p * c_out),
                        stride=stride, groups=p)
    return torch.cat([F.conv2d(x[:, i * c_in:(i + 1) * c_in], weight[i], bias[i], stride=stride) for i in range(p)],
                     dim=1)


class MemberNatureCNN(nn.Module):
    """P Nature-CNN encoders: obs ``[P, M, C·H·W]`` (uint8 pixel values 0–255, or float in the same
    units, as the replay stores them) → features float32 ``[P, M, hidden[-1]]``.

    Member p computes exactly what :class:`~foxdqn.nn.nature_cnn.NatureCNNEncoder` computes with
    its weights: pixels ÷ 255, the three ReLU convolutions, flattened in ``[C, H, W]`` order, then
    the fully connected ReLU layers.

    Args:
        obs_shape: ``(C, H, W)`` of one observation.
        conv_weights: per convolution, float32 ``[P, out, in, k, k]``.  conv_biases: ``[P, out]``.
        strides: per convolution, its stride.
        fc: the fully connected layers (:class:`~foxdqn.population.layers.MemberLinear`).
        grouped: as :func:`member_conv2d` (None: grouped on CUDA, per member on CPU).

    Build it from P classic encoders with :meth:`stack`; :meth:`member_state_dict` gives member p's
    parameters back in the classic encoder's ``state_dict`` layout (``conv.0.weight``, ...,
    ``fc.0.weight``, ...).
    """

    def __init__(self, obs_shape: tuple[int, int, int], conv_weights: list[torch.Tensor],
                 conv_biases: list[torch.Tensor], strides: list[int], fc: list[MemberLinear],
                 grouped: bool | None = None):
        super().__init__()
        self.obs_shape = tuple(int(v) for v in obs_shape)
        self.conv_weights = nn.ParameterList([nn.Parameter(w) for w in conv_weights])
        self.conv_biases = nn.ParameterList([nn.Parameter(b) for b in conv_biases])
        self.strides = list(strides)
        self.fc = nn.ModuleList(fc)
        self.grouped = grouped
        self.num_members = conv_weights[0].shape[0]
        self.out_dim = fc[-1].weight.shape[-1] if fc else None

    #: indices of the classic encoder's ``conv`` Sequential holding its three convolutions
    CONV_INDICES = (0, 2, 4)

    @classmethod
    def stack(cls, encoders: list[NatureCNNEncoder], grouped: bool | None = None) -> "MemberNatureCNN":
        """P classic encoders of one shape (their parameters copied), member p from ``encoders[p]``.

        Raises:
            ValueError: encoders of different observation shapes, or not :class:`NatureCNNEncoder`.
        """
        if any(not isinstance(e, NatureCNNEncoder) for e in encoders):
            raise ValueError("MemberNatureCNN.stack: needs NatureCNNEncoder encoders")
        if len({e.obs_shape for e in encoders}) != 1:
            raise ValueError(f"MemberNatureCNN.stack: encoders of different obs_shape {[e.obs_shape for e in encoders]}")
        convs = [[e.conv[i] for i in cls.CONV_INDICES] for e in encoders]
        weights = [torch.stack([c[j].weight.detach() for c in convs]).contiguous() for j in range(3)]
        biases = [torch.stack([c[j].bias.detach() for c in convs]).contiguous() for j in range(3)]
        strides = [int(convs[0][j].stride[0]) for j in range(3)]
        linears = [[m for m in e.fc if isinstance(m, nn.Linear)] for e in encoders]
        fc = [MemberLinear.stack([ls[j] for ls in linears]) for j in range(len(linears[0]))]
        return cls(encoders[0].obs_shape, weights, biases, strides, fc, grouped=grouped)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        p, m = obs.shape[0], obs.shape[1]
        c, h, w = self.obs_shape
        x = obs.reshape(p, m, c, h, w).to(torch.float32) / 255.0
        x = x.transpose(0, 1).reshape(m, p * c, h, w)  # the members' maps side by side in channels
        for weight, bias, stride in zip(self.conv_weights, self.conv_biases, self.strides):
            x = torch.relu(member_conv2d(x, weight, bias, stride, self.grouped))
        x = x.reshape(m, p, -1).transpose(0, 1).contiguous()  # [P, M, C'·H'·W']: each member's maps, flattened as nn.Flatten
        for layer in self.fc:
            x = torch.relu(layer(x))
        return x

    def pruned_matrices(self) -> list[tuple[nn.Parameter, bool]]:
        """(weight, transposed) of what a single run's magnitude pruner prunes (its parameters of 2 or
        more dimensions), in the classic encoder's parameter order: the convolution weights
        ``[P, out, in, k, k]`` (transposed False: member p's slice is the classic layout), then the
        fully connected weights ``[P, in, out]`` (transposed True: the classic ``[out, in]``
        transposed; :class:`foxdqn.population.pruning.MemberPruner`)."""
        return [(w, False) for w in self.conv_weights] + [(layer.weight, True) for layer in self.fc]

    def member_state_dicts(self) -> dict[str, torch.Tensor]:
        """Every member's parameters in :class:`NatureCNNEncoder`'s ``state_dict`` layout, each with a
        leading member axis ``[P, ...]`` (views: member p's is :meth:`member_state_dict`)."""
        out = {}
        for i, weight, bias in zip(self.CONV_INDICES, self.conv_weights, self.conv_biases):
            out[f"conv.{i}.weight"] = weight.detach()
            out[f"conv.{i}.bias"] = bias.detach()
        for j, layer in enumerate(self.fc):
            for key, t in layer.member_states().items():
                out[f"fc.{2 * j}.{key}"] = t
        return out

    def member_state_dict(self, p: int) -> dict[str, torch.Tensor]:
        """Member ``p``'s parameters in :class:`NatureCNNEncoder`'s ``state_dict`` layout (contiguous copies)."""
        return member_copy(self.member_state_dicts(), p)
