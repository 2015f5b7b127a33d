"""One gradient update: sample → objective → backward → clip → Q monitor → [trial step] → guard → Adam →
target → priorities.

Kernels after backward, on CUDA (eurusd_dqn, Polyak target, no pruning / weight check / PER),
each of the three multi-tensor ops one launch per 8 tensors: the gradient norm and clip
coefficient 1 (:mod:`foxdqn.step.grad_clip`; torch's ``clip_grad_norm_`` is 10), the Q monitor
1, the guard 1, Adam 1 (the clip's multiply, the skip and the step counts included:
:mod:`foxdqn.step.adam`; torch's fused Adam is 3 plus the clip's ``_foreach_mul_``), the target
update 1 (weight, lerp and the counter's ``+= 1``: :mod:`foxdqn.step.target_update`; with
``_foreach_lerp_``, 9): 5 in all, where torch's clip, fused Adam and ``_foreach_lerp_`` are 26.

Device ops only. The training guard (:class:`foxdqn.guard.host.TrainingGuard`, kernel
ops.training_guard) turns NaN/Inf, a loss above the clip,
a gradient collapse or (with ``guard.max_weight``) weights that Adam's step would make non-finite
or larger than the bound into ``skip`` = 1 on the device. The weights after the step are known
before it is applied: :class:`foxdqn.step.weight_check.WeightCheck` runs the same Adam step
on a scratch copy and reduces its max |w| for the guard (docs/design/guard.md#after-the-step).
Adam's kernel reads ``skip`` and
leaves the parameters, moments and step counts unchanged, the target update uses weight·(1 − skip),
and PER priorities are left unchanged, so a bad update changes nothing
(docs/design/guard.md#skip; docs/design/hot_loop.md#the-contract, rule 5).

Training controls (docs/design/update.md; all device ops, inside the captured iteration):

* ``optim.accumulate = M`` (gradient accumulation, docs/design/update.md#accumulation):
  the sampled batch of B = ``agent.batch_size`` rows is split into M consecutive
  micro-batches of B/M rows; each micro-batch loss ℓ_m (the objective's Σ w ℓ / (B/M)) is
  back-propagated as ℓ_m / M, so the summed gradient is the gradient of (1/M) Σ_m ℓ_m, the loss of
  the whole batch. Then one clip of the summed gradient, one guard check of the whole update's
  loss (1/M) Σ_m ℓ_m and total gradient norm, one Adam step, one target update, and the PER
  priorities of all B rows. Exact (to float rounding) for objectives whose loss is a weighted
  mean of per-sample terms computed from that sample alone: DQN, C51, IQL, CQL (over those),
  branching. IQN draws its quantile fractions per micro-batch, so its update has the same
  distribution as the single-batch one but not the same draws.
* ``prune.enabled``: before clipping :class:`foxdqn.step.pruning.MagnitudePruner` zeroes the
  gradients of pruned entries; after the Adam step it updates and applies the weight masks; after
  the target update the target takes the same masks.
* ``regime.enabled``: the regime weights are already in ``batch.weight`` (the replay multiplies
  them in at sample time, :mod:`foxdqn.replay.regime`); priorities stay the unweighted |TD|.
"""
from __future__ import annotations

import torch

from foxdqn.replay.buffer import Batch
from foxdqn.step.adam import adam_update_
from foxdqn.step.grad_clip import grad_norm_and_coefficient
from foxdqn.device.scalars import device_scalar
from foxdqn.step.state import TrainState


def micro_batches(batch: Batch, m: int) -> list[Batch]:
    """Split a batch of B rows into ``m`` batches of B/m consecutive rows (views; B % m == 0,
    checked by the config as ``optim.accumulate``); a field that is None stays None."""
    if m == 1:
        return [batch]
    return [type(batch)(*fields) for fields in zip(*((None,) * m if f is None else f.chunk(m) for f in batch))]


def accumulate_gradients(s: TrainState, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Zero the gradients, back-propagate the batch in ``optim.accumulate`` micro-batches, and
    return (loss float32 0-d detached, td_abs float32 [B], q_values float32 [B, A]) of the whole
    batch. The gradients left in ``.grad`` are those of the whole batch's loss."""
    m = s.cfg.optim.accumulate
    # set_to_none=True: the first backward then writes each .grad (no zero fill, and no add into a
    # zeroed .grad per parameter). Nothing keeps a .grad tensor across updates: the pruner
    # (mask_grads), the weight check (WeightCheck.run reads p.grad each update),
    # the clip and Adam read p.grad afresh each update; the guard reads only the
    # norm; checkpoints do not hold gradients. Under a CUDA graph the captured backward allocates
    # the .grad tensors once from the graph's pool and each replay rewrites them. A parameter
    # that gets no gradient keeps .grad None either way (autograd creates none; zeroing a None
    # grad leaves it None), so Adam sees the same parameters as with set_to_none=False.
    s.optim.optimizer.zero_grad(set_to_none=True)
    # the gradient of loss / m; with m = 1 the engine's own seed of ones (a seed tensor passed to
    # backward makes torch import sympy to check its shape, a slow import: docs/bench.md#other-costs)
    seed = device_scalar(s.device, 1.0 / m) if m > 1 else None
    losses, tds, qs = [], [], []
    for mb in micro_batches(batch, m):
        out = s.nets.objective(mb)
        loss = out.loss
        if s.cfg.debug.inject_nan_at_step is not None:  # poison the loss at one update, decided on the device
            loss = loss + torch.where(s.updates == s.nan_at, float("nan"), 0.0)
        loss.backward(seed)
        losses.append(loss.detach())
        tds.append(out.td_abs)
        qs.append(out.q_values)
    if m == 1:
        return losses[0], tds[0], qs[0]
    return torch.stack(losses).mean(), torch.cat(tds), torch.cat(qs)


def update_step(s: TrainState) -> None:
    """One gradient update of ``s`` (device ops only; the steps in the module docstring)."""
    a = s.cfg.agent
    batch = s.replay.sample(a.batch_size, s.generator)
    loss, td_abs, q_values = accumulate_gradients(s, batch)
    if s.pruner is not None:
        s.pruner.mask_grads()
    # clip_grad_norm_'s norm and coefficient in one kernel; Adam's kernel multiplies by it
    grad_norm, clip = grad_norm_and_coefficient(s.nets.trainable, device_scalar(s.device, s.cfg.optim.grad_clip))
    s.monitors.qmon.update(q_values, s.updates)
    spike = None
    if s.lr_spike_at is not None:  # debug: one update with a learning rate 2**100 times too large
        spike = torch.where(s.updates == s.lr_spike_at, 2.0 ** 100, 1.0)
        s.optim.lr.mul_(spike)
    if s.optim.weight_check is not None:
        s.optim.weight_check.run(clip)  # Adam's step on a copy: max |w| after it, for the guard
    skip = s.monitors.guard.check(loss, grad_norm.detach(), s.updates)
    # with guard.keep_last_good Adam's kernel also copies the weights it starts from, where it applies the step
    last_good = s.optim.last_good
    adam_update_(s.optim.optimizer, grad_scale=clip, skip=skip, prior=None if last_good is None else last_good.of)
    if spike is not None:
        s.optim.lr.div_(spike)  # a power of two: lr is restored exactly
    if s.pruner is not None:
        s.pruner.step(s.updates, skip)
    # the target weight and `updates += 1` in one kernel: nothing below reads the counter
    s.target_update.apply(s.updates, skip, advance=True)
    if s.pruner is not None:
        s.pruner.mask_target()
    s.replay.update_priorities(batch.index, td_abs, skip)
