"""foxdqn.io_pool: background calls, waited for, failures reported in submission order."""
import threading

import pytest

from foxdqn.io_pool import IOQueue


def test_calls_run_in_order_off_the_calling_thread():
    seen, threads = [], set()
    queue = IOQueue()
    for i in range(20):
        queue.submit(lambda i: (seen.append(i), threads.add(threading.get_ident())), i)
    queue.wait()
    assert seen == list(range(20))
    assert threading.get_ident() not in threads and len(threads) == 1
    queue.submit(seen.append, 20)  # usable again after a wait
    queue.wait()
    assert seen[-1] == 20


def test_the_first_failure_is_raised_after_every_call_ended():
    seen = []

    def call(i):
        if i in (3, 5):
            raise OSError(f"call {i}")
        seen.append(i)

    queue = IOQueue()
    for i in range(8):
        queue.submit(call, i)
    with pytest.raises(OSError, match="call 3"):
        queue.wait()
    assert seen == [0, 1, 2, 4, 6, 7]
    queue.wait()  # the failures were reported once


def test_without_check_failures_are_dropped():
    queue = IOQueue()
    queue.submit(lambda: 1 / 0)
    queue.wait(check=False)
    queue.wait()
