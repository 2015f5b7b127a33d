"""tests/fast_interpreter.py gives what Triton's interpreter gives: its reduction on whole slices what
Triton's per-element loop gives, bit for bit (foxdqn/ops/argmax.py's tile_argmax, its one user, on NaN,
±inf, ±0 and ties, along a tile's rows and over a vector); its kept shapes the attributes Triton's
block_type and tensor constructors set, and the same refusals; its broadcast Triton's."""
import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter as I

from foxdqn.ops.argmax import argmax_combine, tile_argmax

# no module-level skip: tests/compile_kernels.py imports this module to compile the kernels below, which
# `make test` records; each test skips where fast_interpreter is not installed (CUDA sessions)


@triton.jit
def _tile_kernel(x_ptr, v_ptr, i_ptr, R: tl.constexpr, C: tl.constexpr, A: tl.constexpr):
    r = tl.arange(0, R)
    c = tl.arange(0, C)
    v = tl.load(x_ptr + r[:, None] * C + c[None, :])
    val, idx = tile_argmax(v, c, (c[None, :] < A) & (r[:, None] >= 0), A)
    tl.store(v_ptr + r, val)
    tl.store(i_ptr + r, idx)


@triton.jit
def _vector_kernel(x_ptr, v_ptr, i_ptr, C: tl.constexpr):
    c = tl.arange(0, C)
    val, idx = tl.reduce((tl.load(x_ptr + c), c), 0, argmax_combine)
    tl.store(v_ptr, val)
    tl.store(i_ptr, idx)


def _argmaxes(x: torch.Tensor) -> list[torch.Tensor]:
    rows, cols = x.shape
    out = []
    for valid in (cols, cols - 3):  # every column, and the last three left out
        v, i = torch.empty(rows), torch.empty(rows, dtype=torch.int32)
        _tile_kernel[(1,)](x, v, i, rows, cols, valid)
        out += [v, i]
    for row in (1, 3):
        v, i = torch.empty(1), torch.empty(1, dtype=torch.int32)
        _vector_kernel[(1,)](x[row].contiguous(), v, i, cols)
        out += [v, i]
    return [t.view(torch.int32) if t.is_floating_point() else t for t in out]


def test_the_reduction_on_slices_equals_tritons_loop(monkeypatch):
    fast = I.ReduceOps.generic_reduce
    if not hasattr(fast, "triton"):
        pytest.skip("fast_interpreter did not replace this Triton's generic_reduce")
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-2, 3, (16, 16), generator=g).float()  # many ties
    for value, p in ((float("nan"), 0.1), (float("inf"), 0.05), (float("-inf"), 0.05), (-0.0, 0.1)):
        x[torch.rand(x.shape, generator=g) < p] = value
    x[0] = float("nan")
    x[2] = -0.0
    x[3:5] = 1.0
    x[3, -1] = 5.0  # the maximum in the last column
    x[4, -1] = float("nan")  # the only NaN there
    got = _argmaxes(x)
    monkeypatch.setattr(I.ReduceOps, "generic_reduce", fast.triton)
    want = _argmaxes(x)
    assert len(got) == len(want) == 8
    for a, b in zip(got, want):
        assert torch.equal(a, b), (a, b)
    assert got[1][3] == 15 and got[1][4] == 15 and got[-1] == 15


def _described(value) -> dict:
    """A block type's or tensor's attributes, a tl.tuple as its class, values and their types."""
    def plain(v):
        if isinstance(v, tl.core.tuple):
            return ("tl.tuple", repr(v.values), [repr(t) for t in v.type.types], v.type.fields)
        return (type(v).__name__, repr(v))
    return {k: plain(v) for k, v in vars(value).items() if k != "handle"}


def _types_and_tensors() -> list:
    out = []
    for shape in ([4, 8], [16], [tl.constexpr(2), 4], tl.core.tuple([4, 2]), [1, 32, 2], [4, 4]):
        for element in (tl.float32, tl.int1, tl.pointer_type(tl.float32)):
            block = tl.block_type(element, shape)
            out += [_described(block), _described(tl.tensor(None, block)), _described(tl.tensor(None, element))]
    for bad in ([3, 4], [], [2**21], (4, 4)):  # not a power of two, 0-d, too many elements, a builtin tuple
        try:
            tl.block_type(tl.float32, bad)
            out.append("made")
        except (AssertionError, TypeError, ValueError) as e:
            out.append(repr(e))
    return out


def test_the_kept_shapes_give_what_tritons_constructors_give(monkeypatch):
    """A block type's and a tensor's attributes as Triton's constructors set them, the first time and
    from what was kept (twice), and a shape Triton refuses refused every time."""
    fast_block, fast_tensor = tl.block_type.__init__, tl.tensor.__init__
    if not (hasattr(fast_block, "triton") and hasattr(fast_tensor, "triton")):
        pytest.skip("fast_interpreter did not replace this Triton's constructors")
    got = [_types_and_tensors(), _types_and_tensors()]
    monkeypatch.setattr(tl.block_type, "__init__", fast_block.triton)
    monkeypatch.setattr(tl.tensor, "__init__", fast_tensor.triton)
    want = _types_and_tensors()
    assert got[0] == got[1] == want
    assert sum(isinstance(x, str) and x != "made" for x in want) == 4


def test_a_broadcast_gives_what_tritons_gives():
    """Blocks of one shape come back as given (the fast path); other pairs go through Triton's."""
    import numpy as np
    from triton.language.semantic import TritonSemantic

    fast = TritonSemantic.broadcast_impl_value
    if not hasattr(fast, "triton"):
        pytest.skip("fast_interpreter did not replace this Triton's broadcast")

    def block(*shape):
        return tl.tensor(I.TensorHandle(np.zeros(shape, np.float32), tl.float32), tl.block_type(tl.float32, list(shape)))

    semantic = I.interpreter_semantic
    a, b, row = block(4, 8), block(4, 8), block(1, 8)
    for broadcast in (fast.triton, fast):
        got = broadcast(semantic, a, b)
        assert got[0] is a and got[1] is b
    for lhs, rhs in ((a, row), (row, a)):
        got, want = fast(semantic, lhs, rhs), fast.triton(semantic, lhs, rhs)
        assert [str(t.type) for t in got] == [str(t.type) for t in want] == [str(a.type)] * 2
        assert all(np.array_equal(g.handle.data, w.handle.data) for g, w in zip(got, want))


def _operand(kind, shape):
    """A tensor of element type ``kind`` (a block of ``shape``, or a scalar for ``()``), or the
    Python number ``kind`` itself."""
    import numpy as np

    if not isinstance(kind, tl.dtype):
        return kind
    np_type = I._get_np_dtype(kind) if not kind.is_ptr() else np.uint64
    data = (np.arange(1, 1 + max(1, int(np.prod(shape)))) % 2).astype(np_type).reshape(shape or ())
    return tl.tensor(I.TensorHandle(data, kind), tl.block_type(kind, list(shape)) if shape else kind)


def _outcome(fn, *args):
    """What ``fn(*args)`` gives: its tensors' types and data (bytes), or its exception's type and message."""
    try:
        out = fn(*args)
    except Exception as e:  # noqa: BLE001 - the fast path must raise what Triton raises
        return (type(e).__name__, str(e))
    if out is None:
        return None
    return [(str(t.type), t.handle.data.dtype.str, t.handle.data.shape, t.handle.data.tobytes()) for t in out]


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # 1e300 as fp16/fp32, both ways
def test_a_binary_operations_type_check_gives_what_tritons_gives():
    """Every pair of a tensor (each element type, a pointer, a block or a scalar) and a tensor or a
    Python number (bools, ints beyond int32 and uint64, floats beyond fp32, negative values), each
    order, with and without the arithmetic check and a division: the same tensors (types and data)
    or the same exception as Triton's type check."""
    from triton.language.semantic import TritonSemantic

    fast = TritonSemantic.binary_op_type_checking_impl
    if not hasattr(fast, "triton"):
        pytest.skip("fast_interpreter did not replace this Triton's binary type check")
    types = [tl.int1, tl.int8, tl.int16, tl.int32, tl.int64, tl.uint8, tl.uint32, tl.float16, tl.bfloat16,
             tl.float32, tl.float64, tl.pointer_type(tl.float32)]
    numbers = [True, 0, 3, -2, 2**31, 2**40, 2**63, -2**40, 2**64, 0.5, -1.5, 1e-300, 1e300, float("nan")]
    tensors = [_operand(t, shape) for t in types for shape in ((), (4,), (2, 4))]
    semantic = I.interpreter_semantic
    compared = raised = 0
    for x in tensors:
        for y in tensors[::2] + numbers:
            for lhs, rhs in ((x, y), (y, x)):
                for flags in ((False, False, True, False), (True, True, True, False), (False, False, True, True),
                              (True, False, False, False)):
                    got = _outcome(fast, semantic, lhs, rhs, *flags)
                    want = _outcome(fast.triton, semantic, lhs, rhs, *flags)
                    assert got == want, (lhs, rhs, flags, got, want)
                    compared += 1
                    raised += isinstance(want, tuple)
    assert compared == 9216 and raised > 1000, raised  # pairs Triton refuses are among them


def test_the_overflow_check_is_tritons_where_device_assert_keeps_it(monkeypatch):
    """Without the debug option (the interpreter's) an int32 addition, subtraction or multiplication
    leaves nothing of its overflow condition, as Triton's (device_assert drops it), and still refuses
    operands of two types; with it set, Triton's check runs and an overflow fails."""
    import dataclasses

    from triton.language.semantic import TritonSemantic

    fast = TritonSemantic.binary_op_sanitize_overflow_impl
    if not hasattr(fast, "triton"):
        pytest.skip("fast_interpreter did not replace this Triton's overflow check")
    semantic = I.interpreter_semantic
    big, one = _operand(tl.int32, (4,)), _operand(tl.int32, (4,))
    big.handle.data[:] = 2**31 - 1
    for op in (semantic.add, semantic.sub, semantic.mul):
        for check in (fast, fast.triton):
            assert check(semantic, big, one, op) is None
            assert _outcome(check, semantic, big, _operand(tl.int16, (4,)), op)[0] == "AssertionError"
    monkeypatch.setattr(semantic.builder, "options", dataclasses.replace(semantic.builder.options, debug=True))
    for check in (fast, fast.triton):
        got = _outcome(check, semantic, big, one, semantic.add)
        assert got[0] == "AssertionError" and "int32 overflow detected for operation add" in got[1], got
        assert check(semantic, one, one, semantic.add) is None
