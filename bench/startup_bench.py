"""Start-up section: wall time of ``python -m foxdqn.train`` outside training, run twice.

Each run is a fresh process of the default experiment (eurusd_dqn) in a temporary folder. Each
series of runs gets an empty Triton cache of its own (``TRITON_CACHE_DIR``): the first run compiles
every kernel it launches, as a user's first run on a fresh machine does (issue 33's cold start:
``kernels_compiled`` counts them), the second finds them warm, which is the number issue 17 targets
(wall minus training <= 6 s on a warm machine). A row per run: the wall time measured around
the process (``wall_s``), the run's own ``timings.json`` (foxdqn.timings: ``total_s`` since
process start, every phase as ``phase_<name>_s``), ``training_s`` (its ``training`` phase) and
``wall_minus_training_s``. On CPU the runs use ``debug=smoke`` (the full experiment trains for
minutes there).

Python's bytecode cache: where the environment turns it off (``PYTHONDONTWRITEBYTECODE``, as the
H200 machine's image does, with no ``__pycache__`` in torch's install), every process compiles
torch's ~1,000 modules from source (``import torch`` 3.7 s instead of 1.5 s there). A machine
where pip installed the packages has their bytecode, so the section then runs a second series
with the cache on (``PYTHONDONTWRITEBYTECODE`` unset, ``PYTHONPYCACHEPREFIX`` a folder of the
series; its first run fills it): the ``bytecode_cache`` column says which.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import bytecode_cache_on
from foxdqn.io_atomic import read_json

#: overrides of every run (progress bars off: the bench reads files, not the terminal)
BASE = ("log.progress=false",)
CPU = ("debug=smoke",)


def run_once(args: tuple[str, ...], folder: Path, timeout: float = 600.0, env: dict | None = None) -> dict:
    """One ``python -m foxdqn.train`` process into ``folder/run`` (environment ``env``, default this
    process's); the row of its timings.

    Raises:
        RuntimeError: the run failed (its exit code and the end of its stderr) or wrote no timings.json.
    """
    run_dir = folder / "run"
    t = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "foxdqn.train", *args, f"hydra.run.dir={run_dir}"],
                         cwd=folder, capture_output=True, text=True, timeout=timeout, env=env or {**os.environ})
    wall = time.perf_counter() - t
    if res.returncode != 0 or not (run_dir / "timings.json").is_file():
        raise RuntimeError(f"foxdqn.train exited {res.returncode}: {res.stderr[-2000:]}")
    times = read_json(run_dir / "timings.json")
    training = float(times["phases"].get("training", 0.0))
    row = {"wall_s": wall, "total_s": times["total_s"], "training_s": training,
           "wall_minus_training_s": wall - training, "overhead_s": times["overhead_s"],
           "training_wall_s": times.get("training_wall_s")}
    row.update({f"phase_{k}_s": v for k, v in times["phases"].items()})
    return row


def _series(cache_dir: str) -> list[tuple[str, dict]]:
    """``(bytecode_cache, environment)`` of each series: this environment as it is, and where it
    turns the bytecode cache off, the same with the cache on in ``cache_dir``."""
    env = {**os.environ}  # the child processes read the variable, not this process's -B flag
    on = bytecode_cache_on(env, cache_dir)
    return [("on", env)] if on is None else [("off (as configured)", env), ("on", on)]


def compiled_kernels(triton_cache: Path) -> int:
    """The kernels Triton compiled into the cache folder ``triton_cache`` (its ``*.cubin`` files; 0
    where nothing was compiled, e.g. on the CPU)."""
    return sum(1 for _ in Path(triton_cache).rglob("*.cubin"))


def rows(device: str = "cuda", runs: int = 2, extra: tuple[str, ...] = ()) -> list[dict]:
    """``runs`` rows (``run`` 1, 2, ...) of the default experiment on ``device`` per series
    (:func:`_series`; a series with the cache turned on gets one more run first, which fills it).
    Each series starts from an empty Triton cache of its own (``TRITON_CACHE_DIR``), so its first
    run pays what a user's first run on a fresh machine pays for compiling the kernels
    (``triton_cache`` ``cold``, ``kernels_compiled`` the kernels it compiled) and the later runs
    find them (``warm``)."""
    args = (*BASE, *(CPU if device != "cuda" else ()), *extra)
    out = []
    with tempfile.TemporaryDirectory(prefix="foxdqn-pycache-") as cache_dir:
        for cache, env in _series(cache_dir):
            extra_run = cache == "on" and env.get("PYTHONPYCACHEPREFIX") == cache_dir
            with tempfile.TemporaryDirectory(prefix="foxdqn-triton-") as triton_cache:
                env = {**env, "TRITON_CACHE_DIR": triton_cache}
                for i in range(1, runs + 1 + extra_run):
                    before = compiled_kernels(triton_cache)
                    with tempfile.TemporaryDirectory(prefix="foxdqn-startup-") as tmp:
                        row = run_once(args, Path(tmp), env=env)
                    compiled = compiled_kernels(triton_cache) - before
                    out.append({"section": "startup", "features": "eurusd_dqn", "size": " ".join(args),
                                "provider": device, "bytecode_cache": cache, "run": i,
                                "triton_cache": "cold" if i == 1 else "warm", "kernels_compiled": compiled, **row})
                    print(f"startup run {i} (bytecode cache {cache}, Triton cache {'cold' if i == 1 else 'warm'}): "
                          f"wall {row['wall_s']:.2f} s, training {row['training_s']:.2f} s, wall - training "
                          f"{row['wall_minus_training_s']:.2f} s, {compiled} kernels compiled", file=sys.stderr)
    return out


def table(df) -> str:
    """The section's markdown: one row per run, the phases over 0.05 s as columns."""
    phases = [c for c in df.columns if c.startswith("phase_") and df[c].astype(float).max() >= 0.05]
    cols = ["bytecode_cache", "run", "triton_cache", "kernels_compiled", "wall_s", "training_s",
            "wall_minus_training_s", *phases]
    return ("## start-up: `python -m foxdqn.train`, run twice per series, each series from an empty Triton cache "
            "(the first run compiles every kernel, as on a fresh machine; the second finds them; in a series that "
            "turns the bytecode cache on, one more run first fills it)\n\n"
            + df[[c for c in cols if c in df]].to_markdown(index=False, floatfmt=".3g"))


if __name__ == "__main__":  # python -m bench.startup_bench [overrides...]
    import pandas as pd

    import torch

    print(table(pd.DataFrame(rows("cuda" if torch.cuda.is_available() else "cpu", extra=tuple(sys.argv[1:])))))
