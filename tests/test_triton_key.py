"""foxdqn.device.triton_key: Triton's cache key computed in a daemon thread where CUDA is available,
not at all on a CPU-only machine, and a failure there never reaches the run."""
from __future__ import annotations

import threading

import torch
import triton.runtime.cache as triton_cache

from foxdqn.device.triton_key import start


def _run(monkeypatch, available: bool, fails: bool = False) -> list:
    calls = []

    def key():
        calls.append((threading.current_thread(), threading.current_thread().daemon))
        if fails:
            raise RuntimeError("no libtriton")
        return "key"

    monkeypatch.setattr(triton_cache, "triton_key", key)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    thread = start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    return calls


def test_the_key_is_computed_in_a_daemon_thread_where_cuda_is_available(monkeypatch):
    calls = _run(monkeypatch, available=True)
    assert len(calls) == 1
    thread, daemon = calls[0]
    assert thread is not threading.main_thread() and daemon


def test_a_cpu_only_machine_computes_nothing(monkeypatch):
    assert _run(monkeypatch, available=False) == []


def test_a_failure_in_the_thread_is_ignored(monkeypatch):
    errors = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args))
    assert len(_run(monkeypatch, available=True, fails=True)) == 1
    assert errors == []
