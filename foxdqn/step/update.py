"""One gradient update: sample → (Double) DQN loss → backward → clip → guard → Adam → Polyak.

Device ops only. The training guard (ops.training_guard) turns NaN/Inf, a loss above the clip
or a gradient collapse into ``skip`` = 1 on the device; fused Adam reads it as ``found_inf`` and
leaves the parameters and its step count unchanged, and the Polyak update uses τ·(1 − skip), so a
bad update changes nothing (zero_sync_hot_path.md component A, ARCHITECTURE.md contract 5).
"""
from __future__ import annotations

import torch

from foxdqn.objectives import double_dqn_loss
from foxdqn.step.state import TrainState


def update_step(s: TrainState) -> None:
    a = s.cfg.agent
    batch = s.replay.sample(a.batch_size, s.generator)
    td = double_dqn_loss(s.online, s.target, batch.obs, batch.action, batch.reward, batch.next_obs,
                         batch.done, s.gamma, a.huber_delta, s.cfg.head.double)
    # debug.inject_nan_at_step: poison the loss at one update, decided on the device
    loss = td.loss + torch.where(s.updates == s.nan_at, float("nan"), 0.0)
    s.optimizer.zero_grad(set_to_none=False)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(s.online_params, a.grad_clip, foreach=True)
    s.qmon.update(td.q_online, s.updates)
    skip = s.guard.check(loss.detach(), grad_norm.detach(), s.updates)
    s.optimizer.step()  # found_inf = skip
    torch.mul(s.tau, 1.0 - skip, out=s.tau_eff)
    torch._foreach_lerp_(s.target_params, s.online_params, [s.tau_eff] * len(s.online_params))
    s.updates.add_(1)
