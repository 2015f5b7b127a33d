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
