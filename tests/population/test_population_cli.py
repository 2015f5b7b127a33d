"""``python -m foxdqn.train --multirun ... hydra/launcher=population`` end to end with the real
trainer (CPU, smoke sizes): folders, metrics, a halted member, the multirun's exit code."""
from __future__ import annotations

import json
import math
import re

import pandas as pd
import pytest
import torch

from foxdqn.run.checkpoint import load_checkpoint


def test_population_multirun_from_the_command_line(train_cli, tmp_path):
    sweep = tmp_path / "s"
    res = train_cli(["--multirun", "+experiment=cartpole_cleanrl", "debug=smoke", "device=cpu", "log.progress=false",
                     "logger=csv", "seed=0,1", "debug.inject_nan_at_step=null,60", "hydra/launcher=population",
                     f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    assert res.returncode == 3, res.stderr[-3000:]  # python -m: the launcher's failures reach main()
    assert "foxdqn: error: 2 job(s) of the multirun failed" in res.stderr
    jobs = {}
    for job in sorted(p for p in sweep.iterdir() if p.name.isdigit()):
        overrides = (job / ".hydra" / "overrides.yaml").read_text()
        jobs[job.name] = ("inject_nan_at_step=60" in overrides, job)
    assert len(jobs) == 4 and sum(faulty for faulty, _ in jobs.values()) == 2
    total = None
    for name, (faulty, job) in sorted(jobs.items(), key=lambda kv: kv[1][0]):  # the finished members first
        metrics = pd.read_csv(job / "metrics.csv")
        ckpt = load_checkpoint(job / "checkpoints" / "last.pt")
        if faulty:
            assert (job / "HALTED").read_text().startswith("non-finite loss or gradient norm")
            assert not (job / "eval").exists()
            assert ckpt["updates"] == 60  # the weights before update 60: counts of the halt, not of the run
            # (update 60 comes after the first log row with updates: a halted member logs no row from its halt on)
            assert ckpt["env_steps"] < total and metrics["train/updates"].max() <= 60
            assert metrics["step"].max() < total  # its rows stopped after the halt
        else:
            own_log = (job / "train.log").read_text()
            assert f"job {name}: trained in" in own_log and own_log.count(": trained in") == 1  # its own line only
            summary = json.loads((job / "eval" / "summary.json").read_text())
            assert summary["population"]["size"] == 4 and summary["updates"] == ckpt["updates"] > 60
            total = summary["env_steps"]
            last = metrics.iloc[-1]
            assert last["step"] == total
            assert metrics["train/episodes"].sum() > 0 and math.isfinite(last["train/loss"])  # real values on CPU
            assert last["train/reward_per_step"] > 0
            returns = metrics["train/episode_return"].dropna()  # rows of intervals in which an episode ended
            assert len(returns) > 0 and all(math.isfinite(r) and r > 0 for r in returns)


@pytest.mark.slow
def test_a_multirun_composes_once_per_structure_and_derives_the_other_jobs(train_cli, tmp_path):
    """Hydra composes the first job; the others differ in values only and are derived without a
    composition (issue 33): their folders hold Hydra's .hydra/ files and their results equal the
    same job composed by Hydra (here job 0 of another population)."""
    common = ["--multirun", "+experiment=cartpole_cleanrl", "debug=smoke", "debug.max_env_steps=1024", "device=cpu",
              "log.progress=false", "logger=csv", "hydra/launcher=population"]
    many = train_cli([*common, "seed=0,1,2", "optim.lr=1e-3,2e-3", f"hydra.sweep.dir={tmp_path / 'a'}"], cwd=tmp_path,
                     timeout=600)
    assert many.returncode == 0, many.stderr[-3000:]
    assert "6 jobs checked in" in many.stdout + many.stderr and "5 derived from the 1 Hydra composed" in many.stdout
    assert re.search(r"#5 : .*seed=2 optim\.lr=0\.002\n", many.stdout), many.stdout  # a derived job is listed too
    two = train_cli([*common, "seed=2,0", "optim.lr=2e-3", f"hydra.sweep.dir={tmp_path / 'b'}"], cwd=tmp_path,
                    timeout=600)
    assert two.returncode == 0, two.stderr[-3000:]

    def job(sweep, *wanted):
        for folder in (tmp_path / sweep).iterdir():
            if folder.name.isdigit():
                overrides = (folder / ".hydra" / "overrides.yaml").read_text()
                if all(w in overrides for w in wanted):
                    return folder
        raise AssertionError(f"no job with {wanted} in {sweep}")

    derived, composed = job("a", "seed=2", "optim.lr=0.002"), job("b", "seed=2")
    assert derived.name != "0" and composed.name == "0"
    import yaml

    def flat(node, path=""):
        return ({k: v for key, value in node.items() for k, v in flat(value, f"{path}.{key}").items()}
                if isinstance(node, dict) else {path: node})

    first, mine = (flat(yaml.safe_load((d / ".hydra" / "hydra.yaml").read_text())) for d in (tmp_path / "a" / "0", derived))
    assert {k for k in first if first[k] != mine[k]} <= {".hydra.job.num", ".hydra.job.id", ".hydra.job.override_dirname",
                                                         ".hydra.overrides.task", ".hydra.runtime.output_dir"}
    assert mine[".hydra.job.num"] == int(derived.name) and mine[".hydra.runtime.output_dir"] == str(derived)
    assert (derived / ".hydra" / "overrides.yaml").read_text().splitlines()[-1] != ""
    mine, theirs = (json.loads((d / "eval" / "summary.json").read_text()) for d in (derived, composed))
    assert mine["metrics"] == theirs["metrics"]
    assert "optim.lr=0.002" in (derived / ".hydra" / "overrides.yaml").read_text()
    assert (derived / "config.yaml").read_text().split("\n", 1)[1] == (composed / "config.yaml").read_text().split(
        "\n", 1)[1]  # the same resolved config (the first lines name two runs)
    # Hydra's copy: the config as composed, before debug=smoke's caps, as Hydra writes it for job 0
    mine, theirs = (yaml.safe_load((d / ".hydra" / "config.yaml").read_text()) for d in (derived, composed))
    assert mine == theirs and mine["agent"]["total_env_steps"] == 500000 and mine["debug"]["max_env_steps"] == 1024


@pytest.mark.slow
def test_prioritized_replay_multirun_trains_as_one_population(train_cli, tmp_path):
    """replay=per with two seeds and two α: one population of four (α is a member key), each member
    with its own folder, its finished run and its updates."""
    sweep = tmp_path / "per"
    res = train_cli(["--multirun", "+experiment=eurusd_dqn", "replay=per", "debug=smoke", "debug.max_env_steps=1024",
                     "device=cpu", "log.progress=false", "logger=csv", "seed=0,1", "replay.alpha=0.6,0.3", "hydra/launcher=population",
                     f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "population of 4 members (jobs 0, 1, 2, 3)" in res.stdout + res.stderr
    alphas = set()
    for job in (sweep / str(j) for j in range(4)):
        summary = json.loads((job / "eval" / "summary.json").read_text())
        assert summary["population"]["size"] == 4 and summary["updates"] > 0
        assert math.isfinite(pd.read_csv(job / "metrics.csv").iloc[-1]["train/loss"])
        config = (job / "config.yaml").read_text()
        assert "name: per" in config
        alphas.add(next(line for line in config.splitlines() if line.strip().startswith("alpha:")).strip())
    assert alphas == {"alpha: 0.6", "alpha: 0.3"}


def two_seed_population(train_cli, tmp_path, experiment: str, *extra: str) -> list[tuple[dict, dict]]:
    """Train seeds 0 and 1 of the shipped ``experiment`` (smoke, CPU, ``extra`` overrides) under
    ``hydra/launcher=population``; check they trained as one population with finite losses and
    return each job's (summary, online weights of last.pt)."""
    sweep = tmp_path / experiment
    res = train_cli(["--multirun", f"+experiment={experiment}", "debug=smoke", "debug.max_env_steps=1024", "device=cpu",
                     "log.progress=false", "logger=csv", *extra, "seed=0,1", "hydra/launcher=population", f"hydra.sweep.dir={sweep}"],
                    cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "population of 2 members (jobs 0, 1)" in res.stdout + res.stderr
    jobs = []
    for job in (sweep / str(j) for j in range(2)):
        summary = json.loads((job / "eval" / "summary.json").read_text())
        assert summary["population"]["size"] == 2 and summary["updates"] > 0
        assert math.isfinite(pd.read_csv(job / "metrics.csv").iloc[-1]["train/loss"])
        jobs.append((summary, load_checkpoint(job / "checkpoints" / "last.pt")["online"]))
    return jobs


def test_eurusd_attention_multirun_trains_as_one_population(train_cli, tmp_path):
    """The shipped attention experiment's seeds train as one population (model.encoder=attention:
    foxdqn.population.attention); each member's checkpoint holds a classic attention network."""
    for _, online in two_seed_population(train_cli, tmp_path, "eurusd_attention", "agent.total_env_steps=1024",
                                         "agent.learning_starts=256"):
        assert "encoder.blocks.1.qkv.weight" in online and "encoder.pos" in online


def test_bitflip_her_multirun_trains_as_one_population(train_cli, tmp_path):
    """The shipped HER experiment's seeds train as one population (env.name=bitflip, replay.her:
    foxdqn.population.envs.MemberBitFlipEnv, foxdqn.population.her); each member's evaluation reports
    its success rate and its checkpoint holds a classic Q network of the goal-conditioned observation."""
    for summary, online in two_seed_population(train_cli, tmp_path, "bitflip_her"):
        assert 0.0 <= summary["metrics"]["agent"]["success_rate"] <= 1.0
        assert online["encoder.net.0.weight"].shape[1] == 60  # concat(state, goal) of 30 bits


def test_cartpole_gym_multirun_trains_as_one_population(train_cli, tmp_path):
    """The shipped Gymnasium experiment's seeds train as one population (env.name=gym:
    foxdqn.population.gym_env.MemberGymEnv, collect steps on the host); each member's checkpoint
    holds a classic Q network and evaluates as a single run's checkpoint does."""
    from foxdqn.evaluate import evaluate_checkpoint

    jobs = two_seed_population(train_cli, tmp_path, "cartpole_gym")
    for _, online in jobs:
        assert online["encoder.net.0.weight"].shape[1] == 4  # CartPole-v1's observation
    checkpoint = tmp_path / "cartpole_gym" / "1" / "checkpoints" / "last.pt"
    evaluated, _ = evaluate_checkpoint(checkpoint, out=tmp_path / "evaluated")
    assert evaluated["metrics"]["agent"]["episodes"] == jobs[1][0]["metrics"]["agent"]["episodes"]
