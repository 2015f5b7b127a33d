"""foxdqn.compose.JobComposer (the multirun precheck's composer): equal to composing every job."""
from __future__ import annotations

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from foxdqn.compose import JobComposer, conf_folder, load_config
from foxdqn.config import to_plain
from foxdqn.errors import ConfigError

JOBS = [
    ["+experiment=cartpole_cleanrl", "debug=smoke", "seed=0", "optim.lr=1e-3", "model.hidden=[8,8]"],
    ["+experiment=cartpole_cleanrl", "debug=smoke", "seed=7", "optim.lr=3e-4", "model.hidden=[16]"],
    ["+experiment=cartpole_cleanrl", "debug=smoke", "seed=1", "optim.lr=0.002", "model.hidden=[8,8]"],
    ["+experiment=cartpole_cleanrl", "debug=smoke", "seed=2", "optim.lr=1e-3", "model.hidden=[32,32,32]"],
]


@pytest.fixture
def hydra_initialised():
    with initialize_config_dir(str(conf_folder()), version_base="1.3"):
        yield
    GlobalHydra.instance().clear()


def test_value_changes_equal_composition(hydra_initialised, monkeypatch):
    import hydra

    composes = []
    real = hydra.compose
    monkeypatch.setattr(hydra, "compose", lambda *a, **k: (composes.append(1), real(*a, **k))[1])
    compose = JobComposer()
    got = [to_plain(compose(job)) for job in JOBS]
    assert len(composes) == 1  # the first job only: the others differ in values
    monkeypatch.setattr(hydra, "compose", real)
    assert got == [to_plain(load_config(job)) for job in JOBS]


@pytest.mark.parametrize("second", [
    ["+experiment=cartpole_cleanrl", "debug=smoke", "seed=1", "head.double=false", "debug.inject_nan_at_step=null"],
    ["+experiment=cartpole_cleanrl", "debug=smoke", "seed=1", "head.double=true", "debug.inject_nan_at_step=5"],
    ["+experiment=cartpole_cleanrl", "debug=none", "seed=1", "head.double=true", "debug.inject_nan_at_step=null"],
    ["+experiment=eurusd_dqn", "debug=smoke", "seed=1", "head.double=true", "debug.inject_nan_at_step=null"],
    ["+experiment=cartpole_cleanrl", "debug=smoke", "seed=1", "head.double=true"],
])
def test_other_changes_equal_composition(hydra_initialised, second):
    """Booleans, null and ints are values; a group (debug=none, +experiment=...) or another override
    list is composed: each way the result is what composing gives."""
    first = ["+experiment=cartpole_cleanrl", "debug=smoke", "seed=0", "head.double=true",
             "debug.inject_nan_at_step=null"]
    compose = JobComposer()
    compose(first)
    assert to_plain(compose(second)) == to_plain(load_config(second))


def test_a_bad_value_is_one_line_naming_the_key(hydra_initialised):
    compose = JobComposer()
    compose(["seed=0", "optim.lr=1e-3"])
    with pytest.raises(ConfigError, match="optim.lr=-1.0 must be > 0"):
        compose(["seed=1", "optim.lr=-1"])
    with pytest.raises(ConfigError, match="optim.lr"):
        compose(["seed=1", "optim.lr=abc"])
