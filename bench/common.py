"""Shared benchmark plumbing: environment tags, timing, result files."""
from __future__ import annotations

import csv
import datetime as _dt
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"


def tags() -> dict:
    """GPU name, versions and date attached to every row."""
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # pragma: no cover - triton missing
        triton_version = None
    return {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else f"cpu:{platform.processor() or platform.machine()}",
        "torch": torch.__version__,
        "triton": triton_version,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def bytecode_cache_on(env: dict, cache_dir: str) -> dict | None:
    """``env`` with Python's bytecode cache turned on (``PYTHONDONTWRITEBYTECODE`` removed,
    ``PYTHONPYCACHEPREFIX`` = ``cache_dir``: the first process fills it, later ones load from it),
    or None where ``env`` does not turn the cache off (it is then on already). An environment that
    turns it off (the GPU machines' image, with no ``__pycache__`` in torch's install) makes every
    process compile torch's ~1,000 modules from source; a machine where pip installed the packages
    has their bytecode (docs/bench.md#start-up)."""
    if not env.get("PYTHONDONTWRITEBYTECODE"):
        return None
    on = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    on["PYTHONPYCACHEPREFIX"] = cache_dir
    return on


def run_multirun(experiment: str, seeds: int, sweep: Path, overrides: list[str] = ()) -> dict:
    """Run ``python -m foxdqn.train --multirun +experiment=E seed=0,...,S-1 log.progress=false
    hydra.sweep.dir=SWEEP [overrides]`` as a subprocess and wait for it.

    The jobs write into ``sweep`` (their folders, and the multirun's report.md/.json from the Hydra
    callback); the process's stdout and stderr go to ``sweep/stdout.log``. Returns ``rc`` (the
    multirun's exit code) and ``wall_s`` (seconds from the command to its exit, 0.1 s steps).
    """
    sweep = Path(sweep)
    cmd = [sys.executable, "-m", "foxdqn.train", "--multirun", f"+experiment={experiment}",
           "seed=" + ",".join(str(s) for s in range(seeds)), "log.progress=false", f"hydra.sweep.dir={sweep}",
           *overrides]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    sweep.mkdir(parents=True, exist_ok=True)
    (sweep / "stdout.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    return {"rc": proc.returncode, "wall_s": round(wall, 1)}


def time_ms(fn, warmup: int = 3, reps: int = 20) -> tuple[float, float, float]:
    """Median, 20th and 80th percentile of ``fn()`` in ms.

    CUDA: ``triton.testing.do_bench`` (CUDA events, L2 flushed). CPU: wall clock per call.
    """
    if torch.cuda.is_available():
        from triton.testing import do_bench

        q = do_bench(fn, warmup=25, rep=100, quantiles=[0.5, 0.2, 0.8])
        return float(q[0]), float(q[1]), float(q[2])
    import time

    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1e3)
    samples.sort()
    pick = lambda f: samples[min(len(samples) - 1, int(f * len(samples)))]  # noqa: E731
    return pick(0.5), pick(0.2), pick(0.8)


def write_csv(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)
    return path
