"""tests/kernel_record.py and tests/compile_kernels.py: a launch's record names its argument types,
constexprs, launch options and source file (a test module's kernel compiles from it); a kernel
the interpreter runs but Triton cannot compile fails the check, by name, and so does a fused kernel
whose widest launch needs more shared memory than an sm_90 block has."""
import json
import subprocess
import sys
from pathlib import Path

import torch

from kernel_record import launch_record

GOOD = '''
import triton
import triton.language as tl


@triton.jit
def total(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    acc = tl.sum(tl.zeros([BLOCK], dtype=tl.float64), axis=0)
    for start in range(0, n, BLOCK):
        v = tl.load(x_ptr + start + tl.arange(0, BLOCK), mask=start + tl.arange(0, BLOCK) < n, other=0.0)
        acc += tl.sum(v.to(tl.float64), axis=0)
    tl.store(out_ptr, acc)
'''
# the PER prefix kernel's bug: a name reused in a loop with another type (the interpreter runs it)
BAD = GOOD.replace("v = tl.load", "m = tl.load").replace("v.to(", "m.to(").replace(
    "    acc = tl.sum(", "    m = tl.program_id(0).to(tl.int64)\n    acc = tl.sum(")


def _kernel_fn():
    """A plain function with GOOD's parameters (launch_record reads only the signature)."""
    namespace: dict = {}
    exec(compile("def total(x_ptr, out_ptr, n, BLOCK: 'tl.constexpr'): pass", "k", "exec"), namespace)
    return namespace["total"]


def test_launch_record_types_and_constexprs():
    fn = _kernel_fn()
    rec = launch_record(fn, (torch.zeros(3), torch.zeros(1, dtype=torch.float64), 3), {"BLOCK": 16, "num_warps": 4})
    assert rec["signature"] == {"x_ptr": "*fp32", "out_ptr": "*fp64", "n": "i32", "BLOCK": "constexpr"}
    assert rec["constexprs"] == {"BLOCK": 16} and rec["options"] == {"num_warps": 4}
    assert launch_record(fn, (torch.zeros(3, dtype=torch.bool), None, 2**40, 8), {})["signature"] == {
        "x_ptr": "*i1", "out_ptr": "constexpr", "n": "i64", "BLOCK": "constexpr"}


def _check(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    (tmp_path / "kmod.py").write_text(source)
    records = tmp_path / "records"
    records.mkdir()
    rec = {"module": "kmod", "name": "total", "signature": {"x_ptr": "*fp32", "out_ptr": "*fp64", "n": "i32",
                                                           "BLOCK": "constexpr"}, "constexprs": {"BLOCK": 32}}
    (records / "w.jsonl").write_text(json.dumps(rec) + "\n")
    script = Path(__file__).parent / "compile_kernels.py"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    return subprocess.run([sys.executable, str(script), str(records)], capture_output=True, text=True, env=env,
                          timeout=120)


def test_a_kernel_that_compiles_passes(tmp_path):
    done = _check(tmp_path, GOOD)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 of 1 recorded launches of 1 kernels compile" in done.stdout



def test_a_kernel_of_a_module_off_the_path_compiles_from_its_recorded_file(tmp_path):
    """A test module's kernel (pytest put its folder on sys.path; compile_kernels's process does not
    have it): the record's ``file`` imports it; without a file the import fails by name."""
    folder = tmp_path / "off_path"
    folder.mkdir()
    (folder / "kfile.py").write_text(GOOD)
    records = tmp_path / "records"
    records.mkdir()
    sig = {"x_ptr": "*fp32", "out_ptr": "*fp64", "n": "i32", "BLOCK": "constexpr"}
    rec = {"module": "kfile", "name": "total", "file": str(folder / "kfile.py"), "signature": sig,
           "constexprs": {"BLOCK": 32}}
    script = Path(__file__).parent / "compile_kernels.py"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    for with_file, code in ((True, 0), (False, 1)):
        (records / "w.jsonl").write_text(json.dumps(rec if with_file else {**rec, "file": None}) + "\n")
        done = subprocess.run([sys.executable, str(script), str(records)], capture_output=True, text=True, env=env,
                              timeout=120)
        assert done.returncode == code, done.stdout + done.stderr
    assert "FAILED kfile.total" in done.stdout and "No module named 'kfile'" in done.stdout

def test_a_loop_carried_type_change_fails_by_name(tmp_path):
    done = _check(tmp_path, BAD)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED kmod.total" in done.stdout and "Loop-carried variable m" in done.stdout


def test_the_records_compiled_in_worker_processes_fail_as_in_one(tmp_path):
    """compile_errors over forked workers (make test's run: one per core) gives each record the
    result, and the message, it gets compiled in one process, in the records' order."""
    (tmp_path / "kgood.py").write_text(GOOD)
    (tmp_path / "kbad.py").write_text(BAD)
    sig = {"x_ptr": "*fp32", "out_ptr": "*fp64", "n": "i32", "BLOCK": "constexpr"}
    found = [{"module": m, "name": "total", "signature": sig, "constexprs": {"BLOCK": b}}
             for m, b in (("kgood", 16), ("kbad", 16), ("kgood", 32), ("kgood", 64), ("kbad", 64))]
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import json, sys\n"
        f"sys.path[:0] = [{str(tmp_path)!r}, {str(Path(__file__).parent)!r}]\n"
        "import compile_kernels as ck\n"
        "from triton.backends.compiler import GPUTarget\n"
        f"found = json.loads({json.dumps(json.dumps(found))})\n"
        "target = GPUTarget('cuda', 90, 32)\n"
        "print(json.dumps([ck.compile_errors(found, target, workers=w) for w in (1, 2, 3)]))\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, str(driver)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    one, two, three = json.loads(done.stdout.splitlines()[-1])
    assert one == two == three
    assert [e is None for e in one] == [True, False, True, True, False]
    assert "Loop-carried variable m" in one[1] and "Loop-carried variable m" in one[4]


def test_no_records_is_an_error(tmp_path):
    script = Path(__file__).parent / "compile_kernels.py"
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no kernel launches recorded" in done.stderr


def test_a_fused_kernel_above_the_shared_memory_of_a_block_fails_by_name(tmp_path):
    """The C51 collect kernel at its widest shapes: with its launch options (no pipelining) it fits;
    with Triton's default 3 stages it needs more than MAX_SHARED, as it did on the H200."""
    import os

    import compile_kernels as ck

    from foxdqn.ops import c51_epsilon_greedy as op

    fn = op._c51_epsilon_greedy_kernel.fn
    h, w, b = torch.zeros(1, 2, op.MAX_WIDTH), torch.zeros(1, op.MAX_WIDTH, 8), torch.zeros(1, 1, 8)
    args = (h, torch.zeros(2, dtype=torch.int64), 2, w, b, w, b, torch.zeros(1, 4), torch.zeros((), dtype=torch.int64),
            *[torch.zeros(1)] * 4, *[1] * 10)
    consts = dict(H=op.MAX_WIDTH, K=op.MAX_ATOMS, A=op.MAX_ACTIONS, PH=op.MAX_WIDTH, PK=op.MAX_ATOMS,
                  PA=op.MAX_ACTIONS, DUELING=True, BLOCK_M=op.BLOCK_M, PREC="tf32", RANDOM_BITS=24)
    record = launch_record(fn, args, {**consts, "num_warps": op.NUM_WARPS, "num_stages": op.NUM_STAGES})
    assert ck.widest([record, {**record, "name": "other"}]) == [record]
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(root)
    for stages, code in ((op.NUM_STAGES, 0), (3, 1)):
        records = tmp_path / f"records{stages}"
        records.mkdir()
        (records / "w.jsonl").write_text(json.dumps({**record, "options": {**record["options"], "num_stages": stages}})
                                         + "\n")
        done = subprocess.run([sys.executable, str(Path(__file__).parent / "compile_kernels.py"), str(records)],
                              capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == code, done.stdout + done.stderr
        line = "_c51_epsilon_greedy_kernel at its widest recorded launch"
        assert (f"FAILED {line}" in done.stdout) == (code == 1) and line in done.stdout
