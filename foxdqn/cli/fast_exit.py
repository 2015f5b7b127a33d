"""End a command-line process without the interpreter's teardown.

After torch is loaded, Python's own shutdown (freeing every module and object one by one) takes a
noticeable time (docs/bench.md#other-costs), after all of the command's work is done.
:func:`run_as_program` runs a command's ``main`` and then ends the process as Python would, minus
that teardown: the non-daemon threads are waited for (``threading._shutdown``, what normal shutdown
does first), the ``atexit`` handlers run (logging's flush and close, weakref finalizers such as
temporary directories, the handlers of Ray, MLflow, joblib), stdout and stderr are flushed, and the
exit status is the one ``sys.exit`` would have given. Files foxdqn writes are complete before this
point (foxdqn.io_atomic). Only for the ``if __name__ == "__main__"`` block of a command: a function
that calls it never returns.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Callable, NoReturn


def exit_code(code: object) -> int:
    """The process exit status of ``sys.exit(code)``: None -> 0, an int as is, anything else -> 1
    (its text is printed to stderr first, as Python does)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def exit_now(code: object = 0) -> NoReturn:
    """Wait for non-daemon threads, run the ``atexit`` handlers, flush stdio, then ``os._exit``
    with :func:`exit_code` of ``code``."""
    status = exit_code(code)
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()  # joins the non-daemon threads, as the interpreter does before atexit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be said there
            pass
    os._exit(status)


def run_as_program(main: Callable[[], object]) -> NoReturn:
    """Call ``main()``; on its return or ``SystemExit``, :func:`exit_now` with that status. Any
    other exception propagates (its traceback, exit status 1, through the normal shutdown)."""
    try:
        main()
    except SystemExit as exc:
        exit_now(exc.code)
    exit_now(0)


def _worker_exit() -> NoReturn:
    atexit.unregister(_worker_exit)
    exit_now(0)


def exit_worker_without_teardown() -> None:
    """In a worker process of a launcher (joblib's loky workers): when the process ends, run the
    other ``atexit`` handlers, flush stdio and ``os._exit(0)`` (:func:`exit_now`) instead of
    Python's teardown, in which Triton's nanobind extension prints dozens of ``nanobind: leaked
    ...`` lines per worker after the sweep's report. Registered once per process; only for processes
    that end with status 0 once the launcher is done with them (a worker's crash kills it before
    ``atexit``). Does nothing in the main process."""
    import multiprocessing

    if multiprocessing.current_process().name == "MainProcess":
        return
    atexit.unregister(_worker_exit)  # at most once
    atexit.register(_worker_exit)
