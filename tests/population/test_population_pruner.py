"""The search's median pruner in a population (``search.pruner=median``, foxdqn.run.search,
foxdqn.population.train): each member has its own pruner (its job number, the sweep folder), fed
its validation values as a single run's; a member below the median of the sweep's finished jobs
stops where a single run would, is reported as pruned, and equals its population of one bit for
bit, while the members above the median train to the end."""
from __future__ import annotations

import json
import math

import pytest

from foxdqn.io_atomic import write_json_atomic
from foxdqn.job.run import objective
from foxdqn.population.jobs import FINISHED, Member
from foxdqn.population.train import train_population
from foxdqn.run.checkpoint import load_checkpoint
from foxdqn.run.search import PRUNING_FOLDER, MedianTrialPruner
from support import skip_module_without
from test_population import configs, market_for
from test_population_early_stop import BASE, EARLY, MEMBERS, assert_same_run, metrics

skip_module_without("optuna")

PRUNE = ["search.pruner=median", "search.n_startup_trials=1"]
JOBS = [1, 2, 3]  # job 0: a finished job of the sweep, written by the test


def train(base, members, folder, sweep, jobs):
    """Train ``members`` (override lists on ``base``) as one population of the sweep folder ``sweep``,
    job ``jobs[p]`` in ``folder/<job>``; their outcomes."""
    tcs = configs(base, members)
    market = market_for(tcs[0])
    outcomes = train_population([Member(tc, market, folder / str(j), j, list(extra), sweep_dir=sweep)
                                 for j, tc, extra in zip(jobs, tcs, members)])
    assert all(o.exit_code == FINISHED for o in outcomes), [o.message for o in outcomes]
    return outcomes


def record(sweep, job):
    return json.loads((sweep / PRUNING_FOLDER / f"{job}.json").read_text())


def finished_job(sweep, intermediate, job=0):
    """Job ``job`` of the sweep ``sweep``: finished, with validation ``intermediate`` ({env steps: value})."""
    write_json_atomic(sweep / PRUNING_FOLDER / f"{job}.json", {"state": "complete", "direction": "maximize",
                                                          "intermediate": {str(k): v for k, v in intermediate.items()}})


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The three members trained first with no finished job in their sweep folder (none is pruned),
    then again with one finished job whose value at their first pruning step lies between the
    lowest member's value and the others': (free outcomes, free folder, pruned outcomes, pruned
    folder, the finished job's values)."""
    root = tmp_path_factory.mktemp("pruner")
    free = train([*BASE, *PRUNE], MEMBERS, root / "free", root / "free", JOBS)
    reported = [{int(k): v for k, v in record(root / "free", j)["intermediate"].items()} for j in JOBS]
    first = min(reported[0])
    values = sorted(r[first] for r in reported)
    assert all(math.isfinite(v) for v in values) and len(set(values)) == 3, values
    intermediate = {first: (values[0] + values[1]) / 2}
    finished_job(root / "sweep", intermediate)
    pruned = train([*BASE, *PRUNE], MEMBERS, root / "sweep", root / "sweep", JOBS)
    return free, root / "free", pruned, root / "sweep", intermediate


def test_members_report_their_validation_and_count_once_finished(sweep):
    """With no finished job nothing is pruned; each member's file holds its val metric at each
    validation after the warm-up (not the last one) and says complete at the end."""
    free, folder, _, _, _ = sweep
    for j, o in zip(JOBS, free):
        assert o.summary["stop"]["reason"] == "completed" and o.summary["selection"]["excluded"] is None
        rec = record(folder, j)
        assert rec["state"] == "complete" and rec["direction"] == "maximize"
        val = metrics(folder / str(j)).dropna(subset=["val/sharpe"]).set_index("step")["val/sharpe"]
        steps = [int(k) for k in rec["intermediate"]]
        assert steps == [s for s in val.index if s > 96]  # after the collect-only iterations
        assert [rec["intermediate"][str(s)] for s in steps] == [float(val[s]) for s in steps]


def test_a_member_below_the_median_is_pruned_there_and_the_others_are_not(sweep):
    _, _, outcomes, folder, intermediate = sweep
    (at,) = intermediate
    stops = [o.summary["stop"] for o in outcomes]
    pruned = [p for p, s in enumerate(stops) if s["reason"] == "pruned"]
    assert len(pruned) == 1, stops  # the lowest member; the two above the median train to the end
    (low,) = pruned
    assert stops[low]["at_env_steps"] == at and outcomes[low].summary["env_steps"] == at
    assert stops[low]["detail"] == "search.pruner=median: validation below the median of the sweep's finished jobs"
    assert outcomes[low].summary["selection"]["excluded"] == "pruned" and math.isnan(objective(outcomes[low].summary))
    assert metrics(folder / str(JOBS[low]))["step"].max() == at  # no row after the prune
    assert load_checkpoint(folder / str(JOBS[low]) / "checkpoints" / "last.pt")["env_steps"] == at
    for p, o in enumerate(outcomes):
        if p != low:
            assert stops[p]["reason"] == "completed" and o.summary["env_steps"] == 720
            assert o.summary["selection"]["excluded"] is None and not math.isnan(objective(o.summary))
            assert metrics(folder / str(JOBS[p]))["train/updates"].max() > outcomes[low].summary["updates"]
    states = {path.stem: json.loads(path.read_text())["state"] for path in (folder / PRUNING_FOLDER).glob("*.json")}
    assert states == {"0": "complete", **{str(j): "pruned" if p == low else "complete" for p, j in enumerate(JOBS)}}


def test_each_members_decision_is_the_single_runs_pruner_on_its_values(sweep, tmp_path):
    """The single run's pruner (a MedianTrialPruner of its own, the same finished job) fed a member's
    validation values stops at the member's stop, or never for a member that was not pruned."""
    _, _, outcomes, folder, intermediate = sweep
    finished_job(tmp_path, intermediate)
    search = configs([*BASE, *PRUNE], [[]])[0].search
    for p, (j, o) in enumerate(zip(JOBS, outcomes)):
        single = MedianTrialPruner(tmp_path, j, search)
        prunes_at = next((int(s) for s, v in record(folder, j)["intermediate"].items() if single.report(int(s), v)),
                         None)
        assert prunes_at == (o.summary["stop"]["at_env_steps"] if o.summary["stop"]["reason"] == "pruned" else None)


def test_pruned_population_members_equal_populations_of_one(sweep, tmp_path):
    """Each member (the pruned one and the two that trained on) equals its population of one in a
    sweep folder with the same finished job: metrics.csv, summary stop/selection/evaluated/counts/
    metrics, checkpoints and its pruning record, bit for bit."""
    _, _, outcomes, folder, intermediate = sweep
    for p, j in enumerate(JOBS):
        alone = tmp_path / f"alone{p}"
        finished_job(alone, intermediate)
        (o,) = train([*BASE, *PRUNE], [MEMBERS[p]], alone, alone, [j])
        assert o.summary["stop"] == outcomes[p].summary["stop"]
        assert_same_run(folder / str(j), alone / str(j))
        assert record(alone, j) == record(folder, j)


def test_a_member_is_pruned_where_its_single_run_is(tmp_path, monkeypatch):
    """With early stopping on and a finished job far above anything the runs reach, a single run
    (foxdqn.train's: a population of one, alone) and the population's members stop at their first
    validation after the warm-up, with the same ``stop`` entry; the kept weights before it (none)
    are not evaluated."""
    from foxdqn.run import search

    from support import train_run as single_train

    base = [*EARLY, *PRUNE]
    high = {s: 1e9 for s in range(48, 720, 48)}
    finished_job(tmp_path / "single", high)
    finished_job(tmp_path / "pop", high)
    cfg = configs(base, [MEMBERS[0]])[0]
    with monkeypatch.context() as m:
        m.setattr(search, "member_pruner", lambda member: search.MedianTrialPruner(tmp_path / "single", 1, cfg.search))
        single = single_train(cfg, market_for(cfg), tmp_path / "single" / "1")
    assert single["stop"]["reason"] == "pruned" and single["selection"]["excluded"] == "pruned"
    outcomes = train(base, MEMBERS[:2], tmp_path / "pop", tmp_path / "pop", [1, 2])
    for o in outcomes:
        assert o.summary["stop"] == single["stop"]
        assert o.summary["env_steps"] == single["env_steps"] and o.summary["evaluated"] == single["evaluated"]
        assert o.summary["selection"]["excluded"] == "pruned"
    assert list(record(tmp_path / "pop", 1)["intermediate"]) == list(record(tmp_path / "single", 1)["intermediate"])
    assert record(tmp_path / "single", 1)["state"] == record(tmp_path / "pop", 1)["state"] == "pruned"


def test_a_pruned_population_multirun_from_the_command_line(train_cli, tmp_path):
    """``--multirun ... search.pruner=median hydra/launcher=population`` with a relative sweep folder
    holding a finished job far above the members: the three seeds train as one population (jobs 1
    and 2 derived from job 0), each member's pruner writes into the sweep folder, and each is pruned
    at its first validation after the warm-up (510 collect-only env steps, a validation every 500),
    with its console line."""
    finished_job(tmp_path / "s", {500 * k: 1e9 for k in range(1, 9)}, job=99)  # (a job of an earlier launch)
    res = train_cli(["--multirun", "+experiment=cartpole_cleanrl", "debug=smoke", "device=cpu", "log.progress=false",
                     "logger=csv", "seed=0,1,2", "eval.interval_env_steps=500", "search.pruner=median",
                     "search.n_startup_trials=1", "hydra/launcher=population", "hydra.sweep.dir=s"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout + res.stderr
    assert "population of 3 members (jobs 0, 1, 2)" in out and "2 derived from the 1 Hydra composed" in out
    for j in range(3):
        summary = json.loads((tmp_path / "s" / str(j) / "eval" / "summary.json").read_text())
        assert summary["stop"]["reason"] == "pruned" and summary["stop"]["at_env_steps"] == 1000
        assert summary["env_steps"] == 1000 and summary["population"]["size"] == 3
        assert record(tmp_path / "s", j) == {"state": "pruned", "direction": "maximize",
                                             "intermediate": {"1000": summary["selection"]["value"]}}
        assert f"job {j}: pruned at 1000 env steps: validation" in out


def test_member_pruner_is_none_where_the_setting_cannot_act(tmp_path, caplog):
    """A member without the setting, outside a multirun (no sweep folder) or without validation
    during training gets no pruner (the last two with a warning naming the job) and writes no file."""
    from foxdqn.run.search import member_pruner

    def member(extra, sweep_dir=tmp_path):
        (tc,) = configs([*BASE, *extra], [[]])
        return Member(tc, None, tmp_path / "7", 7, [], sweep_dir=sweep_dir)

    assert member_pruner(member([])) is None
    assert member_pruner(member(PRUNE, sweep_dir=None)) is None
    assert member_pruner(member([*PRUNE, "eval.interval_env_steps=0"])) is None
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2 and all(w.startswith("job 7: search.pruner=median ") for w in warnings), warnings
    assert not (tmp_path / PRUNING_FOLDER).exists()
    pruner = member_pruner(member(PRUNE))
    assert pruner.path == tmp_path / PRUNING_FOLDER / "7.json" and record(tmp_path, 7)["state"] == "running"
