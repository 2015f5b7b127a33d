"""foxdqn.config.compose.JobComposer (the multirun precheck's composer): equal to composing every job."""
from __future__ import annotations

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from foxdqn.config import compose as compose_module
from foxdqn.config.compose import JobComposer, conf_folder, load_config
from foxdqn.config.schema import to_plain
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


def test_jobs_that_share_a_list_override_get_their_own_lists(hydra_initialised):
    """The parse of an override is shared by every job that uses it (parsed once per text): a list
    value set on one job's config is that job's own, so changing it leaves the other jobs alone."""
    compose = JobComposer()
    compose(JOBS[0])
    a = compose(["+experiment=cartpole_cleanrl", "debug=smoke", "seed=3", "optim.lr=1e-3", "model.hidden=[16]"])
    b = compose(["+experiment=cartpole_cleanrl", "debug=smoke", "seed=4", "optim.lr=1e-3", "model.hidden=[16]"])
    assert a.model.hidden == b.model.hidden == [16] and a.model.hidden is not b.model.hidden
    a.model.hidden.append(8)
    c = compose(["+experiment=cartpole_cleanrl", "debug=smoke", "seed=5", "optim.lr=1e-3", "model.hidden=[16]"])
    assert b.model.hidden == c.model.hidden == [16]
    assert compose_module.parsed_override("model.hidden=[16]") is compose_module.parsed_override("model.hidden=[16]")


@pytest.mark.parametrize("text", ["seed=0", "seed=17", "seed=-3", "env.num_envs=4096", "a_b.c_1=10", "seed=007",
                                  "seed=1_000", "seed=+5", "seed=1.5", "seed=1e3", "+seed=3", "~seed=3", "seed=3,4",
                                  "seed@pkg=3", "model=mlp", "seed=", "seed= 3", "seed=abc", "a-b=3", "seed=99999999999999999999"])
def test_a_plain_int_override_is_built_as_hydras_parser_builds_it(text):
    """parsed_override's fast path (``key=<decimal int>``, a seed) gives the Override Hydra's parser
    gives (field by field, the value's type included); any other text goes to the parser."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    fast = compose_module._PLAIN_INT.fullmatch(text) is not None
    assert fast == (text in {"seed=0", "seed=17", "seed=-3", "env.num_envs=4096", "a_b.c_1=10",
                             "seed=99999999999999999999"})
    compose_module._PARSED.pop(text, None)
    try:
        want = OverridesParser.create().parse_override(text)
    except Exception as exc:  # noqa: BLE001 - the parser refuses it: so must parsed_override
        with pytest.raises(type(exc)):
            compose_module.parsed_override(text)
        assert not fast
        return
    got = compose_module.parsed_override(text)
    assert got == want and type(got.value()) is type(want.value())
    assert got.get_key_element() == want.get_key_element()
    if not want.is_sweep_override():
        assert got.get_value_element_as_str() == want.get_value_element_as_str()


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


def test_two_structures_are_composed_once_each(hydra_initialised, monkeypatch):
    import hydra

    composes = []
    real = hydra.compose
    monkeypatch.setattr(hydra, "compose", lambda *a, **k: (composes.append(1), real(*a, **k))[1])
    compose = JobComposer()
    jobs = [[f"+experiment={name}", "debug=smoke", f"seed={seed}"] for seed in range(3)
            for name in ("cartpole_cleanrl", "eurusd_dqn")]
    got = [to_plain(compose(job)) for job in jobs]
    assert len(composes) == 2 and compose.composed == 2
    monkeypatch.setattr(hydra, "compose", real)
    assert got == [to_plain(load_config(job)) for job in jobs]
    assert to_plain(compose.lookup(jobs[3])) == got[3] and compose.lookup(["seed=9"]) is None


def test_every_member_key_of_every_experiment_derives_as_composed(hydra_initialised, monkeypatch):
    """The plain path (no OmegaConf) sets each population member key as OmegaConf would: for every
    shipped experiment, a job changing the seed and every member key, derived from a job with other
    values of them, equals its composition."""
    from foxdqn.config.compose import experiment_names
    from foxdqn.population.grouping import MEMBER_KEYS

    base = {"seed": "0", "optim.lr": "0.001", "optim.adam_eps": "1e-8", "optim.grad_clip": "10", "agent.gamma": "0.99",
            "explore.eps_start": "1.0", "explore.eps_end": "0.05", "explore.eps_decay_fraction": "0.5",
            "target.tau": "0.005", "target.period": "100", "loss.huber_delta": "1.0", "loss.reward_scale": "1.0",
            "guard.loss_clip": "1e6", "debug.inject_nan_at_step": "null", "objective.cql_alpha": "0",
            "objective.iql_expectile": "0.7", "data.augment.block_length": "50",
            "replay.alpha": "0.6", "replay.beta_start": "0.4", "replay.eps": "1e-6", "head.v_min": "-10",
            "head.v_max": "10", "head.kappa": "1.0", "guard.q_divergence": "1e4", "guard.max_weight": "null",
            "guard.collapse_multiplier": "0", "guard.collapse_patience": "100", "guard.warmup_updates": "100",
            "debug.inject_lr_spike_at_step": "null"}
    other = {"seed": "5", "optim.lr": "1", "optim.adam_eps": "0.001", "optim.grad_clip": "3", "agent.gamma": "0.9",
             "explore.eps_start": "0.5", "explore.eps_end": "0.02", "explore.eps_decay_fraction": "0.3",
             "target.tau": "1", "target.period": "7", "loss.huber_delta": "2", "loss.reward_scale": "10",
             "guard.loss_clip": "100000", "debug.inject_nan_at_step": "9", "objective.cql_alpha": "0.5",
             "objective.iql_expectile": "0.9", "data.augment.block_length": "7",
             "replay.alpha": "0.5", "replay.beta_start": "0.3", "replay.eps": "0.001", "head.v_min": "-3.3",
             "head.v_max": "7.1", "head.kappa": "0", "guard.q_divergence": "50", "guard.max_weight": "20",
             "guard.collapse_multiplier": "3", "guard.collapse_patience": "7", "guard.warmup_updates": "0",
             "debug.inject_lr_spike_at_step": "4"}
    assert set(base) == set(other) == set(MEMBER_KEYS)
    for name in experiment_names():
        if name == "pong_dqn":  # its env needs ale_py to be checked
            continue
        compose = JobComposer()
        compose([f"+experiment={name}", "debug=smoke", *(f"{k}={v}" for k, v in base.items())])
        job = [f"+experiment={name}", "debug=smoke", *(f"{k}={v}" for k, v in other.items())]
        omegaconf_path = []
        monkeypatch.setattr(compose_module, "finalize", lambda cfg: omegaconf_path.append(1))
        derived = compose(job)
        monkeypatch.undo()
        assert compose.composed == 1 and not omegaconf_path, name  # derived on the plain path
        assert to_plain(derived) == to_plain(load_config(job)), name


def test_set_leaf_converts_as_omegaconf_or_declines():
    from foxdqn.config.compose import set_leaf
    from foxdqn.config.schema import Head, TrainConfig

    tc = TrainConfig()
    assert set_leaf(tc, "optim.lr", 1) and tc.optim.lr == 1.0 and type(tc.optim.lr) is float
    assert set_leaf(tc, "head.name", "c51") and tc.head.name is Head.c51
    assert set_leaf(tc, "debug.inject_nan_at_step", None) and tc.debug.inject_nan_at_step is None
    assert set_leaf(tc, "head.double", False) and tc.head.double is False
    before = to_plain(tc)
    for key, value in (("optim.lr", "abc"), ("head.name", "nope"), ("model.hidden", [8]), ("optim.nope", 1),
                       ("seed", 1.5), ("head.double", 1), ("optim", 3), ("optim.lr", None)):
        assert not set_leaf(tc, key, value), key
    assert to_plain(tc) == before
