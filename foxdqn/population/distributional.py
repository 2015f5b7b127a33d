"""P distributional networks in one module: the C51 and IQN heads with a member axis.

Member p's network is the classic :class:`foxdqn.nn.c51.C51Network` (Bellemare, Dabney & Munos
2017, §4; Rainbow's dueling streams over logits, Hessel et al. 2018) or
:class:`foxdqn.nn.iqn.IQNNetwork` (Dabney, Ostrovski, Silver & Munos 2018, §3.1, eq. 4) of an
:class:`~foxdqn.nn.mlp.MLPEncoder` or an :class:`~foxdqn.nn.attention.AttentionEncoder`, with the layers of
:class:`~foxdqn.population.network.MemberQNetwork` (weights ``[P, in, out]``, one
``torch.baddbmm`` per layer for all members) and the interface the shared losses read
(:func:`foxdqn.objectives.c51.c51_cross_entropy`: ``logits``, ``support``, ``v_min``, ``v_max``,
``atoms``; :func:`foxdqn.objectives.iqn.iqn_quantile_loss`: ``encoder``, ``head``, ``policy_q``).
Each C51 member keeps its own support (``head.v_min`` / ``head.v_max`` are member keys,
:data:`foxdqn.population.grouping.NETWORK_KEYS`); the atom count K, IQN's embedding size n and
policy midpoints K are shared (they give the tensors their shapes). Members never mix: every op is
per member or per row.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from foxdqn.nn.c51 import C51Network
from foxdqn.nn.iqn import IQNNetwork
from foxdqn.ops import c51_epsilon_greedy as c51_op
from foxdqn.ops import iqn_epsilon_greedy as iqn_op
from foxdqn.ops.c51_expected_q import c51_expected_q, c51_expected_q_fits
from foxdqn.ops.backend import fused_forward
from foxdqn.ops.c51_project import support_table
from foxdqn.ops.member_iqn_embedding import member_iqn_embedding, member_iqn_embedding_supported
from foxdqn.ops.member_linear import member_linear as member_linear_kernel, member_linear_supported
from foxdqn.population.layers import member_linear_kernel_taken, member_product, member_products
from foxdqn.population.network import MemberQNetwork, stack_encoder, stack_linears

#: An IQN population's ψ(s) ⊙ φ(τ) through ops/member_iqn_embedding.py where the fused forwards run
#: (1 launch forward and 3 backward, against 4 and 5 through the torch ops and the embedding's layer).
IQN_EMBEDDING_KERNEL = True


class MemberC51Network(MemberQNetwork):
    """P C51 networks: obs float32 ``[P, M, D]`` → expected Q float32 ``[P, M, A]``,
    Q = Σ_k softmax(logits)_k z_k (acting, evaluation, Double DQN selection). Where no gradient is
    needed and the fused kernels run (:meth:`fusable`), the dueling combine, the softmax and the
    expectation are one kernel (:func:`foxdqn.ops.c51_expected_q.c51_expected_q`).

    ``logits(obs)``: float32 ``[P, M, A, K]``. Buffers (not in the state dict, they come from each
    member's config): ``support`` float32 ``[P, 1, 1, K]``, member p's z_k = v_min_p + k·Δz_p exactly
    as its :class:`~foxdqn.nn.c51.C51Network` computes them; ``v_min``, ``v_max`` float64 ``[P]``
    (return units; float64 so that the projection rounds them as a single run rounds its Python
    floats, :func:`foxdqn.ops.c51_project.support_table`).

    Args:
        weights, biases, activation, dueling, prefixes, member_encoder: as :class:`MemberQNetwork`
            (the head's layers: ``logits``, or with ``dueling`` ``value`` ([K] per member) and
            ``advantage``).
        num_actions: A.
        support: float32 ``[P, K]``, each member's atoms.
        v_min, v_max: float64 ``[P]``, each member's support bounds (fixed: ``projection_table``,
            float32 ``[P, 4]``, is their :func:`foxdqn.ops.c51_project.support_table`, made here).
    """

    def __init__(self, weights: list[torch.Tensor], biases: list[torch.Tensor], activation: str, dueling: bool,
                 prefixes: list[str], num_actions: int, support: torch.Tensor, v_min: torch.Tensor,
                 v_max: torch.Tensor, member_encoder: nn.Module | None = None):
        super().__init__(weights, biases, activation, dueling, prefixes, member_encoder)
        self.num_actions, self.atoms = num_actions, support.shape[1]
        self.register_buffer("support", support[:, None, None, :].clone(), persistent=False)  # [P, 1, 1, K]
        self.register_buffer("v_min", v_min.clone(), persistent=False)
        self.register_buffer("v_max", v_max.clone(), persistent=False)
        # the projection's (v_min, v_max, Δz, 1/Δz) rows, made once (foxdqn.ops.c51_loss takes them)
        self.register_buffer("projection_table", support_table(v_min, v_max, self.atoms), persistent=False)

    @classmethod
    def from_networks(cls, nets: list[C51Network], activation: str) -> "MemberC51Network":
        """Stack P classic C51 networks of one architecture (weights and supports copied).

        Raises:
            ValueError: a network that is not a C51Network of an MLP or attention encoder, or networks with
                different atom counts.
        """
        weights, biases, prefixes = stack_linears(nets, (C51Network,))
        if len({net.atoms for net in nets}) != 1:
            raise ValueError(f"MemberC51Network: needs C51Networks of one atom count, got {[n.atoms for n in nets]}")
        device = weights[0].device
        bounds = [torch.tensor([getattr(net, key) for net in nets], dtype=torch.float64, device=device)
                  for key in ("v_min", "v_max")]
        return cls(weights, biases, activation, nets[0].head.dueling, prefixes, nets[0].num_actions,
                   torch.stack([net.support for net in nets]), *bounds, stack_encoder(nets))

    def q_forward_args(self, obs: torch.Tensor) -> None:
        """None: the fused Q kernels compute a scalar head's Q, not a distribution's mean."""
        return None

    def fused_epsilon_greedy(self, obs: torch.Tensor, step: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
                             duration: torch.Tensor, u: torch.Tensor) -> torch.Tensor | None:
        """The collect step's ε-greedy actions int64 ``[P·M]`` of obs ``[P, M, D]`` (one schedule
        per member, :func:`foxdqn.step.act.act`'s arguments): the encoder's layers, then the head,
        the expected Q and the selection in one kernel
        (:func:`foxdqn.ops.c51_epsilon_greedy.c51_epsilon_greedy`); None where the fused kernels do not
        run (:meth:`fusable`) or the sizes exceed the kernel's (H <= 256, K <= 128, A <= 64)."""
        head = len(self.weights) - (2 if self.dueling else 1)
        if (not self.fusable(obs) or self.atoms > c51_op.MAX_ATOMS or self.num_actions > c51_op.MAX_ACTIONS
                or self.weights[head].shape[1] > c51_op.MAX_WIDTH):
            return None
        h = self.encoder(obs).contiguous()
        return c51_op.c51_epsilon_greedy(h, list(self.weights[head:]), list(self.biases[head:]),
                                         self.support[:, 0, 0], step=step, start=start, end=end, duration=duration,
                                         u=u, backend="triton")

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        """Atom logits ``[P, M, A, K]`` of obs ``[P, M, D]`` (the classic head's, with a member axis)."""
        h = self.encoder(obs)
        p, m = h.shape[:2]
        if self.dueling:  # Rainbow: v + a − mean_a a, per atom
            v = self.layer(-2, h)[:, :, None, :]  # [P, M, 1, K]
            adv = self.layer(-1, h).view(p, m, self.num_actions, self.atoms)  # [P, M, A, K]
            return v + adv - adv.mean(dim=2, keepdim=True)
        return self.layer(-1, h).view(p, m, self.num_actions, self.atoms)

    def logit_parts(self, obs: torch.Tensor, *, value_kernel: bool = False
                    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(value stream ``[P, M, K]``, advantages ``[P, M, A, K]``, value bias, advantage bias) of
        obs ``[P, M, D]`` with the dueling head, whose :meth:`logits` combine them; (None, the logits,
        None, their bias) without it. For :func:`foxdqn.ops.c51_loss.c51_loss` and
        :func:`foxdqn.ops.c51_expected_q.c51_expected_q`, which combine them in their kernels. The
        biases (float32 ``[P, K]`` and ``[P, A·K]``, views of the parameters): where the fused
        forwards run and no head layer takes the member kernel (:meth:`unbiased_heads`), the
        streams are the head layers' products without their biases (``bmm``: no copy of the bias
        into the ``[P, M, A·K]`` output), which the kernels add; else None, the streams biased.

        ``value_kernel`` (no gradient: :meth:`forward`): with the dueling head where the biases are
        left to the kernels, the value stream (K columns) runs through
        :func:`foxdqn.ops.member_linear.member_linear`'s kernel with its bias in the epilogue (its
        bias returned as None): one launch, where ``bmm`` of a population of one's rows is a
        cuBLASLt split-K pair (docs/bench.md#kernels)."""
        h = self.encoder(obs)
        p, m = h.shape[:2]
        unbiased = self.unbiased_heads(h)
        if unbiased and self.dueling and value_kernel \
                and member_linear_supported(h, self.weights[-2], self.biases[-2]):
            value = member_linear_kernel(h, self.weights[-2], self.biases[-2], backend="triton")
            adv = member_product(h, self.weights[-1]).view(p, m, self.num_actions, self.atoms)
            return value, adv, None, self.biases[-1].view(p, -1)
        if unbiased and self.dueling:  # both heads' products, x's gradient in two GEMMs (member_products)
            adv, value = member_products(h, self.weights[-1], self.weights[-2])
        elif unbiased:
            adv, value = member_product(h, self.weights[-1]), None
        else:
            adv, value = self.layer(-1, h), (self.layer(-2, h) if self.dueling else None)
        return value, adv.view(p, m, self.num_actions, self.atoms), *self._head_biases(unbiased)

    def logit_parts_pair(self, obs: torch.Tensor, next_obs: torch.Tensor) -> tuple[tuple, tuple, tuple]:
        """(:meth:`logit_parts`' streams of obs with gradient, of next_obs without, (value bias,
        advantage bias)) of obs and next_obs ``[P, B, D]`` (a Double DQN target's online pass): the
        encoder's layers run the rows of both in one launch each (:meth:`encoder_pair`), and so do
        the heads where their widths take the member kernel (:meth:`layer_pair`); else each head is
        two ``bmm`` (the biases returned, as :meth:`logit_parts`)."""
        h_a, h_b = self.encoder_pair(obs, next_obs)
        p = h_a.shape[0]
        unbiased = self.unbiased_heads(h_a)

        if unbiased:
            with torch.no_grad():
                adv_b = member_product(h_b, self.weights[-1])
                value_b = member_product(h_b, self.weights[-2]) if self.dueling else None
            adv_a, value_a = member_products(h_a, self.weights[-1], self.weights[-2]) if self.dueling \
                else (member_product(h_a, self.weights[-1]), None)
        else:
            adv_a, adv_b = self.layer_pair(-1, h_a, h_b)
            value_a, value_b = self.layer_pair(-2, h_a, h_b) if self.dueling else (None, None)
        return ((value_a, adv_a.view(p, h_a.shape[1], self.num_actions, self.atoms)),
                (value_b, adv_b.view(p, h_b.shape[1], self.num_actions, self.atoms)), self._head_biases(unbiased))

    def unbiased_heads(self, h: torch.Tensor) -> bool:
        """Whether :meth:`logit_parts` of features ``h`` leaves the head layers' biases to the
        kernels: the fused forwards run and no head layer takes the member kernel, whose epilogue
        adds its bias (:func:`~foxdqn.population.layers.member_linear_kernel_taken`)."""
        first = len(self.weights) - (2 if self.dueling else 1)
        return fused_forward(h) and not any(member_linear_kernel_taken(h, self.weights[i], self.biases[i])
                                            for i in range(first, len(self.weights)))

    def _head_biases(self, unbiased: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(value bias ``[P, K]`` or None, advantage bias ``[P, A·K]``) views, or (None, None)."""
        if not unbiased:
            return None, None
        p = self.biases[-1].shape[0]
        return (self.biases[-2].view(p, -1) if self.dueling else None), self.biases[-1].view(p, -1)

    def expected_q(self, logits: torch.Tensor) -> torch.Tensor:
        """Q ``[P, M, A]`` = Σ_k softmax(logits ``[P, M, A, K]``)_k z_k of each member's support."""
        return (F.softmax(logits, dim=-1) * self.support).sum(dim=-1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.fusable(obs) and c51_expected_q_fits(self.num_actions, self.atoms):
            # the biases, dueling combine, softmax, mean: one kernel
            value, adv, value_bias, adv_bias = self.logit_parts(obs, value_kernel=True)
            return c51_expected_q(adv, value, self.support[:, 0, 0], bias=adv_bias, value_bias=value_bias,
                                  backend="triton")
        return self.expected_q(self.logits(obs))


class MemberIQNNetwork(MemberQNetwork):
    """P IQN networks: obs float32 ``[P, M, D]`` → expected Q float32 ``[P, M, A]``, the mean of
    Z_τ over the K fixed midpoints τ_k = (k + 0.5)/K (acting, evaluation, Double DQN selection;
    :class:`foxdqn.nn.iqn.IQNNetwork`'s policy).

    ``encoder(obs)``: features ``[P, M, H]``. ``head(h, taus)``: h ``[P, M, H]``, τ float32
    ``[P, M, N]`` in [0, 1] → Z_τ ``[P, M, N, A]`` = f(ψ(s) ⊙ φ(τ)), φ_j(τ) = ReLU(Σ_i cos(π i τ)
    w_ij + b_j) (IQN eq. 4), f = Linear + ReLU, then Linear(H, A) or the dueling combination per τ.
    ``policy_q(h)``: ``[P, M, A]``. Buffers (not in the state dict): ``pi_i`` float32 ``[n]``,
    ``policy_taus`` float32 ``[K]``.

    Args:
        weights, biases, activation, dueling, prefixes, member_encoder: as :class:`MemberQNetwork`
            (the head's layers: ``embedding.linear``, ``hidden``, then ``out``, or ``value`` and
            ``advantage``).
        num_actions: A.
        embedding_dim: n, the cosine basis size (``head.embedding_dim``).
        num_quantiles_policy: K (``head.num_quantiles_policy``).
    """

    def __init__(self, weights: list[torch.Tensor], biases: list[torch.Tensor], activation: str, dueling: bool,
                 prefixes: list[str], num_actions: int, embedding_dim: int, num_quantiles_policy: int,
                 member_encoder: nn.Module | None = None):
        super().__init__(weights, biases, activation, dueling, prefixes, member_encoder)
        self.num_actions, self.num_quantiles_policy = num_actions, num_quantiles_policy
        device = weights[0].device
        pi_i = torch.arange(embedding_dim, dtype=torch.float32, device=device) * math.pi  # as CosineEmbedding's
        k = torch.arange(num_quantiles_policy, dtype=torch.float32, device=device)
        self.register_buffer("pi_i", pi_i, persistent=False)
        self.register_buffer("policy_taus", (k + 0.5) / num_quantiles_policy, persistent=False)
        self._policy_cos = self._policy_cos_of(weights[0].shape[0])

    @classmethod
    def from_networks(cls, nets: list[IQNNetwork], activation: str) -> "MemberIQNNetwork":
        """Stack P classic IQN networks of one architecture (their weights are copied).

        Raises:
            ValueError: a network that is not an IQNNetwork of an MLP or attention encoder.
        """
        weights, biases, prefixes = stack_linears(nets, (IQNNetwork,))
        net = nets[0]
        return cls(weights, biases, activation, net.head.dueling, prefixes, net.num_actions,
                   net.head.embedding.embedding_dim, net.num_quantiles_policy, stack_encoder(nets))

    def q_forward_args(self, obs: torch.Tensor) -> None:
        """None: the fused Q kernels compute a scalar head's Q, not a quantile mean."""
        return None

    def fused_epsilon_greedy(self, obs: torch.Tensor, step: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
                             duration: torch.Tensor, u: torch.Tensor) -> torch.Tensor | None:
        """The collect step's ε-greedy actions int64 ``[P·M]`` of obs ``[P, M, D]`` (one schedule
        per member, :func:`foxdqn.step.act.act`'s arguments): the encoder's layers, then the
        embedding of the K policy fractions, the head at each, their mean and the selection in one
        kernel (:func:`foxdqn.ops.iqn_epsilon_greedy.iqn_epsilon_greedy`); None where the fused
        kernels do not run (:meth:`fusable`) or the sizes exceed the kernel's (n, H, F <= 256, A <= 64)."""
        e = self.encoder_layers
        sizes = (self.pi_i.shape[0], self.weights[e].shape[2], self.weights[e + 1].shape[2])
        if not self.fusable(obs) or max(sizes) > iqn_op.MAX_WIDTH or self.num_actions > iqn_op.MAX_ACTIONS:
            return None
        h = self.encoder(obs).contiguous()
        return iqn_op.iqn_epsilon_greedy(h, list(self.weights[e:]), list(self.biases[e:]), self.pi_i,
                                         self.policy_taus, step=step, start=start, end=end, duration=duration, u=u,
                                         backend="triton")

    def head(self, h: torch.Tensor, taus: torch.Tensor) -> torch.Tensor:
        """Z_τ ``[P, M, N, A]`` of features h ``[P, M, H]`` at τ ``[P, M, N]`` (the classic head's
        layers with a member axis; rows ``M·N`` per member in each layer)."""
        p, m, n = taus.shape
        x = self._fused_mix(h, taus)
        if x is not None:
            return self._head_after_mix(x).view(p, m, n, -1)
        e = self.encoder_layers  # the embedding's layer, then the hidden one
        phi = self.layer(e, torch.cos(taus[..., None] * self.pi_i).view(p, m * n, -1), relu=True)  # [P, M·N, H]
        return self._head_after_embedding(h, phi.view(p, m, n, -1))

    def head_parts(self, h: torch.Tensor, taus: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(Z_τ ``[P, M, N, A]`` without the output layer's bias, that bias float32 ``[P, A]``, a
        view of the parameter) of features h ``[P, M, H]`` at τ ``[P, M, N]`` where the fused
        forwards run, the head is not dueling and its output layer takes no member kernel (for
        :func:`foxdqn.ops.iqn_loss.iqn_loss`, which adds the bias as it reads Z: no copy of the
        bias into Z, which ``baddbmm`` launches); else (:meth:`head`, None)."""
        p, m, n = taus.shape
        x = None if self.dueling else self._fused_mix(h, taus)
        if x is None:
            return self.head(h, taus), None
        x = self.layer(self.encoder_layers + 1, x, relu=True)
        if member_linear_kernel_taken(x, self.weights[-1], self.biases[-1]):
            return self.layer(-1, x).view(p, m, n, -1), None
        return member_product(x, self.weights[-1]).view(p, m, n, -1), self.biases[-1].view(p, -1)

    def _fused_mix(self, h: torch.Tensor, taus: torch.Tensor, h_next: torch.Tensor | None = None
                   ) -> torch.Tensor | None:
        """ψ(s) ⊙ φ(τ) ``[P, M·N, H]`` of h ``[P, M, H]`` and τ ``[P, M, N]`` in one kernel
        (:func:`foxdqn.ops.member_iqn_embedding.member_iqn_embedding`; with ``h_next`` ``[P, M', H]``
        its rows after h's, τ ``[P, M + M', N]``) where the fused forwards run and
        :data:`IQN_EMBEDDING_KERNEL` is on; else None (the layers run)."""
        e = self.encoder_layers
        args = (h, taus, self.pi_i, self.weights[e], self.biases[e])
        if IQN_EMBEDDING_KERNEL and fused_forward(h) and member_iqn_embedding_supported(*args, h_next):
            return member_iqn_embedding(*args, h_next=h_next, backend="triton")
        return None

    def _head_after_embedding(self, h: torch.Tensor, phi: torch.Tensor) -> torch.Tensor:
        """Z ``[P, M, N, A]`` of h ``[P, M, H]`` and φ(τ) ``[P, M, N, H]`` (or ``[P, 1, N, H]``, the
        same fractions for every row): ψ(s) ⊙ φ(τ), then the hidden layer and the output."""
        p, m, n = h.shape[0], h.shape[1], phi.shape[2]
        x = (h[:, :, None, :] * phi).view(p, m * n, -1)  # ψ(s) ⊙ φ(τ)
        return self._head_after_mix(x).view(p, m, n, -1)

    def _head_after_mix(self, x: torch.Tensor) -> torch.Tensor:
        """Z ``[P, R, A]`` of ψ(s) ⊙ φ(τ) ``[P, R, H]``: the hidden layer and the output (or the
        dueling combination)."""
        x = self.layer(self.encoder_layers + 1, x, relu=True)
        if self.dueling:
            adv = self.layer(-1, x)  # [P, M·N, A]
            out = self.layer(-2, x) + adv - adv.mean(dim=-1, keepdim=True)
        else:
            out = self.layer(-1, x)
        return out

    def _policy_cos_of(self, members: int) -> torch.Tensor:
        """cos(π i τ_k) of the K policy fractions, float32 ``[P, K, n]`` (one copy per member: the
        embedding layer's GEMM operand), on the buffers' device."""
        return torch.cos(self.policy_taus[:, None] * self.pi_i)[None].expand(members, -1, -1).contiguous()

    def policy_embedding(self, members: int) -> torch.Tensor:
        """φ(τ_k) of the K policy midpoints, float32 ``[P, K, H]``: the same for every row, computed
        once per member (K rows) from the constant cos(π i τ_k). That constant is a plain attribute
        made with the network (not a buffer: no checkpoint holds or needs it), made again on the
        first call after the network moved to another device (or for another number of members)."""
        if self._policy_cos.device != self.pi_i.device or self._policy_cos.shape[0] != members:
            self._policy_cos = self._policy_cos_of(members)
        return self.layer(self.encoder_layers, self._policy_cos, relu=True)

    def policy_q(self, h: torch.Tensor, h_next: torch.Tensor | None = None) -> torch.Tensor:
        """Expected Q ``[P, M, A]`` of features h ``[P, M, H]``: the mean of Z over the K midpoints
        (with ``h_next`` ``[P, M', H]``, ``[P, M + M', A]`` of h's rows, then h_next's: one pass,
        as of their concatenation, which :meth:`_fused_mix` reads in place).
        The output layer (or the dueling streams) is affine in the hidden layer's activations, so
        the mean of Z is the output layer of their mean over the K midpoints: the hidden layer runs
        on the ``M·K`` rows, the output on the M means (K times fewer rows; equal to the mean of
        Z to float rounding). ψ(s) ⊙ φ(τ_k) in one kernel where :meth:`_fused_mix` runs (the
        midpoints an expanded view, their embedding recomputed per row), else their embedding
        (:meth:`policy_embedding`) broadcast over the M rows."""
        p, m, k = h.shape[0], h.shape[1] + (0 if h_next is None else h_next.shape[1]), self.num_quantiles_policy
        x = self._fused_mix(h, self.policy_taus.expand(p, m, k), h_next)  # φ(τ_k) recomputed per row, in the kernel
        if x is None:
            h = h if h_next is None else torch.cat([h, h_next], dim=1)
            x = (h[:, :, None, :] * self.policy_embedding(p).view(p, 1, k, -1)).view(p, m * k, -1)
        x = self._hidden_mean(x, k)  # [P, M, F]
        if self.dueling:
            adv = self._small_layer(-1, x)
            return self._small_layer(-2, x) + adv - adv.mean(dim=-1, keepdim=True)
        return self._small_layer(-1, x)

    def _hidden_mean(self, x: torch.Tensor, k: int) -> torch.Tensor:
        """The hidden layer's ReLU outputs of ``x`` ``[P, M·K, H]``, averaged over each row's K
        fractions: ``[P, M, F]``. Where its member kernel runs, the op's ``group_mean`` (without a
        gradient, the mean in the kernel's epilogue: one launch, not two); else the layer, then
        ``Tensor.mean``."""
        i = self.encoder_layers + 1
        w, b = self.weights[i], self.biases[i]
        if member_linear_kernel_taken(x, w, b):
            return member_linear_kernel(x, w, b, True, group_mean=k, backend="triton")
        p = x.shape[0]
        return self.layer(i, x, relu=True).view(p, -1, k, w.shape[2]).mean(dim=2)

    def _small_layer(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """:meth:`layer` ``i`` of the few rows of :meth:`policy_q`'s means: the member kernel at any
        width where the fused forwards run (one launch with its bias; ``baddbmm`` would copy the
        bias first, and at these few rows an unaligned width costs the kernel little), else
        :meth:`layer`."""
        w, b = self.weights[i], self.biases[i]
        if fused_forward(x) and member_linear_supported(x, w, b):
            return member_linear_kernel(x, w, b, backend="triton")
        return self.layer(i, x)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.policy_q(self.encoder(obs))
