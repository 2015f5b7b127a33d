"""bench.kernels_bench without CUDA: every shipped experiment planned at P = 1 and P = 64, the rows
written with a note for what cannot be measured (refused by the population trainer, a host env's
collect step, a package missing, a failed build), the population states the P = 64 rows count
(built and stepped on CPU), and the side-by-side table from hand-made rows. The counting itself
(torch.profiler's CUDA kernels, captured graphs) runs on a GPU only: python -m bench.run --sections kernels."""
import math

import pandas as pd
import pytest

from bench import kernels_bench as kb
from bench.harness import make_population
from bench.ops.training import TRADING_ENVS
from bench.run import main
from foxdqn.config.compose import experiment_names, load_config
from foxdqn.population import step as P

SMALL_CARTPOLE = ("debug=smoke", "env.num_envs=4", "replay.capacity=512", "agent.batch_size=16", "model.hidden=[16,8]")
SMALL_TRADING = ("debug=smoke", "env.num_envs=3", "replay.capacity=300", "agent.batch_size=8", "model.hidden=[16]",
                 "env.window=8", "env.episode_length=16")


@pytest.fixture(scope="module")
def cases():
    return {name: kb.case(name) for name in kb.experiments()}


def test_every_shipped_experiment_is_planned_at_p1_and_p64(cases):
    assert list(cases) == experiment_names() and len(cases) >= 18
    for name, c in cases.items():
        planned = kb.plan(c)
        assert {m for m, _, _ in planned} == {1, kb.POPULATION}, name
        assert [p for m, p, _ in planned if m == kb.POPULATION] == ["collect", "update"], name
        assert [p for m, p, _ in planned if m == 1][:2] == ["collect", "update"], name
        assert c.overrides == ((f"env.num_envs={TRADING_ENVS}",) if c.env == "trading" else ()), name
    assert {cases[n].env for n in ("eurusd_dqn", "googl_dqn", "cartpole_cleanrl", "bitflip_her", "pong_dqn")} == \
        {"trading", "cartpole", "bitflip", "gym"} and cases["googl_dqn"].env == "trading"


def test_p64_rows_are_measured_where_the_population_trainer_takes_the_experiment(cases):
    measured = {n for n, c in cases.items() if all(note in (None, kb.HOST_ENV_NOTE) for m, _, note in kb.plan(c)
                                                   if m == kb.POPULATION)}
    assert {"eurusd_dqn", "cartpole_cleanrl"} <= measured  # issue 33's own rows
    assert {"eurusd_c51", "eurusd_iqn"} <= measured  # the distributional heads train in populations
    assert "eurusd_controls" in measured  # accumulation, pruning, regime weights train in populations (issue 32)
    assert {"eurusd_attention", "eurusd_branching", "eurusd_routed"} <= measured  # encoder and action modes too
    for name, c in cases.items():
        notes = [note for m, _, note in kb.plan(c) if m == kb.POPULATION]
        if name in measured:
            assert c.refusal is None
        else:  # the refusal, word for word, on both rows
            assert notes == [c.refusal, c.refusal] and c.refusal
    assert cases["cartpole_gym"].refusal is None and cases["pong_dqn"].refusal is None  # host envs in populations


def test_a_host_env_population_notes_its_collect_step_and_counts_its_update(cases):
    for name in ("cartpole_gym", "pong_dqn"):
        c = cases[name]
        if c.missing is None:
            assert [r for r in kb.plan(c) if r[0] == kb.POPULATION] == [
                (kb.POPULATION, "collect", kb.HOST_ENV_NOTE), (kb.POPULATION, "update", None)]


def test_device_envs_measure_every_phase_at_p1(cases):
    """Every phase at P = 1, the iteration in turn too where the iteration runs its collect steps
    beside its update (not for prioritized replay's eurusd_controls, which runs them in turn)."""
    for name in ("eurusd_dqn", "cartpole_cleanrl", "bitflip_her", "eurusd_controls"):
        beside = name != "eurusd_controls"
        assert cases[name].beside == beside, name
        single = [r for r in kb.plan(cases[name]) if r[0] == 1]
        assert single == [(1, phase, None) for phase in kb.PHASES if beside or phase != "iteration_in_turn"]


def test_a_host_env_notes_its_collect_step_and_counts_its_update(cases):
    c = cases["cartpole_gym"]
    assert c.host_env and c.missing is None
    assert [r for r in kb.plan(c) if r[0] == 1] == [(1, "collect", kb.HOST_ENV_NOTE), (1, "update", None)]
    assert "host env" in kb.HOST_ENV_NOTE and "update is counted" in kb.HOST_ENV_NOTE


def test_an_experiment_whose_package_is_missing_is_a_note_not_a_gap(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ale_py" else real(name, *a))
    c = kb.case("pong_dqn")
    assert "ale_py" in c.missing and "[atari]" in c.missing
    assert kb.plan(c) == [(1, "collect", c.missing), (1, "update", c.missing),
                          (kb.POPULATION, "collect", c.missing), (kb.POPULATION, "update", c.missing)]
    rows = list(kb.case_rows(c))  # nothing to build: no device needed
    assert [(r["members"], r["phase"]) for r in rows] == [(1, "collect"), (1, "update"), (64, "collect"), (64, "update")]
    assert all(r["note"] and "kernels" not in r for r in rows)
    assert kb.missing_packages(load_config(["+experiment=eurusd_dqn"])) is None


def test_a_failed_build_notes_the_rows_it_leaves_and_the_section_goes_on(monkeypatch, capsys):
    def fail(c, members):
        raise RuntimeError(f"no state at P={members}")

    monkeypatch.setattr(kb, "_build", fail)
    c = kb.Case("eurusd_controls", "trading", refusal="regime.enabled=true: a population supports false only")
    rows = list(kb.case_rows(c))
    assert [r["members"] for r in rows] == [1, 1, 1, 1, 64, 64] and all(r["members"] in (1, 64) for r in rows)
    assert all(r["note"] == "building the state: RuntimeError: no state at P=1" for r in rows[:4])
    assert all(r["note"] == c.refusal for r in rows[4:])
    assert "RuntimeError" in capsys.readouterr().err  # the traceback


def test_no_rows_on_cpu(capsys):
    assert list(kb.rows("cpu")) == []
    assert "skipped on CPU" in capsys.readouterr().err


def test_only_accepts_every_experiment_and_names_unknown_ones(capsys, tmp_path):
    assert main(["--sections", "kernels", "--only", "pong_dqn,eurusd_routed", "--out", str(tmp_path)]) == 0
    with pytest.raises(SystemExit) as exc:
        main(["--sections", "kernels", "--only", "eurusd_dqn,eurusd_nope"])
    assert exc.value.code == 2 and "--only: unknown rows ['eurusd_nope']" in capsys.readouterr().err


def test_population_state_of_distinct_seeds_steps_on_cpu():
    """What the P = 64 rows count: a population built as the launcher builds one, seeds 0..P-1, its
    collect and update steps (here 3 members, small, on CPU)."""
    s = make_population(["+experiment=cartpole_cleanrl", *SMALL_CARTPOLE], 3, "cpu")
    assert s.members == 3 and [c.seed for c in s.cfgs] == [0, 1, 2]
    first = [w.detach().clone() for w in s.online.parameters()]
    assert not all(bool((w[0] == w[1]).all()) for w in first)  # members initialised from their own seeds
    steps = int(s.env_steps)
    P.collect_step(s)
    P.update_step(s)
    assert int(s.env_steps) == steps + 4 and int(s.updates) == 1


@pytest.mark.parametrize("experiment", ["eurusd_dqn", "eurusd_c51", "eurusd_iqn", "eurusd_controls"])
def test_build_warms_a_trading_population_up_on_cpu(experiment):
    c = kb.Case(experiment, "trading", overrides=SMALL_TRADING)
    s = kb._build(c, 2, device="cpu")
    assert s.members == 2 and int(s.updates) == 3 and s.obs.shape[0] == 2 * 3


def test_build_warms_a_single_run_up_on_cpu():
    """P = 1: a single run, a population of one (as foxdqn.train trains it)."""
    s = kb._build(kb.Case("cartpole_cleanrl", "cartpole", overrides=SMALL_CARTPOLE), 1, device="cpu")
    assert s.members == 1 and int(s.updates) == 3 and s.obs.shape[0] == 4


def test_a_refused_experiment_builds_no_population(monkeypatch):
    """A setting the population trainer refuses (none does since resume joined it: a refusal rule is
    put in for the test) builds nothing and names the key."""
    import foxdqn.population.grouping as grouping

    monkeypatch.setattr(grouping, "SUPPORTED", (("env.name", lambda v: str(v) != "cartpole", "not cartpole"),))
    with pytest.raises(ValueError, match="env.name=cartpole: a population supports not cartpole only"):
        make_population(["+experiment=cartpole_cleanrl", *SMALL_CARTPOLE], 2, "cpu", fill=False)


def _fake_rows():
    def r(name, members, phase, kernels=None, note=None):
        row = {"section": "kernels", "features": name, "members": members, "phase": phase, "num_envs": 4096}
        if kernels is not None:
            row.update(kernels=kernels, graph_nodes=kernels + 1, device_us=40.0, ms=0.05)
        if note:
            row["note"] = note
        return row

    refusal = "regime.enabled=true: a population supports false only"
    return pd.DataFrame([
        r("eurusd_dqn", 1, "collect", 6), r("eurusd_dqn", 1, "update", 37), r("eurusd_dqn", 1, "iteration"),
        r("eurusd_dqn", 64, "collect", 9), r("eurusd_dqn", 64, "update", 37),
        r("eurusd_controls", 1, "collect", 8), r("eurusd_controls", 1, "update", 60),
        r("eurusd_controls", 64, "collect", note=refusal), r("eurusd_controls", 64, "update", note=refusal),
        r("cartpole_gym", 1, "collect", note=kb.HOST_ENV_NOTE), r("cartpole_gym", 1, "update", 14),
        r("cartpole_gym", 64, "collect", note="env.name=gym"), r("cartpole_gym", 64, "update", note="env.name=gym"),
    ])


def test_summary_puts_p1_and_p64_side_by_side_with_their_ratio():
    out = kb.summary(_fake_rows()).set_index("experiment")
    assert list(out.index) == ["eurusd_dqn", "eurusd_controls", "cartpole_gym"]
    assert list(out.columns) == ["collect P=1", "collect P=64", "collect P=64/P=1", "update P=1", "update P=64",
                                 "update P=64/P=1", "note"]
    assert (out.loc["eurusd_dqn", "collect P=1"], out.loc["eurusd_dqn", "collect P=64"]) == (6, 9)
    assert out.loc["eurusd_dqn", "collect P=64/P=1"] == 1.5 and out.loc["eurusd_dqn", "update P=64/P=1"] == 1.0
    assert out.loc["eurusd_dqn", "note"] == ""
    assert math.isnan(out.loc["eurusd_controls", "update P=64"])
    assert math.isnan(out.loc["eurusd_controls", "update P=64/P=1"])
    assert out.loc["eurusd_controls", "note"] == "P=64: regime.enabled=true: a population supports false only"
    assert math.isnan(out.loc["cartpole_gym", "collect P=1"]) and out.loc["cartpole_gym", "update P=1"] == 14
    assert out.loc["cartpole_gym", "note"] == f"collect P=1: {kb.HOST_ENV_NOTE}; P=64: env.name=gym"


def test_table_has_the_side_by_side_and_every_row_and_reads_old_csvs():
    md = kb.table(_fake_rows())
    side, every = md.split("## kernels: per collect step, per update and per iteration")
    assert "| experiment " in side and "collect P=64/P=1" in side and "| eurusd_dqn " in side
    header = [cell.strip() for cell in every.strip().splitlines()[2].strip("|").split("|")]
    assert header[:4] == ["features", "members", "phase", "num_envs"] and header[-1] == "note"
    assert "nan" not in md  # missing values are empty cells
    assert len([line for line in every.splitlines() if line.startswith("| eurusd_dqn")]) == 5
    old = _fake_rows().query("members == 1").drop(columns=["members"])  # a CSV from before the members column
    assert kb.summary(old)["collect P=64"].isna().all() and "| eurusd_dqn " in kb.table(old)
