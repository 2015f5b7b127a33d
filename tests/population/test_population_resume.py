"""A population resumes (CPU): every member's checkpoints/last.pt holds its slice of the population,
and a population interrupted by SIGINT/SIGTERM (or stopped at a periodic checkpoint) and resumed
from those files, in any order or grouping of its members, ends bit for bit as the uninterrupted
one (weights, metrics.csv rows, summary). docs/design/population.md#what-a-population-supports ("Resume")."""
from __future__ import annotations

import json
import os
import signal

import sys

import pandas as pd
import pytest
import torch

import foxdqn.population.train as train_module
from foxdqn.errors import StoppedBySignal
from foxdqn.population.checkpoint import ENVS, SCRATCH, LayoutError, POSITION, SHARED, layout, state_parts
from foxdqn.population.jobs import Member
from foxdqn.population.state import build_population
from foxdqn.run.checkpoint import load_checkpoint
from foxdqn.run.resume import read_checkpoint
from test_population import CARTPOLE, CPU, TRADING, configs, market_for

TIMING = ["train/env_steps_per_s"]
RUN = ["logger=csv", "checkpoint.save_replay=true"]
CART_RUN = [*CARTPOLE, *RUN, "agent.total_env_steps=1024", "log.interval_env_steps=64",
            "checkpoint.every_env_steps=128"]
TRADE_RUN = [*TRADING, *RUN, "replay=per", "agent.total_env_steps=720", "agent.learning_starts=96",
             "log.interval_env_steps=48", "checkpoint.every_env_steps=96", "eval.interval_env_steps=144",
             "early_stop.enabled=true", "early_stop.patience=2"]
MEMBERS = [["seed=0"], ["seed=1", "optim.lr=3e-3"], ["seed=2", "agent.gamma=0.9"]]

#: settings whose state differs (heads, objectives, encoders, actions, replay, controls, envs)
LAYOUT_CASES = {
    "cartpole": CARTPOLE,
    "iqn_cql": [*TRADING, "head=iqn", "head.num_quantiles=8", "head.num_target_quantiles=6",
                "head.num_quantiles_policy=4", "objective.cql_alpha=1"],
    "iql_c51": [*TRADING, "objective.iql=true"],
    "c51": [*TRADING, "head=c51"],
    "attention_branching": [*TRADING, "model=attention", "model.width=8", "model.heads=2", "model.layers=2",
                            "action=branching"],
    "routed_switch": [*TRADING, "action=exposure_routed", "action.switch_margin=0.1"],
    "augment": [*TRADING, "data.augment.method=block_bootstrap", "data.augment.paths=3",
                "data.augment.block_length=6"],
    "controls": [*TRADING, "replay=per", "prune.enabled=true", "optim.accumulate=2", "regime.enabled=true",
                 "guard.max_weight=10", "guard.collapse_multiplier=2", "early_stop.enabled=true",
                 "early_stop.on_q_divergence=true", "eval.interval_env_steps=96"],
    "gym": ["+experiment=cartpole_gym", "debug=smoke", "device=cpu", "log.progress=false", "env.num_envs=2"],
    "bitflip_her_per": ["+experiment=bitflip_her", "debug=smoke", "device=cpu", "log.progress=false",
                        "env.num_envs=4", "env.n_bits=5", "replay.capacity=512", "replay=per"],
}


@pytest.mark.parametrize("case", sorted(LAYOUT_CASES))
def test_every_state_tensor_has_a_member_layout_that_scales_with_p(case):
    """Every tensor of a population of 2 and of 3 has a LAYOUT rule; a member tensor's axis holds
    its width per member, a shared tensor has one shape whatever P."""
    shapes = {}
    for members in (2, 3):
        cfgs = configs(LAYOUT_CASES[case], [[f"seed={i}"] for i in range(members)])
        s = build_population(cfgs, market_for(cfgs[0]), CPU)
        shapes[members] = {k: tuple(t.shape) for k, t in state_parts(s)}
    n = cfgs[0].env.num_envs
    assert shapes[2].keys() == shapes[3].keys()
    for path, two in shapes[2].items():
        kind, dim, width = layout(path)
        three = shapes[3][path]
        if kind == SHARED:
            assert two == three, path
        elif kind not in (POSITION, SCRATCH):
            w = n if width == ENVS else width
            assert (two[dim], three[dim]) == (2 * w, 3 * w), path
            assert two[:dim] + two[dim + 1:] == three[:dim] + three[dim + 1:], path


@pytest.mark.parametrize("case", ["cartpole", "iqn_cql", "iql_c51", "attention_branching", "controls"])
def test_checkpoints_from_one_host_copy_equal_those_read_member_by_member(case, tmp_path):
    """member_checkpoint with a HostCopy of the population (one device read for all members, the
    networks' member_state_dict read from their host twins) writes what it writes alone, resumable
    and best-weights checkpoints alike, and the networks keep their own tensors afterwards."""
    import copy

    from foxdqn.population.checkpoint import HostCopy, member_checkpoint
    from test_population import run

    cfgs = configs(LAYOUT_CASES[case], [[f"seed={i}"] for i in range(3)])
    s = run(cfgs, iterations=2, collect_first=4)
    best = tuple(None if net is None else copy.deepcopy(net) for net in (s.online, s.target, s.value))
    with torch.no_grad():
        for t in best[0].parameters():
            t.mul_(0.5)
    nets = (s.online, s.target, s.value)
    before = {id(t) for net in nets if net is not None for t in [*net.parameters(), *net.buffers()]}
    host = HostCopy(s, best)
    copies = {id(copy) for *_, copy in host.parts if copy is not None}
    for group in (nets, best):  # every tensor read from the host copy (on CUDA: no device read in the writer's thread)
        for net in group:
            twin = host.twin(net)
            assert (twin is None) == (net is None) and host.twin(net) is twin  # built once
            for name, t in [] if net is None else [*twin.named_parameters(), *twin.named_buffers()]:
                assert id(t) in copies, f"{case}: {type(net).__name__}.{name} is not a host copy"
    with pytest.raises(ValueError, match="no host copy"):
        host.twin(copy.deepcopy(s.online))  # a network the copy was not taken of
    for p in range(3):
        for kind, args in (("last", dict(loop={"p": p}, best=best, run_id="r")), ("best", dict(nets=best, counts=(5, 6)))):
            a = load_checkpoint(member_checkpoint(s, p, tmp_path / "alone" / f"{kind}{p}.pt", **args))
            b = load_checkpoint(member_checkpoint(s, p, tmp_path / "host" / f"{kind}{p}.pt", host=host, **args))
            assert_payloads_equal(a, b, f"{case} {kind} member {p}")
    assert {id(t) for net in nets if net is not None for t in [*net.parameters(), *net.buffers()]} == before


def assert_payloads_equal(a, b, where):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_payloads_equal(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    else:
        assert a == b, where


@pytest.mark.parametrize("case", ["controls", "bitflip_her_per"])
def test_the_counters_are_kept_without_the_replay(case):
    """PER's β reads the population's update counter: a checkpoint without the replay
    (checkpoint.save_replay=false) still holds it, as ``updates`` (it was named
    replay.priorities.updates and lost, so a resumed run restarted its schedules: pruning, β, the
    target period); a slice written before, without ``updates``, resumes from its member_state's count."""
    from pathlib import Path
    from types import SimpleNamespace

    from foxdqn.population.checkpoint import member_tensors
    from foxdqn.population.resume import restore_members

    cfgs = configs(LAYOUT_CASES[case], [["seed=0"], ["seed=1"]])
    s = build_population(cfgs, market_for(cfgs[0]), CPU)
    s.updates.fill_(7)
    s.env_steps.fill_(40)
    paths = dict(state_parts(s))
    assert paths["updates"] is s.updates and paths["env_steps"] is s.env_steps
    assert s.replay.priorities.updates is s.updates  # the tensor PER's schedule reads
    slices = [member_tensors(s, p, save_replay=False) for p in range(2)]
    assert all(int(t["updates"]) == 7 and int(t["env_steps"]) == 40 for t in slices)
    if case == "controls":  # the pruning masks' k table is built from the schedule, never saved
        assert "pruner.k_table" in paths and not any("pruner.k_table" in t for t in slices)
    fresh = build_population(cfgs, market_for(cfgs[0]), CPU)
    old = [{k: v for k, v in t.items() if k != "updates"} for t in slices]  # as written before the fix
    members = [SimpleNamespace(payload={"member_state": {"tensors": t, "replay_saved": False, "loop": {},
                                                        "env_steps": 40, "updates": 7}}, run_dir=tmp)
               for t, tmp in zip(old, (Path("a"), Path("b")))]
    restored = restore_members(fresh, members, None)
    assert restored.updates == 7 and int(fresh.updates) == 7 and int(fresh.env_steps) == 40


def test_a_tensor_without_a_rule_is_an_error():
    with pytest.raises(LayoutError, match="no member layout"):
        layout("somewhere.new_state")


class Killed(Exception):
    """Stands in for kill -9 in process: the loop ends at once, nothing more is written."""


def interrupt_at(monkeypatch, iteration: int, signum: int | None) -> None:
    """The population's training loop receives ``signum`` (a real signal, to its real handler)
    when it calls an iteration for the ``iteration``-th time; None: :class:`Killed` is raised there."""
    import foxdqn.population.train as train_mod

    real, calls = train_mod.make_iteration, {"n": 0}

    def make_iteration(*args, **kwargs):
        fn = real(*args, **kwargs)

        def interrupting():
            calls["n"] += 1
            if calls["n"] == iteration:
                if signum is None:
                    raise Killed
                os.kill(os.getpid(), signum)
            return fn()
        return interrupting

    monkeypatch.setattr(train_mod, "make_iteration", make_iteration)


def members_of(cfgs, root, payloads=None):
    """One Member per config, in ``root/<p>``; with ``payloads`` (checkpoint dicts) resumed."""
    out = []
    for p, tc in enumerate(cfgs):
        payload = None if payloads is None else payloads[p]
        out.append(Member(tc, market_for(tc), root / str(p), p, [], payload=payload,
                          run_id=None if payload is None else payload["run_id"]))
    return out


def train(cfgs, root, payloads=None):
    from foxdqn.population.train import train_population

    return train_population(members_of(cfgs, root, payloads))


def assert_same_run(a, b):
    """Run folders ``a`` and ``b``: the same final weights, counters, metrics.csv rows and summary metrics."""
    ca, cb = load_checkpoint(a / "checkpoints" / "last.pt"), load_checkpoint(b / "checkpoints" / "last.pt")
    for name in ("online", "target"):
        for key in ca[name]:
            assert torch.equal(ca[name][key], cb[name][key]), (a, name, key)
    assert (ca["env_steps"], ca["updates"]) == (cb["env_steps"], cb["updates"])
    ma = pd.read_csv(a / "metrics.csv").drop(columns=TIMING)
    mb = pd.read_csv(b / "metrics.csv").drop(columns=TIMING)
    pd.testing.assert_frame_equal(ma, mb)  # no row twice, none lost
    sa, sb = (json.loads((d / "eval" / "summary.json").read_text()) for d in (a, b))
    for key in ("metrics", "env_steps", "updates", "selection", "stop"):
        assert sa.get(key) == sb.get(key), key
    assert not (b / "INCOMPLETE").exists()


def interrupted_then_resumed(monkeypatch, cfgs, root, at, signum, order):
    """Train ``cfgs`` in ``root`` until the ``at``-th iteration's signal (exit 128 + signal, INCOMPLETE
    kept; None: killed there, the periodic checkpoint stays), then resume the members in the groups
    ``order`` (lists of member indices)."""
    interrupt_at(monkeypatch, at, signum)
    with pytest.raises(Killed if signum is None else StoppedBySignal) as stopped:
        train(cfgs, root)
    if signum is not None:
        assert stopped.value.exit_code == 128 + signum
        print(f"foxdqn: error: {stopped.value}", file=sys.stderr)  # what foxdqn.train prints of it
    monkeypatch.undo()
    payloads = [read_checkpoint(root / str(p) / "checkpoints" / "last.pt") for p in range(len(cfgs))]
    steps = {pl["member_state"]["env_steps"] for pl in payloads}
    assert len(steps) == 1 and 0 < steps.pop() < cfgs[0].agent.total_env_steps
    assert all((root / str(p) / "INCOMPLETE").exists() for p in range(len(cfgs)))
    for group in order:
        from foxdqn.population.train import train_population

        members = members_of(cfgs, root, payloads)
        outcomes = train_population([members[p] for p in group])
        assert [o.exit_code for o in outcomes] == [0] * len(group)
    return payloads[0]["member_state"]["env_steps"]


def test_cartpole_population_interrupted_and_resumed_equals_uninterrupted(tmp_path, monkeypatch, capfd):
    cfgs = configs(CART_RUN, MEMBERS)
    assert [o.exit_code for o in train(cfgs, tmp_path / "whole")] == [0, 0, 0]
    # SIGINT, then resumed as two populations, in another order
    interrupted_then_resumed(monkeypatch, cfgs, tmp_path / "cut", 70, signal.SIGINT, [[2, 0], [1]])
    err = capfd.readouterr().err
    assert "foxdqn: error: interrupted by SIGINT at 280 env steps; each member's state is in its" in err
    assert "continue with the same command and resume=auto hydra.sweep.dir=" in err
    # killed at once (no handler) after a periodic checkpoint: it continues from that checkpoint
    assert interrupted_then_resumed(monkeypatch, cfgs, tmp_path / "killed", 150, None, [[1, 2, 0]]) == 512
    for p in range(3):
        assert_same_run(tmp_path / "whole" / str(p), tmp_path / "cut" / str(p))
        assert_same_run(tmp_path / "whole" / str(p), tmp_path / "killed" / str(p))


def test_a_periodic_checkpoint_waits_for_its_rows_and_holds_the_collapse_monitors_they_left(tmp_path, monkeypatch):
    """Without the replay in the checkpoints, a periodic checkpoint goes to the writer after its
    boundary's rows (here, with no row budget between boundaries, at the next boundary): its files
    are written once those rows are in every metrics.csv, and each holds its member's collapse
    monitor as the rows up to the checkpoint leave it (min_entropy 1: almost every interval low,
    a warning at the 10th low one in a row), recomputed here from metrics.csv."""
    from foxdqn.logger.diversity import CollapseMonitor
    from foxdqn.population.writer import BackgroundWriter

    root = tmp_path / "run"
    cfgs = configs([*CART_RUN, "checkpoint.save_replay=false", "diversity.min_entropy=1.0", "diversity.patience=10"],
                   MEMBERS)
    written, submit = [], BackgroundWriter.submit

    def checked_submit(writer, items):
        rows = {int(pd.read_csv(root / str(p) / "metrics.csv")["step"].max()) for p in range(3)}
        submit(writer, items)
        writer.wait()
        states = [read_checkpoint(root / str(p) / "checkpoints" / "last.pt")["member_state"] for p in range(3)]
        written.append((rows, {s["env_steps"] for s in states}, [s["loop"]["collapse"] for s in states]))

    monkeypatch.setattr(train_module, "DEFERRED_ROWS_S", 0.0)
    monkeypatch.setattr(BackgroundWriter, "submit", checked_submit)
    assert [o.exit_code for o in train(cfgs, root)] == [0, 0, 0]
    # every periodic checkpoint (128 ... 896 env steps) after its boundary's rows, the final one after all
    assert [(rows, steps) for rows, steps, _ in written] == [({x}, {x}) for x in [*range(128, 1024, 128), 1024]]
    for p in range(3):
        metrics = pd.read_csv(root / str(p) / "metrics.csv")
        for _, (at,), states in written:
            monitor = CollapseMonitor(1.0, 10)
            for step, h in zip(metrics["step"], metrics["train/action_entropy_norm"]):
                if step <= at:
                    monitor.update(h, step)
            assert states[p] == monitor.state_dict(), (p, at)
        assert written[-1][2][p]["warnings"] == 1 and written[3][2][p]["warnings"] == 0  # the warning after 512


@pytest.fixture(scope="module")
def trading_whole(tmp_path_factory):
    """The uninterrupted TRADE_RUN population (read only by the tests below, which interrupt their own)."""
    root = tmp_path_factory.mktemp("whole")
    assert [o.exit_code for o in train(configs(TRADE_RUN, MEMBERS), root)] == [0, 0, 0]
    return root


@pytest.mark.parametrize("at", [30, 40])  # 360 env steps: best weights kept; 480: a member early-stopped at 432
def test_trading_per_population_with_early_stopping_resumes_bit_for_bit(tmp_path, monkeypatch, at, trading_whole):
    cfgs = configs(TRADE_RUN, MEMBERS)
    interrupted_then_resumed(monkeypatch, cfgs, tmp_path / "cut", at, signal.SIGTERM, [[0, 1, 2]])
    stopped = [json.loads((trading_whole / str(p) / "eval" / "summary.json").read_text())["stop"]
               for p in range(3)]
    assert sum(s["reason"] == "early_stop_val" and s["at_env_steps"] < at * 12 for s in stopped) == (at == 40)
    for p in range(3):
        assert_same_run(trading_whole / str(p), tmp_path / "cut" / str(p))


SWEEP = ["--multirun", "+experiment=cartpole_cleanrl", "debug=smoke", "device=cpu", "log.progress=false", "logger=csv",
         "seed=0,1", "optim.lr=1e-3", "agent.total_env_steps=16384", "checkpoint.every_env_steps=2048",
         "checkpoint.save_replay=true", "hydra/launcher=population", "resume=auto"]


def interrupted_sweep(cli, sweep, cwd):
    """The SWEEP multirun in ``sweep`` (a child of conftest's ``cli`` server: the process once its
    imports are done), stopped by SIGINT once both members wrote a checkpoint; returns its stderr."""
    import time

    proc = cli.start("foxdqn.train", [*SWEEP, f"hydra.sweep.dir={sweep}"], cwd=cwd)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not all((sweep / j / "checkpoints" / "last.pt").is_file() for j in "01"):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    err = proc.wait(timeout=300).stderr
    assert proc.returncode == 130, err[-2000:]
    return err


@pytest.mark.slow
def test_a_population_multirun_interrupted_continues_with_the_same_command(cli, train_cli, tmp_path):
    """SIGINT: every member's checkpoint, INCOMPLETE kept, one line naming the command; the same
    command (resume=auto) regroups the members and each ends as the uninterrupted run's; a member
    whose record was edited, or whose checkpoint is another run's, is refused with one line (exit 2)
    and left as it was, while the others continue."""
    import shutil

    whole = train_cli([*SWEEP, f"hydra.sweep.dir={tmp_path / 'whole'}"], cwd=tmp_path, timeout=600)
    assert whole.returncode == 0, whole.stderr[-2000:]
    err = interrupted_sweep(cli, tmp_path / "cut", tmp_path)
    assert err.strip().splitlines()[-1].endswith(
        f"continue with the same command and resume=auto hydra.sweep.dir={tmp_path / 'cut'}")
    assert all((tmp_path / "cut" / j / "INCOMPLETE").is_file() for j in "01")
    shutil.copytree(tmp_path / "cut", tmp_path / "edited")
    shutil.copytree(tmp_path / "cut", tmp_path / "mixed")
    res = train_cli([*SWEEP, f"hydra.sweep.dir={tmp_path / 'cut'}"], cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "population of 2 members (jobs 0, 1)" in res.stdout + res.stderr
    for j in "01":
        assert_same_run(tmp_path / "whole" / j, tmp_path / "cut" / j)

    record = tmp_path / "edited" / "1" / "config.yaml"
    record.write_text(record.read_text().replace("lr: 0.001", "lr: 0.002"))
    shutil.copy(tmp_path / "mixed" / "0" / "checkpoints" / "last.pt", tmp_path / "mixed" / "1" / "checkpoints")
    for sweep, said in (("edited", "config.yaml was edited after the run started"),
                        ("mixed", "belongs to another run")):
        before = (tmp_path / sweep / "1" / "checkpoints" / "last.pt").read_bytes()
        res = train_cli([*SWEEP, f"hydra.sweep.dir={tmp_path / sweep}"], cwd=tmp_path, timeout=600)
        assert res.returncode == 2, res.stderr[-2000:]
        lines = [ln for ln in res.stderr.splitlines() if ln.startswith("foxdqn: error: job 1: ")]
        assert len(lines) == 1 and said in lines[0], res.stderr[-2000:]
        assert (tmp_path / sweep / "1" / "INCOMPLETE").is_file() and not (tmp_path / sweep / "1" / "eval").exists()
        assert (tmp_path / sweep / "1" / "checkpoints" / "last.pt").read_bytes() == before
        assert_same_run(tmp_path / "whole" / "0", tmp_path / sweep / "0")  # the other member continued alone
