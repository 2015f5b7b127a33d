"""P Q-networks in one module: an MLP or attention encoder and a Q or dueling head with a member axis.

Member p's network is the classic :class:`foxdqn.nn.qnet.QNetwork` of
:class:`~foxdqn.nn.mlp.MLPEncoder` (or :class:`~foxdqn.nn.attention.AttentionEncoder`:
:class:`~foxdqn.population.attention.MemberAttentionEncoder`, ``model.encoder=attention``) and
:class:`~foxdqn.nn.heads.QHead` / :class:`~foxdqn.nn.heads.DuelingHead` (Wang et al. 2016, eq. 9):
every linear layer's weight is stored transposed with a leading member axis, ``[P, in, out]``, its
bias as ``[P, 1, out]``, and the forward pass is one ``torch.baddbmm`` per layer for the whole
population (docs/design/population.md). On CUDA, where no gradient is needed (the collect step,
the target network, evaluation) and the network is a ReLU MLP of 1 or 2 hidden layers of width
<= 256 with a dueling head of at most 64 actions, the whole forward of all P members is one kernel
(:func:`foxdqn.ops.q_forward.q_forward`; measured at ``eurusd_dqn``'s shape, 8 members of 512
rows: 24.5 µs against 63 for the layers below, docs/bench.md#kernels). A plain Q head (the
CartPole populations) of a ReLU MLP of 1 to 4 layers, every width <= 128, runs on CUDA as
:func:`foxdqn.ops.member_mlp_chain.member_mlp_chain` (:meth:`MemberQNetwork.chain_args`): the
update's online forward with gradient is one kernel and its backward two (issue 33: the layers'
batched GEMMs, ReLUs and autograd's elementwise kernels over ``[P, B, hidden]``), the target
network's forward one kernel; the collect step's action selection fuses it too
(:meth:`MemberQNetwork.acting_chain_args`: the chain and the ε-greedy selection in one kernel). A
plain head wider than that acts through its layers and the ε-greedy kernel. With
:data:`DUELING_HEAD_KERNELS` (on; its comment has the timing) a dueling head's two streams and their
combine run, where a gradient is needed, as one kernel forward and two backward
(:func:`foxdqn.ops.member_dueling_head.member_dueling_head`; four and eight through the layers).
On the CPU (outside :func:`foxdqn.ops.backend.cpu_kernels`) the layers run, so that a member
equals a population of one bit for bit (:meth:`MemberQNetwork.layer`). Members never mix: member
p's outputs read only member p's parameters and inputs.

:meth:`MemberQNetwork.from_networks` stacks P classic networks (so a member starts from exactly
the weights a single run of its seed would, :func:`foxdqn.step.build.build_network`);
:meth:`MemberQNetwork.member_state_dict` gives member p's weights back in the classic network's
``state_dict`` layout (evaluation, checkpoints). :class:`MemberValueNetwork` is the same for IQL's
value network V(s) (``objective.iql``): an MLP or attention encoder and one output.
:meth:`MemberQNetwork.layer` and :meth:`MemberQNetwork.encoder` are the pieces the distributional
and branching heads' member networks reuse (:mod:`foxdqn.population.distributional`,
:mod:`foxdqn.population.branching`).
"""
from __future__ import annotations

import torch
from torch import nn

from foxdqn.nn.attention import AttentionEncoder
from foxdqn.nn.heads import DuelingHead
from foxdqn.nn.iql_value import IQLValueNetwork
from foxdqn.nn.mlp import ACTIVATIONS, MLPEncoder
from foxdqn.nn.qnet import QNetwork, forward_hooked
from foxdqn.ops.backend import fused_forward
from foxdqn.ops.dueling_combine import dueling_combine
from foxdqn.ops.member_dueling_head import member_dueling_head, member_dueling_head_supported
from foxdqn.ops.member_mlp_chain import (ChainGradNorm, member_mlp_chain, member_mlp_chain_split,
                                         member_mlp_chain_supported)
from foxdqn.ops.q_forward import q_forward, q_forward_supported
from foxdqn.nn.nature_cnn import NatureCNNEncoder
from foxdqn.population.attention import MemberAttentionEncoder
from foxdqn.population.conv import MemberNatureCNN
from foxdqn.population.layers import member_copy, member_linear, member_linear_pair

#: A dueling head's streams and combine through ops/member_dueling_head.py (1 launch forward, 2 backward)
#: instead of their layers (4 and 8 on CUDA: 9 kernels fewer per update). The op's second version (weight
#: tiles straight into tl.dot) made ``eurusd_dqn``'s network forward + backward 0.71, 0.83 and 0.89 of the
#: layers' time at 1, 64 and 512 members on an H100 (its first version: 1.08–1.45×; docs/bench.md#kernels).
DUELING_HEAD_KERNELS = True

#: Classic encoders whose member version is one module (:func:`stack_encoder`), not layers of ``weights``.
MODULE_ENCODERS = (AttentionEncoder, NatureCNNEncoder)


def _linears(net: nn.Module) -> list[tuple[str, nn.Linear]]:
    """(state_dict prefix, layer) of a classic network with an MLP, attention or Nature-CNN encoder,
    input to output: an MLP encoder's layers (the other encoders' are :func:`stack_encoder`'s), then the
    head's in registration order (QNetwork, C51Network, IQNNetwork), or IQL's ``value`` layer
    (IQLValueNetwork)."""
    encoder = getattr(net, "encoder", None)
    if not isinstance(encoder, (MLPEncoder, *MODULE_ENCODERS)):
        raise ValueError(f"MemberQNetwork: needs a network of an MLPEncoder, AttentionEncoder or NatureCNNEncoder, "
                         f"got {type(net).__name__}")
    layers = ([] if isinstance(encoder, MODULE_ENCODERS) else
              [(f"encoder.net.{i}", m) for i, m in enumerate(encoder.net) if isinstance(m, nn.Linear)])
    if isinstance(net, IQLValueNetwork):
        return layers + [("value", net.value)]
    return layers + [(f"head.{name}", m) for name, m in net.head.named_modules() if isinstance(m, nn.Linear)]


def stack_linears(nets: list[nn.Module], kinds: tuple[type, ...]) -> tuple[list[torch.Tensor], list[torch.Tensor],
                                                                           list[str]]:
    """(weights ``[P, in, out]``, biases ``[P, 1, out]``, prefixes) of P classic networks of one
    architecture (:func:`_linears`; their weights are copied).

    Raises:
        ValueError: a network that is none of ``kinds``, or not of an MLP, attention or Nature-CNN encoder.
    """
    for net in nets:
        if not isinstance(net, kinds):
            raise ValueError(f"MemberQNetwork: needs {' or '.join(k.__name__ for k in kinds)} networks, got "
                             f"{type(net).__name__}")
    layers = [_linears(net) for net in nets]
    prefixes = [name for name, _ in layers[0]]
    weights = [torch.stack([ls[i][1].weight.detach().t() for ls in layers]).contiguous()
               for i in range(len(prefixes))]
    biases = [torch.stack([ls[i][1].bias.detach()[None] for ls in layers]).contiguous()
              for i in range(len(prefixes))]
    return weights, biases, prefixes


def stack_encoder(nets: list[nn.Module]) -> MemberAttentionEncoder | MemberNatureCNN | None:
    """The members' encoder module, the P classic networks' ``encoder`` stacked (weights copied):
    :class:`~foxdqn.population.attention.MemberAttentionEncoder` for attention encoders,
    :class:`~foxdqn.population.conv.MemberNatureCNN` for Nature-CNN ones, or None for MLP encoders
    (whose layers :func:`stack_linears` stacks)."""
    encoders = [net.encoder for net in nets]
    if isinstance(encoders[0], AttentionEncoder):
        return MemberAttentionEncoder.stack(encoders)
    if isinstance(encoders[0], NatureCNNEncoder):
        return MemberNatureCNN.stack(encoders)
    return None


class MemberQNetwork(nn.Module):
    """P Q networks of an MLP, attention or Nature-CNN encoder: obs float32 ``[P, M, D]`` (uint8 pixels
    for the Nature CNN) → Q float32 ``[P, M, A]``.

    Args:
        weights: per linear layer (an MLP encoder's layers, then the head's: ``q``, or ``value``
            and ``advantage``; a subclass's head its own, :mod:`foxdqn.population.distributional`)
            a float32 ``[P, in, out]`` tensor.
        biases: the matching ``[P, 1, out]`` tensors.
        activation: the MLP encoder's hidden nonlinearity (relu | gelu | tanh | silu).
        dueling: the last two layers are the dueling value and advantage streams.
        prefixes: the classic ``state_dict`` prefix of each layer (``encoder.net.0``, ``head.q``, ...).
        member_encoder: None (an MLP encoder, its layers first in ``weights``), or the members'
            encoder module (:func:`stack_encoder`: :class:`~foxdqn.population.attention.MemberAttentionEncoder`,
            :class:`~foxdqn.population.conv.MemberNatureCNN`; ``weights`` are then the head's only).
            Its parameters come first in :meth:`parameters`, as the classic network's encoder's do.

    Attribute ``grad_norm``: None, or a :class:`~foxdqn.ops.member_mlp_chain.ChainGradNorm` that a
    forward with gradient through :func:`~foxdqn.ops.member_mlp_chain.member_mlp_chain` (or its
    split) hands to the op, whose backward then leaves each member's gradient norm and clip
    coefficient in it (set by the population's build where the chain's gradient is all the
    update's: :func:`foxdqn.population.state.chain_grad_norm`).

    Raises:
        ValueError: an unknown activation, or weights and biases of different lengths.
    """

    grad_norm: ChainGradNorm | None = None

    def __init__(self, weights: list[torch.Tensor], biases: list[torch.Tensor], activation: str, dueling: bool,
                 prefixes: list[str], member_encoder: nn.Module | None = None):
        super().__init__()
        self.member_encoder = member_encoder  # registered first: its parameters lead, as a classic encoder's
        if activation not in ACTIVATIONS:
            raise ValueError(f"MemberQNetwork: activation={activation!r}; choose one of {', '.join(ACTIVATIONS)}")
        if not (len(weights) == len(biases) == len(prefixes)):
            raise ValueError("MemberQNetwork: weights, biases and prefixes must have the same length")
        self.weights = nn.ParameterList([nn.Parameter(w) for w in weights])
        self.biases = nn.ParameterList([nn.Parameter(b) for b in biases])
        self.act = ACTIVATIONS[activation]()  # the classic encoder's nonlinearity modules
        self.dueling, self.prefixes = dueling, list(prefixes)
        self.num_members = weights[0].shape[0]
        self.encoder_layers = sum(prefix.startswith("encoder.") for prefix in self.prefixes)

    @classmethod
    def from_networks(cls, nets: list[QNetwork], activation: str) -> "MemberQNetwork":
        """Stack P classic networks of one architecture (their weights are copied): Q networks of
        a Q or dueling head (:class:`MemberValueNetwork`: IQL value networks).

        Raises:
            ValueError: another kind of network, or one without an MLP or attention encoder.
        """
        weights, biases, prefixes = stack_linears(nets, (QNetwork, IQLValueNetwork))
        return cls(weights, biases, activation, isinstance(getattr(nets[0], "head", None), DuelingHead), prefixes,
                   stack_encoder(nets))

    def layer(self, i: int, x: torch.Tensor, relu: bool = False) -> torch.Tensor:
        """Linear layer ``i`` (negative: from the end) of every member: ``x [P, M, in] → [P, M, out]``,
        then a ReLU with ``relu`` (:func:`~foxdqn.population.layers.member_linear`: one kernel on
        CUDA; on CPU a population of one multiplies as a batch of two, so that its products round
        as a member's of P > 1)."""
        return member_linear(x, self.weights[i], self.biases[i], relu)

    def layer_pair(self, i: int, x_a: torch.Tensor, x_b: torch.Tensor,
                   relu: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`layer` ``i`` of ``x_a`` (with gradient) and of ``x_b`` (a constant) in one launch
        where the kernel takes both (:func:`~foxdqn.population.layers.member_linear_pair`)."""
        return member_linear_pair(x_a, x_b, self.weights[i], self.biases[i], relu)

    def encoder_pair(self, obs_a: torch.Tensor, obs_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(:meth:`encoder` of ``obs_a`` ``[P, M_a, D]`` with gradient, of ``obs_b`` ``[P, M_b, D]``
        without): an MLP encoder of ReLUs runs each layer's rows of both in one launch
        (:meth:`layer_pair`: s and s' of a Double DQN target, IQL's V(s) and V(s')); any other
        encoder runs twice, the second under ``torch.no_grad()``."""
        if self.member_encoder is not None or not self.relu_fused():
            with torch.no_grad():
                h_b = self.encoder(obs_b)
            return self.encoder(obs_a), h_b
        h_a, h_b = obs_a, obs_b
        for i in range(self.encoder_layers):
            h_a, h_b = self.layer_pair(i, h_a, h_b, relu=True)
        return h_a, h_b

    def relu_fused(self) -> bool:
        """Whether the encoder's nonlinearity is a ReLU that :meth:`layer` may apply in its
        kernel: an ``nn.ReLU`` with no forward hook (it would not run)."""
        return type(self.act) is nn.ReLU and not forward_hooked([self.act])

    def encoder(self, obs: torch.Tensor) -> torch.Tensor:
        """The encoder of every member (MLP, attention or Nature CNN): obs ``[P, M, D]`` → features ``[P, M, H]``."""
        if self.member_encoder is not None:
            return self.member_encoder(obs)
        h = obs
        relu = self.relu_fused()
        for i in range(self.encoder_layers):
            h = self.layer(i, h, relu=True) if relu else self.act(self.layer(i, h))
        return h

    def q_forward_args(self, obs: torch.Tensor) -> tuple[list, list, bool] | None:
        """``(weights, biases, dueling)`` with which :func:`~foxdqn.ops.q_forward.q_forward`
        computes the members' Q for ``obs`` ``[P, M, D]`` (what :meth:`forward` runs then: a
        dueling ReLU network on CUDA, no gradient needed; the measured case, module docstring), or
        None. Host metadata only."""
        return self._fused_args(obs) if self.dueling else None

    def acting_chain_args(self, obs: torch.Tensor) -> tuple[list, list] | None:
        """:meth:`chain_args` for the collect step's ε-greedy selection
        (:func:`foxdqn.step.act.act`: :func:`~foxdqn.ops.member_mlp_chain_epsilon_greedy.member_mlp_chain_epsilon_greedy`,
        one kernel for the chain and the selection), or None: also where a subclass's Q is not its
        layers' output (:mod:`foxdqn.population.distributional` overrides :meth:`forward`). A plain
        head wider than the chain takes its layers then the ε-greedy kernel (on the H200 faster
        than :func:`~foxdqn.ops.q_forward_epsilon_greedy.q_forward_epsilon_greedy` at a few rows
        per member: docs/bench.md#kernels). Host metadata only."""
        if type(self).forward is not MemberQNetwork.forward:
            return None
        return self.chain_args(obs)

    def fusable(self, obs: torch.Tensor) -> bool:
        """Whether a fused no-gradient kernel may replace this network's layers for ``obs``: on
        CUDA (or on the CPU inside :func:`foxdqn.ops.backend.cpu_kernels`), with no forward hook on
        its modules (:func:`foxdqn.nn.qnet.forward_hooked`: the kernel would skip it), no gradient
        needed. Host metadata only."""
        return fused_forward(obs) and not torch.is_grad_enabled() and not forward_hooked([self])

    def _fused_args(self, obs: torch.Tensor) -> tuple[list, list, bool] | None:
        if self.member_encoder is not None:  # the fused kernels compute an MLP's Q only
            return None
        if not (fused_forward(obs) and type(self.act) is nn.ReLU) or forward_hooked([self]):
            return None
        weights, biases = list(self.weights), list(self.biases)
        return (weights, biases, self.dueling) if q_forward_supported(obs, weights, biases, self.dueling) else None

    def chain_args(self, obs: torch.Tensor) -> tuple[list, list] | None:
        """``(weights, biases)`` with which :func:`~foxdqn.ops.member_mlp_chain.member_mlp_chain`
        computes :meth:`forward` for ``obs`` ``[P, M, D]`` (with or without a gradient to come), or
        None: a plain head (not dueling) on an MLP encoder of ReLUs, where the fused forwards run
        (CUDA, or :func:`~foxdqn.ops.backend.cpu_kernels`), no forward hook, an ``obs`` that needs
        no gradient, and shapes the op takes (1 to 4 layers, widths <= 128). Host metadata only."""
        if self.dueling or self.member_encoder is not None or obs.requires_grad:
            return None
        if not (fused_forward(obs) and type(self.act) is nn.ReLU) or forward_hooked([self]):
            return None
        weights, biases = list(self.weights), list(self.biases)
        return (weights, biases) if member_mlp_chain_supported(obs, weights, biases) else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        args = self.q_forward_args(obs)
        if args is not None:  # no gradient needed: one kernel
            return q_forward(obs, args[0], args[1], dueling=args[2], backend="triton")
        chain = self.chain_args(obs)
        if chain is not None:  # forward one kernel, backward two
            return member_mlp_chain(obs, chain[0], chain[1], norm=self.grad_norm, backend="triton")
        h = self.encoder(obs)
        if not self.dueling:
            return self.layer(-1, h)
        head = (h, self.weights[-2], self.biases[-2], self.weights[-1], self.biases[-1])
        if DUELING_HEAD_KERNELS and fused_forward(h) and member_dueling_head_supported(*head):  # one kernel
            return member_dueling_head(*head, backend="triton")
        value = self.layer(-2, h)  # [P, M, 1]
        adv = self.layer(-1, h)  # [P, M, A]
        return dueling_combine(value, adv)  # Wang et al. 2016 eq. 9, one kernel on CUDA

    def forward_split(self, obs: torch.Tensor, grad_rows: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """:meth:`forward` of ``obs`` ``[P, M, D]`` as ``(Q of rows < grad_rows [P, grad_rows, A] with
        gradient, Q of the other rows [P, M − grad_rows, A], a constant)`` in one forward launch whose
        backward covers the first rows only (:func:`~foxdqn.ops.member_mlp_chain.member_mlp_chain_split`:
        the Double DQN pair [s; s'], foxdqn.objectives.dqn_forward), where :meth:`chain_args` takes
        ``obs``; else None (the caller runs :meth:`forward`). Host metadata only."""
        chain = self.chain_args(obs) if type(self).forward is MemberQNetwork.forward else None
        if chain is None:
            return None
        return member_mlp_chain_split(obs, chain[0], chain[1], grad_rows, norm=self.grad_norm, backend="triton")

    def member_state_dicts(self) -> dict[str, torch.Tensor]:
        """Every member's weights in the classic :class:`QNetwork` ``state_dict`` layout, each with a
        leading member axis ``[P, ...]`` (views: member p's is :meth:`member_state_dict`)."""
        out = {} if self.member_encoder is None else {
            f"encoder.{key}": t for key, t in self.member_encoder.member_state_dicts().items()}
        for prefix, w, b in zip(self.prefixes, self.weights, self.biases):
            out[f"{prefix}.weight"] = w.detach().transpose(1, 2)
            out[f"{prefix}.bias"] = b.detach()[:, 0]
        return out

    def member_state_dict(self, p: int) -> dict[str, torch.Tensor]:
        """Member ``p``'s weights in the classic :class:`QNetwork` ``state_dict`` layout (contiguous copies)."""
        return member_copy(self.member_state_dicts(), p)


class MemberValueNetwork(MemberQNetwork):
    """P IQL state-value networks (:class:`foxdqn.nn.iql_value.IQLValueNetwork`, Kostrikov, Nair &
    Levine 2021, §4): obs float32 ``[P, M, D]`` → V float32 ``[P, M]`` (return units).

    The layers of :class:`MemberQNetwork` with one output (the ``value`` Linear after the MLP or
    attention encoder), its last axis dropped. Build it with :meth:`from_networks` from P classic
    value networks; :meth:`member_state_dict` gives member p's weights in the classic network's
    layout (``encoder.*``, ``value.*``). Members never mix.
    """

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return super().forward(obs).squeeze(-1)

    def forward_pair(self, obs: torch.Tensor, next_obs: torch.Tensor,
                     pair: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(V(s) float32 ``[P, B]`` with gradient, V(s') ``[P, B]`` a constant) of obs and next_obs
        ``[P, B, D]`` (IQL's two passes, eqs. 5 and 6): where the fused kernels run and no forward
        hook would be skipped, the MLP chain's one launch for the replay's stacked ``pair``
        ``[P, 2, B, D]`` (:func:`~foxdqn.ops.member_mlp_chain.member_mlp_chain_split`, widths
        <= 128), else each layer's rows of both in one launch (:meth:`encoder_pair`, :meth:`layer_pair`:
        wider MLPs); elsewhere two forwards, the second under ``torch.no_grad()``."""
        if fused_forward(obs) and not forward_hooked([self]):
            chain = self.chain_args(obs)
            if chain is not None and pair is not None:
                a, b = member_mlp_chain_split(pair.view(obs.shape[0], -1, pair.shape[-1]), chain[0], chain[1],
                                              obs.shape[1], backend="triton")
                return a.squeeze(-1), b.squeeze(-1)
            if chain is None and self.member_encoder is None and self.relu_fused():
                h_a, h_b = self.encoder_pair(obs, next_obs)
                v_a, v_b = self.layer_pair(-1, h_a, h_b)
                return v_a.squeeze(-1), v_b.squeeze(-1)
        with torch.no_grad():
            v_b = self(next_obs)
        return self(obs), v_b
