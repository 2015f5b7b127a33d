"""One gradient update: sample → objective → backward → clip → guard → Adam → target → priorities.

Device ops only. The training guard (ops.training_guard) turns NaN/Inf, a loss above the clip
or a gradient collapse into ``skip`` = 1 on the device; fused Adam reads it as ``found_inf`` and
leaves the parameters and its step count unchanged, the target update uses weight·(1 − skip),
and PER priorities are left unchanged, so a bad update changes nothing
(zero_sync_hot_path.md component A; ARCHITECTURE.md contract 5).
"""
from __future__ import annotations

import torch

from foxdqn.step.state import TrainState


def target_weight(s: TrainState, skip: torch.Tensor) -> torch.Tensor:
    """This update's lerp weight for θ' ← θ' + w (θ − θ'): Polyak τ, or 1 every
    ``hard_update_period`` updates (hard copy, Mnih et al. 2015); 0 when the update is skipped."""
    if s.cfg.agent.target_update == "hard":
        w = ((s.updates + 1) % s.hard_period == 0).to(torch.float32)
    else:
        w = s.tau
    return torch.mul(w, 1.0 - skip, out=s.tau_eff)


def update_step(s: TrainState) -> None:
    a = s.cfg.agent
    batch = s.replay.sample(a.batch_size, s.generator)
    out = s.objective(batch)
    loss = out.loss
    if s.cfg.debug.inject_nan_at_step is not None:  # poison the loss at one update, decided on the device
        loss = loss + torch.where(s.updates == s.nan_at, float("nan"), 0.0)
    s.optimizer.zero_grad(set_to_none=False)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(s.trainable, a.grad_clip, foreach=True)
    s.qmon.update(out.q_values, s.updates)
    skip = s.guard.check(loss.detach(), grad_norm.detach(), s.updates)
    s.optimizer.step()  # found_inf = skip
    with torch.no_grad():  # else the targets would join the autograd graph (and keep it alive)
        w = target_weight(s, skip)
        torch._foreach_lerp_(s.target_params, s.source_params, [w] * len(s.target_params))
    s.replay.update_priorities(batch.index, out.td_abs, skip)
    s.updates.add_(1)
