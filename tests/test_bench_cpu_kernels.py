"""bench.cpu_kernels: the launches of a step counted on the CPU (one per Triton launch and per
kernel-launching aten op; views and no-op conversions free; host reads listed), and
foxdqn.ops.backend.cpu_kernels, which makes "auto" run the kernels on CPU tensors."""
import pytest
import torch

if torch.cuda.is_available():  # counting runs the kernels in the interpreter: CPU sessions only
    pytest.skip("launches are counted on the CPU (TRITON_INTERPRET=1); bench kernels counts them on CUDA",
                allow_module_level=True)

from bench import cpu_kernels as ck
from foxdqn.ops import backend as B
from foxdqn.ops.member_uniform import member_uniform


def test_launches_count_kernels_not_views_and_list_host_reads():
    x = torch.arange(12, dtype=torch.float32)
    keys = torch.tensor([1, 2], dtype=torch.int64)
    counter = torch.zeros((), dtype=torch.int64)

    def step():
        y = x.view(3, 4)[1:].reshape(-1).to(torch.float32)  # views and a no-op conversion: nothing
        z = (y * 2).to(torch.float64)  # two kernels
        w = x.view(3, 4).t().reshape(-1)  # a reshape that copies: one
        u = member_uniform(keys, counter, 5)  # "auto" on CPU: the Triton kernel inside cpu_kernels
        counter.add_(5)
        return z.sum().item() + float(u[0, 0]) + float(w[0])  # sum, then three host reads

    assert ck.launches(step) == ["aten::mul", "aten::to", "aten::reshape", "triton::_member_uniform_kernel",
                                 "aten::add_", "aten::sum", "aten::item", "aten::item", "aten::item"]


def test_cpu_kernels_makes_auto_pick_triton_and_restores_it():
    cpu = torch.zeros(1)
    assert B.resolve_backend("op", "auto", cpu) == "torch" and not B.fused_forward(cpu)
    with B.cpu_kernels():
        assert B.resolve_backend("op", "auto", cpu) == "triton" and B.fused_forward(cpu)
        assert B.resolve_backend("op", "torch", cpu) == "torch"
    assert B.resolve_backend("op", "auto", cpu) == "torch" and not B.fused_forward(cpu)


def test_cpu_kernels_needs_the_interpreter(monkeypatch):
    monkeypatch.setattr(B, "INTERPRET", False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        with B.cpu_kernels():
            pass


def test_shipped_widths_keep_the_experiments_network():
    """--shipped-widths: no model.hidden override, smoke's hidden cap lifted (a 2 x 256 MLP of
    eurusd_dqn stays 256 wide, where the small overrides make it 16)."""
    from foxdqn.config.compose import load_config

    small = ck.small_overrides("eurusd_dqn")
    shipped = ck.small_overrides("eurusd_dqn", shipped_widths=True)
    assert "model.hidden=[16]" in small and not any(o.startswith("model.hidden=") for o in shipped)
    assert load_config(["+experiment=eurusd_dqn", *shipped]).model.hidden == [256, 256]
    assert load_config(["+experiment=eurusd_dqn", *small]).model.hidden == [16]
