"""foxdqn.population.grouping: which jobs share a population (group_key), which configs the
population trainer refuses (batch_refusal) and the groups a multirun becomes (plan)."""
import copy
import dataclasses
from enum import Enum
from functools import reduce
from pathlib import Path

import pytest

from foxdqn.config.compose import load_config
from foxdqn.population.grouping import MEMBER_KEYS, SUPPORTED, batch_refusal, group_key, plan
from foxdqn.population.jobs import Member


@pytest.fixture(scope="module")
def cartpole():
    return load_config(["+experiment=cartpole_cleanrl", "debug=smoke", "device=cpu"])


@pytest.fixture(scope="module")
def trading():
    return load_config(["debug=smoke", "device=cpu"])


def get(tc, dotted):
    return reduce(getattr, dotted.split("."), tc)


def with_values(tc, **values):
    """A deep copy of ``tc`` with dotted keys (``__`` for ``.``) set."""
    out = copy.deepcopy(tc)
    for key, value in values.items():
        *parents, leaf = key.split("__")
        setattr(reduce(getattr, parents, out), leaf, value)
    return out


def leaves(node, prefix=""):
    """Dotted names of every non-dataclass field of a config dataclass."""
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            yield from leaves(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}"


def other_value(value):
    """Candidates for a value of the same field that differs from ``value``."""
    if isinstance(value, Enum):
        return [m for m in type(value) if m != value][:1]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, (int, float)):
        return [value * 2 + 1]
    if isinstance(value, str):
        return [value + "_x"]
    if isinstance(value, list):
        return [value + value[-1:] if value else [1]]
    return [1, 1.5, "x", True]  # None: the first value the field's type accepts


def test_member_and_supported_keys_are_config_keys(cartpole):
    names = set(leaves(cartpole))
    assert set(MEMBER_KEYS) <= names
    assert {key for key, _, _ in SUPPORTED} <= names


def test_group_key_ignores_every_member_key(cartpole):
    base = group_key(cartpole)
    changed = copy.deepcopy(cartpole)
    for key in MEMBER_KEYS:
        *parents, leaf = key.split(".")
        node = reduce(getattr, parents, changed)
        value = getattr(node, leaf)
        setattr(node, leaf, 7 if value is None else other_value(value)[0])
        assert get(changed, key) != get(cartpole, key)
        assert group_key(changed) == base, key


def test_group_key_differs_for_every_other_key(cartpole):
    base = group_key(cartpole)
    tried = 0
    for key in leaves(cartpole):
        if key in MEMBER_KEYS:
            continue
        *parents, leaf = key.split(".")
        for candidate in other_value(get(cartpole, key)):
            changed = copy.deepcopy(cartpole)
            setattr(reduce(getattr, parents, changed), leaf, candidate)
            try:
                changed_key = group_key(changed)
            except Exception:  # noqa: BLE001 - the field's type refuses this candidate; try the next
                continue
            assert changed_key != base, key
            tried += 1
            break
        else:
            pytest.fail(f"no other value found for {key}")
    assert tried > 100  # every group's keys were tried, not a handful


def test_batch_refusal_accepts_the_supported_experiments(cartpole, trading):
    assert batch_refusal(cartpole) is None
    assert batch_refusal(trading) is None
    for head in ("q", "dueling", "c51", "iqn"):  # every head trains in a population
        assert batch_refusal(load_config([f"head={head}", "debug=smoke", "device=cpu"])) is None, head
    for experiment in ("eurusd_c51", "eurusd_iqn", "eurusd_attention", "eurusd_routed", "eurusd_branching",
                       "bitflip_dqn", "bitflip_her", "cartpole_gym", "pong_dqn"):
        assert batch_refusal(load_config([f"+experiment={experiment}", "debug=smoke", "device=cpu"])) is None


def test_distributional_scalars_are_member_keys_and_shapes_group_keys():
    """A sweep over C51's head.v_min / head.v_max or IQN's head.kappa stays one population; one over
    head.atoms or IQN's quantile counts and embedding size (shapes) makes several."""
    c51 = load_config(["+experiment=eurusd_c51", "debug=smoke", "device=cpu"])
    assert {"head.v_min", "head.v_max", "head.kappa"} <= set(MEMBER_KEYS)
    assert group_key(with_values(c51, head__v_min=-3.0, head__v_max=4.0)) == group_key(c51)
    assert group_key(with_values(c51, head__atoms=21)) != group_key(c51)
    iqn = load_config(["+experiment=eurusd_iqn", "debug=smoke", "device=cpu"])
    assert group_key(with_values(iqn, head__kappa=0.0)) == group_key(iqn)
    for key in ("num_quantiles", "num_target_quantiles", "num_quantiles_policy", "embedding_dim"):
        assert group_key(with_values(iqn, **{f"head__{key}": 7})) != group_key(iqn), key


#: (key, value) a population refuses, one per SUPPORTED rule: none now (gym, nature_cnn and resume train
#: in a population)
REFUSED: list[tuple[str, object]] = []


def test_every_refusal_rule_is_tested():
    assert {key for key, _ in REFUSED} == {key for key, _, _ in SUPPORTED}


@pytest.mark.parametrize("key,value,accepted", [("env.name", "cartpole", "bitflip"), ("replay.her", False, True)])
def test_batch_refusal_names_the_key(cartpole, monkeypatch, key, value, accepted):
    """The mechanism, with a rule put in for the test (the shipped table refuses nothing): the
    first key whose value fails its rule is named with the value and what is supported."""
    import foxdqn.population.grouping as grouping

    monkeypatch.setattr(grouping, "SUPPORTED", ((key, lambda v: v != value, "something else"),))
    reason = batch_refusal(with_values(cartpole, **{key.replace(".", "__"): value}))
    assert reason is not None and reason.startswith(f"{key}=") and "population" in reason, reason
    shown = reason.split(":")[0].split("=", 1)[1]
    assert shown == ("false" if value is False else str(value))
    assert batch_refusal(with_values(cartpole, **{key.replace(".", "__"): accepted})) is None


#: settings a population once refused and now trains per member (tests/population/test_population_controls.py;
#: the search's median pruner: tests/population/test_population_pruner.py; Gymnasium envs and the Nature
#: CNN: tests/population/test_population_gym.py)
LIFTED = [("optim.accumulate", 2), ("debug.inject_lr_spike_at_step", 3), ("guard.max_weight", 10.0),
          ("guard.collapse_multiplier", 5.0), ("early_stop.on_q_divergence", True),
          ("regime.enabled", True), ("prune.enabled", True), ("search.pruner", "median"),
          ("env.name", "gym"), ("model.encoder", "nature_cnn")]


@pytest.mark.parametrize("key,value", LIFTED, ids=[f"{k}={v}" for k, v in LIFTED])
def test_lifted_settings_join_a_population(cartpole, key, value):
    tc = with_values(cartpole, **{key.replace(".", "__"): value})
    assert batch_refusal(tc) is None
    assert key not in MEMBER_KEYS or group_key(tc) == group_key(cartpole)


def test_the_loggers_do_not_keep_a_job_out_of_a_population(cartpole):
    """MLflow, W&B and Prometheus run in a population (foxdqn.population.train): each member gets its
    own MLflow and W&B run, the population one endpoint with a series per member."""
    tc = with_values(cartpole, logger__mlflow=True, logger__wandb=True)
    tc.logger.prometheus.port = 9464
    assert batch_refusal(tc) is None


def members(tcs):
    return [Member(tc, None, Path(f"/sweep/{i}"), i, [f"seed={tc.seed}"]) for i, tc in enumerate(tcs)]


def jobs(groups):
    return [[m.job_num for m in g] for g in groups]


def test_plan_groups_equal_settings_in_job_order(cartpole):
    tcs = [with_values(cartpole, seed=s, model__hidden=h) for s in range(3) for h in ([8], [16])]
    assert jobs(plan(members(tcs))) == [[0, 2, 4], [1, 3, 5]]
    assert jobs(plan(members(tcs), max_members=2)) == [[0, 2], [1, 3], [4], [5]]
    assert jobs(plan(members(tcs), max_members=1)) == [[0], [1], [2], [3], [4], [5]]
    assert jobs(plan(members(tcs), max_members=3)) == [[0, 2, 4], [1, 3, 5]]


def test_plan_puts_member_keys_together_and_single_run_resumes_alone(cartpole):
    """A job continuing a single run's checkpoint trains alone (the single-run path restores it)."""
    tcs = [with_values(cartpole, seed=0, optim__lr=1e-3), with_values(cartpole, seed=1, target__period=7),
           with_values(cartpole, seed=2, resume="auto"), with_values(cartpole, seed=3, explore__eps_end=0.2),
           with_values(cartpole, seed=4, resume="auto")]
    ms = members(tcs)
    for m in (ms[2], ms[4]):
        m.payload = {"online": {}, "env_steps": 64}  # a single run's checkpoint
    assert jobs(plan(ms)) == [[0, 1, 3], [2], [4]]  # the two alone are not grouped together


def member_slice(env_steps):
    """A population member's resumable checkpoint payload at ``env_steps`` (what plan reads of it)."""
    return {"online": {}, "member_state": {"env_steps": env_steps}}


def test_plan_groups_resumed_members_by_where_they_continue(cartpole):
    """resume=auto: members continuing population checkpoints at the same env step regroup (in job
    order, whatever population they came from); members at another step, or started over, do not
    join them."""
    tcs = [with_values(cartpole, seed=s, resume="auto") for s in range(5)]
    ms = members(tcs)
    for m, steps in zip(ms, (256, 256, 128, None, 256)):
        m.payload = None if steps is None else member_slice(steps)
    assert jobs(plan(ms)) == [[0, 1, 4], [2], [3]]
    assert jobs(plan(ms, max_members=2)) == [[0, 1], [2], [3], [4]]


def test_plan_puts_a_sweep_over_cql_alpha_in_one_population(cartpole):
    """objective.cql_alpha is a member key (0 included: a member with α = 0 adds 0 · its CQL term)."""
    assert "objective.cql_alpha" in MEMBER_KEYS
    tcs = [with_values(cartpole, seed=s, objective__cql_alpha=a) for s in range(2) for a in (0.0, 0.5, 1.0)]
    assert all(batch_refusal(tc) is None for tc in tcs)
    assert jobs(plan(members(tcs))) == [[0, 1, 2, 3, 4, 5]]


def test_plan_puts_a_sweep_over_iql_expectile_in_one_population(cartpole):
    """objective.iql_expectile is a member key; objective.iql itself (a value network or none) is
    not: IQL and non-IQL jobs form two populations."""
    assert "objective.iql_expectile" in MEMBER_KEYS and "objective.iql" not in MEMBER_KEYS
    tcs = [with_values(cartpole, seed=s, objective__iql=True, objective__iql_expectile=t, objective__cql_alpha=a)
           for s, t, a in ((0, 0.7, 0.0), (1, 0.9, 0.0), (2, 0.5, 1.0))] + [with_values(cartpole, seed=3)]
    assert all(batch_refusal(tc) is None for tc in tcs)
    assert jobs(plan(members(tcs))) == [[0, 1, 2], [3]]


def test_augmented_jobs_group_over_seeds_and_block_lengths(trading):
    """data.augment.method=block_bootstrap trains in a population: a sweep over seeds and
    data.augment.block_length is one group; data.augment.paths (the bars of each member's paths)
    makes another."""
    aug = with_values(trading, data__augment__method="block_bootstrap")
    assert batch_refusal(aug) is None
    tcs = [with_values(aug, seed=0), with_values(aug, seed=1, data__augment__block_length=5.0),
           with_values(aug, seed=2, data__augment__paths=4), with_values(trading, seed=3)]
    assert jobs(plan(members(tcs), cap=lambda tc, market: None)) == [[0, 1], [2], [3]]


def test_a_seed_sweep_of_eurusd_attention_is_one_population():
    """model.encoder=attention trains in a population (foxdqn.population.attention): the shipped
    experiment's seeds form one group; its shapes (model.width, heads, layers, pooling) are group keys."""
    tcs = [load_config(["+experiment=eurusd_attention", "debug=smoke", "device=cpu", f"seed={s}"]) for s in (0, 1)]
    assert all(batch_refusal(tc) is None for tc in tcs)
    assert jobs(plan(members(tcs), cap=lambda tc, market: None)) == [[0, 1]]
    for key, value in (("width", 32), ("heads", 2), ("layers", 1), ("pooling", "last")):
        assert group_key(with_values(tcs[0], **{f"model__{key}": value})) != group_key(tcs[0]), key


@pytest.mark.parametrize("experiment", ["bitflip_dqn", "bitflip_her"])
def test_a_seed_sweep_of_a_bitflip_experiment_is_one_population(experiment):
    """env.name=bitflip trains in a population (foxdqn.population.envs.MemberBitFlipEnv), with HER
    too (replay.her: foxdqn.population.her): the shipped experiments' seeds form one group;
    env.n_bits (the observation's and the action space's size), replay.her and replay.her_k are
    group keys."""
    tcs = [load_config([f"+experiment={experiment}", "debug=smoke", "device=cpu", f"seed={s}"]) for s in (0, 1)]
    assert all(batch_refusal(tc) is None for tc in tcs) and tcs[0].env.name == "bitflip"
    assert jobs(plan(members(tcs), cap=lambda tc, market: None)) == [[0, 1]]
    for key, value in (("env__n_bits", 12), ("replay__her", not tcs[0].replay.her), ("replay__her_k", 2)):
        assert group_key(with_values(tcs[0], **{key: value})) != group_key(tcs[0]), key


@pytest.mark.parametrize("experiment", ["eurusd_routed", "eurusd_branching"])
def test_a_seed_sweep_of_an_action_mode_experiment_is_one_population(experiment):
    """action.mode=exposure_routed and branching train in a population: the shipped experiments'
    seeds form one group, and the mode is a group key."""
    tcs = [load_config([f"+experiment={experiment}", "debug=smoke", "device=cpu", f"seed={s}"]) for s in (0, 1)]
    assert all(batch_refusal(tc) is None for tc in tcs)
    assert jobs(plan(members(tcs), cap=lambda tc, market: None)) == [[0, 1]]
    assert group_key(with_values(tcs[0], action__mode="factored")) != group_key(tcs[0])


def test_prioritized_replay_groups_with_its_alpha_beta_and_eps_as_member_keys(cartpole):
    """replay.name=per trains in a population; its α, β₀ and ε are member keys (one population for a
    sweep over them), while per and uniform replay are two populations."""
    per = [with_values(cartpole, seed=s, replay__name="per", replay__alpha=a, replay__beta_start=b, replay__eps=e)
           for s, (a, b, e) in enumerate([(0.6, 0.4, 1e-6), (0.3, 0.4, 1e-6), (0.6, 0.7, 1e-3)])]
    assert all(batch_refusal(tc) is None for tc in per)
    assert {"replay.alpha", "replay.beta_start", "replay.eps"} <= set(MEMBER_KEYS)
    tcs = [per[0], with_values(cartpole, seed=9), per[1], per[2]]
    assert jobs(plan(members(tcs))) == [[0, 2, 3], [1]]


def test_plan_splits_what_does_not_fit_in_memory(cartpole):
    """The memory cap (foxdqn.job.memory.memory_cap: replays of P members in 80 % of the free memory) splits
    a group like max_members; the smaller of the two wins."""
    tcs = [with_values(cartpole, seed=s) for s in range(5)]
    assert jobs(plan(members(tcs), cap=lambda tc, market: 2)) == [[0, 1], [2, 3], [4]]
    assert jobs(plan(members(tcs), max_members=3, cap=lambda tc, market: 4)) == [[0, 1, 2], [3, 4]]
    assert jobs(plan(members(tcs), cap=lambda tc, market: None)) == [[0, 1, 2, 3, 4]]


def test_memory_cap_counts_replay_bytes_per_member(cartpole, monkeypatch):
    import foxdqn.job.memory as train
    from foxdqn.job.memory import memory_cap
    from foxdqn.replay.buffer import replay_bytes

    per_member = replay_bytes(cartpole.replay.capacity, 4)
    monkeypatch.setattr(train, "available_bytes", lambda device: int(10 * per_member / 0.8))
    assert memory_cap(cartpole, None) == 10
    monkeypatch.setattr(train, "available_bytes", lambda device: 1)
    assert memory_cap(cartpole, None) == 1  # never below one member: the single-run precheck refuses it
    monkeypatch.setattr(train, "available_bytes", lambda device: None)
    assert memory_cap(cartpole, None) is None


def test_plan_refuses_max_members_below_one(cartpole):
    assert plan([], None) == []
    with pytest.raises(ValueError, match="max_members=0"):
        plan(members([cartpole]), max_members=0)


def test_validation_during_training_and_early_stopping_are_supported(cartpole):
    tc = with_values(cartpole, eval__interval_env_steps=100, early_stop__enabled=True, early_stop__q_bound=50.0)
    assert batch_refusal(tc) is None
