"""Interruption and resume (CPU): SIGINT/SIGTERM stop with a checkpoint; resuming gives the run an
uninterrupted run would have given; kill -9 leaves checkpoints that load and continue."""
import signal
import time

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from foxdqn.run.checkpoint import load_checkpoint
from foxdqn.config.compose import load_config
from foxdqn.errors import StoppedBySignal as Interrupted
from foxdqn.job.check import market_data

from support import interrupt_at, train_run as train

OVERRIDES = ["debug=smoke", "device=cpu", "log.progress=false", "logger=csv", "log.interval_env_steps=256",
             "checkpoint.every_env_steps=512", "checkpoint.save_replay=true"]
TIMING = ["train/env_steps_per_s"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """(config, market data, summary, folder) of the uninterrupted run of OVERRIDES."""
    cfg = load_config(OVERRIDES)
    market = market_data(cfg)
    folder = tmp_path_factory.mktemp("uninterrupted")
    return cfg, market, train(cfg, market, folder), folder


@pytest.mark.parametrize("signum, at", [(signal.SIGINT, 23), (signal.SIGTERM, 41)])
def test_interrupted_and_resumed_equals_uninterrupted(tmp_path, monkeypatch, uninterrupted, signum, at):
    cfg, market, whole, whole_dir = uninterrupted
    interrupt_at(monkeypatch, at, signum)
    with pytest.raises(Interrupted) as stopped:
        train(cfg, market, tmp_path / "cut")
    assert stopped.value.exit_code == 128 + signum
    monkeypatch.undo()
    payload = load_checkpoint(tmp_path / "cut" / "checkpoints" / "last.pt")
    assert 0 < payload["env_steps"] < cfg.agent.total_env_steps
    resumed = train(cfg, market, tmp_path / "cut", resume=payload)

    a = load_checkpoint(whole_dir / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "cut" / "checkpoints" / "last.pt")
    for name in ("online", "target"):
        for key in a[name]:
            assert torch.equal(a[name][key], b[name][key]), (name, key)
    assert a["env_steps"] == b["env_steps"] and a["updates"] == b["updates"]
    assert resumed["metrics"] == whole["metrics"]
    ma = pd.read_csv(whole_dir / "metrics.csv").drop(columns=TIMING)
    mb = pd.read_csv(tmp_path / "cut" / "metrics.csv").drop(columns=TIMING)
    assert list(mb["step"]) == sorted(set(mb["step"]))  # no step twice
    pd.testing.assert_frame_equal(ma, mb)


@pytest.mark.slow
def test_resume_refuses_another_config_and_a_finished_run(train_cli, tmp_path):
    def run(*args):
        return train_cli(["debug=smoke", "debug.max_env_steps=1024", "log.progress=false", *args], cwd=tmp_path)

    first = run(f"hydra.run.dir={tmp_path / 'a'}")
    assert first.returncode == 0, first.stderr[-2000:]
    again = run(f"hydra.run.dir={tmp_path / 'a'}")
    assert again.returncode == 2 and "already holds a run" in again.stderr
    done = run(f"hydra.run.dir={tmp_path / 'a'}", "resume=auto")
    assert done.returncode == 2 and "has finished" in done.stderr
    (tmp_path / "a" / "INCOMPLETE").write_text("pretend it was killed\n")
    other = run(f"hydra.run.dir={tmp_path / 'a'}", "resume=auto", "optim.lr=1e-3")
    assert other.returncode == 2 and "optim.lr" in other.stderr and len(other.stderr.strip().splitlines()) == 1
    # a key checked against the run's config, not against the default experiment's (3 does not divide its batch)
    accum = run(f"hydra.run.dir={tmp_path / 'a'}", "resume=auto", "optim.accumulate=3")
    assert accum.returncode == 2 and "optim.accumulate (3 here, 1 there)" in accum.stderr, accum.stderr
    # a key the composed (default) config ignores: no warning about that config, only the refusal
    ignored = run(f"hydra.run.dir={tmp_path / 'a'}", "resume=auto", "head.atoms=21")
    assert ignored.returncode == 2 and "head.atoms" in ignored.stderr, ignored.stderr
    assert len(ignored.stderr.strip().splitlines()) == 1, ignored.stderr
    assert "WARNING" not in ignored.stdout and "WARNING" not in (tmp_path / "a" / "train.log").read_text(), ignored.stdout
    missing = train_cli([f"hydra.run.dir={tmp_path / 'b'}", "resume=auto"], cwd=tmp_path)
    assert missing.returncode == 2 and "no run in" in missing.stderr and not (tmp_path / "b").exists()
    # no run there: this call's config starts, checked as any start's (before debug=smoke's caps too)
    fresh = run(f"hydra.run.dir={tmp_path / 'f'}", "resume=auto", "optim.accumulate=3")
    assert fresh.returncode == 2 and "divide agent.batch_size=128" in fresh.stderr, fresh.stderr
    foreign = tmp_path / "foreign.pt"
    foreign.write_bytes(b"not a checkpoint")
    bad = run(f"resume={foreign}")
    assert bad.returncode == 2 and "foreign.pt" in bad.stderr
    assert not (tmp_path / "outputs").exists()  # refused before Hydra made a folder
    folder = run(f"resume={tmp_path / 'a'}", f"hydra.run.dir={tmp_path / 'c'}")  # a run folder means its last.pt
    assert folder.returncode == 0, folder.stderr[-2000:]  # 'a' is marked INCOMPLETE above: it is finished now
    assert not (tmp_path / "a" / "INCOMPLETE").exists() and not (tmp_path / "c").exists()


def test_the_printed_resume_command_continues_a_run_started_with_overrides(cli, train_cli, tmp_path):
    """SIGINT prints 'continue with resume=auto hydra.run.dir=RUN': that command alone continues the
    run with its own settings (here another dataset, learning rate and budget), read from its
    checkpoint; a key given again must agree."""
    run_dir = tmp_path / "run"
    started = ["+experiment=googl_dqn", "optim.lr=0.001", "agent.total_env_steps=20000", "log.progress=false",
               "checkpoint.every_env_steps=2500", "log.interval_env_steps=1250", "device=cpu", "logger=csv"]
    proc = cli.start("foxdqn.train", [*started, f"hydra.run.dir={run_dir}"], cwd=tmp_path)  # a child of the server
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (run_dir / "checkpoints" / "last.pt").is_file():
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    err = proc.wait(timeout=300).stderr
    assert proc.returncode == 130, err[-2000:]
    hint = err.strip().splitlines()[-1].split("continue with ", 1)[1].split()
    assert hint == ["resume=auto", f"hydra.run.dir={run_dir}"]
    record = (run_dir / "config.yaml").read_bytes()  # the start record, as the run started
    clash = train_cli([*hint, "optim.lr=0.01"], cwd=tmp_path)
    assert clash.returncode == 2 and "optim.lr (0.01 here, 0.001 there)" in clash.stderr
    res = train_cli([*hint, "log.progress=false"], cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    config = OmegaConf.load(run_dir / "config.yaml")
    assert config.data.name == "googl_1d" and config.optim.lr == 0.001 and config.agent.total_env_steps == 20000
    assert (run_dir / "config.yaml").read_bytes() == record and config.resume is None  # never rewritten by a resume
    assert (run_dir / "eval" / "summary.json").is_file()


def test_resume_auto_starts_over_a_run_killed_before_its_first_checkpoint(train_cli, tmp_path):
    run_dir = tmp_path / "killed"
    run_dir.mkdir()
    (run_dir / "INCOMPLETE").write_text("killed early\n")
    (run_dir / "metrics.csv").write_text("step,train/loss\n256,0.5\n")
    res = train_cli(["debug=smoke", "log.progress=false", "resume=auto", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "starting it over" in res.stdout + res.stderr
    assert not (run_dir / "INCOMPLETE").exists() and (run_dir / "eval" / "summary.json").is_file()
    assert pd.read_csv(run_dir / "metrics.csv")["step"].is_monotonic_increasing


def test_a_signal_outside_training_is_one_line_and_128_plus_signal(capfd, monkeypatch):
    from foxdqn import train as cli

    def exit_now(code):
        raise SystemExit(code)

    monkeypatch.setattr(cli.os, "_exit", exit_now)
    with pytest.raises(SystemExit) as stop:
        cli._outside_training(signal.SIGTERM, None)
    err = capfd.readouterr().err
    assert stop.value.code == 143 and "SIGTERM outside training" in err and len(err.strip().splitlines()) == 1


def test_resume_without_the_replay_refills_it_before_updating(tmp_path, monkeypatch):
    cfg = load_config([*OVERRIDES[:-1], "checkpoint.save_replay=false"])
    market = market_data(cfg)
    interrupt_at(monkeypatch, 30, signal.SIGINT)
    with pytest.raises(Interrupted):
        train(cfg, market, tmp_path)
    monkeypatch.undo()
    payload = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert not payload["member_state"]["replay_saved"]
    summary = train(cfg, market, tmp_path, resume=payload)
    per_iter = cfg.env.num_envs * cfg.agent.steps_per_iter
    refill = -(-cfg.agent.learning_starts // per_iter)
    total = -(-cfg.agent.total_env_steps // per_iter)
    state = payload["member_state"]  # the population's counters
    resumed_at = state["env_steps"] // per_iter
    assert summary["updates"] == state["updates"] + (total - resumed_at - refill) * cfg.agent.updates_per_iter
    logged = pd.read_csv(tmp_path / "metrics.csv")
    assert logged["train/updates"].iloc[-1] == summary["updates"]


def test_opening_a_folder_removes_temporaries_a_killed_writer_left(tmp_path):
    from foxdqn.run.folder import RunFolder

    (tmp_path / "checkpoints").mkdir()
    stale = tmp_path / "checkpoints" / ".last.pt.abc123de.tmp.pt"
    stale.write_bytes(b"partial")
    (tmp_path / "INCOMPLETE").write_text("killed\n")
    RunFolder(tmp_path).open(resume=True).release()
    assert not stale.exists()


def test_a_refused_resume_names_the_first_key_in_the_schemas_order_with_its_values_as_typed():
    """The clash message names the first differing key in the config's own order (debug.name comes
    before debug.max_env_steps and debug.fit_prune_schedule), its values as the command line writes
    them (null, true), not Python's (None, True)."""
    from foxdqn.config.compose import load_config
    from foxdqn.config.schema import to_plain
    from foxdqn.run.resume import _first_difference

    smoke, none = (to_plain(load_config([f"debug={d}"])) for d in ("smoke", "none"))
    assert _first_difference(none["debug"], smoke["debug"], "debug") == "debug.name (null here, 'smoke' there)"
    lifted = to_plain(load_config(["debug=smoke", "debug.max_eval_bars=null"]))
    assert _first_difference(lifted, smoke, "config") == "config.debug.max_eval_bars (null here, 256 there)"
    double = to_plain(load_config(["debug=smoke", "head.double=false"]))
    assert _first_difference(smoke, double, "config") == "config.head.double (true here, false there)"
    assert _first_difference(smoke, smoke, "config") is None
