"""foxdqn.population.writer: checkpoint batches written in a background thread; a failure is
raised in the owner's thread, at the next wait or submit."""
from __future__ import annotations

import threading

import pytest
import torch

from foxdqn.population.writer import BackgroundWriter
from foxdqn.run.checkpoint import decode


def test_a_batch_is_written_in_another_thread_and_wait_returns_when_it_is_complete(tmp_path, monkeypatch):
    import foxdqn.population.writer as writer_module

    threads, real = [], writer_module.write_payload
    monkeypatch.setattr(writer_module, "write_payload",
                        lambda path, payload: threads.append(threading.current_thread()) or real(path, payload))
    writer = BackgroundWriter()
    items = [(tmp_path / f"m{p}" / "last.pt", {"format": 4, "w": torch.full((3,), float(p))}) for p in range(4)]
    writer.submit(items)
    writer.wait()
    assert len(threads) == 4 and all(t is not threading.main_thread() for t in threads)
    for p in range(4):
        path = tmp_path / f"m{p}" / "last.pt"
        assert torch.equal(decode(path.read_bytes(), path)["w"], torch.full((3,), float(p)))
    writer.wait()  # nothing in flight: returns


def test_a_failed_write_is_raised_by_the_next_wait_or_submit_once(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    writer = BackgroundWriter()
    writer.submit([(blocker / "last.pt", {"format": 4})])
    with pytest.raises(OSError) as info:
        writer.wait()
    assert str(blocker / "last.pt") in str(info.value)
    writer.wait()  # raised once
    writer.submit([(blocker / "again.pt", {"format": 4})])
    writer.join()  # keeps the failure
    with pytest.raises(OSError):
        writer.submit([(tmp_path / "ok.pt", {"format": 4})])
    assert not (tmp_path / "ok.pt").exists()


def _final_run(tmp_path, monkeypatch, fail: bool):
    """A 2-member CartPole population with only the final checkpoints; records, per write, its
    thread and whether any summary.json existed then; ``fail``: member 1's write raises."""
    import foxdqn.population.writer as writer_module
    from test_population import CARTPOLE, configs
    from test_population_resume import train

    seen = []

    def recorded(real):
        def write(path, payload):  # a payload (written member by member) or a file's bytes (member_files)
            seen.append((threading.current_thread() is threading.main_thread(),
                         any(tmp_path.glob("*/eval/summary.json"))))
            if fail and path.parent.parent.name == "1":
                raise OSError(28, "No space left on device", str(path))
            return real(path, payload)
        return write

    for name in ("write_payload", "write_bytes_atomic"):
        monkeypatch.setattr(writer_module, name, recorded(getattr(writer_module, name)))
    cfgs = configs([*CARTPOLE, "agent.total_env_steps=256", "checkpoint.every_env_steps=0"], [["seed=0"], ["seed=1"]])
    return seen, cfgs, lambda: train(cfgs, tmp_path)


def test_the_final_checkpoints_are_written_beside_the_evaluation_and_before_any_summary(tmp_path, monkeypatch):
    from foxdqn.run.resume import read_checkpoint

    seen, cfgs, run = _final_run(tmp_path, monkeypatch, fail=False)
    outcomes = run()
    assert [o.exit_code for o in outcomes] == [0, 0]
    assert seen == [(False, False), (False, False)]  # the writer's thread, no summary yet
    for p in range(2):
        payload = read_checkpoint(tmp_path / str(p) / "checkpoints" / "last.pt")
        assert payload["member_state"]["env_steps"] == cfgs[p].agent.total_env_steps
        assert (tmp_path / str(p) / "eval" / "summary.json").exists()


def test_a_final_checkpoint_that_cannot_be_written_fails_the_run_before_any_summary(tmp_path, monkeypatch):
    _, _, run = _final_run(tmp_path, monkeypatch, fail=True)
    with pytest.raises(OSError, match="No space left"):
        run()
    for p in range(2):
        assert not (tmp_path / str(p) / "eval" / "summary.json").exists()
        assert (tmp_path / str(p) / "INCOMPLETE").exists()


def test_a_payload_with_a_tensor_off_the_host_is_refused_before_the_thread_starts(tmp_path):
    """A device tensor in a payload would be read by the writer's thread: on CUDA that read
    invalidates the evaluation's graph capture running meanwhile (seen with eurusd_iql)."""
    writer = BackgroundWriter()
    payload = {"format": 4, "iql_value": {"value.weight": torch.empty(2, 3, device="meta")}, "w": torch.zeros(1)}
    with pytest.raises(ValueError, match=r"m0/last.pt: payload\['iql_value'\]\['value.weight'\] \(meta\)"):
        writer.submit([(tmp_path / "m0" / "last.pt", payload)])
    assert not (tmp_path / "m0").exists()
    writer.wait()


def test_a_batch_given_as_a_callable_is_built_in_the_thread_and_its_device_tensor_raised_by_wait(tmp_path):
    """save(background=True) hands over a builder: the payloads are built from host copies in the
    writer's thread; a tensor off the host there is refused before any file of the batch is written."""
    writer, built = BackgroundWriter(), []

    def items():
        built.append(threading.current_thread())
        return [(tmp_path / "m0" / "last.pt", {"format": 4, "w": torch.ones(2)})]

    writer.submit(items)
    writer.wait()
    assert built and built[0] is not threading.main_thread()
    path = tmp_path / "m0" / "last.pt"
    assert torch.equal(decode(path.read_bytes(), path)["w"], torch.ones(2))
    writer.submit(lambda: [(tmp_path / "m1" / "last.pt", {"format": 4, "w": torch.zeros(1)}),
                           (tmp_path / "m2" / "last.pt", {"format": 4, "w": torch.empty(1, device="meta")})])
    with pytest.raises(ValueError, match=r"m2/last.pt: payload\['w'\] \(meta\)"):
        writer.wait()
    assert not (tmp_path / "m1").exists() and not (tmp_path / "m2").exists()


def test_a_boundarys_rows_are_written_during_the_next_iterations_and_are_the_same_rows(tmp_path, monkeypatch):
    """_log_rows leaves each member's row to _write_rows, which the loop calls after each launch
    with a time budget: with a budget of 0 (no row between boundaries: each boundary writes the
    last one's) rows are still pending after a boundary, and every member's metrics.csv equals the
    one written with no limit."""
    import foxdqn.population.train as train_module
    from test_population import CARTPOLE, configs
    from test_population_resume import assert_same_run, train

    cfgs = configs([*CARTPOLE, "agent.total_env_steps=512", "log.interval_env_steps=64"],
                   [[f"seed={p}"] for p in range(3)])
    pending, original = [], train_module._Population._log_rows

    def log_rows(self, rate, last):
        returns = original(self, rate, last)
        pending.append(len(self.pending_rows))
        return returns

    monkeypatch.setattr(train_module._Population, "_log_rows", log_rows)
    for name, budget in (("all", 1e9), ("one", 0.0)):
        monkeypatch.setattr(train_module, "DEFERRED_ROWS_S", budget)
        assert [o.exit_code for o in train(cfgs, tmp_path / name)] == [0, 0, 0]
    assert pending and all(n == 3 for n in pending)  # every boundary's rows left to the loop
    for p in range(3):
        assert_same_run(tmp_path / "all" / str(p), tmp_path / "one" / str(p))


def test_rows_are_written_at_the_budgets_average_rate_when_a_row_takes_longer(monkeypatch):
    """_write_rows with a budget keeps a credit: each call adds the budget and each row's time is
    taken from it. Rows of 0.5 ms at 0.2 ms a call: a row every 2.5 calls on average, never two in
    one call, so the host spends 0.2 ms a call on rows (a row each call would spend 0.5); without a
    budget every pending row is written at once, in order."""
    import functools
    import types
    from collections import deque

    import foxdqn.population.train as train_module

    clock, written = [0.0], []

    class Logger:
        def log(self, env_steps, row):
            clock[0] += 5e-4
            written.append((env_steps, row["train/n"]))

    monkeypatch.setattr(train_module.time, "perf_counter", lambda: clock[0])
    write = train_module._Population._write_row
    run = types.SimpleNamespace(pending_rows=deque(functools.partial(write, Logger(), 64, lambda n=n: {"n": n})
                                                   for n in range(40)), row_credit=0.0)
    per_call = []
    for _ in range(25):
        before = len(written)
        train_module._Population._write_rows(run, 2e-4)
        per_call.append(len(written) - before)
    assert sum(per_call) == 10 and max(per_call) == 1
    assert clock[0] == pytest.approx(25 * 2e-4)  # the 25 calls' budget, spent on rows
    assert -5e-4 < run.row_credit <= 2e-4  # what is left or overrun is less than a row
    train_module._Population._write_rows(run)
    assert [n for _, n in written] == list(range(40)) and not run.pending_rows and run.row_credit == 0.0
    train_module._Population._write_rows(run, 2e-4)  # nothing pending: no credit saved up
    assert run.row_credit == 0.0


def test_every_summary_is_written_before_the_first_equity_plot(tmp_path, monkeypatch):
    """A trading population's reports: each member's summary.json and equity.csv first, then the
    equity plots (drawn last, each still written); a single run draws its plot in write_report."""
    import foxdqn.analysis.backtest as backtest
    from test_population import TRADING, configs
    from test_population_resume import train

    seen, real = [], backtest.plot_equity

    def plot(path, *args):
        seen.append(sorted(p.parent.parent.name for p in tmp_path.glob("*/eval/summary.json")))
        return real(path, *args)

    monkeypatch.setattr(backtest, "plot_equity", plot)
    cfgs = configs([*TRADING, "agent.total_env_steps=192", "agent.learning_starts=48"],
                   [[f"seed={p}"] for p in range(3)])
    assert [o.exit_code for o in train(cfgs, tmp_path)] == [0, 0, 0]
    assert seen == [["0", "1", "2"]] * 3
    assert all((tmp_path / str(p) / "eval" / "equity.png").stat().st_size > 0 for p in range(3))
