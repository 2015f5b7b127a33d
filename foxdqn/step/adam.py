"""The run's Adam: its state in ``torch.optim.Adam``'s form, stepped by :mod:`foxdqn.ops.adam_step` in one kernel.

``torch.optim.Adam(fused=True)`` is three kernels per update on CUDA (step ``+= 1``, the
multi-tensor kernel, step ``-= found_inf``), and its multi-tensor kernel runs on a few blocks for
a network of ~10**5 parameters (a large share of an ``eurusd_dqn`` update:
docs/bench.md#launch-constants).
:func:`foxdqn.ops.adam_step.adam_step_` does the same update, the clip coefficient's multiply
and the guard's skip in one launch per 8 tensors.

:class:`Adam` holds the state: ``state[p]`` with ``step`` (float32 0-d on the device),
``exp_avg`` and ``exp_avg_sq``, one ``param_groups`` entry with ``lr``, ``betas`` and ``eps``,
and ``state_dict`` / ``load_state_dict`` in ``torch.optim.Adam(fused=True, capturable=True)``'s
format, so a checkpoint loads into either. It is not a ``torch.optim.Optimizer``: constructing
one imports ``torch._dynamo`` (``Optimizer`` wraps its methods with ``torch._disable_dynamo``),
a large part of a warm start (docs/bench.md#start-up), for a class the run uses only as a
dictionary. :func:`adam_update_` and :func:`adam_state` take either (they read
``state`` and ``param_groups``) and read the state tensors afresh at every call
(``load_state_dict`` replaces them).
"""
from __future__ import annotations

import torch

from foxdqn.ops.adam_step import adam_step_
from foxdqn.device.scalars import device_scalar

_STATE_KEYS = ("step", "exp_avg", "exp_avg_sq")


class Adam:
    """Adam (Kingma & Ba 2015, Algorithm 1; no amsgrad, weight decay or maximize) over one group of
    parameters, stepped by :func:`adam_update_`.

    Args:
        params: the trained parameters, float32 on one device (several devices or dtypes are the
            kernel's error at the first step).
        lr: float32 0-d tensor on the parameters' device, the learning rate (changed in place by
            the caller; :meth:`load_state_dict` copies into it, never rebinds it).
        betas: (β1, β2), each in [0, 1).
        eps: ε > 0, added to √v̂.

    Attributes:
        param_groups: one dict as ``torch.optim.Adam``'s group: ``params``, ``lr``, ``betas``,
            ``eps`` and the fixed ``weight_decay=0``, ``amsgrad=False``, ``maximize=False``,
            ``foreach=None``, ``capturable``, ``differentiable=False``, ``fused=True``,
            ``decoupled_weight_decay=False``.
        state: parameter → ``{"step", "exp_avg", "exp_avg_sq"}``, made at its first step.

    Raises:
        ValueError: a beta outside [0, 1) or eps <= 0.
    """

    #: foxdqn.run.checkpoint's tensor walk passes over it: its state goes in the checkpoint's "optimizer"
    #: entry (state_dict) and comes back through load_state_dict
    checkpointed = False

    def __init__(self, params, lr: torch.Tensor, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        params = list(params)
        if not all(0.0 <= b < 1.0 for b in betas) or not eps > 0:
            raise ValueError(f"Adam: betas must be in [0, 1) and eps > 0, got betas={tuple(betas)}, eps={eps}")
        self.param_groups = [{"params": params, "lr": lr, "betas": (float(betas[0]), float(betas[1])),
                              "eps": float(eps), "weight_decay": 0.0, "amsgrad": False, "maximize": False,
                              "foreach": None, "capturable": lr.is_cuda, "differentiable": False, "fused": True,
                              "decoupled_weight_decay": False}]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    @property
    def params(self) -> list[torch.Tensor]:
        """The group's parameters, in order (the ``state_dict`` indices)."""
        return self.param_groups[0]["params"]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Every parameter's gradient to None (``set_to_none``) or to zeros in place."""
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def step(self, *, grad_scale: torch.Tensor | None = None, skip: torch.Tensor | None = None) -> None:
        """:func:`adam_update_` of this optimizer (same keyword arguments)."""
        adam_update_(self, grad_scale=grad_scale, skip=skip)

    def state_dict(self) -> dict:
        """``{"state": {i: {"step", "exp_avg", "exp_avg_sq"}}, "param_groups": [group with "params": [0..n-1]]}``,
        torch.optim.Adam's format; the tensors are this optimizer's own (not copies), as torch's are."""
        index = {id(p): i for i, p in enumerate(self.params)}
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        group["params"] = list(range(len(self.params)))
        return {"state": {index[id(p)]: dict(st) for p, st in self.state.items()}, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Copy a :meth:`state_dict` (this class's or ``torch.optim.Adam``'s) into this optimizer.

        The moments are copied to each parameter's device and dtype, every step to a float32 0-d
        tensor on it; the learning rate is copied into the ``lr`` tensor; betas and eps are the
        saved ones.

        Raises:
            ValueError: not one group of as many parameters as this one, a state of a parameter
                index outside it or missing a key, a moment of another shape than its parameter,
                or amsgrad / weight decay / maximize set.
        """
        groups, n = state_dict.get("param_groups", []), len(self.params)
        if len(groups) != 1 or len(groups[0].get("params", ())) != n or any(k not in groups[0] for k in ("lr", "betas", "eps")):
            sizes = [len(g.get("params", ())) for g in groups]
            raise ValueError(f"Adam.load_state_dict: one parameter group of {n} parameters with lr, betas and eps "
                             f"expected, got groups of {sizes} parameters")
        saved = groups[0]
        if saved.get("amsgrad") or saved.get("weight_decay") or saved.get("maximize"):
            raise ValueError("Adam.load_state_dict: amsgrad, weight decay and maximize are not supported, got "
                             f"amsgrad={saved.get('amsgrad')}, weight_decay={saved.get('weight_decay')}, "
                             f"maximize={saved.get('maximize')}")
        state = {}
        for i, st in state_dict.get("state", {}).items():
            if not isinstance(i, int) or not 0 <= i < n or any(k not in st for k in _STATE_KEYS):
                raise ValueError(f"Adam.load_state_dict: state {i!r} is not a parameter index in [0, {n}) with "
                                 f"keys {_STATE_KEYS}")
            p = self.params[i]
            if st["step"].numel() != 1:
                raise ValueError(f"Adam.load_state_dict: parameter {i}'s step must be one number, got {list(st['step'].shape)}")
            if st["exp_avg"].shape != p.shape or st["exp_avg_sq"].shape != p.shape:
                raise ValueError(f"Adam.load_state_dict: parameter {i} is {list(p.shape)}, its saved moments are "
                                 f"{list(st['exp_avg'].shape)} and {list(st['exp_avg_sq'].shape)}")
            state[p] = {"step": st["step"].detach().to(device=p.device, dtype=torch.float32).reshape(()).clone(),
                        "exp_avg": st["exp_avg"].detach().to(device=p.device, dtype=p.dtype).clone(),
                        "exp_avg_sq": st["exp_avg_sq"].detach().to(device=p.device, dtype=p.dtype).clone()}
        lr = torch.as_tensor(saved["lr"], dtype=torch.float32)
        betas, eps = tuple(float(b) for b in saved["betas"]), float(saved["eps"])
        if lr.numel() != 1 or len(betas) != 2:
            raise ValueError(f"Adam.load_state_dict: lr must be one number and betas two, got lr {list(lr.shape)}, "
                             f"betas {betas}")
        group = self.param_groups[0]  # every check passed: change nothing before this point
        with torch.no_grad():
            group["lr"].copy_(lr.reshape(()))
        group["betas"], group["eps"] = betas, eps
        self.state = state


def adam_state(optimizer: Adam, params: list[torch.Tensor]) -> tuple[list, list, list]:
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


def adam_hyperparameters(optimizer: Adam) -> tuple[float, float, float]:
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


def group_lr(optimizer: Adam) -> torch.Tensor:
    """The learning rate of ``optimizer``'s group as a float32 0-d tensor on its parameters' device:
    the group's own tensor (the run's :attr:`foxdqn.step.state.Optimization.lr`), or a cached
    device scalar of a float lr."""
    g = optimizer.param_groups[0]
    lr = g["lr"]
    return lr if isinstance(lr, torch.Tensor) else device_scalar(g["params"][0].device, float(lr))


@torch.no_grad()
def adam_update_(optimizer: Adam, *, grad_scale: torch.Tensor | None = None,
                 skip: torch.Tensor | None = None, prior: dict[int, torch.Tensor] | None = None) -> None:
    """Adam's step of every parameter of ``optimizer`` that has a gradient, in place.

    The parameters without a gradient are left alone, as ``optimizer.step()`` leaves them.
    Device ops only (capturable after one eager call).

    Args:
        optimizer: :class:`Adam` (or a ``torch.optim.Adam``) over float32 contiguous parameters on
            one device (one group); the learning rate is its group's (:func:`group_lr`: the run's
            :attr:`foxdqn.step.state.Optimization.lr` tensor).
        grad_scale: float32 0-d, each gradient is multiplied by it (the clip coefficient), or None.
        skip: float32 0-d, 1.0 leaves parameters, moments and step counts unchanged (the guard's
            skip), or None.
        prior: None, or ``id(param)`` → a tensor of its shape that receives the parameter's value
            from before the step where the step is applied (:class:`foxdqn.step.last_good.LastGood`).

    Raises:
        ValueError: see :func:`adam_hyperparameters` and :func:`foxdqn.ops.adam_step.adam_step_`.
    """
    beta1, beta2, eps = adam_hyperparameters(optimizer)
    params = [p for p in optimizer.param_groups[0]["params"] if p.grad is not None]
    if not params:
        return
    exp_avgs, exp_avg_sqs, steps = adam_state(optimizer, params)
    adam_step_(params, [p.grad for p in params], exp_avgs, exp_avg_sqs, steps, lr=group_lr(optimizer), beta1=beta1, beta2=beta2,
               eps=eps, grad_scale=grad_scale, skip=skip,
               prior=None if prior is None else [prior[id(p)] for p in params])
