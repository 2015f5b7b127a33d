"""The run's Adam step in one kernel: ``torch.optim.Adam`` keeps the state, :mod:`foxdqn.ops.adam_step` steps it.

``torch.optim.Adam(fused=True)`` is three kernels per update on CUDA (step ``+= 1``, the
multi-tensor kernel, step ``-= found_inf``), and its multi-tensor kernel runs on a few blocks for
a network of ~10**5 parameters (34.6 µs of a 213 µs ``eurusd_dqn`` update on the H200).
:func:`foxdqn.ops.adam_step.adam_step_` does the same update, the clip coefficient's multiply
and the guard's skip in one launch per 8 tensors. The optimizer object stays what the run
checkpoints and resumes (``state_dict`` / ``load_state_dict``: its ``state[p]`` holds ``step``
(float32 0-d on the device), ``exp_avg`` and ``exp_avg_sq``, torch's own format), and its group's
``betas`` and ``eps`` are the hyperparameters; :func:`adam_update_` reads the state tensors
afresh at every call (``load_state_dict`` replaces them).
"""
from __future__ import annotations

import torch

from foxdqn.ops.adam_step import adam_step_
from foxdqn.step.scalars import device_scalar


def adam_state(optimizer: torch.optim.Adam, params: list[torch.Tensor]) -> tuple[list, list, list]:
    """``(exp_avgs, exp_avg_sqs, steps)`` of ``params`` in ``optimizer.state``, creating any that is
    missing as torch's fused Adam does on its first step (zero moments like the parameter, a float32
    0-d zero step on the parameter's device)."""
    state = optimizer.state
    for p in params:
        st = state.get(p)
        if not st:
            state[p] = {"step": torch.zeros((), dtype=torch.float32, device=p.device),
                        "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                        "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        elif st["step"].device != p.device or st["step"].dtype != torch.float32:
            # load_state_dict keeps a non-fused, non-capturable group's step on the CPU: the kernel
            # reads it on the parameter's device (eager only: a resume happens before any capture)
            st["step"] = st["step"].to(device=p.device, dtype=torch.float32)
    return ([state[p]["exp_avg"] for p in params], [state[p]["exp_avg_sq"] for p in params],
            [state[p]["step"] for p in params])


def adam_hyperparameters(optimizer: torch.optim.Adam) -> tuple[float, float, float]:
    """``(beta1, beta2, eps)`` of ``optimizer``'s single parameter group.

    Raises:
        ValueError: several groups, amsgrad, weight decay or maximize (not what the kernel does).
    """
    groups = optimizer.param_groups
    g = groups[0]
    if len(groups) != 1 or g.get("amsgrad") or g.get("weight_decay") or g.get("maximize"):
        raise ValueError("adam_update_: one parameter group of plain Adam is supported (no amsgrad, weight decay "
                         f"or maximize); got {len(groups)} group(s) of {sorted(k for k in g if k != 'params')}")
    beta1, beta2 = g["betas"]
    return float(beta1), float(beta2), float(g["eps"])


def group_lr(optimizer: torch.optim.Adam) -> torch.Tensor:
    """The learning rate of ``optimizer``'s group as a float32 0-d tensor on its parameters' device:
    the group's own tensor (the run's :attr:`foxdqn.step.state.Optimization.lr`), or a cached
    device scalar of a float lr."""
    g = optimizer.param_groups[0]
    lr = g["lr"]
    return lr if isinstance(lr, torch.Tensor) else device_scalar(g["params"][0].device, float(lr))


@torch.no_grad()
def adam_update_(optimizer: torch.optim.Adam, grad_scale: torch.Tensor | None = None,
                 skip: torch.Tensor | None = None) -> None:
    """Adam's step of every parameter of ``optimizer`` that has a gradient, in place.

    The parameters without a gradient are left alone, as ``optimizer.step()`` leaves them.
    Device ops only (capturable after one eager call).

    Args:
        optimizer: ``torch.optim.Adam`` over float32 contiguous parameters on one device (one
            group); the learning rate is its group's (:func:`group_lr`: the run's
            :attr:`foxdqn.step.state.Optimization.lr` tensor).
        grad_scale: float32 0-d, each gradient is multiplied by it (the clip coefficient), or None.
        skip: float32 0-d, 1.0 leaves parameters, moments and step counts unchanged (the guard's
            skip), or None.

    Raises:
        ValueError: see :func:`adam_hyperparameters` and :func:`foxdqn.ops.adam_step.adam_step_`.
    """
    beta1, beta2, eps = adam_hyperparameters(optimizer)
    params = [p for p in optimizer.param_groups[0]["params"] if p.grad is not None]
    if not params:
        return
    exp_avgs, exp_avg_sqs, steps = adam_state(optimizer, params)
    adam_step_(params, [p.grad for p in params], exp_avgs, exp_avg_sqs, steps, lr=group_lr(optimizer), beta1=beta1, beta2=beta2,
               eps=eps, grad_scale=grad_scale, skip=skip)
