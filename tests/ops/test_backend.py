"""foxdqn.ops.backend: the one place that picks Triton or the torch reference."""
import pytest
import torch

from foxdqn.ops import backend as B


def test_auto_picks_by_device_and_names_pass_through():
    cpu = torch.zeros(1)
    assert B.resolve_backend("op", "auto", cpu) == "torch"
    assert B.resolve_backend("op", "torch", cpu) == "torch"


def test_unknown_backend_names_the_op():
    with pytest.raises(ValueError, match="my_op: backend must be 'auto', 'triton' or 'torch'"):
        B.resolve_backend("my_op", "cuda", torch.zeros(1))


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.setattr(B, "INTERPRET", True)
    assert B.resolve_backend("op", "triton", torch.zeros(1)) == "triton"
    monkeypatch.setattr(B, "INTERPRET", False)
    with pytest.raises(RuntimeError, match="op: backend='triton' on CPU tensors needs TRITON_INTERPRET=1"):
        B.resolve_backend("op", "triton", torch.zeros(1))


def test_no_sys_fence_on_cpu_or_in_the_interpreter():
    class InterpretedFunction:  # the interpreter's kernel type name
        pass

    assert not B.use_sys_fence(torch.zeros(1), InterpretedFunction())
    assert B.interpreted(InterpretedFunction()) and not B.interpreted(object())
