"""Every experiment composes; bad overrides are refused with the field named."""
import re
from pathlib import Path

import pytest

from foxdqn.errors import ConfigError
from foxdqn.config.compose import experiment_names, load_config

EXPERIMENTS = experiment_names()


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
    assert "learning_starts" in str(info.value) and "batch_size" in str(info.value)


@pytest.mark.parametrize("override, field", [
    ("agent.gamma=1.5", "agent.gamma"),
    ("agent.batch_size=0", "agent.batch_size"),
    ("device=tpu", "device"),
    ("graph=sometimes", "graph"),
    ("head=c99", "head"),
    ("optim.lr=abc", "optim.lr"),
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
    ("action.switch_margin=-1", "action.switch_margin"),
    ("action.switch_margin=nan", "action.switch_margin"),
    ("+experiment=cartpole_dqn action.switch_margin=1", "action.switch_margin"),
    ("data.augment.method=shuffle", "data.augment.method"),
    ("data.augment.block_length=0.5", "data.augment.block_length"),
    ("data.augment.paths=0", "data.augment.paths"),
    ("model=attention model.width=30 model.heads=4", "model.width"),
    ("replay=per replay.alpha=2", "replay.alpha"),
    # unknown keys added with "+", non-finite numbers, schedules that cannot work
    ("+agent.lrr=1e-3", "agent.lrr"),
    ("+foo=1", "foo"),
    ("optim.lr=nan", "optim.lr"),
    ("optim.lr=inf", "optim.lr"),
    ("objective=cql objective.cql_alpha=nan", "objective.cql_alpha"),
    ("head=c51 head.v_max=inf", "head.v_max"),
    ("agent.learning_starts=100000 agent.total_env_steps=1000", "agent.learning_starts"),
    ("explore.eps_start=0.1 explore.eps_end=0.5", "explore.eps_end"),
    ("debug.inject_nan_at_step=-3", "debug.inject_nan_at_step"),
    ("debug.max_eval_bars=0", "debug.max_eval_bars"),
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
    from foxdqn.config.compose import load_config

    with pytest.raises(ConfigError, match=needle):
        load_config(overrides)


@pytest.mark.parametrize("sizes, debug, checks", [
    ({}, False, 1), ({}, True, 2), ({"hidden": [32, 32]}, True, 2),  # batch and replay still capped
    ({"num_envs": 4, "batch_size": 32, "capacity": 4096, "hidden": [32, 32]}, True, 1),  # within every cap
])
def test_checked_again_only_where_a_size_cap_changed_a_size(monkeypatch, sizes, debug, checks):
    """finalize_object validates the config as written, and again after the size caps only where
    one of them changed a size (num_envs, batch, replay capacity, hidden widths): a sweep's jobs
    without caps are checked once each."""
    from foxdqn.config import schema
    from foxdqn.config.schema import clone_config

    cfg = clone_config(load_config(["+experiment=eurusd_dqn"]))
    if debug:
        cfg.debug = clone_config(load_config(["debug=smoke"])).debug
    cfg.env.num_envs = sizes.get("num_envs", cfg.env.num_envs)
    cfg.agent.batch_size = sizes.get("batch_size", cfg.agent.batch_size)
    cfg.replay.capacity = sizes.get("capacity", cfg.replay.capacity)
    cfg.model.hidden = sizes.get("hidden", cfg.model.hidden)
    calls, real = [], schema.validate
    monkeypatch.setattr(schema, "validate", lambda c: (calls.append(c.agent.batch_size), real(c)))
    out = schema.finalize_object(cfg, warn=False)
    assert len(calls) == checks, calls
    assert calls[-1] == out.agent.batch_size


def test_ignored_settings_are_warned(caplog):
    from foxdqn.config.compose import load_config

    with caplog.at_level("WARNING", logger="foxdqn.config.schema"):
        load_config(["debug=smoke", "head.atoms=1", "debug.inject_nan_at_step=100000"])
    text = caplog.text
    assert "head.atoms set but head.name='dueling': ignored" in text
    assert "debug.inject_nan_at_step=100000 is past the run's last update" in text
    caplog.clear()
    with caplog.at_level("WARNING", logger="foxdqn.config.schema"):
        load_config(["+experiment=eurusd_c51", "debug=smoke"])
    assert caplog.text == ""
    with caplog.at_level("WARNING", logger="foxdqn.config.schema"):
        load_config(["data.augment.paths=4", "objective=iql", "action.switch_margin=1"])
    assert "data.augment.paths set but data.augment.method='none': ignored" in caplog.text
    assert "action.switch_margin with objective.iql=true" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="foxdqn.config.schema"):
        load_config(["data.augment.method=block_bootstrap", "data.augment.paths=4", "action.switch_margin=1"])
    assert caplog.text == ""


def test_experiment_names_are_the_files_of_conf_experiment():
    folder = Path(__file__).parents[2] / "conf" / "experiment"
    assert EXPERIMENTS == sorted(p.stem for p in folder.glob("*.yaml"))


@pytest.mark.parametrize("override, message", [
    ("head.name=c99", "head.name='c99' is not allowed; choose one of q, dueling, c51, iqn"),
    ("target.update=soft", "target.update='soft' is not allowed; choose one of polyak, hard"),
    ("matmul_precision=low", "matmul_precision='low' is not allowed; choose one of highest, high, medium"),
    ("eval.split=holdout", "eval.split='holdout' is not allowed; choose one of train, val, test"),
])
def test_choices_are_refused_at_compose_time(override, message):
    with pytest.raises(ConfigError) as info:
        load_config([override])
    assert str(info.value) == message


@pytest.mark.parametrize("old, new", sorted(__import__("foxdqn.config.schema", fromlist=["MOVED_KEYS"]).MOVED_KEYS.items()))
@pytest.mark.parametrize("plus", ["", "+"])
def test_moved_keys_name_their_new_place(old, new, plus):
    with pytest.raises(ConfigError) as info:
        load_config([f"{plus}{old}=1"])
    assert str(info.value).startswith(f"{old} moved to {new}; set ")


def test_choices_compare_print_and_serialise_as_strings():
    import json

    from foxdqn.config.schema import Choice, to_plain

    cfg = load_config(["head=c51", "target.update=hard"])
    assert isinstance(cfg.head.name, Choice) and cfg.head.name == "c51"
    assert f"{cfg.head.name}" == "c51" and repr(cfg.target.update) == "'hard'"
    plain = to_plain(cfg)
    assert type(plain["head"]["name"]) is str and json.loads(json.dumps(plain))["target"]["update"] == "hard"


def test_a_config_built_in_python_is_checked_for_choices():
    from foxdqn.config.schema import TrainConfig, validate

    cfg = TrainConfig()
    cfg.head.name = "c99"
    with pytest.raises(ConfigError, match="head.name='c99' is not allowed"):
        validate(cfg)


def test_upgrade_moves_an_older_checkpoints_keys():
    from foxdqn.config.schema import to_plain, upgrade
    from foxdqn.config.compose import from_plain

    cfg = load_config(["optim.lr=0.002", "target.update=hard", "target.period=7", "logger=csv"])
    old = to_plain(cfg)
    old["agent"].update(lr=old["optim"].pop("lr"), target_update=old["target"].pop("update"),
                        hard_update_period=old["target"].pop("period"))
    old["log"]["tensorboard"] = old.pop("logger")["tensorboard"]  # before the logger group and its mlflow keys
    new = upgrade(old)
    assert new["optim"]["lr"] == 0.002 and new["target"] == {**to_plain(cfg)["target"], "update": "hard", "period": 7}
    assert "lr" not in new["agent"] and new["logger"] == {"tensorboard": False}
    assert from_plain(new) == cfg  # keys added since then take their defaults


def test_upgrade_gives_a_record_without_an_added_key_the_behaviour_it_started_with():
    """optim.accumulate_one_pass came after runs with optim.accumulate were recorded: their resume
    keeps the M passes they started with; a current record keeps its value."""
    from foxdqn.config.schema import to_plain, upgrade
    from foxdqn.config.compose import from_plain

    current = to_plain(load_config(["agent.batch_size=64", "optim.accumulate=4"]))
    assert current["optim"]["accumulate_one_pass"] is True
    assert upgrade(current) == current
    old = to_plain(load_config(["agent.batch_size=64", "optim.accumulate=4"]))
    del old["optim"]["accumulate_one_pass"]
    resumed = from_plain(upgrade(old))
    assert resumed.optim.accumulate_one_pass is False and resumed.optim.accumulate == 4


def test_a_record_from_before_the_collect_beside_the_update_resumes_in_its_order():
    """agent.collect_beside_update came after runs were recorded: an older run, resumed, keeps
    sampling after its collect steps (the order it trained in); a current record keeps its value."""
    from foxdqn.config.schema import to_plain, upgrade
    from foxdqn.config.compose import from_plain

    current = to_plain(load_config(["+experiment=cartpole_cleanrl"]))
    assert current["agent"]["collect_beside_update"] is True and upgrade(current) == current
    del current["agent"]["collect_beside_update"]
    assert from_plain(upgrade(current)).agent.collect_beside_update is False


def test_logger_group_is_combinable():
    assert load_config([]).logger.tensorboard
    assert not load_config(["logger=csv"]).logger.tensorboard
    assert load_config(["logger=[csv,tensorboard]"]).logger.tensorboard


def test_prometheus_is_off_unless_a_port_is_set():
    assert load_config([]).logger.prometheus.port is None
    both = load_config(["logger=[tensorboard,prometheus]"]).logger
    assert both.tensorboard and both.prometheus.port == 9464 and both.prometheus.addr == "127.0.0.1"
    cfg = load_config(["logger.prometheus.port=9100", "logger.prometheus.addr=0.0.0.0"]).logger
    assert cfg.tensorboard and (cfg.prometheus.port, cfg.prometheus.addr) == (9100, "0.0.0.0")


@pytest.mark.parametrize("override, message", [
    ("logger.prometheus.port=0", "logger.prometheus.port=0 must be a TCP port in [1, 65535]"),
    ("logger.prometheus.port=65536", "logger.prometheus.port=65536 must be a TCP port in [1, 65535]"),
    ("logger.prometheus.addr=' '", "logger.prometheus.addr must be an address to bind"),
])
def test_prometheus_settings_are_checked(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config([override])


def test_prometheus_bind_errors_name_the_key():
    import errno
    import socket

    p = load_config(["logger.prometheus.port=9464"]).logger.prometheus
    in_use = str(p.bind_error(OSError(errno.EADDRINUSE, "Address already in use")))
    assert in_use.startswith("logger.prometheus.port=9464: ") and "already in use" in in_use and "\n" not in in_use
    assert str(p.bind_error(socket.gaierror(-2, "Name or service not known"))).startswith(
        "logger.prometheus.addr=127.0.0.1: not an address to bind")
    assert str(p.bind_error(OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"))).startswith(
        "logger.prometheus.addr=127.0.0.1: not an address to bind")


@pytest.mark.parametrize("name", ["eurusd_dqn", "cartpole_cleanrl", "eurusd_rainbowish", "pong_dqn", "bitflip_her"])
def test_to_plain_equals_omegaconf_container(name):
    """to_plain walks the dataclasses itself; it must give what OmegaConf's container gives."""
    from omegaconf import OmegaConf

    from foxdqn.config.schema import to_plain

    tc = load_config([f"+experiment={name}", "debug=smoke"])
    assert to_plain(tc) == OmegaConf.to_container(OmegaConf.structured(tc), enum_to_str=True)


@pytest.mark.parametrize("body", ["defaults:\n  - override /head: q\nexperiment: mine\n",  # head@experiment.head
                                  "experiment: mine\nseed: 3\n"])  # experiment.experiment
def test_an_experiment_file_without_the_global_package_line_is_told_to_add_it(tmp_path, body):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text(body)
    with pytest.raises(ConfigError) as info:
        load_config([f"hydra.searchpath=[file://{tmp_path}]", "+experiment=mine"])
    assert str(info.value) == ("experiment/mine.yaml: add the line `# @package _global_` at the top of the file "
                               "(its keys and overrides are for the whole config, as in conf/experiment/)")
    (tmp_path / "experiment" / "mine.yaml").write_text("# @package _global_\n" + body)
    assert load_config([f"hydra.searchpath=[file://{tmp_path}]", "+experiment=mine"]).experiment == "mine"


@pytest.mark.parametrize("experiment, path, env_id, name", [
    ("eurusd_dqn", None, None, "eurusd_dqn"),
    ("eurusd_dqn", "/data/my bars.csv", None, "dqn_my_bars"),  # the user's file, not the bundled market
    ("eurusd_c51", "x/GBPUSD.parquet", None, "c51_GBPUSD"),
    ("googl_dqn", "aapl.csv", None, "dqn_aapl"),
    ("mine", "aapl.csv", None, "mine_aapl"),  # no market prefix to drop
    ("cartpole_gym", None, "Acrobot-v1", "cartpole_gym_Acrobot-v1"),
])
def test_run_name(experiment, path, env_id, name):
    from foxdqn.config.schema import run_name

    assert run_name(experiment, path, env_id) == name


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_family_ships_a_search_space(name):
    """hparams_search=<family>_optuna composes with each experiment of the family, and every key it
    searches is a key of that experiment's config (none is forced: no PER or CQL added)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf, open_dict

    from foxdqn.config.compose import conf_folder
    from foxdqn.config.schema import finalize

    family = name.split("_")[0]
    try:
        with initialize_config_dir(str(conf_folder()), version_base="1.3"):
            hydra_cfg = compose("train", overrides=[f"+experiment={name}", f"hparams_search={family}_optuna"],
                                return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
    params = hydra_cfg.hydra.sweeper.params
    with open_dict(hydra_cfg):
        del hydra_cfg["hydra"]
    cfg, plain = finalize(hydra_cfg), load_config([f"+experiment={name}"])
    assert cfg.replay.name == plain.replay.name and cfg.objective == plain.objective and cfg.head == plain.head
    assert cfg.search.pruner == "median" and cfg.eval.interval_env_steps > 0
    assert len(params) >= 3
    structured = OmegaConf.structured(cfg)
    for key in params:
        assert OmegaConf.select(structured, key, default="missing") != "missing", key


def test_trading_options_are_refused_for_other_envs():
    from foxdqn.config.compose import load_config

    for option in ("data.augment.method=block_bootstrap", "action.switch_margin=1"):
        with pytest.raises(ConfigError, match="trading env"):
            load_config(["+experiment=cartpole_cleanrl", "debug=smoke", "device=cpu", option])


def test_cartpole_gym_is_cartpole_cleanrl_on_gymnasium_s_env():
    """cartpole_gym takes cartpole_cleanrl's settings (its defaults list): the composed configs differ
    in the experiment's name and the env group only, so a change to CleanRL's settings reaches both."""
    import dataclasses

    gym, cleanrl = (dataclasses.asdict(load_config([f"+experiment={e}"])) for e in ("cartpole_gym", "cartpole_cleanrl"))
    assert {k for k in gym if gym[k] != cleanrl[k]} == {"experiment", "env"}
    assert (gym["env"]["name"], gym["env"]["id"], gym["env"]["num_envs"]) == ("gym", "CartPole-v1", cleanrl["env"]["num_envs"])
