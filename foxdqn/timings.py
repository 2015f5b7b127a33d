"""Start-up breakdown of a run: wall seconds per phase, from process start (``timings.json``).

:data:`CLOCK` splits the process's wall time into consecutive segments. :func:`mark` ends the
segment that began at the previous mark (the first one begins at process start) and adds its
seconds to the named phase; a phase marked more than once (warm-up of the collect-only and of the
full iteration, say) sums its segments. A mark is one ``time.perf_counter()`` read: it never waits
for the device. CUDA work still queued at a mark is therefore counted in the phase during which
the host next waits for it; the marks of the hot loop sit where the host already waits (the
synchronize before a CUDA-graph capture, :meth:`foxdqn.population.train._Population.close`), so the training
phase never gains a host synchronisation. docs/outputs.md#timingsjson lists the phases.

Process start: on Linux the process's start time from ``/proc/self/stat`` (field 22, in clock
ticks, so 10 ms resolution) against ``CLOCK_BOOTTIME``; elsewhere the moment this module was
first imported (``import foxdqn`` imports it), and ``interpreter`` is then absent.
"""
from __future__ import annotations

import os
import time

__all__ = ["CLOCK", "PhaseClock", "mark", "process_start", "format_line", "PHASES"]

#: the phases foxdqn marks, in the order a run passes them (docs/outputs.md#timingsjson)
PHASES = (
    "interpreter",       # process start -> `import foxdqn` (Python start-up, runpy)
    "imports",           # module imports of foxdqn.train (Hydra, OmegaConf, torch, ...)
    "compose",           # Hydra: command line, config composition, run folder, logging
    "validate",          # foxdqn.config.schema.finalize (and a resume's checkpoint settings)
    "data_load",         # market data read, features computed
    "preflight",         # the other checks before any work (device memory: CUDA's first call)
    "build",             # run folder, env, network, replay, optimizer, monitors, loggers
    "warmup",            # eager warm-up iterations (Triton compilation, first allocations)
    "graph_capture",     # torch.cuda.graph capture of an iteration
    "training",          # the iteration loop (graph replays, guard polls, log rows)
    "periodic_checkpoint",  # the loop's checkpoints: the device read and the loop states (a thread writes)
    "validation",        # validation passes (eval.interval_env_steps, the selection's)
    "checkpoint",        # checkpoints/last.pt and best.pt writes
    "close",             # the last log rows, logger flush/close, host env workers
    "final_evaluation",  # the evaluation on eval.split
    "report",            # eval/ files and plot, TensorBoard hparams, MLflow
    "summary",           # the results table on stdout, run-folder markers
)


def _proc_start_age() -> float | None:
    """Seconds since this process started (Linux), or None where it cannot be read."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2:].split()  # after "(comm)": the comm may hold spaces
        start_ticks = int(fields[19])  # field 22 of proc(5); fields[0] is field 3
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def process_start() -> tuple[float, bool]:
    """(``time.perf_counter()`` value of process start, whether it is the real process start)."""
    now, age = time.perf_counter(), _proc_start_age()
    return (now, False) if age is None else (now - age, True)


class PhaseClock:
    """Consecutive wall-time segments, each added to a named phase.

    Args:
        start: ``time.perf_counter()`` value where the first segment begins.
        origin: what ``start`` is (``"process start"``, ``"previous run's end"``), written with the times.
    """

    def __init__(self, start: float, origin: str = "process start") -> None:
        self.start, self.origin = start, origin
        self.last = start
        self.phases: dict[str, float] = {}

    def mark(self, phase: str) -> float:
        """End the current segment now and add its seconds to ``phase``; returns those seconds."""
        now = time.perf_counter()
        dt = max(0.0, now - self.last)
        self.phases[phase] = self.phases.get(phase, 0.0) + dt
        self.last = now
        return dt

    def total(self) -> float:
        """Seconds from ``start`` to the last mark."""
        return self.last - self.start

    def as_dict(self, **extra) -> dict:
        """``{"origin", "total_s", "phases": {name: s}, "overhead_s", ...extra}``: ``overhead_s`` is
        the total minus the ``training`` phase (the start-up and wind-down cost of the run)."""
        phases = {k: round(v, 4) for k, v in self.phases.items()}
        total = round(self.total(), 4)
        return {"origin": self.origin, "total_s": total, "phases": phases,
                "overhead_s": round(total - phases.get("training", 0.0), 4), **extra}

    def restart(self, origin: str = "previous run's end") -> None:
        """Begin a new breakdown at the last mark (the next job of a multirun in this process)."""
        self.start, self.origin, self.phases = self.last, origin, {}


def format_line(times: dict) -> str:
    """One log line of :meth:`PhaseClock.as_dict`'s result: total, training, then every phase
    over 0.05 s, largest first."""
    phases = sorted(((v, k) for k, v in times["phases"].items() if k != "training" and v >= 0.05), reverse=True)
    parts = ", ".join(f"{k} {v:.2f}" for v, k in phases)
    return (f"wall {times['total_s']:.2f} s since {times['origin']} = training {times['phases'].get('training', 0.0):.2f} s"
            f" + {times['overhead_s']:.2f} s other ({parts})")


_start, _real = process_start()
#: the process-wide clock; its first segment, ``interpreter``, ends at this module's import
CLOCK = PhaseClock(_start, "process start" if _real else "import foxdqn")
if _real:
    CLOCK.mark("interpreter")


def mark(phase: str) -> float:
    """:meth:`PhaseClock.mark` of :data:`CLOCK`."""
    return CLOCK.mark(phase)
