"""Test configuration.

Without CUDA, TRITON_INTERPRET=1 is set before any Triton kernel module is imported (it is read
at ``@triton.jit`` time) so that kernels run on CPU tensors in Triton's interpreter. With CUDA the
kernels compile for the GPU; tests marked ``gpu`` run only there.

Under pytest-xdist (``make test``: one worker per core) each worker runs torch on one thread, so
that the workers do not oversubscribe the cores; the files with the most tests marked ``slow``
(those of ten seconds or more on 2 busy cores) are collected first, so that the workers start on them.

Under the interpreter, tests/fast_interpreter.py skips the interpreter's patching of
``triton.language`` at each call of a jit helper where its launch has patched it already, runs a
custom-combine reduction on whole slices, and keeps what block types and tensors derive from a shape
(what a kernel computes is unchanged: tests/test_fast_interpreter.py).

This folder goes on ``sys.path`` so that every test file imports the shared helpers of
``tests/support.py`` with ``from support import ...``.

The fixtures ``cli`` and ``train_cli`` give ``python -m MODULE ARGS`` calls for the cost of one
interpreter start and import per module and pytest process (support.CliServer).
"""
import functools
import os
import sys
from collections import Counter
from pathlib import Path

# MKL's conditional numerical reproducibility, before torch loads MKL: a batched product then rounds
# the same whatever its layout, which the population tests' bit-for-bit comparisons of P members
# against populations of one rely on (without it MKL rounded a few shapes, e.g. 35 rows x 5
# outputs, by layout)
os.environ.setdefault("MKL_CBWR", "AVX2,STRICT")

import pytest  # noqa: E402
import torch  # noqa: E402

_INTERPRET_GIVEN = os.environ.get("TRITON_INTERPRET") == "1"  # asked for by the caller
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# JAX (the bench's peer, tests/test_bench_jax_peer.py) must not take most of the GPU's memory when
# a module imports it (gymnax creates arrays at import): torch's tests share the device
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs one worker per core (pytest-xdist)
    torch.set_num_threads(1)

_TESTS = str(Path(__file__).parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

# every Triton launch of this run recorded for tests/compile_kernels.py (`make test` sets it)
_write_kernel_record = None
if os.environ.get("FOXDQN_KERNEL_RECORD") and os.environ.get("TRITON_INTERPRET") == "1":
    from kernel_record import install  # noqa: E402 - after the sys.path entry

    _write_kernel_record = install(os.environ["FOXDQN_KERNEL_RECORD"])

from support import CliServer  # noqa: E402 - after the sys.path entry

if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter without its re-patching at each helper call
    from fast_interpreter import install as _install_fast_interpreter  # noqa: E402

    _install_fast_interpreter()


def _cache_load_config() -> None:
    """foxdqn.config.compose.load_config, memoized for this pytest process by its override list: a
    Hydra composition and finalize cost 0.2 s on 2 busy cores and the population tests compose the
    same configs again and again (two of their files: 173 calls, 82 distinct configs; 40 s of their
    67 s). A hit returns a deep copy of the first call's finalized config (callers may change theirs)
    and logs the same warnings of ignored settings again (schema.warn_ignored on the copy), so a test
    sees what a fresh composition gives. Not cached: calls inside an initialised Hydra (its search
    path), ``hydra.*`` overrides, overrides with interpolations (``${oc.env:...}``), configs whose
    checks asked torch about CUDA (device=cuda, graph=on: a test may patch it), and errors. Must run
    before the test modules import load_config (``from ... import load_config`` binds it).

    A miss goes through a JobComposer (the multirun's composer: a config whose overrides differ from
    one composed before only in plain values, ``seed=1`` for ``seed=0``, is derived from it without
    Hydra; tests/config/test_compose_jobs.py checks that this equals composing), except in the tests
    of tests/config/ (load_config composes there) and where it fails (load_config then gives its own
    error)."""
    import copy

    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from foxdqn.config import compose
    from foxdqn.config.schema import warn_ignored
    from foxdqn.errors import ConfigError

    real, cache, composers = compose.load_config, {}, {}

    def miss(overrides, config_name):
        if os.environ.get("PYTEST_CURRENT_TEST", "").startswith("tests/config/"):
            return real(overrides, config_name)
        # one composer per key list: JobComposer tries each base it holds, parsing overrides with
        # Hydra's parser (about 5-10 ms each), so the hundreds of structures a test process composes
        # would make every miss dearer than a composition; only the same keys can derive anyway
        keys = (config_name, *(o.split("=", 1)[0] for o in overrides))
        composer = composers.setdefault(keys, compose.JobComposer(config_name))
        try:
            with initialize_config_dir(str(compose.conf_folder()), version_base="1.3"):
                return composer(overrides)
        except ConfigError:
            return real(overrides, config_name)
        finally:
            GlobalHydra.instance().clear()

    @functools.wraps(real)
    def load_config(overrides, config_name="train"):
        overrides = list(overrides)
        if (GlobalHydra.instance().is_initialized() or not all(isinstance(o, str) for o in overrides)
                or any("${" in o or o.lstrip("+~").startswith("hydra") for o in overrides)):
            return real(overrides, config_name)
        key = (tuple(overrides), config_name)
        if key in cache:
            cfg = copy.deepcopy(cache[key])
            warn_ignored(cfg)
            return cfg
        cfg = miss(overrides, config_name)
        if cfg.device != "cuda" and cfg.graph != "on":
            cache[key] = copy.deepcopy(cfg)
        return cfg

    compose.load_config = load_config


_cache_load_config()


def pytest_sessionfinish(session, exitstatus):
    if _write_kernel_record is not None:
        _write_kernel_record()


def pytest_collection_modifyitems(config, items):
    # the files with the most `slow` tests first, the others as collected (a stable sort: each file's
    # tests stay together and in order): `make test` (pytest-xdist, --dist loadfile
    # --no-loadscope-reorder) hands the files to its workers in this order, so that the long files
    # start first and the short ones fill the workers' ends, instead of a long file last
    slow = Counter(item.nodeid.split("::")[0] for item in items if "slow" in item.keywords)
    items.sort(key=lambda item: -slow[item.nodeid.split("::")[0]])
    if torch.cuda.is_available():
        if os.environ.get("TRITON_INTERPRET") == "1" and not _INTERPRET_GIVEN:
            # a module imported while collecting turned the interpreter on: every kernel module
            # imported after it (and torch.compile's Triton code) would run interpreted on the GPU
            raise pytest.UsageError("TRITON_INTERPRET=1 was set while collecting the tests on a CUDA machine "
                                    "(a module sets it at import): set it only in a command's __main__")
        return
    skip = pytest.mark.skip(reason="needs CUDA (run `make test-gpu` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def matmul_precision():
    """Sets torch's float32 matmul precision for the test (call it with "high" or "highest") and
    restores it after."""
    before = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


@pytest.fixture(scope="session")
def cli(tmp_path_factory):
    """``cli(MODULE, ARGS, cwd, timeout=300, environ=None)``: the CompletedProcess (exit status,
    stdout, stderr) of ``python -m MODULE ARGS`` run in ``cwd`` with this checkout first on PYTHONPATH
    (and ``environ``'s variables, for ones the command reads as it runs), from a child forked by a
    server that imported MODULE once for this pytest process (support.CliServer).
    ``cli.start(MODULE, ARGS, cwd)``: the call while its child runs (support.CliProcess: its pid for
    a signal, ``poll``, ``wait``). Not for calls that test the process's own start (signals during
    the imports, timings.json's import time, limits set before it starts): those need a process of
    their own."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    folder, servers = tmp_path_factory.mktemp("cli"), {}

    def server(module: str) -> CliServer:
        if module not in servers:
            (folder / module).mkdir()
            servers[module] = CliServer(module, env, folder / module)
        return servers[module]

    def call(module: str, args, cwd, timeout: float = 300, environ: dict | None = None):
        return server(module).run(args, cwd=cwd, timeout=timeout, environ=environ)

    call.start = lambda module, args, cwd, timeout=300: server(module).start(args, cwd, timeout=timeout)
    yield call
    for server in servers.values():
        server.close()


@pytest.fixture
def train_cli(cli):
    """``train_cli(ARGS, cwd, timeout=300)``: ``cli("foxdqn.train", ARGS, cwd, timeout)``."""
    return functools.partial(cli, "foxdqn.train")
