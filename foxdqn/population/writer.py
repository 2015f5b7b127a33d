"""Checkpoint files written in a background thread while training goes on.

A population's periodic checkpoints (``checkpoint.every_env_steps``) cost milliseconds of host
time per member (docs/bench.md#the-jax-peer): seconds per checkpoint at 512 members, which the
training loop would wait for. The population's state is copied to the host at the boundary
(:class:`foxdqn.population.checkpoint.HostCopy`); the members' files are encoded from those copies
(:func:`foxdqn.population.checkpoint_batch.member_files`: every member's tensors packed at once)
and written atomically in the thread, while the main thread goes on launching iterations (a
CUDA-graph replay releases the GIL). The final checkpoints are written the same way while the
members are evaluated, and waited for before any summary is written
(:func:`foxdqn.population.train.train_population`). One batch is in flight at a time.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, Iterable

from foxdqn.io_atomic import deferred_sync, write_bytes_atomic
from foxdqn.run.checkpoint import _walk, write_payload

__all__ = ["BackgroundWriter"]


class BackgroundWriter:
    """Writes batches of checkpoint payloads (:func:`foxdqn.run.checkpoint.write_payload`, atomic
    each, one file-system sync per batch) in one thread, a batch at a time."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, items: list[tuple[Path, dict]] | Callable[[], Iterable[tuple[Path, dict | bytes]]]) -> None:
        """Write ``items`` (path, payload) in the background, after the batch in flight (waited
        for, as :meth:`wait`). The payloads must not change afterwards. ``items`` may be a callable
        that builds them, called in the thread: it must read host copies only (never the device,
        nor objects this thread goes on changing); it returns a list of (path, payload), or an
        iterable of (path, the file's bytes) (:func:`foxdqn.population.checkpoint_batch.member_files`),
        each file written as it comes.

        Raises:
            OSError: the batch before failed (as :meth:`wait`).
            ValueError: a payload holds a tensor that is not on the CPU (names the file and the
                key): the thread would read the device, and a device read from another thread
                invalidates a CUDA-graph capture running in this one. For a callable, the check
                runs in the thread on what it built, and the error is raised by :meth:`wait`.
        """
        self.wait()
        if not callable(items):
            _check_host(items)

        def work() -> None:
            try:
                batch = items() if callable(items) else items
                if callable(items) and isinstance(batch, list):
                    _check_host(batch)
                with deferred_sync():
                    for path, payload in batch:
                        if isinstance(payload, bytes):
                            write_bytes_atomic(path, payload)
                        else:
                            write_payload(path, payload)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the owner's thread by wait()
                self._error = exc

        self._thread = threading.Thread(target=work, name="foxdqn-checkpoints")
        self._thread.start()

    def wait(self) -> None:
        """Block until the batch in flight is written.

        Raises:
            OSError: a file of that batch could not be written (names the path; the files
                written before it stay, the others keep their previous content).
        """
        self.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def join(self) -> None:
        """Block until the batch in flight is written, keeping a failure for :meth:`wait`."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def _check_host(items: list[tuple[Path, dict]]) -> None:
    """Raise ValueError naming the file and key of the first tensor of a payload that is not on the CPU."""
    for path, payload in items:
        if isinstance(payload, bytes):
            continue
        for where, t in _walk(payload, "payload", set()):
            if t.device.type != "cpu":
                raise ValueError(f"checkpoint {path}: {where} ({t.device}) is not a CPU tensor; a payload written "
                                 "in the background must hold host copies (foxdqn.population.checkpoint.HostCopy)")
