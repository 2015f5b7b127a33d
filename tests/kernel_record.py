"""Records every Triton kernel launch of a CPU test run, so that ``tests/compile_kernels.py`` can
compile each one for a CUDA target afterwards.

Triton's interpreter (``TRITON_INTERPRET=1``, the CPU suite) runs a kernel's Python body with
NumPy and checks none of what the compiler checks (a loop-carried variable that changes type, a
constexpr used as a tensor, ...): a kernel can pass every CPU test and fail to compile on the GPU.
With ``FOXDQN_KERNEL_RECORD=DIR`` in the environment, ``tests/conftest.py`` calls :func:`install`:
each launch's kernel (module and name), argument types and constexpr values go, once per distinct
combination, to ``DIR/<xdist worker>.jsonl`` at the process's exit.
"""
from __future__ import annotations

import atexit
import inspect
import json
import os
from pathlib import Path

import torch

#: torch dtype → Triton's pointer element type.
_POINTEE = {torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16",
            torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
            torch.bool: "i1"}


def _is_constexpr(param: inspect.Parameter) -> bool:
    a = param.annotation
    return a is not inspect.Parameter.empty and ("constexpr" in a if isinstance(a, str) else "constexpr" in repr(a))


def _arg_type(name: str, value) -> str:
    """Triton's signature type of a runtime argument: ``*fp32`` for a float32 tensor, ``i32``/``i64``
    for an int by its range, ``fp32`` for a float, ``i1`` for a bool."""
    if isinstance(value, torch.Tensor):
        return "*" + _POINTEE[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"kernel argument {name}: no Triton type for {type(value).__name__}")


def launch_record(fn, args: tuple, kwargs: dict) -> dict:
    """The record of one launch of the Python kernel function ``fn`` with ``args``/``kwargs``:
    ``{"module", "name", "file", "signature": {arg: type or "constexpr"}, "constexprs": {arg: value},
    "options": {"num_warps": n, "num_stages": s}}`` (the launch options given; not arguments; ``file``
    the kernel's source file, for a test module that only pytest's sys.path can import).

    Raises:
        TypeError: an argument of a type Triton has no signature type for.
    """
    params = inspect.signature(fn).parameters
    bound = dict(zip(params, args))
    bound.update({k: v for k, v in kwargs.items() if k in params})
    signature, constexprs = {}, {}
    for name, param in params.items():
        value = bound.get(name, param.default)
        if _is_constexpr(param) or value is None:
            signature[name] = "constexpr"
            constexprs[name] = value.value if hasattr(value, "value") else value
        else:
            signature[name] = _arg_type(name, value)
    options = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}
    return {"module": fn.__module__, "name": fn.__qualname__, "file": inspect.getsourcefile(fn),
            "signature": signature, "constexprs": constexprs, "options": options}


def install(folder: str | os.PathLike):
    """Wraps Triton's interpreter launch so that each distinct launch is recorded. Returns the
    function that writes the records to ``folder/<xdist worker>-<pid>.jsonl`` (conftest calls it at
    the session's end; it is also registered with atexit, for processes that end otherwise)."""
    from triton.runtime.interpreter import InterpretedFunction

    seen: dict[str, dict] = {}
    launch = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        record = launch_record(self.fn, args, kwargs)
        seen.setdefault(json.dumps(record, sort_keys=True, default=repr), record)
        return launch(self, *args, grid=grid, warmup=warmup, **kwargs)

    def write():
        path = Path(folder) / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r, default=repr) + "\n" for r in seen.values()))

    InterpretedFunction.run = run
    atexit.register(write)
    return write
