"""Every experiment composes; bad overrides are refused with the field named."""
from pathlib import Path

import pytest

from foxdqn.errors import ConfigError
from foxdqn.train import load_config

EXPERIMENTS = sorted(p.stem for p in (Path(__file__).parents[1] / "foxdqn" / "conf" / "experiment").glob("*.yaml"))


def test_experiments_found():
    assert {"eurusd_dqn", "googl_dqn"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("name", EXPERIMENTS)
@pytest.mark.parametrize("debug", [[], ["debug=smoke"]])
def test_experiment_composes(name, debug):
    cfg = load_config([f"+experiment={name}", *debug])
    assert cfg.experiment == name
    if debug:
        assert cfg.agent.total_env_steps <= cfg.debug.max_env_steps
        assert cfg.env.num_envs <= cfg.debug.max_num_envs


def test_default_is_eurusd_dqn():
    assert load_config([]) == load_config(["+experiment=eurusd_dqn"])


def test_smoke_caps_win_over_experiment():
    cfg = load_config(["+experiment=eurusd_dqn", "debug=smoke", "agent.total_env_steps=10000000"])
    assert cfg.agent.total_env_steps == cfg.debug.max_env_steps


def test_unknown_key_lists_the_allowed_keys():
    with pytest.raises(ConfigError) as info:
        load_config(["+agent.lrr=1e-3"])
    assert "lr" in str(info.value) and "batch_size" in str(info.value)


@pytest.mark.parametrize("override, field", [
    ("agent.gamma=1.5", "agent.gamma"),
    ("agent.batch_size=0", "agent.batch_size"),
    ("device=tpu", "device"),
    ("graph=sometimes", "graph"),
    ("head=c99", "head"),
    ("agent.lr=abc", "agent.lr"),
    ("agent.no_such_key=1", "no_such_key"),
    ("+experiment=nope", "experiment"),
    ("replay.capacity=8", "replay.capacity"),
    ("model.hidden=[]", "model.hidden"),
    # incompatible or invalid feature settings, refused at start with the field named
    ("head=c51 head.v_min=5 head.v_max=1", "head.v_min"),
    ("head=c51 head.atoms=1", "head.atoms"),
    ("head=iqn head.num_quantiles=0", "head.num_quantiles"),
    ("head=iqn head.kappa=-1", "head.kappa"),
    ("replay.her=true", "replay.her"),
    ("replay.n_step=0", "replay.n_step"),
    ("+experiment=bitflip_her replay.n_step=3", "replay.n_step"),
    ("objective=iql head=c51", "objective.iql"),
    ("objective.cql_alpha=-1", "objective.cql_alpha"),
    ("objective.iql_expectile=1.0", "objective.iql_expectile"),
    ("action=branching head=c51", "action.mode"),
    ("+experiment=cartpole_dqn action=exposure_routed", "action.mode"),
    ("+experiment=cartpole_dqn model=attention", "model.encoder"),
    ("model=attention model.width=30 model.heads=4", "model.width"),
    ("replay=per replay.alpha=2", "replay.alpha"),
    # unknown keys added with "+", non-finite numbers, schedules that cannot work
    ("+agent.lrr=1e-3", "agent.lrr"),
    ("+foo=1", "foo"),
    ("agent.lr=nan", "agent.lr"),
    ("agent.lr=inf", "agent.lr"),
    ("objective=cql objective.cql_alpha=nan", "objective.cql_alpha"),
    ("head=c51 head.v_max=inf", "head.v_max"),
    ("agent.learning_starts=100000 agent.total_env_steps=1000", "agent.learning_starts"),
    ("agent.eps_start=0.1 agent.eps_end=0.5", "agent.eps_end"),
    ("debug.inject_nan_at_step=-3", "debug.inject_nan_at_step"),
])
def test_bad_override_names_field(override, field):
    with pytest.raises(ConfigError) as info:
        load_config(override.split())
    assert field in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("overrides, needle", [
    (["debug=smoke", "agent.batch_size=200000", "replay.capacity=100000"], "replay.capacity"),  # not hidden by caps
    (["seed=-1"], "seed"),
])
def test_refused_before_the_smoke_caps(overrides, needle):
    from foxdqn.errors import ConfigError
    from foxdqn.train import load_config

    with pytest.raises(ConfigError, match=needle):
        load_config(overrides)


def test_ignored_settings_are_warned(caplog):
    from foxdqn.train import load_config

    with caplog.at_level("WARNING", logger="foxdqn.config"):
        load_config(["debug=smoke", "head.atoms=1", "debug.inject_nan_at_step=100000"])
    text = caplog.text
    assert "head.atoms set but head.name='dueling': ignored" in text
    assert "debug.inject_nan_at_step=100000 is past the run's last update" in text
    caplog.clear()
    with caplog.at_level("WARNING", logger="foxdqn.config"):
        load_config(["+experiment=eurusd_c51", "debug=smoke"])
    assert caplog.text == ""
