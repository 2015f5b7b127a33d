"""Backend dispatch shared by the ops: Triton kernel or plain-torch reference.

Every public op takes ``backend="auto" | "triton" | "torch"``. ``auto`` runs the Triton kernel
for CUDA tensors and the torch reference otherwise; ``triton`` on CPU tensors needs Triton's
interpreter (``TRITON_INTERPRET=1`` in the environment before the op module is imported: Triton
reads it at ``@triton.jit`` time).
"""
from __future__ import annotations

import contextlib
import math
import numbers
import os
from typing import Callable, Iterable

import torch

#: Triton's interpreter is on (read once, when foxdqn.ops is first imported, as Triton does).
INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"

_BACKENDS = ("auto", "triton", "torch")
#: what ``"auto"`` picks for CPU tensors: the torch reference, or Triton's interpreter inside
#: :func:`cpu_kernels`
_auto_cpu = "torch"


@contextlib.contextmanager
def cpu_kernels():
    """Within the block, ``backend="auto"`` runs the Triton kernels for CPU tensors too (in Triton's
    interpreter) and :func:`fused_forward` is True for them: a step on the CPU then calls the ops
    a step on CUDA calls, one kernel launch each, so its launches can be counted without a GPU
    (bench/cpu_kernels.py). For counting and tests only (the interpreter is slow); not thread-safe.

    Raises:
        RuntimeError: TRITON_INTERPRET=1 was not set before foxdqn.ops was imported.
    """
    global _auto_cpu
    if not INTERPRET:
        raise RuntimeError("cpu_kernels: needs TRITON_INTERPRET=1 set before foxdqn.ops is imported")
    before, _auto_cpu = _auto_cpu, "triton"
    try:
        yield
    finally:
        _auto_cpu = before


def fused_forward(t: torch.Tensor) -> bool:
    """Whether a network takes its fused no-gradient forward (one kernel) for input ``t``: on CUDA,
    or on the CPU inside :func:`cpu_kernels` (:class:`foxdqn.nn.qnet.QNetwork`'s
    ``chain_backend="auto"``, :class:`foxdqn.population.network.MemberQNetwork`)."""
    return t.is_cuda or _auto_cpu == "triton"


def describe(t) -> str:
    """What an op's argument is, for its error messages: ``"dtype [shape] on device"`` for a tensor
    (`` (not contiguous)`` added when it is not), else the type's name."""
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{t.dtype} {list(t.shape)}{'' if t.is_contiguous() else ' (not contiguous)'} on {t.device}"


def float32_problem(op: str, named: Iterable[tuple[str, object, int]]) -> str | None:
    """The first ``(name, value, dims)`` whose value is not a float32 tensor of ``dims`` dimensions,
    as an op's error message (``"<op>: <name> must be a float32 tensor of 3 dimensions, got ..."``),
    or None. Shared by the member ops' argument checks."""
    for name, t, dims in named:
        if not isinstance(t, torch.Tensor) or t.dim() != dims or t.dtype != torch.float32:
            unit = "dimension" if dims == 1 else "dimensions"
            return f"{op}: {name} must be a float32 tensor of {dims} {unit}, got {describe(t)}"
    return None


def group_count(op: str, name: str, value, rows: int, valid: Callable[[float], bool], want: str) -> int:
    """The groups G of an op's per-group parameter ``value``: a float32 ``[G]`` tensor (G >= 1
    dividing ``rows``; its device values are not checked) gives G, a finite real number for which
    ``valid`` holds gives 1.

    Raises:
        ValueError: anything else, ``"{op}: {name} must be {want}..."``.
    """
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.dtype != torch.float32 or value.shape[0] < 1 or rows % value.shape[0]:
            raise ValueError(f"{op}: {name} must be {want} or a float32 [G] tensor with G dividing B={rows}, "
                             f"got {describe(value)}")
        return value.shape[0]
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or not valid(value):
        raise ValueError(f"{op}: {name} must be {want}, got {value!r}")
    return 1


def flat_float32(op: str, rows: int, named: Iterable[tuple[str, torch.Tensor | None]]) -> list:
    """Each ``(name, tensor)`` of ``named`` flattened (a view where it can be), None kept.

    Raises:
        ValueError: a tensor that is not float32 of ``rows`` elements.
    """
    out = []
    for name, x in named:
        if x is not None:
            x = x.reshape(-1)
            if x.shape[0] != rows or x.dtype != torch.float32:
                raise ValueError(f"{op}: {name} must be float32 [{rows}], got {describe(x)}")
        out.append(x)
    return out


def check_devices(op: str, q: torch.Tensor, named: Iterable[tuple[str, object]]) -> None:
    """Every tensor of ``named`` (``(name, value)``; other values ignored) on ``q``'s device.

    Raises:
        ValueError: ``"{op}: {name} is on {device}, q on {q.device}"``.
    """
    for name, x in named:
        if isinstance(x, torch.Tensor) and x.device != q.device:
            raise ValueError(f"{op}: {name} is on {x.device}, q on {q.device}")


def resolve_backend(op: str, backend: str, t: torch.Tensor) -> str:
    """The backend that runs ``op`` on tensor ``t``: ``"triton"`` or ``"torch"``.

    Args:
        op: the op's name (starts the error messages).
        backend: ``"auto"`` (``"triton"`` when ``t`` is on CUDA, else ``"torch"``; ``"triton"``
            inside :func:`cpu_kernels`), ``"triton"`` or ``"torch"``.
        t: an input of the op; its device decides ``auto`` and whether Triton can run.

    Raises:
        ValueError: ``backend`` is none of the three names.
        RuntimeError: ``"triton"`` for CPU tensors without TRITON_INTERPRET=1.
    """
    if backend not in _BACKENDS:
        raise ValueError(f"{op}: backend must be 'auto', 'triton' or 'torch', got {backend!r}")
    if backend == "auto":
        return "triton" if t.is_cuda else _auto_cpu
    if backend == "triton" and not t.is_cuda and not INTERPRET:
        raise RuntimeError(f"{op}: backend='triton' on CPU tensors needs TRITON_INTERPRET=1 set before "
                           "foxdqn.ops is imported")
    return backend


def interpreted(kernel) -> bool:
    """``kernel`` (a ``@triton.jit`` function) runs in Triton's interpreter (numpy on the host)."""
    return type(kernel).__name__ == "InterpretedFunction"


def use_sys_fence(t: torch.Tensor, kernel) -> bool:
    """Emit the system-scope fence of the host-ring writers (NVIDIA PTX): CUDA tensor ``t``, not
    ROCm, and ``kernel`` compiled (the interpreter never runs PTX)."""
    return t.is_cuda and torch.version.hip is None and not interpreted(kernel)
