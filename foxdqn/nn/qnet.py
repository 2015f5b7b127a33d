"""Q network = encoder + head (built from the config by foxdqn.step.build.build_network)."""
from __future__ import annotations

import torch
from torch import nn

from foxdqn.nn.heads import DuelingHead, QHead
from foxdqn.nn.mlp import MLPEncoder
from foxdqn.ops.backend import fused_forward
from foxdqn.ops.mlp_chain import MAX_LAYERS, mlp_chain, mlp_chain_supported
from foxdqn.ops.q_forward import MAX_HIDDEN, q_forward, q_forward_supported

CHAIN_BACKENDS = ("auto", "triton", "torch")
#: rows from which a no-gradient forward of a dueling MLP runs q_forward (read at each call): below,
#: the modules are as fast or faster (the target network's 128 rows); the op's time hardly depends
#: on the rows (one program per 32 rows, latency-bound). H200 figures: docs/bench.md#launch-constants.
Q_FORWARD_MIN_ROWS = 1024


def _chain_layers(encoder: nn.Module, head: nn.Module) -> list[nn.Linear] | None:
    """The Linear layers of a ReLU :class:`MLPEncoder` followed by a :class:`QHead`, in order (at most
    :data:`~foxdqn.ops.mlp_chain.MAX_LAYERS`), or None for any other encoder, activation or head."""
    if type(encoder) is not MLPEncoder or type(head) is not QHead:
        return None
    if not all(fused for _, _, fused in encoder._layers):  # fused: the activation is nn.ReLU
        return None
    layers = [linear for linear, _, _ in encoder._layers] + [head.q]
    return layers if len(layers) <= MAX_LAYERS else None


def _dueling_layers(encoder: nn.Module, head: nn.Module) -> list[nn.Linear] | None:
    """``[hidden..., value, advantage]`` Linears of a ReLU :class:`MLPEncoder` of 1 or 2 layers
    followed by a :class:`DuelingHead` (q_forward's order), or None for any other network."""
    if type(encoder) is not MLPEncoder or type(head) is not DuelingHead:
        return None
    if not 1 <= len(encoder._layers) <= MAX_HIDDEN or not all(fused for _, _, fused in encoder._layers):
        return None
    return [linear for linear, _, _ in encoder._layers] + [head.value, head.advantage]


def forward_hooked(modules: list[nn.Module]) -> bool:
    """Whether a forward hook would run in ``head(encoder(obs))`` (a module's own or a global one,
    e.g. ``torch.nn.utils.prune``'s pre-hook): the fused op would skip it, so the modules run."""
    from torch.nn.modules import module as nn_module

    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for root in modules for m in root.modules())  # the Linears too


class QNetwork(nn.Module):
    """obs float32 [B, D] → Q values float32 [B, A].

    Two fused ops replace the modules where they apply, on CUDA, for a contiguous float32
    ``[B, D]`` input and no forward hook on the modules:

    * a ReLU :class:`~foxdqn.nn.mlp.MLPEncoder` with a plain :class:`~foxdqn.nn.heads.QHead` of at
      most 4 Linear layers in all, every width <= 128 (``cartpole_cleanrl``'s 4 → 120 → 84 → 2),
      when the input needs no gradient (the replay's batches and the rollout's observations):
      :func:`foxdqn.ops.mlp_chain.mlp_chain` (forward one kernel, backward two);
    * a ReLU MLPEncoder of 1 or 2 layers with a :class:`~foxdqn.nn.heads.DuelingHead` (hidden
      widths <= 256, at most 64 actions: ``eurusd_dqn``'s 162 → 256 → 256 → dueling 45) when no
      gradient is needed at all (grad mode off, or no input or weight requiring grad: the collect
      step, evaluation, the target network) and the input has at least
      :data:`Q_FORWARD_MIN_ROWS` rows (below, the modules measured faster: the target network's
      128 rows keep them): :func:`foxdqn.ops.q_forward.q_forward`, one kernel where the modules
      launch six; the collect step's ε-greedy selection joins it (:meth:`q_forward_args`,
      :func:`foxdqn.step.act.act`).

    Anything else runs ``head(encoder(obs))``. All compute the same function with the same
    parameters (the modules' own ``nn.Linear`` weights, read at each call: ``state_dict`` keys,
    checkpoints and ``copy.deepcopy`` are unchanged) and differ only by float rounding.

    Args:
        encoder: features of the observations, ``[B, D] → [B, H]``.
        head: Q values of the features, ``[B, H] → [B, A]``.
        chain_backend: when the fused ops run: ``"auto"`` (for CUDA inputs, and CPU inputs inside
            :func:`foxdqn.ops.backend.cpu_kernels`), ``"triton"`` (also
            for CPU inputs, in Triton's interpreter: tests) or ``"torch"`` (never). Kept as the
            attribute of the same name.

    Raises:
        ValueError: an unknown ``chain_backend``.
    """

    def __init__(self, encoder: nn.Module, head: nn.Module, chain_backend: str = "auto"):
        super().__init__()
        if chain_backend not in CHAIN_BACKENDS:
            raise ValueError(f"QNetwork: chain_backend must be one of {', '.join(CHAIN_BACKENDS)}, "
                             f"got {chain_backend!r}")
        self.encoder = encoder
        self.head = head
        self.chain_backend = chain_backend
        # a plain list (registers nothing; a deepcopy of the network maps it to the copy's layers)
        self._chain = _chain_layers(encoder, head)
        self._dueling = _dueling_layers(encoder, head)

    def fused_chain(self, obs: torch.Tensor) -> tuple[list, list] | None:
        """``(weights, biases)`` that :meth:`forward` passes to ``mlp_chain`` for ``obs``, or None
        when it runs ``head(encoder(obs))`` (class docstring). Host metadata only."""
        if self._chain is None or obs.requires_grad or forward_hooked([self.encoder, self.head]):
            return None
        if not self._fused_backend(obs):
            return None
        weights = [linear.weight for linear in self._chain]
        biases = [linear.bias for linear in self._chain]
        return (weights, biases) if mlp_chain_supported(obs, weights, biases) else None

    def _fused_backend(self, obs: torch.Tensor) -> bool:
        return self.chain_backend == "triton" or (self.chain_backend == "auto" and fused_forward(obs))

    def q_forward_args(self, obs: torch.Tensor) -> tuple[list, list, bool] | None:
        """``(weights, biases, dueling)`` with which :func:`~foxdqn.ops.q_forward.q_forward`
        computes this network's Q for ``obs`` (what :meth:`forward` runs then), or None when it
        does not apply (class docstring). Host metadata only."""
        if (self._dueling is None or obs.dim() != 2 or obs.shape[0] < Q_FORWARD_MIN_ROWS
                or not self._fused_backend(obs) or forward_hooked([self.encoder, self.head])):
            return None
        weights = [linear.weight for linear in self._dueling]
        biases = [linear.bias for linear in self._dueling]
        return (weights, biases, True) if q_forward_supported(obs, weights, biases, True) else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        chain = self.fused_chain(obs)
        if chain is not None:
            return mlp_chain(obs, *chain, backend="triton")
        args = self.q_forward_args(obs)
        if args is not None:
            weights, biases, dueling = args
            return q_forward(obs, weights, biases, dueling=dueling, backend="triton")
        return self.head(self.encoder(obs))
