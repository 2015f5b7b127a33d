r"""Gradual magnitude pruning of the online network's weight matrices (``prune.*``).

Source: Zhu & Gupta 2017, "To prune, or not to prune: exploring the efficacy of pruning for
model compression", §3, eq. 1: at update t the target sparsity is

    s_t = s_f + (s_i − s_f) · (1 − (t − t0) / (n Δt))³      for t0 <= t <= t0 + nΔt

(s_i initial, s_f final sparsity, t0 = ``start_update``, t0 + nΔt = ``end_update``,
Δt = ``frequency``); 0 before t0 (no pruning yet) and s_f after the end. The reference design's
captured step carried the same mask step (docs/design/update.md#pruning; ``submit_pruning_mask_ops``,
between the loss ops and the Adam step; here it runs after the Adam step, see below).

Masks (one per weight matrix: every online parameter with ``dim >= 2``; biases, norm scales and
other vectors are never pruned) are recomputed at the mask-update steps: t in [t0, t0 + nΔt]
with (t − t0) mod Δt = 0, and t = t0 + nΔt itself (so s_f is always reached), but not when the
training guard skipped the update. A recomputed mask zeroes the ⌊s_t · numel⌋ entries of
smallest |w| (ties broken by position, a stable sort), so exactly that many per matrix. Already
pruned weights rank as 0 (the ranking uses |w · mask|), and s_t never decreases, so a pruned
weight stays pruned.

Every update, the gradients of pruned entries are zeroed before clipping (as a mask in the
forward pass would: they count neither in the gradient norm nor in Adam's moments), and after
the Adam step each matrix is multiplied by its mask (so weights Adam's
momentum moves off 0 are put back to 0), and after the target update the target network's
matching matrices are multiplied by the same masks: the target has the online sparsity pattern
exactly (with Polyak averaging it would otherwise only decay toward 0).

All device ops with fixed shapes (argsort of each matrix every update, the result selected with
``torch.where`` on the device flag), so the step runs inside the captured iteration without a
host sync. The masks live on the device and are not checkpointed (the zeros are in the weights).
"""
from __future__ import annotations

import torch
from torch import Tensor


class MagnitudePruner:
    """Masks for the weight matrices of ``online`` and the schedule that grows them.

    Args:
        online, target: networks with the same parameter layout (target = copy of online).
        initial_sparsity, final_sparsity: s_i <= s_f in [0, 1) (``prune.initial_sparsity``,
            ``prune.final_sparsity``), fractions of each matrix's entries set to 0.
        start_update, end_update: t0 < t0 + nΔt, update numbers (0-based, ``updates`` counter).
        frequency: Δt >= 1 updates between mask updates.
        device: the training device.

    Attributes:
        params, target_params: the pruned matrices (lists of tensors), online and target.
        masks: float32 tensors shaped like ``params`` (1 keep, 0 pruned).
    """

    def __init__(self, online: torch.nn.Module, target: torch.nn.Module, initial_sparsity: float,
                 final_sparsity: float, start_update: int, end_update: int, frequency: int,
                 device: torch.device):
        pairs = [(p, tp) for p, tp in zip(online.parameters(), target.parameters()) if p.dim() >= 2]
        self.params = [p for p, _ in pairs]
        self.target_params = [tp for _, tp in pairs]
        self.masks = [torch.ones_like(p, dtype=torch.float32) for p in self.params]
        self._ranks = [torch.arange(p.numel(), device=device) for p in self.params]
        self._schedule(initial_sparsity, final_sparsity, start_update, end_update, frequency, device)

    def _schedule(self, initial_sparsity: float, final_sparsity: float, start_update: int, end_update: int,
                  frequency: int, device: torch.device) -> None:
        """The schedule's device constants (s_i, s_f, t0, t0 + nΔt, Δt) and nΔt."""
        f64, i64 = dict(dtype=torch.float64, device=device), dict(dtype=torch.int64, device=device)
        self.s_i = torch.tensor(float(initial_sparsity), **f64)
        self.s_f = torch.tensor(float(final_sparsity), **f64)
        self.t0 = torch.tensor(int(start_update), **i64)
        self.t_end = torch.tensor(int(end_update), **i64)
        self.frequency = torch.tensor(int(frequency), **i64)
        self._span = float(end_update - start_update)  # nΔt, a run constant

    def sparsity_at(self, t: Tensor) -> Tensor:
        """float64 0-d target sparsity s_t of update ``t`` (int64 0-d), Zhu & Gupta eq. 1."""
        progress = ((t - self.t0).to(torch.float64) / self._span).clamp(0.0, 1.0)
        s = self.s_f + (self.s_i - self.s_f) * (1.0 - progress) ** 3
        return torch.where(t < self.t0, torch.zeros_like(s), s)

    def due(self, t: Tensor) -> Tensor:
        """bool 0-d: update ``t`` recomputes the masks (before the guard's skip is applied)."""
        inside = (t >= self.t0) & (t <= self.t_end)
        return inside & (((t - self.t0) % self.frequency == 0) | (t == self.t_end))

    @torch.no_grad()
    def step(self, t: Tensor, skip: Tensor) -> None:
        """After the optimizer step of update ``t`` (int64 0-d): recompute the masks when due and
        the update was not skipped (``skip`` float32 0-d, 1 = skipped), then mask the online
        matrices. Device ops only."""
        due = self.due(t) & (skip == 0)
        s = self.sparsity_at(t)
        for p, mask, ranks in zip(self.params, self.masks, self._ranks):
            k = torch.floor(s * p.numel()).to(torch.int64)  # entries to zero in this matrix
            # ascending |w| of the masked weights: entries pruned before rank first (Adam may have
            # moved them off 0 in this step; they are put back to 0 below)
            order = (p.detach().abs() * mask).flatten().argsort(stable=True)
            fresh = torch.empty_like(mask).view(-1).scatter_(0, order, (ranks >= k).to(mask.dtype))
            mask.copy_(torch.where(due, fresh.view_as(mask), mask))
        torch._foreach_mul_(self.params, self.masks)

    @torch.no_grad()
    def mask_grads(self) -> None:
        """Before clipping: zero the gradients of pruned entries, as if the mask were applied in the
        forward pass (Zhu & Gupta's implementation), so they count neither in the clipped norm (nor
        the guard's) nor in Adam's moments."""
        torch._foreach_mul_([p.grad for p in self.params], self.masks)

    @torch.no_grad()
    def mask_target(self) -> None:
        """After the target update: the target matrices take the online masks."""
        torch._foreach_mul_(self.target_params, self.masks)

    @torch.no_grad()
    def log_values(self, t: Tensor) -> Tensor:
        """float64 [2]: measured sparsity of the online matrices (fraction of entries == 0) and
        the scheduled s_t at update ``t``. Device ops; read with the log snapshot."""
        zeros = torch.stack([(p == 0).sum() for p in self.params]).sum().to(torch.float64)
        total = float(sum(p.numel() for p in self.params))
        return torch.stack([zeros / total, self.sparsity_at(t)])
