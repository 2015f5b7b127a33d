"""File-system work of many run folders, done on a background thread.

A population's P run folders cost a handful of file creations each (a job's ``.hydra/`` files:
a ``mkdir`` and three writes). Creating a file is a system call that waits on the file system and
releases the GIL: 0.25 ms a job on the 2-core CPU's disk when idle, 2.5-3 ms while it still writes
back an earlier sweep's files (docs/bench.md#other-costs). On one background thread those
waits overlap the main thread's Python (the callers render the texts; the thread only writes).
One thread, not several: file creations in one folder serialise on its lock, and on the 2-core
CPU eight threads made the writes twice as slow.

:class:`IOQueue` runs calls in the background until :meth:`IOQueue.wait`, which reports the first
failure in submission order after every call has ended, so the caller never sees a folder still
being written.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

__all__ = ["IOQueue"]


class IOQueue:
    """Calls run in the background on one thread, in submission order, until :meth:`wait`. The
    calls must not depend on anything the caller changes afterwards."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._futures: list[Future] = []

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` in the background."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="foxdqn-io")
        self._futures.append(self._pool.submit(fn, *args))

    def wait(self, check: bool = True) -> None:
        """Wait for every call submitted so far.

        Raises:
            BaseException: (``check``) the exception of the first call (in submission order) that
                raised, once every call has ended; without ``check`` failures are dropped (the
                caller is already raising its own).
        """
        futures, self._futures = self._futures, []
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for f in futures if check else ():
            f.result()
