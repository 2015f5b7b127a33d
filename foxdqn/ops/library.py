"""Our ops' ``torch.library`` registration, made for ``torch.compile`` only, not at import.

Registering an op with ``torch.library.triton_op`` imports ``torch._inductor`` (to find the
Triton kernels in the op's source), and with it ``torch._dynamo``, sympy and pandas; calling any
``torch.library`` op imports ``torch._dynamo`` too (its backend function is wrapped in
``torch._disable_dynamo``), as does ``torch.compiler.disable`` when it decorates. A training run
never compiles: eager calls and CUDA-graph capture launch the kernels directly. Those imports
are a large part of a warm start (docs/bench.md#start-up, docs/bench.md#other-costs), so the ops
are registered when ``torch.compile`` needs them:

* :func:`device_op` wraps an op's launcher (the function a ``triton_op`` would register, with
  its Triton launches through ``torch.library.wrap_triton``). Eager calls run the launcher
  itself; under ``torch.compile`` the call goes to the registered ``torch.ops.foxdqn.<name>``,
  which Inductor sees into as it sees into any ``triton_op``.
* :func:`wrap_triton` is what the launchers launch through: the kernel itself, or
  ``torch.library.wrap_triton(kernel)`` once :func:`register_ops` ran (the launch may then be
  traced). ``torch.library.wrap_triton`` of a compiled kernel imports ``torch._dynamo`` too
  (``torch._higher_order_ops.triton_kernel_wrap`` asks ``torch.utils._triton.has_triton``).
* :func:`compile_disabled` marks a host-touching public function (the pinned-ring writers) that
  Dynamo must run as an opaque call (a graph break), as ``torch.compiler.disable`` does.
* :func:`register_ops` registers every op made by :func:`device_op` and every
  :func:`compile_disabled` function. Call it once before ``torch.compile`` of code that calls a
  foxdqn op (it imports ``torch._inductor``). A foxdqn op met while compiling without it raises
  (with ``fullgraph=True`` that error stops the compile; without, Dynamo breaks the graph there
  and runs the op eagerly). Eager calls after it still launch the kernels directly; a call on
  traced (fake or functional) tensors, as AOTAutograd makes when it traces a registered op's
  backward outside Dynamo, goes to the registered op.

Ops with a derivative (:meth:`DeviceOp.register_autograd`) run eagerly, when an input requires
grad, through one ``torch.autograd.Function`` with the same ``setup_context`` and ``backward``
that ``register_autograd`` gets when the op is registered (inputs bound to the signature with
defaults filled in; no list inputs).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import pkgutil
from typing import Any, Callable, Iterable

import torch

import foxdqn.ops

__all__ = ["DeviceOp", "device_op", "compile_disabled", "register_ops", "wrap_triton"]

_OPS: list["DeviceOp"] = []
_DISABLED: list["_CompileDisabled"] = []
_REGISTERED = False

_HINT = "call foxdqn.ops.library.register_ops() before torch.compile of code that calls foxdqn ops"


class DeviceOp:
    """An op launcher registered with ``torch.library.triton_op`` only by :func:`register_ops`.

    Args:
        qualname: ``"foxdqn::<name>"``, the name under ``torch.ops``.
        fn: the launcher, type-annotated as ``triton_op`` needs (its schema is inferred from them).
        mutates_args: the arguments ``fn`` writes, as for ``triton_op``.

    Calling it runs ``fn`` (eager), or ``torch.ops.foxdqn.<name>`` while ``torch.compile`` traces.
    """

    def __init__(self, qualname: str, fn: Callable, mutates_args: Iterable[str]) -> None:
        self.qualname, self.fn, self.mutates_args = qualname, fn, mutates_args
        self._setup_context: Callable | None = None
        self._backward: Callable | None = None
        self._op: Any = None  # the torch.ops overload packet, once registered
        functools.update_wrapper(self, fn)
        _OPS.append(self)

    def register_autograd(self, backward: Callable, *, setup_context: Callable) -> None:
        """The op's derivative, with ``CustomOpDef.register_autograd``'s signatures:
        ``setup_context(ctx, inputs, output)`` and ``backward(ctx, *grads)`` (one gradient or None
        per input)."""
        self._setup_context, self._backward = setup_context, backward

    def __call__(self, *args, **kwargs):
        # AOTAutograd traces a registered op's backward outside Dynamo (is_compiling() is False
        # there) on fake tensors, which only the registered op can take: a direct launch would
        # read their data pointers
        if torch.compiler.is_compiling() or _traced(args, kwargs):
            if self._op is None:
                raise RuntimeError(f"{self.qualname} is not registered with torch.library: {_HINT}")
            return self._op(*args, **kwargs)
        with _direct_launches():
            if self._backward is not None and torch.is_grad_enabled():
                inputs = self._inputs(args, kwargs)
                if any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs):
                    return _EagerAutograd.apply(self, *inputs)
            return self.fn(*args, **kwargs)

    def _inputs(self, args, kwargs) -> tuple:
        """Every input of ``fn`` in its signature's order, defaults filled in (what torch's
        ``register_autograd`` hands ``setup_context`` and expects a gradient for)."""
        bound = inspect.signature(self.fn).bind(*args, **kwargs)
        bound.apply_defaults()
        inputs = tuple(bound.arguments.values())
        if any(isinstance(t, (list, tuple)) for t in inputs):
            raise TypeError(f"{self.qualname}: an op with a derivative takes no list inputs here")
        return inputs

    def _register(self) -> None:
        op = torch.library.triton_op(self.qualname, self.fn, mutates_args=self.mutates_args)
        if self._backward is not None:
            op.register_autograd(self._backward, setup_context=self._setup_context)
        namespace, name = self.qualname.split("::")
        self._op = getattr(getattr(torch.ops, namespace), name)


def _traced(args, kwargs) -> bool:
    """Whether a tensor among the arguments (or in a list argument) is of a tensor subclass: the
    fake and functional tensors of a trace (a plain tensor or ``nn.Parameter`` is not). Any other
    subclass (a user's, DTensor) also goes to the registered op, which takes it; unregistered, the
    call raises the ``register_ops()`` hint, as under Dynamo."""
    for a in (*args, *kwargs.values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, torch.Tensor) and type(t) not in (torch.Tensor, torch.nn.Parameter):
                return True
    return False


class _EagerAutograd(torch.autograd.Function):
    """Eager form of a :class:`DeviceOp` with a derivative: ``forward(ctx, op, *inputs)``."""

    @staticmethod
    def forward(ctx, op: DeviceOp, *inputs):
        with _direct_launches():
            output = op.fn(*inputs)
        ctx.device_op = op
        op._setup_context(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx, *grads):
        # needs_input_grad counts the op argument first: the op's backward reads its own inputs' flags
        with _direct_launches():
            result = ctx.device_op._backward(_ShiftedContext(ctx), *grads)
        return (None, *(result if isinstance(result, tuple) else (result,)))


class _ShiftedContext:
    """``ctx`` with ``needs_input_grad`` of the op's inputs only (without the leading op argument)."""

    def __init__(self, ctx) -> None:
        object.__setattr__(self, "_ctx", ctx)

    @property
    def needs_input_grad(self):
        return self._ctx.needs_input_grad[1:]

    def __getattr__(self, name):
        return getattr(self._ctx, name)


class _CompileDisabled:
    """A public function that Dynamo runs as an opaque call once :func:`register_ops` ran."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self._disabled: Callable | None = None
        functools.update_wrapper(self, fn)
        _DISABLED.append(self)

    def __call__(self, *args, **kwargs):
        if torch.compiler.is_compiling():
            if self._disabled is None:
                raise RuntimeError(f"{self.fn.__module__}.{self.fn.__name__} cannot be traced: {_HINT}")
            return self._disabled(*args, **kwargs)
        return self.fn(*args, **kwargs)


def _direct_launches():
    """Context in which ``torch.library.wrap_triton`` returns the kernel itself: what a registered op's
    eager call does (``torch._library.triton.set_wrap_triton_enabled(False)``), since the traceable
    wrapper's dispatch is slow (docs/bench.md#other-costs) and records each launch in torch's kernel
    side table. Nothing to do before :func:`register_ops` (:func:`wrap_triton` returns the kernel then)."""
    if not _REGISTERED:
        return contextlib.nullcontext()
    from torch._library import triton as library_triton

    switch = getattr(library_triton, "set_wrap_triton_enabled", None)
    return switch(False) if switch is not None else contextlib.nullcontext()


def device_op(qualname: str, *, mutates_args: Iterable[str]) -> Callable[[Callable], DeviceOp]:
    """Decorator: ``fn`` as a :class:`DeviceOp` named ``qualname`` (``"foxdqn::<name>"``)."""
    return lambda fn: DeviceOp(qualname, fn, mutates_args)


def compile_disabled(fn: Callable) -> Callable:
    """Decorator: ``fn`` runs as itself eagerly and as ``torch.compiler.disable(fn)`` (a graph break)
    while ``torch.compile`` traces, after :func:`register_ops`."""
    return _CompileDisabled(fn)


def register_ops() -> None:
    """Register every foxdqn op with ``torch.library`` (``triton_op`` and its autograd formula) and
    wrap every :func:`compile_disabled` function with ``torch.compiler.disable``, so that
    ``torch.compile`` can trace code calling them (``fullgraph=True`` included, except across a
    disabled function). Imports every module of :mod:`foxdqn.ops` first. Idempotent.

    Imports ``torch._inductor`` and ``torch._dynamo`` (seconds: docs/bench.md#other-costs; the reason
    this is not done at import).
    """
    global _REGISTERED
    for module in pkgutil.iter_modules(foxdqn.ops.__path__):
        importlib.import_module(f"foxdqn.ops.{module.name}")
    for op in _OPS:
        if op._op is None:
            op._register()
    for fn in _DISABLED:
        if fn._disabled is None:
            fn._disabled = torch.compiler.disable(fn.fn)
    _REGISTERED = True


def wrap_triton(kernel):
    """``kernel`` (a ``@triton.jit`` function) to launch as ``kernel[grid](...)``: itself, or
    ``torch.library.wrap_triton(kernel)`` once :func:`register_ops` ran, so that a launch inside a
    registered op can be traced by ``torch.compile``."""
    return torch.library.wrap_triton(kernel) if _REGISTERED else kernel
