"""Triton's interpreter (``TRITON_INTERPRET=1``, the CPU suite) without its repeated patching of
``triton.language`` at every call of a ``@triton.jit`` helper inside a kernel.

The interpreter runs a launch (``GridExecutor.__call__``) inside a patch scope: ``_patch_lang(fn)``
replaces the builtins of the language modules the kernel's globals name (``triton.language``,
``triton.language.core``) with interpreted ones and restores them after the grid. A helper called
from the kernel (``InterpretedFunction.__call__``: ``tl.sum``, ``tl.max``, a foxdqn helper, a
reduction's combine function; once per call and per program of the grid) calls ``_patch_lang`` again,
which walks every member of those modules with ``inspect.getmembers`` (about a quarter of a
launch's time in the CPU launch-count tests, tests/population/test_population_kernels.py) and whose
scope is never restored. When the launch's scope has already patched the helper's modules this
re-patches nothing (the builtins found are already the interpreter's wrappers; the other attributes
are set to the same functions), so :func:`install` skips it; a helper that names a module the
launch's scope did not patch (``triton.language.standard``'s helpers name ``core``) is patched as
before, once per launch, and its scope is restored with the launch's (Triton leaves it patched).
What a kernel computes is unchanged.

It also memoizes ``_get_np_dtype`` (the NumPy dtype of a Triton type; called for each value the
interpreter makes, it built its table of 19 types at every call) per scalar element type.

A reduction with a combine function of its own (``tl.reduce``: foxdqn/ops/argmax.py's
``argmax_combine``) falls back in Triton's interpreter to calling the combine function once per
element of the input, on scalars (``ReduceOps.generic_reduce``): a [128, 16] tile's argmax is 2,048
calls of about 15 interpreted ops each, more than half of the collect step's time in the launch-count
tests. :func:`install` runs the same combinations on whole slices instead: along the axis in the same
order (element 0, then combine(acc, element 1), ...), each call on every other index at once, so that
each output element goes through the same sequence of the same elementwise operations as in Triton's
loop. For comparisons, bitwise operations and ``where`` (argmax_combine's) NumPy gives the same bits
on arrays as on scalars; its ``maximum`` and ``minimum`` may not (the sign of a zero of a ±0 tie), so
the scan (``ScanOps.generic_scan``; per_sample's running max) keeps Triton's loop.

Last, every value the interpreter makes is a ``tl.tensor`` of a ``tl.block_type`` (hundreds of
thousands per test file), and both constructors redo the same work from the shape: unwrapping and
checking it (powers of two, the element limit), the type's name, a ``constexpr`` per dimension.
:func:`install` keeps what they compute per shape (and element type's name) after the first time,
so that a shape Triton refuses is still refused (never kept) and the attributes are the same values.
The implicit broadcast of a binary operation (``TritonSemantic.broadcast_impl_value``) returns two
blocks of the same shape as they are after comparing them dimension by dimension through
``tl.tuple`` equality (a ``constexpr`` per comparison); that case is answered from the two
shapes' lists of ints (a block and a scalar, or blocks of other shapes, go through Triton's).

Two more of every binary operation's steps are answered without Triton's general code where their
result is known. Its type check (``TritonSemantic.binary_op_type_checking_impl``) of two tensors of
one plain element type (neither a pointer) casts each to the computation type, which for an integer
type, or a floating type outside a division or modulo of a narrower float than fp32, is that same type
(``computation_type_impl``'s rules: the cast returns the tensor as it is), and then broadcasts them: the
broadcast is what :func:`install` returns at once; any other pair (a Python number, a pointer, two
types, a float division) goes through Triton's. An integer addition, subtraction or multiplication of
fewer than 64 bits computes its int64 result and a range condition for ``device_assert``
(``binary_op_sanitize_overflow_impl``), which drops it at once without the ``debug`` option (never set
in the interpreter: ``InterpreterOptions``): :func:`install` checks what it checks before (the operands'
one integer type) and builds the condition only where ``debug`` is set.

Installed by tests/conftest.py under the interpreter only, and only where Triton's code is the code
this replaces (:func:`install` returns False otherwise: the suite then runs Triton's own, slower).
"""
from __future__ import annotations

import inspect

#: what Triton's InterpretedFunction.__call__ is (3.x), and the lines of GridExecutor.__call__ this relies on
_CALL = """    def __call__(self, *args, **kwargs):
        # This is a device function call
        _patch_lang(self.fn)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise InterpreterError(repr(e)) from e
"""
_LAUNCH = ("patch_scope = _patch_lang(self.fn)", "patch_scope.restore()")
#: SHA-256 of Triton's _get_np_dtype (3.x): a pure function of the element type
_NP_DTYPE = "8f20d41e3207891ae9872819aff05bee11d5c9bbe24f772282cb3ac72749fc75"
#: SHA-256 of Triton's ReduceOps.generic_reduce (3.9): the per-element loop replaced
_GENERIC_REDUCE = "982b63f20d16162f726180f8f2cfbf7df75f08cdfb85b752408b250ca2f6b2d2"
#: SHA-256 of triton.language's block_type.__init__ and tensor.__init__ (3.9): pure functions of their shape
_BLOCK_TYPE_INIT = "403f4b016ec5c2c37f33465d4ceab2d800bc4dcb832ce1859b0a7cd4a6f65763"
_TENSOR_INIT = "d9b043b5c9897657533939d47e8463abec325cc6dbd13bfe621b6b681129ed7a"
#: SHA-256 of TritonSemantic.broadcast_impl_value (3.9): two blocks of one shape come back as given
_BROADCAST = "90c3a175f67942b0097c344a6deeef0fd43759335af2ecc095d8f82b84446909"
#: SHA-256 of TritonSemantic's binary_op_type_checking_impl, computation_type_impl, integer_promote_impl and
#: cast (3.9): two tensors of one integer or float type come back as given, then broadcast
_TYPE_CHECKING = ("1d2ffc4e5a2ea4a7cc5e592d9e53f37fced833cbabc648fbf67e7cfedcbb7478",
                  "0010a93a2bd5f46236d093bdb3155ef7048f6ccf7aa31c1450d86661a4d34a6e",
                  "7321a1ab440a9bee6928b2f3f955f667a7c23e5991f069d33b54defcf2ef375f",
                  "b69dba3389e69c97aae804554b1ef8f78be84981d661db03ece3f63c737540a8")
#: SHA-256 of TritonSemantic's binary_op_sanitize_overflow_impl and device_assert (3.9): the overflow
#: condition goes to device_assert, which returns at once without the debug option
_SANITIZE = ("bdd7f3e24aa645ab7d9560d3c8df63c971f33d54937cb3ed5851e3c7d2eb9467",
             "361fee05925913d289320495bb4d8032d420cd732379bc642da22d5dff319dd5")


def install() -> bool:
    """Replace ``InterpretedFunction.__call__`` and the module's ``_patch_lang`` (module docstring);
    False, changing nothing, where Triton's interpreter is not the code they replace."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter as I

        call, launch = inspect.getsource(I.InterpretedFunction.__call__), inspect.getsource(I.GridExecutor.__call__)
        real = I._patch_lang
    except (ImportError, AttributeError, OSError, TypeError):
        return False
    if call != _CALL or not all(line in launch for line in _LAUNCH) or getattr(real, "_foxdqn_tests", False):
        return False

    live: list[tuple[set[int], list]] = []  # per launch being run: the modules patched, helpers' scopes
    langs_of: dict = {}

    def langs(fn) -> frozenset[int]:
        found = langs_of.get(fn)
        if found is None:  # the same test as _patch_lang's
            found = langs_of[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                             if inspect.ismodule(v) and v in [tl, tl.core])
        return found

    def patch_lang(fn):  # a launch's scope (GridExecutor.__call__), restored after its grid
        scope = real(fn)
        entry = (set(langs(fn)), [])
        live.append(entry)
        restore = scope.restore

        def restore_all() -> None:
            live.remove(entry)
            for nested in reversed(entry[1]):
                nested.restore()
            restore()

        scope.restore = restore_all
        return scope

    patch_lang._foxdqn_tests = True

    def __call__(self, *args, **kwargs):  # a device function call
        mine = langs(self.fn)
        if not live:
            real(self.fn)  # outside a launch: as Triton does
        elif not mine <= live[-1][0]:
            live[-1][1].append(real(self.fn))
            live[-1][0].update(mine)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise I.InterpreterError(repr(e)) from e

    I._patch_lang = patch_lang
    I.InterpretedFunction.__call__ = __call__
    _memoize_np_dtype(I, tl)
    _vectorize_generic_reductions(I, tl)
    _memoize_shapes(tl)
    _skip_known_type_checks(tl)
    return True


def _memoize_np_dtype(I, tl) -> None:
    import hashlib

    real = I._get_np_dtype
    if hashlib.sha256(inspect.getsource(real).encode()).hexdigest() != _NP_DTYPE:
        return
    memo: dict = {}

    def _get_np_dtype(tt_dtype):  # real's result, by the element type (pointer and block types are unhashable)
        key = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(key, tl.pointer_type):
            return real(key)
        found = memo.get(key)
        if found is None:
            found = memo[key] = real(key)
        return found

    I._get_np_dtype = _get_np_dtype


def _vectorize_generic_reductions(I, tl) -> None:
    """Replace the per-element loop of ``ReduceOps.generic_reduce`` (module docstring) where its source is
    the one this was written against."""
    import hashlib

    import numpy as np

    def same(fn, digest: str) -> bool:
        return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest() == digest

    def combine(op, accs, items, dtypes, shape):
        """``op.combine_fn`` on the slices ``accs`` and ``items`` (arrays of ``shape``): its results
        as arrays of ``shape`` in the inputs' NumPy dtypes (Triton's loop stores each into such an array)."""
        ret = op.combine_fn.fn(*(op.to_tensor(a, t) for a, t in zip(accs, dtypes)),
                               *(op.to_tensor(x, t) for x, t in zip(items, dtypes)))
        ret = ret if isinstance(ret, tuple) else (ret,)
        out = []
        for r, a in zip(ret, accs):
            data = np.asarray(r.handle.data if isinstance(r, tl.core.tensor) else r)
            data = data.reshape(shape) if data.size == a.size else np.broadcast_to(data, shape)
            out.append(data.astype(a.dtype, copy=True))
        return out

    if same(I.ReduceOps.generic_reduce, _GENERIC_REDUCE):
        def generic_reduce(self, input):
            original_axis = self.axis
            input, axis = self.unravel(input, self.axis)
            dtypes = [arg.dtype for arg in input]
            datas = [np.moveaxis(arg.handle.data, axis, 0) for arg in input]  # the reduced axis first
            shape = datas[0].shape[1:]
            accs = [np.array(d[0], dtype=d.dtype) for d in datas]
            for k in range(1, datas[0].shape[0]):
                accs = combine(self, accs, [np.array(d[k]) for d in datas], dtypes, shape)
            ret = []
            for data, dtype in zip(accs, dtypes):  # packed as Triton's generic_reduce packs its output
                if self.keep_dims:
                    if original_axis is not None:
                        data = np.expand_dims(data, axis)
                    else:
                        for _ in range(len(input[0].handle.data.shape)):
                            data = np.expand_dims(data, 0)
                elif original_axis is None:
                    data = data.item()
                ret.append(self.to_tensor(data, dtype))
            return ret

        generic_reduce.triton = I.ReduceOps.generic_reduce  # Triton's loop (tests/test_fast_interpreter.py)
        I.ReduceOps.generic_reduce = generic_reduce


def _memoize_shapes(tl) -> None:
    """``tl.block_type.__init__`` and ``tl.tensor.__init__`` with what they derive from a shape of plain
    ints kept per shape, and the implicit broadcast of two blocks of one shape answered at once (module
    docstring), where their source is the one this was written against."""
    import hashlib
    import math

    core = tl.core

    def same(fn, digest: str) -> bool:
        return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest() == digest

    if same(core.block_type.__init__, _BLOCK_TYPE_INIT):
        real_block_type_init, by_shape = core.block_type.__init__, {}

        def block_type_init(self, element_ty, shape):
            if type(shape) is list or type(shape) is core.tuple:  # what Triton asserts (its `tuple`: tl.tuple)
                dims = tuple([d.value if type(d) is core.constexpr else d for d in shape])
                if all(type(d) is int for d in dims):
                    key = (dims, str(element_ty))
                    found = by_shape.get(key)
                    if found is None:
                        real_block_type_init(self, element_ty, shape)  # raises for a shape Triton refuses
                        by_shape[key] = (self.shape.type, self.numel, self.name)
                        return
                    # a tl.tuple of its own, as Triton's (its shape tuple is a tl.tuple, not a builtin one)
                    self.element_ty, self.shape = element_ty, core.tuple(list(dims), found[0])
                    self.numel, self.name = found[1], found[2]
                    return
            real_block_type_init(self, element_ty, shape)

        block_type_init.triton = real_block_type_init  # tests/test_fast_interpreter.py
        core.block_type.__init__ = block_type_init

    semantic = tl.semantic.TritonSemantic
    if same(semantic.broadcast_impl_value, _BROADCAST):
        real_broadcast = semantic.broadcast_impl_value

        def broadcast_impl_value(self, lhs, rhs):
            lhs_ty, rhs_ty = lhs.type, rhs.type
            if (type(lhs_ty) is core.block_type and type(rhs_ty) is core.block_type
                    and type(lhs_ty.shape) is core.tuple and type(rhs_ty.shape) is core.tuple
                    and lhs_ty.shape.values == rhs_ty.shape.values):
                return lhs, rhs  # what Triton's gives for blocks of one shape: no expand, no broadcast
            return real_broadcast(self, lhs, rhs)

        broadcast_impl_value.triton = real_broadcast
        semantic.broadcast_impl_value = broadcast_impl_value

    if same(core.tensor.__init__, _TENSOR_INIT):
        real_tensor_init, by_dims = core.tensor.__init__, {}

        def tensor_init(self, handle, ty):
            self.handle = handle
            shape = ty.shape if ty.is_block() else ()
            dims = tuple(shape.values) if isinstance(shape, core.tuple) else tuple(shape)
            found = by_dims.get(dims)
            if found is None:
                sizes = [core.constexpr(d) for d in dims]
                found = by_dims[dims] = (core.constexpr(math.prod(dims)), sizes, core.tuple(sizes).type)
            # as Triton's: its numel a constexpr, its shape a tl.tuple (of its own) of constexprs
            self.numel, self.shape = found[0], core.tuple(list(found[1]), found[2])
            self.type = ty
            self.dtype = ty.scalar

        tensor_init.triton = real_tensor_init
        core.tensor.__init__ = tensor_init


def _skip_known_type_checks(tl) -> None:
    """``binary_op_type_checking_impl`` of two tensors of one plain element type and
    ``binary_op_sanitize_overflow_impl`` without the debug option answered at once (module docstring),
    where the source of what they skip is the one this was written against."""
    import hashlib

    core = tl.core
    semantic = tl.semantic.TritonSemantic

    def same(fn, digest: str) -> bool:
        return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest() == digest

    checked = (semantic.binary_op_type_checking_impl, semantic.computation_type_impl, semantic.integer_promote_impl,
               semantic.cast)
    if all(same(fn, digest) for fn, digest in zip(checked, _TYPE_CHECKING)):
        real_checking = semantic.binary_op_type_checking_impl

        computed: dict = {}  # computation_type_impl's result by its arguments (the types by name)

        def binary_op_type_checking_impl(self, lhs, rhs, allow_lhs_ptr=False, allow_rhs_ptr=False,
                                         arithmetic_check=True, div_or_mod=False):
            left, right = type(lhs), type(rhs)
            if left is core.tensor and right is core.tensor:
                a, b = lhs.type.scalar, rhs.type.scalar
                # plain element types (a pointer_type is a subclass) of one name: one type
                if type(a) is core.dtype and type(b) is core.dtype and a.name == b.name and (
                        a.is_int() or (a.is_floating() and (not div_or_mod or a.is_fp32() or a.is_fp64()))):
                    return self.broadcast_impl_value(lhs, rhs)
            elif arithmetic_check and ((left is core.tensor and right in (int, float))
                                       or (right is core.tensor and left in (int, float))):
                # a tensor of a plain type and a Python int or float (not a bool): Triton's steps, its
                # type computation kept per pair of types, where the tensor's type is the computation's
                tensor, number = (lhs, rhs) if left is core.tensor else (rhs, lhs)
                ty = tensor.type.scalar
                if type(ty) is core.dtype:
                    number_ty = self.to_tensor_type(number)
                    key = (ty.name, number_ty.name, left is core.tensor, div_or_mod)
                    ret = computed.get(key)
                    if ret is None:
                        args = (ty, False, number_ty, True) if left is core.tensor else (number_ty, True, ty, False)
                        ret = computed[key] = self.computation_type_impl(*args, div_or_mod)
                    if ret.name == ty.name:  # the tensor's cast returns it as it is
                        number = self._cast_to_computation_type(number, ret)
                        pair = (tensor, number) if left is core.tensor else (number, tensor)
                        return self.broadcast_impl_value(*pair)
            return real_checking(self, lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)

        binary_op_type_checking_impl.triton = real_checking  # tests/test_fast_interpreter.py
        semantic.binary_op_type_checking_impl = binary_op_type_checking_impl

    if all(same(fn, digest) for fn, digest in zip((semantic.binary_op_sanitize_overflow_impl, semantic.device_assert),
                                                  _SANITIZE)):
        real_sanitize = semantic.binary_op_sanitize_overflow_impl

        def binary_op_sanitize_overflow_impl(self, lhs, rhs, binary_op):
            if lhs.type.scalar.int_bitwidth >= 64 or not self.builder.options.sanitize_overflow:
                return
            if self.builder.options.debug:  # device_assert keeps the condition: Triton's, in full
                return real_sanitize(self, lhs, rhs, binary_op)
            lhs_sca_ty = lhs.type.scalar  # Triton's checks before it builds the condition
            rhs_sca_ty = rhs.type.scalar
            assert lhs_sca_ty == rhs_sca_ty, f"expected matching operand types, got {lhs_sca_ty} and {rhs_sca_ty}"
            assert lhs_sca_ty.is_int(), f"expected integer type, got {lhs_sca_ty}"

        binary_op_sanitize_overflow_impl.triton = real_sanitize
        semantic.binary_op_sanitize_overflow_impl = binary_op_sanitize_overflow_impl
