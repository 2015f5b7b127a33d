"""The JAX peer of ``make bench`` section population (bench/peers/, bench/population_bench.py), without
JAX: its settings read from cartpole_cleanrl's composed config, the one-line skip when a package is
missing, where its rows go, and the foxdqn / peer ratio table from hand-made rows. The peer's own
training is tested in tests/test_bench_jax_peer.py (skipped without the peers extra)."""
import os
import sys
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import bench.peers
from bench import population_bench as pb
from bench.peers.jax_dqn_cartpole import Settings, main, settings_from_config, train
from foxdqn.config.compose import load_config



@pytest.fixture(autouse=True)
def no_bytecode_fill(monkeypatch):
    """The section's rows here are hand-made: no process fills a bytecode cache (where this
    environment turns it off, ``rows`` would start two)."""
    monkeypatch.setattr(pb, "fill_bytecode", lambda env, peer: None)

def test_defaults_are_cartpole_cleanrl_and_cleanrl_s_settings():
    """The CLI's defaults are the composed cartpole_cleanrl config's, and those are CleanRL's CartPole DQN
    (cleanrl/dqn.py): 500k steps, buffer 10k, batch 128, lr 2.5e-4, γ 0.99, ε 1 → 0.05 over half the
    run, hard target copy every 500 steps, learning from 10k steps, an update every 10 steps, 120-84."""
    s = settings_from_config(load_config(["+experiment=cartpole_cleanrl"]))
    assert s == Settings()
    assert (s.total_env_steps, s.num_envs, s.buffer_size, s.batch_size, s.lr, s.gamma) == \
        (500_000, 10, 10_000, 128, 2.5e-4, 0.99)
    assert (s.eps_start, s.eps_end, s.eps_anneal_steps) == (1.0, 0.05, 250_000)
    assert (s.target_period, s.learning_starts, s.train_interval, s.hidden) == (500, 10_000, 10, (120, 84))
    assert s.eval_episodes == 100 and s.iterations == 50_000


def test_settings_follow_the_overrides_and_debug_caps():
    """What the bench passes on CPU (debug=smoke) and any override reach the peer."""
    s = settings_from_config(load_config(["+experiment=cartpole_cleanrl", "debug=smoke", "optim.lr=1e-3",
                                          "target.period=20", "env.num_envs=8"]))
    assert (s.total_env_steps, s.batch_size, s.learning_starts, s.buffer_size, s.hidden) == \
        (4096, 64, 512, 8192, (64, 64))
    assert (s.lr, s.num_envs, s.train_interval, s.target_period, s.eps_anneal_steps) == (1e-3, 8, 8, 160, 2048)


def test_a_config_the_peer_cannot_train_is_refused_by_name():
    cfg = load_config(["+experiment=cartpole_cleanrl", "replay.n_step=3", "target.update=polyak",
                       "agent.updates_per_iter=2", "head.double=true"])
    with pytest.raises(ValueError) as err:
        settings_from_config(cfg)
    for key in ("replay.n_step=3", "target.update='polyak'", "agent.updates_per_iter=2", "head.double=True"):
        assert key in str(err.value)


def test_settings_json_round_trip_and_unknown_keys():
    s = Settings(total_env_steps=2000, hidden=(8, 4))
    assert Settings.from_json(s.to_json()) == s
    assert Settings.from_json('{"lr": 0.001}') == Settings(lr=0.001)
    with pytest.raises(ValueError, match="unknown keys"):
        Settings.from_json('{"learning_rate": 0.001}')


def test_missing_finds_modules_without_importing_them():
    assert bench.peers.missing(("json", "no_such_module_for_foxdqn")) == ["no_such_module_for_foxdqn"]
    assert set(bench.peers.JAX_PEER_MODULES) == {"jax", "flax", "optax", "gymnax", "flashbax"}


def test_peer_missing_asks_another_interpreter(monkeypatch):
    """FOXDQN_PEER_PYTHON: the probe runs in that interpreter; one that cannot run is named."""
    monkeypatch.setattr(bench.peers, "JAX_PEER_MODULES", ("json", "no_such_module_for_foxdqn"))
    other = os.path.realpath(sys.executable)
    assert pb.peer_missing(other) == ["no_such_module_for_foxdqn"]
    assert pb.peer_missing("/no/such/python") == ["/no/such/python (FileNotFoundError)"]
    monkeypatch.setenv("FOXDQN_PEER_PYTHON", "/no/such/python")
    assert pb.peer_python() == "/no/such/python"


def test_skip_is_one_line_and_no_row(monkeypatch, capsys):
    """A missing package: one line on stderr, no peer row, the foxdqn rows as before."""
    monkeypatch.setattr(pb, "peer_missing", lambda python=None: ["gymnax", "flashbax"])
    monkeypatch.setattr(pb, "sweep", lambda experiment, members, launcher, graph, extra=(), env=None, first_seed=0: {
        "section": "population", "experiment": experiment, "launcher": launcher, "members": members})
    monkeypatch.setattr(pb, "peer_row", lambda *a: pytest.fail("the peer ran"))
    rows = list(pb.rows("cpu"))
    assert [r["launcher"] for r in rows] == ["population", "basic"] * 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["population section: JAX peer skipped, gymnax, flashbax not importable "
                   "(pip install -e '.[peers]')"]


def test_skip_in_this_environment_when_jax_is_absent(capsys):
    """The real check: where the peers extra is not installed (foxdqn's own test venv), no error."""
    absent = pb.peer_missing()
    settings = pb.peer_settings("cartpole_cleanrl", ["debug=smoke"])
    if absent:
        assert settings is None
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    else:
        assert settings.total_env_steps == 4096
    assert pb.peer_settings("eurusd_dqn") is None  # not the peer's experiment: no check, no line


def test_cli_without_the_packages_says_so_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(bench.peers, "missing", lambda modules=None: ["jax"])
    assert main(["--seeds", "2"]) == 3
    assert capsys.readouterr().err.strip().splitlines() == [
        "JAX peer: jax not installed (pip install -e '.[peers]')"]


def test_a_bad_seed_range_is_refused_before_any_import(monkeypatch, capsys):
    """``--first-seed`` below 0 or ``--seeds`` below 1: argparse's one line and exit 2, checked
    before the packages are looked for; ``train`` raises ValueError before it imports JAX."""
    monkeypatch.setattr(bench.peers, "missing", lambda modules=None: pytest.fail("looked for the packages"))
    with pytest.raises(SystemExit) as exit_:
        main(["--seeds", "2", "--first-seed", "-1"])
    assert exit_.value.code == 2 and "first_seed: must be >= 0, got -1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["--seeds", "0"])
    assert exit_.value.code == 2 and "seeds: must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="first_seed: must be >= 0, got -3"):
        train(2, first_seed=-3)


def test_peer_rows_follow_the_foxdqn_row_of_the_same_size(monkeypatch):
    monkeypatch.setattr(pb, "peer_missing", lambda python=None: [])
    monkeypatch.setattr(pb, "sweep", lambda experiment, members, launcher, graph, extra=(), env=None, first_seed=0: {
        "experiment": experiment, "launcher": launcher, "graph": graph, "members": members, "first_seed": first_seed})
    seen = []
    monkeypatch.setattr(pb, "peer_row", lambda members, s, env=None, first_seed=0: seen.append(s) or {
        "launcher": pb.PEER, "members": members, "first_seed": first_seed})
    rows = [(r["launcher"], r["members"]) for r in pb.rows("cuda", only=("cartpole_cleanrl",))]
    assert rows == [("population", 1), (pb.PEER, 1), ("population", 16), (pb.PEER, 16), ("population", 128),
                    (pb.PEER, 128), ("population", 512), (pb.PEER, 512), ("basic", 512)]
    assert all(s == Settings() for s in seen)  # CUDA: cartpole_cleanrl as shipped
    picked = [(r["launcher"], r["members"]) for r in pb.rows("cuda", only=("cartpole_cleanrl",), members=(128, 512))]
    assert picked == [("population", 128), (pb.PEER, 128), ("population", 512), (pb.PEER, 512), ("basic", 512)]
    # another draw of seeds: every row of both sides on seeds 512..512+P-1
    drawn = list(pb.rows("cuda", only=("cartpole_cleanrl",), members=(512,), first_seed=512))
    assert [(r["launcher"], r["first_seed"]) for r in drawn] == [("population", 512), (pb.PEER, 512), ("basic", 512)]


def test_warm_runs_each_population_sweep_once_untimed_first(monkeypatch):
    """--warm: every population row's sweep runs twice, the second one is the row (its Triton cache
    warm); the eager and basic rows run once."""
    calls = []
    monkeypatch.setattr(pb, "peer_missing", lambda python=None: ["jax"])
    monkeypatch.setattr(pb, "sweep", lambda experiment, members, launcher, graph, extra=(), env=None, first_seed=0: calls.append(
        (launcher, graph, members)) or {"experiment": experiment, "launcher": launcher, "graph": graph,
                                         "members": members, "run": len(calls)})
    rows = list(pb.rows("cuda", only=("eurusd_dqn",), members=(5,), warm=True))
    assert calls == [("population", "auto", 5), ("population", "auto", 5), ("population", "off", 5),
                     ("basic", "auto", 5)]
    assert [(r["launcher"], r["graph"], r.get("triton_cache"), r["run"]) for r in rows] == [
        ("population", "auto", "warm", 2), ("population", "off", None, 3), ("basic", "auto", None, 4)]
    calls.clear()
    cold = list(pb.rows("cuda", only=("eurusd_dqn",), members=(5,)))
    assert len(calls) == 3 and cold[0]["triton_cache"] == "as found"


@pytest.mark.parametrize("configured", [None, "1"])
def test_every_process_of_the_section_runs_in_one_environment_with_the_bytecode_cache_on(monkeypatch, configured):
    """foxdqn's sweeps and the peer get the same environment; where it turns Python's bytecode cache
    off, the section turns it on in a folder of its own and fills it before the first row (the label
    says which); --bytecode as-configured keeps the environment as it is."""
    if configured is None:
        monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    else:
        monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", configured)
    monkeypatch.setattr(pb, "peer_missing", lambda python=None: [])
    envs = []
    monkeypatch.setattr(pb, "sweep", lambda experiment, members, launcher, graph, extra=(), env=None, first_seed=0: envs.append(
        env) or {"launcher": launcher, "members": members})
    monkeypatch.setattr(pb, "peer_row", lambda members, s, env=None, first_seed=0: envs.append(env) or {"launcher": pb.PEER})
    filled = []
    monkeypatch.setattr(pb, "fill_bytecode", lambda env, peer: filled.append((env, peer)))
    rows = list(pb.rows("cuda", only=("cartpole_cleanrl",), members=(16,), warm=True))
    assert len(envs) == 4 and all(e == envs[0] for e in envs)  # warm-up, row, peer, basic
    if configured is None:
        assert envs[0] == dict(os.environ) and {r["bytecode_cache"] for r in rows} == {"on"}
        assert filled == []  # the cache is on already: nothing to fill
    else:
        assert filled == [(envs[0], True)]  # filled before the first row, the peer's packages too
        assert "PYTHONDONTWRITEBYTECODE" not in envs[0] and envs[0]["PYTHONPYCACHEPREFIX"]
        assert {k: v for k, v in envs[0].items() if k != "PYTHONPYCACHEPREFIX"} == {
            k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        assert {r["bytecode_cache"] for r in rows} == {"on (prefix)"}
        envs.clear()
        rows = list(pb.rows("cuda", only=("cartpole_cleanrl",), members=(16,), bytecode=False))
        assert envs[0] == dict(os.environ) and {r["bytecode_cache"] for r in rows} == {"as configured"}


def test_both_sides_train_the_seeds_from_first_seed(monkeypatch):
    """The commands of a foxdqn sweep and of a peer run with first_seed=512: seeds 512..512+P-1 on both."""
    cmds = []
    monkeypatch.setattr(pb.subprocess, "run", lambda cmd, **kw: cmds.append(cmd) or SimpleNamespace(
        returncode=1, stdout="", stderr="stopped by the test"))
    assert pb.sweep("cartpole_cleanrl", 16, "population", "auto", first_seed=512)["first_seed"] == 512
    assert pb.sweep("cartpole_cleanrl", 16, "basic", "auto", first_seed=512)["jobs_run"] == pb.BASIC_JOBS
    assert pb.peer_row(16, Settings(), first_seed=512)["first_seed"] == 512  # a failed run's row names its seeds too
    assert "seed=range(512,528)" in cmds[0] and f"seed=range(512,{512 + pb.BASIC_JOBS})" in cmds[1]
    assert cmds[2][cmds[2].index("--seeds"):cmds[2].index("--seeds") + 4] == ["--seeds", "16", "--first-seed", "512"]


def test_members_must_be_counts_the_section_knows(capsys):
    from bench.run import main

    with pytest.raises(SystemExit) as info:
        main(["--sections", "population", "--members", "128,7"])
    assert info.value.code == 2 and "--members: '128,7'; allowed" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["--sections", "population", "--first-seed", "-1"])
    assert info.value.code == 2 and "--first-seed: must be >= 0, got -1" in capsys.readouterr().err


def _result(seeds, wall_train, compile_s, rate, rate_run, ret):
    return {"seeds": seeds, "train_s": wall_train, "compile_s": compile_s + 0.5, "compile_train_s": compile_s,
            "run_s": wall_train - compile_s, "env_steps_per_s": rate, "env_steps_per_s_run": rate_run,
            "return_mean": ret, "return_min": ret - 10, "return_max": ret + 5, "jax": "0.11.2",
            "device": "gpu:NVIDIA H200", "settings": {"eval_episodes": 100}}


def _frame():
    def ours(members, wall, train, rate, ret, launcher="population", rate_run=None):
        return {"section": "population", "experiment": "cartpole_cleanrl", "launcher": launcher, "graph": "auto",
                "members": members, "wall_s": wall, "wall_per_job_s": wall / members, "train_s": train,
                "host_s": wall - train, "env_steps_per_s": rate, "metric": "mean_return", "metric_mean": ret,
                "metric_min": ret, "metric_max": ret, "failed": 0,
                **({} if rate_run is None else {"env_steps_per_s_run": rate_run})}
    return pd.DataFrame([
        ours(16, 40.0, 25.0, 320_000.0, 495.0, rate_run=4e5),
        pb.peer_result_row(16, _result(16, 12.0, 8.0, 666_666.7, 2e6, 480.0), 20.0),
        ours(128, 54.0, 23.0, 2.78e6, 495.0), pb.peer_result_row(128, _result(128, 16.0, 9.0, 4e6, 9.1e6, 490.0), 27.0),
        ours(512, 141.0, 57.0, 4.49e6, 494.0),
        pb.peer_result_row(512, None, 3.0, rc=1, stderr="Traceback\nRuntimeError: out of memory"),
        ours(512, 4000.0, 3000.0, 1e5, 495.0, launcher="basic"),
    ])


def test_peer_row_columns():
    row = pb.peer_result_row(16, _result(16, 12.0, 8.0, 666_666.7, 2e6, 480.0), 20.0)
    assert row["first_seed"] == 0 and pb.peer_result_row(16, {**_result(16, 12.0, 8.0, 1e6, 2e6, 480.0),
                                                               "first_seed": 512}, 20.0)["first_seed"] == 512
    assert (row["launcher"], row["graph"], row["wall_s"], row["train_s"], row["compile_s"], row["host_s"]) == \
        ("jax_peer", "jit", 20.0, 12.0, 8.5, 8.0)
    assert (row["metric"], row["metric_mean"], row["failed"], row["env_steps_per_s_run"]) == \
        ("mean_return", 480.0, 0, 2e6)
    assert row["note"] == ("JAX peer, jax 0.11.2 on gpu:NVIDIA H200: 100 greedy episodes per seed; "
                           "train_s = 8 s compile + 4 s run")
    failed = pb.peer_result_row(512, None, 3.0, rc=1, stderr="Traceback\nRuntimeError: out of memory")
    assert (failed["failed"], failed["rc"], failed["note"]) == (512, 1, "RuntimeError: out of memory")
    assert "wall_s" not in failed


def test_ratio_table_from_hand_made_rows():
    text = pb.table(_frame())
    peer = text[text.index("## population: foxdqn / JAX peer"):]
    lines = peer.splitlines()
    assert lines[0] == "## population: foxdqn / JAX peer (cartpole_cleanrl, same settings, same device, one run)"
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| members")]
    # no standard errors in these rows (rows from before the column, and results without ``returns``): means alone
    assert rows == ["| 16 | 40 | 20 | 2 | 3.2e+05 | 6.667e+05 | 0.48 | 4e+05 | 2e+06 | 0.2 | 8.5 | 495 | 480 | 15 |",
                    # 128: no run rate of foxdqn's (a row from before the column): its cells empty
                    "| 128 | 54 | 27 | 2 | 2.78e+06 | 4e+06 | 0.695 |  | 9.1e+06 |  | 9.5 | 495 | 490 | 5 |"]  # 512: peer failed
    assert "compile_s" in [c.strip() for c in text.splitlines()[2].split("|")]  # the rows' table: peer compile s
    assert "basic launcher wall time / population wall time" in text  # the existing ratio table stays


def test_standard_error_of_a_greedy_mean():
    assert pb.standard_error([490.0, 500.0, 500.0, 470.0]) == pytest.approx(np.std([490, 500, 500, 470], ddof=1) / 2)
    assert pb.standard_error([500.0, 500.0]) == 0.0
    assert np.isnan(pb.standard_error([500.0])) and np.isnan(pb.standard_error([]))


def test_the_greedy_columns_give_each_mean_its_standard_error_and_the_difference_its_own():
    peer = pb.peer_result_row(4, {**_result(4, 12.0, 8.0, 1e6, 2e6, 492.5), "returns": [500.0, 500.0, 470.0, 500.0]}, 20.0)
    assert peer["metric_se"] == pytest.approx(7.5)  # sd 15 over √4
    ours = {"section": "population", "experiment": "cartpole_cleanrl", "launcher": "population", "graph": "auto",
            "members": 4, "wall_s": 10.0, "train_s": 8.0, "env_steps_per_s": 2e6, "metric": "mean_return",
            "metric_mean": 497.5, "metric_se": 2.5, "failed": 0}
    line = [x for x in pb.peer_table(pd.DataFrame([ours, peer])).splitlines() if x.startswith("| 4 |")][0]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[-3:] == ["497.5 ± 2.5", "492.5 ± 7.5", "5 ± 7.9"]  # √(2.5² + 7.5²) = 7.91


def test_the_run_rate_counts_the_loop_and_its_checkpoints_only():
    timings = {"phases": {"build": 1.0, "warmup": 0.5, "training": 16.0, "periodic_checkpoint": 1.0,
                          "checkpoint": 0.4}}
    assert pb.loop_seconds(timings) == 17.0
    assert pb.loop_seconds({"phases": {"build": 1.0}}) == 0.0


def test_without_peer_rows_the_tables_are_as_before():
    df = _frame()
    df = df[df.launcher != pb.PEER].drop(columns=["compile_s", "env_steps_per_s_run", "note"])
    text = pb.table(df)
    assert "JAX peer" not in text and "compile_s" not in text
    assert pb.peer_table(df) == ""
