"""Compiles, for a CUDA target, every Triton kernel launch that a CPU test run recorded
(tests/kernel_record.py): ``python tests/compile_kernels.py DIR`` after
``FOXDQN_KERNEL_RECORD=DIR pytest ...`` (``make test`` does both).

Each distinct (kernel, argument types, constexpr values) goes through Triton's front end and its
first lowering (Python AST → Triton IR → TTIR) for sm_90, on the CPU: what the interpreter does not
check (types of loop-carried variables, constexpr misuse, unsupported operations) fails here with
the kernel's name and Triton's message. The fused kernels that hold weight tiles in shared memory
(:data:`SHARED_CHECKED`) are also compiled to the end, with their launch options, at the widest
shapes the run recorded for each (the largest constexpr widths): their shared memory must fit an
H100/H200 block (:data:`MAX_SHARED`; the GPU refuses the launch otherwise, which no CPU test sees).
Exit 0 when every one compiles and fits, 1 otherwise, 2 when DIR holds no record (nothing was
checked) unless ``--allow-empty`` is given (a run of a few tests)."""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path

if __name__ == "__main__":  # the command, not a test that imports its helpers (its session interprets)
    os.environ.pop("TRITON_INTERPRET", None)  # the kernels must be JIT functions here, not interpreted
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default, set to quiet its notice


def records(folder: Path) -> list[dict]:
    """The distinct records of every ``*.jsonl`` file in ``folder``."""
    unique = {}
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            unique.setdefault(line, json.loads(line))
    return list(unique.values())


def kernel_of(record: dict):
    """The JIT function a record names: from its module, or, for a kernel of a test module (pytest put
    its folder on sys.path, this process does not), from the record's source file."""
    try:
        module = importlib.import_module(record["module"])
    except ModuleNotFoundError:
        if not record.get("file"):
            raise
        spec = importlib.util.spec_from_file_location(record["module"], record["file"])
        module = importlib.util.module_from_spec(spec)
        sys.modules[record["module"]] = module
        spec.loader.exec_module(module)
    fn = module
    for part in record["name"].split("."):
        fn = getattr(fn, part)
    return fn


def compile_record(record: dict, target) -> None:
    """Front end and TTIR lowering of one record's kernel for ``target``.

    Raises:
        Exception: Triton's compilation error (CompilationError, AssertionError, ...).
    """
    from triton._C.libtriton import ir
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    fn = kernel_of(record)
    backend = make_backend(target)
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    src = ASTSource(fn=fn, signature=record["signature"], constexprs=record["constexprs"])
    module = src.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(),
                         context)
    stages: dict = {}
    backend.add_stages(stages, options, src.language)
    stages["ttir"](module, {})


def _errors(records: list[dict], target) -> list[str | None]:
    """:func:`compile_record` of each record: None, or ``"<exception type>: <its last 3 lines>"``."""
    out = []
    for record in records:
        try:
            compile_record(record, target)
            out.append(None)
        except Exception as e:  # noqa: BLE001 - Triton's errors are of many types
            message = " | ".join(line.strip() for line in str(e).strip().splitlines()[-3:])
            out.append(f"{type(e).__name__}: {message}")
    return out


def compile_errors(found: list[dict], target, workers: int | None = None) -> list[str | None]:
    """:func:`_errors` of ``found``, in its order, computed by ``workers`` forked processes (default
    one per core; 1: in this process): every 1 of ``workers`` records in each (about 35 ms a record
    on a 2-core CPU, 889 records in ``make test``'s run)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    workers = min(workers or os.cpu_count() or 1, len(found))
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return _errors(found, target)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        parts = list(pool.map(_errors, [found[k::workers] for k in range(workers)], [target] * workers))
    out: list[str | None] = [None] * len(found)
    for k, part in enumerate(parts):
        out[k::workers] = part
    return out


#: the opt-in shared memory of one block on sm_90 (H100, H200): 227 KiB
MAX_SHARED = 232448
#: kernels whose tiles of weights sit in shared memory: compiled to the end at their widest launch
SHARED_CHECKED = ("_iqn_epsilon_greedy_kernel", "_c51_epsilon_greedy_kernel", "_branching_epsilon_greedy_kernel",
                  "_q_forward_kernel")


def widest(found: list[dict]) -> list[dict]:
    """Per kernel of :data:`SHARED_CHECKED`, its recorded launch with the largest sum of integer
    constexprs (the widths, paddings and block sizes)."""
    best: dict[str, tuple[int, dict]] = {}
    for r in found:
        if r["name"] in SHARED_CHECKED:
            size = sum(v for v in r["constexprs"].values() if isinstance(v, int) and not isinstance(v, bool))
            if r["name"] not in best or size > best[r["name"]][0]:
                best[r["name"]] = (size, r)
    return [r for _, r in best.values()]


def shared_bytes(record: dict, target) -> int:
    """Shared memory (bytes) of one record's kernel compiled to the end for ``target`` with its
    launch options (``record["options"]``; Triton's defaults where absent)."""
    import triton
    from triton.compiler import ASTSource

    fn = kernel_of(record)
    src = ASTSource(fn=fn, signature=record["signature"], constexprs=record["constexprs"])
    return int(triton.compile(src, target=target, options=dict(record.get("options") or {})).metadata.shared)


def main(argv: list[str]) -> int:
    from triton.backends.compiler import GPUTarget

    allow_empty = "--allow-empty" in argv
    argv = [a for a in argv if a != "--allow-empty"]
    folder = Path(argv[0]) if argv else None
    found = records(folder) if folder is not None and folder.is_dir() else []
    if not found and allow_empty:
        print(f"compile_kernels: no kernel launches recorded in {folder}: nothing to compile")
        return 0
    if not found:
        print(f"compile_kernels: no kernel launches recorded in {folder} (set FOXDQN_KERNEL_RECORD for the test run)",
              file=sys.stderr)
        return 2
    target = GPUTarget("cuda", 90, 32)
    failed: dict[tuple[str, str], list[dict]] = {}  # (kernel, Triton's message) → its failing launches
    for record, error in zip(found, compile_errors(found, target)):
        if error is not None:  # report every kernel that fails, not only the first
            failed.setdefault((f"{record['module']}.{record['name']}", error), []).append(record)
    kernels = {(r["module"], r["name"]) for r in found}
    bad = sum(len(v) for v in failed.values())
    print(f"compile_kernels: {len(found) - bad} of {len(found)} recorded launches of {len(kernels)} kernels "
          f"compile for sm_90")
    for (kernel, message), launches in failed.items():
        print(f"  FAILED {kernel} ({len(launches)} launches, e.g. constexprs {launches[0]['constexprs']}): {message}")
    too_big, broken = [], {kernel for kernel, _ in failed}  # a kernel that failed above is not compiled again
    for record in widest([r for r in found if f"{r['module']}.{r['name']}" not in broken]):
        try:
            shared = shared_bytes(record, target)
        except Exception as e:  # noqa: BLE001 - reported like a front-end failure
            too_big.append(f"  FAILED {record['name']} (compiled to the end): {type(e).__name__}: {str(e)[-200:]}")
            continue
        line = f"{record['name']} at its widest recorded launch: {shared} bytes of shared memory (limit {MAX_SHARED})"
        print(f"compile_kernels: {line}")
        if shared > MAX_SHARED:
            too_big.append(f"  FAILED {line}; constexprs {record['constexprs']}")
    for line in too_big:
        print(line)
    return 1 if failed or too_big else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
