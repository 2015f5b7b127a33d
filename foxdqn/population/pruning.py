"""Gradual magnitude pruning of a population's online weight matrices (``prune.*``), per member.

The single run's :class:`foxdqn.step.pruning.MagnitudePruner` (Zhu & Gupta 2017, eq. 1; its
schedule, :meth:`~foxdqn.step.pruning.MagnitudePruner.sparsity_at` and
:meth:`~foxdqn.step.pruning.MagnitudePruner.due`, shared: the ``prune.*`` keys are group keys) with
a member axis: one mask per member weight matrix ``[P, in, out]`` (the member network's linear
weights; with the Nature CNN, ``model.encoder=nature_cnn``, its convolution weights ``[P, out, in,
k, k]`` and fully connected layers too, as a single run prunes every parameter of 2 or more
dimensions: :meth:`foxdqn.population.conv.MemberNatureCNN.pruned_matrices`; its biases, vectors in
a single run, are never pruned), and member p's
slice is recomputed from member p's weights alone at the mask-update steps, unless the guard skipped
p's update. Each member ranks its entries in the classic layout ``[out, in]`` of its single run's
matrix (a stable argsort of |w · mask| per member, so ties fall as they do in its single run), zeroes
the ⌊s_t · numel⌋ smallest (a convolution's in its own layout), and so reaches exactly its single run's masks from the same weights.
As in a single run: gradients of pruned entries are zeroed before clipping
(:meth:`MemberPruner.mask_grads`), the masks are applied after the Adam step
(:meth:`MemberPruner.step`) and to the target after its update (:meth:`MemberPruner.mask_target`).
Device ops only (capturable).
"""
from __future__ import annotations

import torch
from torch import Tensor

from foxdqn.ops.prune_masks import prune_masks_
from foxdqn.population.network import MemberQNetwork
from foxdqn.step.pruning import MagnitudePruner


class MemberPruner(MagnitudePruner):
    """Masks of the members' weight matrices and the (shared) schedule that grows them.

    Args:
        online, target: the population's member networks (target = copy of online).
        initial_sparsity, final_sparsity, start_update, end_update, frequency, device: as
            :class:`~foxdqn.step.pruning.MagnitudePruner`.

    Attributes:
        params, target_params: the member weight matrices ``[P, in, out]`` (a Nature CNN's convolution
            weights ``[P, out, in, k, k]`` first), online and target.
        masks: float32 tensors shaped like ``params`` (1 keep, 0 pruned).
    """

    def __init__(self, online: MemberQNetwork, target: MemberQNetwork, initial_sparsity: float,
                 final_sparsity: float, start_update: int, end_update: int, frequency: int, device: torch.device):
        # an encoder module's matrices first (the Nature CNN's, in the classic network's parameter order), then the layers'
        enc, target_enc = getattr(online, "member_encoder", None), getattr(target, "member_encoder", None)
        matrices = list(enc.pruned_matrices()) if hasattr(enc, "pruned_matrices") else []
        target_matrices = list(target_enc.pruned_matrices()) if matrices else []
        self.params = [w for w, _ in matrices] + list(online.weights)
        self.target_params = [w for w, _ in target_matrices] + list(target.weights)
        self._transposed = [t for _, t in matrices] + [True] * len(online.weights)
        self.masks = [torch.ones_like(w, dtype=torch.float32) for w in self.params]
        self._schedule(initial_sparsity, final_sparsity, start_update, end_update, frequency, device)
        self._window = (int(start_update), int(end_update), int(frequency))
        self.k_table = self._k_table(device)

    def _k_table(self, device: torch.device) -> Tensor:
        """int64 ``[R, C]``: k = ⌊s_t · n⌋ of each mask-update step t (row
        :func:`foxdqn.ops.prune_masks.due_row`) for each matrix (column), with the schedule's float64
        device ops (:meth:`sparsity_at`) on ``device``, as an update would compute them."""
        t0, t_end, freq = self._window
        steps = list(range(t0, t_end + 1, freq))
        if steps[-1] != t_end:
            steps.append(t_end)
        s = self.sparsity_at(torch.tensor(steps, dtype=torch.int64, device=device))  # [R]
        return torch.stack([torch.floor(s * w[0].numel()).to(torch.int64) for w in self.params], dim=1).contiguous()

    @torch.no_grad()
    def step(self, t: Tensor, skip: Tensor) -> None:
        """After the optimizer step of update ``t`` (int64 0-d): recompute each member's masks when
        due and its update was not skipped (``skip`` float32 ``[P]``), then mask the online matrices:
        one :func:`foxdqn.ops.prune_masks.prune_masks_` for every matrix (each member ranks |w · mask| in
        its single run's order, ``[out, in]`` for a Linear, ascending, ties by position)."""
        t0, t_end, freq = self._window
        prune_masks_([w.data for w in self.params], self.masks, t, skip, self.k_table, t0, t_end, freq, self._transposed)

    @torch.no_grad()
    def log_values(self, t: Tensor) -> Tensor:
        """float64 ``[P, 2]``: each member's measured sparsity of its online matrices (fraction of
        entries == 0) and the scheduled s_t at update ``t``. Device ops."""
        p = self.params[0].shape[0]
        zeros = torch.stack([(w == 0).view(p, -1).sum(dim=1) for w in self.params]).sum(dim=0).to(torch.float64)
        total = float(sum(w[0].numel() for w in self.params))
        return torch.stack([zeros / total, self.sparsity_at(t).expand(p)], dim=1)
