"""foxdqn.ops.library: ops run eagerly without torch.library, register for torch.compile on demand.

The start-up saving it exists for (no torch._dynamo in a training run) is checked in a fresh
interpreter; registration and tracing with ``torch.compile(backend="eager")`` run on the CPU
(Dynamo only, no Inductor code generation).
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from foxdqn.ops.library import DeviceOp, compile_disabled, device_op, register_ops

_TRAINING_RUN_IMPORTS = textwrap.dedent("""
    import sys, torch
    import foxdqn.train, foxdqn.population.train, foxdqn.run.checkpoint, foxdqn.population.step
    from foxdqn.ops.quantile_huber_loss import quantile_huber_loss
    from foxdqn.ops.target_lerp import target_lerp_
    from foxdqn.population.optim import MemberAdam
    q = torch.randn(3, 4, requires_grad=True)
    quantile_huber_loss(q, torch.randn(3, 5), torch.rand(3, 4), 1.0).sum().backward()
    p = torch.nn.Parameter(torch.ones(1, 3)); p.grad = torch.ones(1, 3)
    opt = MemberAdam([p], 0.1); opt.step(torch.zeros(1)); opt.state_dict(); opt.zero_grad()
    t = [torch.zeros(3)]
    target_lerp_(t, [torch.ones(3)], torch.zeros((), dtype=torch.int64), torch.zeros(()), torch.tensor(0.5),
                 torch.ones((), dtype=torch.int64), hard=False, advance=True)
    print("torch._dynamo" in sys.modules, "torch._inductor" in sys.modules, t[0].tolist())
""")


def test_training_run_imports_neither_dynamo_nor_inductor():
    out = subprocess.run([sys.executable, "-c", _TRAINING_RUN_IMPORTS], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[:2] == ["False", "False"], out.stdout
    assert "[0.5, 0.5, 0.5]" in out.stdout  # the ops ran


@device_op("foxdqn_test::scaled", mutates_args=())
def _scaled(x: torch.Tensor, k: float) -> torch.Tensor:
    return x * k


def _scaled_setup(ctx, inputs, output):
    ctx.k = inputs[1]


def _scaled_backward(ctx, grad):
    return (grad * ctx.k if ctx.needs_input_grad[0] else None), None


_scaled.register_autograd(_scaled_backward, setup_context=_scaled_setup)


@device_op("foxdqn_test::shifted", mutates_args=())
def _shifted(x: torch.Tensor, k: float = 2.0) -> torch.Tensor:
    _FLAGS.append(_wrap_enabled())
    return x * k + 1.0


def _shifted_setup(ctx, inputs, output):
    ctx.k = inputs[1]  # the default when the caller omits k


_shifted.register_autograd(lambda ctx, grad: (grad * ctx.k, None), setup_context=_shifted_setup)
_FLAGS: list = []


def _wrap_enabled() -> bool:
    from torch._library.triton import is_wrap_triton_enabled

    return is_wrap_triton_enabled()


@compile_disabled
def _host_side(x: torch.Tensor) -> torch.Tensor:
    return x + float(x.detach().sum())  # a host read: Dynamo must not trace it


def test_eager_call_runs_the_launcher_with_its_derivative():
    assert isinstance(_scaled, DeviceOp) and _scaled.__name__ == "_scaled"
    x = torch.arange(4.0, requires_grad=True)
    y = _scaled(x, 3.0)
    y.sum().backward()
    assert torch.equal(y.detach(), torch.arange(4.0) * 3) and torch.equal(x.grad, torch.full((4,), 3.0))
    with torch.no_grad():
        assert not _scaled(x, 2.0).requires_grad


def test_eager_autograd_binds_keywords_and_defaults_and_skips_setup_without_grad():
    x = torch.ones(3, requires_grad=True)
    _shifted(x, k=5.0).sum().backward()  # keyword: the derivative reads k = 5
    assert torch.equal(x.grad, torch.full((3,), 5.0))
    x.grad = None
    y = _shifted(x)  # default k = 2
    y.sum().backward()
    assert torch.equal(y.detach(), torch.full((3,), 3.0)) and torch.equal(x.grad, torch.full((3,), 2.0))
    out = _shifted(torch.ones(2), k=3.0)  # no input requires grad: the launcher alone
    assert out.grad_fn is None and torch.equal(out, torch.full((2,), 4.0))


def test_compile_without_registration_names_the_fix():
    code = textwrap.dedent("""
        import torch
        from foxdqn.ops.library import device_op

        @device_op("foxdqn_test::twice", mutates_args=())
        def twice(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        assert torch.equal(twice(torch.ones(2)), torch.full((2,), 2.0))  # eager: fine
        torch.compile(lambda x: twice(x), backend="eager", fullgraph=True)(torch.ones(2))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "register_ops()" in out.stderr, out.stderr[-2000:]


def test_registered_ops_trace_with_torch_compile_and_match_eager():
    register_ops()
    assert hasattr(torch.ops.foxdqn_test, "scaled") and hasattr(torch.ops.foxdqn, "adam_step_")
    assert hasattr(torch.ops.foxdqn, "q_forward")  # a no-autograd op (foxdqn/ops/q_forward.py)

    def f(x):
        return _host_side(_scaled(x, 2.0))

    x = torch.arange(5.0, requires_grad=True)
    compiled = torch.compile(f, backend="eager")  # a graph break at _host_side, by design
    y = compiled(x)
    y.sum().backward()
    assert torch.equal(y.detach(), f(x.detach()))
    assert torch.equal(x.grad, torch.full((5,), 2.0))
    with pytest.raises(Exception):  # fullgraph: the disabled function is a graph break
        torch.compile(f, backend="eager", fullgraph=True)(torch.ones(2))
    g = torch.compile(lambda x: _scaled(x, 4.0), backend="eager", fullgraph=True)
    assert torch.equal(g(torch.ones(3)), torch.full((3,), 4.0))
    # eager calls after registration still launch kernels directly (no traceable wrap_triton)
    _FLAGS.clear()
    _shifted(torch.ones(2))
    _shifted(torch.ones(2, requires_grad=True)).sum().backward()
    assert _FLAGS == [False, False] and _wrap_enabled()


@device_op("foxdqn_test::halved", mutates_args=())
def _halved(x: torch.Tensor) -> torch.Tensor:
    _FLAGS.append(_wrap_enabled())  # False: a direct launch (eager); True: traced as the registered op
    return x * 0.5


@device_op("foxdqn_test::halved_backward", mutates_args=())
def _halved_backward_op(grad: torch.Tensor) -> torch.Tensor:
    _FLAGS.append(_wrap_enabled())
    return grad * 0.5


_halved.register_autograd(lambda ctx, grad: _halved_backward_op(grad), setup_context=lambda ctx, inputs, output: None)


def test_backward_op_traced_by_aot_autograd_goes_to_the_registered_op():
    """A registered op whose backward calls another op (quantile_huber_loss's pattern): AOTAutograd
    traces that backward outside Dynamo on fake tensors, and the call must reach the registered op
    (a direct launch of a Triton kernel would read the fake tensors' data pointers); eager calls
    still launch directly. On torch >= 2.12 the aot_eager half passes without the routing too
    (is_compiling() stays True through the compile); the FakeTensorMode half guards it on any
    version. Unregistered, a call on fake tensors raises the register_ops() hint."""
    register_ops()
    _FLAGS.clear()
    x = torch.arange(4.0, requires_grad=True)
    compiled = torch.compile(lambda x: _halved(x).sum(), backend="aot_eager", fullgraph=True)
    compiled(x).backward()
    assert torch.equal(x.grad, torch.full((4,), 0.5))
    assert _FLAGS and all(_FLAGS), _FLAGS  # forward and backward traced through the registered ops
    _FLAGS.clear()
    _halved(torch.ones(2, requires_grad=True)).sum().backward()
    assert _FLAGS == [False, False]
    # what AOTAutograd hands the backward: fake tensors, outside Dynamo (torch 2.11's
    # is_compiling() is False there; later versions hold it True through the whole compile)
    from torch._subclasses.fake_tensor import FakeTensorMode

    _FLAGS.clear()
    with FakeTensorMode():
        out = _halved_backward_op(torch.ones(3))
    assert type(out).__name__ == "FakeTensor" and _FLAGS == [True]
    import foxdqn.ops.library as library

    unregistered = DeviceOp("foxdqn_test::never_registered", lambda x: x * 2, mutates_args=())
    try:
        with FakeTensorMode(), pytest.raises(RuntimeError, match=r"register_ops\(\)"):
            unregistered(torch.ones(2))
    finally:
        library._OPS.remove(unregistered)  # a later register_ops() must not meet it


@pytest.mark.gpu
def test_gpu_training_iterations_and_capture_import_neither_dynamo_nor_inductor():
    """On CUDA the launches go through compiled kernels (``torch.library.wrap_triton`` of one would
    import torch._dynamo) and the iteration is captured as a graph."""
    code = textwrap.dedent("""
        import sys, torch
        from bench.harness import iteration, make_state
        s = make_state(["env.num_envs=64", "guard.max_weight=1e6"], "cuda")
        it = iteration(s, use_graph=True)
        for _ in range(3):
            it()
        torch.cuda.synchronize()
        print("torch._dynamo" in sys.modules, "torch._inductor" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["False", "False"], out.stdout
