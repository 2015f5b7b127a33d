"""foxdqn.population.train's phases (foxdqn.timings): the training phase is the loop alone. The run
folders and loggers, opened after the population is built, end the build phase; the last log
boundary's rows, written after the device's last iteration, are in close."""
from __future__ import annotations

import foxdqn.population.train as train_module
from test_population import CARTPOLE, configs
from test_population_resume import train


def test_the_training_phase_holds_neither_the_run_folders_nor_the_last_rows(tmp_path, monkeypatch):
    events = []
    mark, open_folders = train_module.mark, train_module.open_folders
    open_loggers, write_row = train_module._Population.open_loggers, train_module._Population._write_row
    monkeypatch.setattr(train_module, "mark", lambda name: events.append(name) or mark(name))
    monkeypatch.setattr(train_module, "open_folders", lambda members: events.append("folders") or open_folders(members))
    monkeypatch.setattr(train_module._Population, "open_loggers", lambda self: events.append("loggers") or open_loggers(self))
    monkeypatch.setattr(train_module._Population, "_write_row",
                        staticmethod(lambda *a: events.append("row") or write_row(*a)))
    cfgs = configs([*CARTPOLE, "agent.total_env_steps=256", "log.interval_env_steps=64", "checkpoint.every_env_steps=0"],
                   [["seed=0"], ["seed=1"]])
    assert [o.exit_code for o in train(cfgs, tmp_path)] == [0, 0]
    loop = events.index("row")  # the loop's first boundary: the rows of the first log interval
    assert events[:loop] == ["build", "folders", "loggers", "build"]
    end = events.index("training")  # close(): the device has run its last iteration
    assert events[loop:end] == ["row"] * 6  # three boundaries' rows, written in the loop
    assert events[end:events.index("close") + 1] == ["training", "row", "row", "close"]  # the last boundary's
