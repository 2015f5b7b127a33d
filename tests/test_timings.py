"""foxdqn.timings (the start-up breakdown's clock) and foxdqn.cli.fast_exit (the CLI's end).

The run's own timings.json is checked by tests/test_train_cli.py::test_default_smoke_writes_every_output."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from foxdqn import timings
from foxdqn.cli.fast_exit import exit_code
from foxdqn.timings import PhaseClock, format_line, process_start


def test_marks_split_the_wall_time_into_consecutive_phases(monkeypatch):
    now = iter([10.5, 12.0, 12.25, 15.0])
    monkeypatch.setattr(timings.time, "perf_counter", lambda: next(now))
    clock = PhaseClock(10.0)
    assert clock.mark("imports") == 0.5
    assert clock.mark("training") == 1.5
    assert clock.mark("imports") == 0.25  # a phase marked twice sums its segments
    assert clock.mark("report") == 2.75
    assert clock.phases == {"imports": 0.75, "training": 1.5, "report": 2.75}
    assert list(clock.phases) == ["imports", "training", "report"]  # first-seen order
    assert clock.total() == 5.0 == sum(clock.phases.values())
    d = clock.as_dict(device="cpu")
    assert d == {"origin": "process start", "total_s": 5.0, "phases": {"imports": 0.75, "training": 1.5, "report": 2.75},
                 "overhead_s": 3.5, "device": "cpu"}


def test_restart_begins_a_new_breakdown_at_the_last_mark(monkeypatch):
    now = iter([1.0, 3.0, 4.0])
    monkeypatch.setattr(timings.time, "perf_counter", lambda: next(now))
    clock = PhaseClock(0.0)
    clock.mark("imports")
    clock.mark("training")
    clock.restart()
    assert clock.phases == {} and clock.origin == "previous run's end" and clock.total() == 0.0
    clock.mark("compose")
    assert clock.as_dict()["total_s"] == 1.0 and clock.as_dict()["overhead_s"] == 1.0  # no training phase: all overhead


def test_format_line_names_the_large_phases_largest_first():
    line = format_line({"origin": "process start", "total_s": 10.0, "overhead_s": 6.0,
                        "phases": {"imports": 2.0, "training": 4.0, "report": 3.96, "close": 0.04}})
    assert line.startswith("wall 10.00 s since process start = training 4.00 s + 6.00 s other")
    assert line.index("report 3.96") < line.index("imports 2.00")
    assert "close" not in line  # under 0.05 s


def test_process_start_is_before_this_process_ran_any_python():
    start, real = process_start()
    now = time.perf_counter()
    if not sys.platform.startswith("linux"):
        pytest.skip("the process start time is read from /proc")
    assert real
    assert start <= timings.CLOCK.start + 0.02 <= now  # 10 ms ticks
    assert "interpreter" in timings.CLOCK.phases or timings.CLOCK.origin != "process start"


def test_process_start_of_a_fresh_process_counts_the_time_before_python_started():
    """A process that sleeps before exec'ing Python: its start is the fork, not the import."""
    code = "import time; from foxdqn.timings import CLOCK; print(CLOCK.phases['interpreter'])"
    res = subprocess.run(["sh", "-c", f'sleep 0.3; exec "{sys.executable}" -c "{code}"'], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert 0.3 <= float(res.stdout) < 10.0


@pytest.mark.parametrize("code, status", [(None, 0), (0, 0), (3, 3), ("message", 1)])
def test_exit_code_is_that_of_sys_exit(code, status, capsys):
    assert exit_code(code) == status
    assert capsys.readouterr().err == ("message\n" if isinstance(code, str) else "")


def _program(body: str, tmp_path) -> subprocess.CompletedProcess:
    head = ("import atexit, sys, threading, time\n"
            "from foxdqn.cli.fast_exit import run_as_program\n"
            "atexit.register(lambda: print('atexit ran'))\n"
            "def main():\n")
    tail = "run_as_program(main)\nprint('not reached')\n"
    script = tmp_path / "prog.py"
    script.write_text(head + textwrap.indent(textwrap.dedent(body).strip(), "    ") + "\n" + tail)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)


def test_run_as_program_keeps_exit_status_atexit_threads_and_buffered_output(tmp_path):
    res = _program("""
        t = threading.Thread(target=lambda: (time.sleep(0.2), print("thread done")))
        t.start()
        sys.stdout.write("buffered, no newline")
        """, tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "buffered, no newlinethread done\natexit ran\n"  # the thread joined before atexit
    res = _program("sys.exit(4)", tmp_path)
    assert (res.returncode, res.stdout) == (4, "atexit ran\n")
    res = _program("sys.exit('bad input')", tmp_path)
    assert (res.returncode, res.stderr) == (1, "bad input\n")
    res = _program("raise ValueError('boom')", tmp_path)  # an error: Python's own traceback and status
    assert res.returncode == 1 and "ValueError: boom" in res.stderr and "atexit ran" in res.stdout
