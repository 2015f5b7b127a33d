"""hydra/launcher=population (hydra_plugins.foxdqn_population): the plugin is found and composes,
its setting is checked, and a multirun through it groups the jobs, leaves every job folder as the
basic launcher would, trains groups of one by the classic path and the larger ones by
foxdqn.population.train.train_population (faked here: tests/population/fake_trainer_run.py),
reports failures with their exit codes, and keeps CheckJobs and the sweep report around it.
Also the collection types of foxdqn.population.jobs."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from foxdqn.population.jobs import COLLECTOR, Collector, Member, Outcome
from support import CliServer

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).with_name("fake_trainer_run.py")
TARGET = "hydra_plugins.foxdqn_population.population_launcher.PopulationLauncher"
SMOKE = ["+experiment=cartpole_cleanrl", "debug=smoke", "debug.max_env_steps=1024", "device=cpu"]


# ---------------------------------------------------------------------------------- in process


def test_the_twins_of_a_log_file_route_a_line_by_its_job_without_asking_every_twin(tmp_path):
    """_Twins: a line about job N reaches job N's file only, a line about no job every file, one
    about a job it does not hold none; the twins keep the model's level, format and its filters but
    the first member's _OneJob; a line about one job is filtered by one twin, not by all P."""
    import logging

    from hydra_plugins.foxdqn_population.population_launcher import _OneJob, _Twins

    model = logging.FileHandler(tmp_path / "first.log")
    model.setLevel(logging.INFO)
    model.setFormatter(logging.Formatter("[%(levelname)s] %(message)s"))
    asked = []

    class Counting(logging.Filter):
        def filter(self, record):
            asked.append(record.getMessage())
            return "drop" not in record.getMessage()

    model.addFilter(Counting())
    model.addFilter(_OneJob(0))
    twins = _Twins(model)
    for job in (1, 2, 3):
        twins.add(job, tmp_path / f"{job}.log")
    assert all(not any(isinstance(f, _OneJob) for f in t.filters) for t in twins.files.values())
    logger = logging.getLogger("test_twins")
    logger.propagate, logger.level = False, logging.DEBUG
    logger.addHandler(twins)
    try:
        logger.info("everyone")
        asked.clear()
        logger.info("only two", extra={"foxdqn_job": 2})
        assert asked == ["only two"]  # one twin asked, not three
        logger.info("another population's", extra={"foxdqn_job": 7})
        logger.info("drop this")
        logger.debug("below the level")
    finally:
        logger.removeHandler(twins)
        twins.close()
        model.close()
    text = {job: (tmp_path / f"{job}.log").read_text() for job in (1, 2, 3)}
    assert text[1] == text[3] == "[INFO] everyone\n"
    assert text[2] == "[INFO] everyone\n[INFO] only two\n"


def test_outcome_checks_its_code_and_summary():
    assert Outcome({"selection": {"metric": "mean_return", "value": 1.0}}, 0).message == ""
    assert Outcome(None, 3, "training halted: x").exit_code == 3
    with pytest.raises(ValueError, match="exit_code=1"):
        Outcome(None, 1, "x")
    with pytest.raises(ValueError, match="selection"):
        Outcome({"metrics": {}}, 0)


def test_collector_is_active_only_inside_collecting():
    collector = Collector()
    member = Member(None, None, Path("/x"), 0, [])
    with pytest.raises(RuntimeError, match="outside a collection"):
        collector.add(member)
    with pytest.raises(KeyError):
        with collector.collecting():
            collector.add(member)
            assert collector.active and collector.members == [member]
            raise KeyError("boom")
    assert not collector.active and collector.members == [member]
    with collector.collecting():
        assert collector.members == []  # a new collection starts empty
        with pytest.raises(RuntimeError, match="already running"):
            with collector.collecting():
                pass
    assert not COLLECTOR.active  # the process's collector is idle outside a launch


def test_launcher_is_registered_and_composes_from_our_conf():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.plugins import Plugins
    from hydra.plugins.launcher import Launcher
    from hydra.utils import instantiate

    import hydra_plugins.foxdqn_population.population_launcher as module
    from foxdqn.config.compose import conf_folder

    module.register()
    PopulationLauncher = module.PopulationLauncher  # Hydra's scan may have run the module again: its class now
    assert PopulationLauncher in Plugins.instance().discover(Launcher)
    try:
        with initialize_config_dir(str(conf_folder()), version_base="1.3"):
            cfg = compose("train", overrides=["hydra/launcher=population", "hydra.launcher.max_members=2"],
                          return_hydra_config=True)
            assert dict(cfg.hydra.launcher) == {"_target_": TARGET, "max_members": 2, "n_jobs": None}
            assert compose("train", overrides=["hydra/launcher=population"],
                           return_hydra_config=True).hydra.launcher.max_members is None
            launcher = instantiate(cfg.hydra.launcher)
            assert isinstance(launcher, PopulationLauncher) and launcher.max_members == 2
            with pytest.raises(Exception, match="max_members"):
                compose("train", overrides=["hydra/launcher=population", "hydra.launcher.max_members=two"],
                        return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()


def test_max_members_below_one_is_one_line_and_exit_2(capsys):
    from hydra_plugins.foxdqn_population.population_launcher import PopulationLauncher

    with pytest.raises(SystemExit) as exc:
        PopulationLauncher(max_members=0).setup(hydra_context=None, task_function=None, config=None)
    assert exc.value.code == 2
    assert capsys.readouterr().err == ("foxdqn: error: hydra.launcher.max_members=0 must be >= 1 "
                                       "(or null: no limit)\n")


# ---------------------------------------------------------------------------------- subprocesses


@pytest.fixture(scope="module")
def fake_trainer(tmp_path_factory):
    """``python tests/population/fake_trainer_run.py ARGS`` calls from one server's forked children
    (support.CliServer: one interpreter start and import of foxdqn.train for the module's calls)."""
    server = CliServer(str(FAKE), {**os.environ, "PYTHONPATH": str(ROOT)}, tmp_path_factory.mktemp("fake_trainer"))
    yield server
    server.close()


@pytest.fixture
def run(fake_trainer):
    """``run(ARGS, tmp_path, **ENV)``: the fake trainer's multirun of ARGS into ``tmp_path/s``, its
    calls and job ends logged beside, ENV the variables the fake reads as it runs (FAKE_HALT_SEED)."""
    def call(args, tmp_path, **env):
        env = {"FAKE_POPULATION_CALLS": str(tmp_path / "calls.jsonl"), "FAKE_JOB_ENDS": str(tmp_path / "ends.jsonl"),
               **env}
        return fake_trainer.run(["--multirun", *args, f"hydra.sweep.dir={tmp_path / 's'}"], cwd=tmp_path,
                                timeout=300, environ=env)
    return call


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def test_plugin_scan_finds_the_launcher_beside_the_installed_plugins(tmp_path):
    """From a source checkout (PYTHONPATH=.): hydra_plugins/ has no __init__.py, so it is one
    namespace package with the installed plugins' folders, and Hydra's scan imports our module
    without a warning."""
    assert not (ROOT / "hydra_plugins" / "__init__.py").exists()
    code = ("from hydra.core.plugins import Plugins; from hydra.plugins.launcher import Launcher; "
            "print(' '.join(f'{c.__module__}.{c.__name__}' for c in Plugins.instance().discover(Launcher)))")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr
    found = res.stdout.split()
    assert TARGET in found
    assert "hydra._internal.core_plugins.basic_launcher.BasicLauncher" in found
    try:
        import hydra_plugins.hydra_joblib_launcher  # noqa: F401 - an installed plugin in the same namespace
    except ImportError:
        pass
    else:
        assert "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher" in found
    assert "Error importing" not in res.stderr and "plugins scanner" not in res.stderr, res.stderr


def test_multirun_groups_jobs_into_populations(run, tmp_path):
    """seed=0,1,2 x two widths, at most 2 members: per width the first two seeds are a population
    (the fake trainer), the third trains alone (the classic path); seed 1 halts (exit 3 at the end)."""
    res = run([*SMOKE, "seed=0,1,2", "model.hidden=[8],[16]", "hydra/launcher=population",
               "hydra.launcher.max_members=2", "+hydra.callbacks.record._target_=__main__.RecordReturns"],
              tmp_path, FAKE_HALT_SEED="1")
    assert res.returncode == 3, res.stderr[-3000:]
    sweep = tmp_path / "s"
    job_dirs = sorted((p for p in sweep.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    assert [p.name for p in job_dirs] == [str(i) for i in range(6)]
    overrides = {int(p.name): yaml.safe_load((p / ".hydra" / "overrides.yaml").read_text()) for p in job_dirs}
    for p in job_dirs:  # Hydra's files and the job log, as with the basic launcher
        assert {"config.yaml", "hydra.yaml", "overrides.yaml"} <= {f.name for f in (p / ".hydra").iterdir()}
        assert (p / "train.log").is_file()
    width = {j: next(o for o in ov if o.startswith("model.hidden=")) for j, ov in overrides.items()}
    expected = []
    for w in dict.fromkeys(width[j] for j in sorted(width)):
        same = [j for j in sorted(width) if width[j] == w]
        expected += [same[:2], same[2:]]
    populations = [g for g in expected if len(g) == 2]
    alone = [g[0] for g in expected if len(g) == 1]
    assert len(populations) == 2 and len(alone) == 2

    calls = read_lines(tmp_path / "calls.jsonl")
    assert [[m["job"] for m in call] for call in calls] == populations
    for call in calls:
        for m in call:
            assert m["run_dir"] == str(sweep / str(m["job"]))
            assert m["overrides"] == overrides[m["job"]]
            assert f"seed={m['seed']}" in m["overrides"]
            assert width[m["job"]] == f"model.hidden={m['hidden']}".replace(" ", "")
        assert len({m["seed"] for m in call}) == 2 and len({str(m["hidden"]) for m in call}) == 1
    for group in populations:
        line = f"population of 2 members (jobs {group[0]}, {group[1]})"
        assert line in res.stdout
        for j in group:
            assert line in (sweep / str(j) / "train.log").read_text()  # each member's log has the population's lines

    from fake_trainer_run import fake_value  # tests/population is on sys.path (pytest's rootdir insertion)

    ends = {e["job"]: e for e in read_lines(tmp_path / "ends.jsonl")}
    assert sorted(ends) == list(range(6))
    halted = sorted(m["job"] for call in calls for m in call if m["seed"] == 1)
    for call in calls:
        for m in call:
            if m["seed"] == 1:
                assert ends[m["job"]] == {"job": m["job"], "value": None, "summary": False}
            else:
                value = fake_value(m["seed"], m["hidden"], m["lr"])
                assert ends[m["job"]] == {"job": m["job"], "value": value, "summary": True}
    for j in alone:  # the classic path: a complete run folder, its real validation value returned
        for rel in ("config.yaml", "metrics.csv", "checkpoints/last.pt", "eval/summary.json"):
            assert (sweep / str(j) / rel).is_file(), rel
        summary = json.loads((sweep / str(j) / "eval" / "summary.json").read_text())
        assert ends[j]["summary"] and ends[j]["value"] == pytest.approx(summary["selection"]["value"])
        assert f"job {j} trains alone" in (sweep / str(j) / "train.log").read_text()
    assert [line for line in res.stderr.splitlines() if line.startswith("foxdqn: error:")] == [
        *(f"foxdqn: error: job {j}: training halted: fake halt" for j in halted),
        "foxdqn: error: 2 job(s) of the multirun failed (see above and report.md)"]
    report = json.loads((sweep / "report.json").read_text())
    status = {row["job"]: row["status"] for row in report["jobs"]}
    assert [j for j in range(6) if status[str(j)] == "ok"] == sorted(j for j in range(6) if j not in halted)
    assert (sweep / "report.md").is_file()
    timings = json.loads((sweep / "timings.json").read_text())  # the sweep's breakdown (foxdqn.timings)
    assert (timings["jobs"], timings["populations"]) == (6, 2)
    assert "summary" in timings["phases"]
    # from the process start, the jobs that trained alone one phase (the last group is one of them)
    assert timings["origin"] == "process start" and timings["phases"]["jobs_alone"] > 0 and "imports" in timings["phases"]
    assert timings["total_s"] == pytest.approx(sum(timings["phases"].values()), abs=0.01)
    assert "sweep breakdown: wall" in res.stdout + res.stderr


def test_a_sweep_whose_jobs_all_train_alone_writes_no_sweep_timings(run, tmp_path):
    """Two structures of one job each: both train alone, as single runs, each with its own
    timings.json; the sweep writes none of its own (it would be empty: every job's time is in its
    own file) and prints no sweep breakdown."""
    res = run([*SMOKE, "seed=0", "model.hidden=[8],[16]", "hydra/launcher=population"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    sweep = tmp_path / "s"
    assert not read_lines(tmp_path / "calls.jsonl")  # no population trained
    for j in (0, 1):
        assert f"job {j} trains alone" in (sweep / str(j) / "train.log").read_text()
        assert json.loads((sweep / str(j) / "timings.json").read_text())["phases"]["training"] > 0
    assert not (sweep / "timings.json").exists() and "sweep breakdown" not in res.stdout + res.stderr


def test_a_job_refused_at_its_start_fails_alone(run, tmp_path):
    """Without CheckJobs' precheck (as under Optuna) a bad job is refused when it starts: NaN, its
    folder removed, the others train; the multirun exits 2 at the end."""
    res = run([*SMOKE, "seed=0,1", "optim.lr=1e-3,-1", "hydra/launcher=population", "~hydra.callbacks.check_jobs"],
              tmp_path)
    assert res.returncode == 2, res.stderr[-3000:]
    sweep = tmp_path / "s"
    calls = read_lines(tmp_path / "calls.jsonl")
    assert len(calls) == 1 and sorted(m["seed"] for m in calls[0]) == [0, 1]
    assert all("optim.lr=0.001" in m["overrides"] for m in calls[0])
    good = sorted(m["job"] for m in calls[0])
    assert sorted(int(p.name) for p in sweep.iterdir() if p.name.isdigit()) == good  # refused folders removed
    for j in good:
        assert (sweep / str(j) / "eval" / "summary.json").is_file()
    errors = [line for line in res.stderr.splitlines() if line.startswith("foxdqn: error:")]
    assert len(errors) == 3 and all("optim.lr=-1.0 must be > 0" in e for e in errors[:2])
    assert (sweep / "report.md").is_file()


def test_optuna_batch_is_one_population(run, tmp_path):
    """Optuna calls launch() once per batch of n_jobs trials: each batch is a population, and each
    trial's value (the fake's validation value) reaches the sampler."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    res = run([*SMOKE, "hydra/sweeper=optuna", "hydra.sweeper.direction=maximize", "hydra.sweeper.n_trials=4",
               "hydra.sweeper.n_jobs=2", "optim.lr=interval(0.0001,0.001)", "hydra/launcher=population"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    calls = read_lines(tmp_path / "calls.jsonl")
    assert [[m["job"] for m in call] for call in calls] == [[0, 1], [2, 3]]
    from fake_trainer_run import fake_value

    values = [fake_value(m["seed"], m["hidden"], m["lr"]) for call in calls for m in call]
    result = yaml.safe_load((tmp_path / "s" / "optimization_results.yaml").read_text())
    assert result["best_value"] == pytest.approx(max(values))


def test_two_jobs_of_one_folder_are_one_line_and_exit_2_before_training(run, tmp_path):
    """Jobs whose hydra.sweep.subdir resolves to one folder: one line naming both jobs and the
    folder, exit 2, nothing trained (each would otherwise fail on the other's lock)."""
    res = run([*SMOKE, "seed=0,1", "hydra.sweep.subdir=fixed", "hydra/launcher=population"], tmp_path)
    assert res.returncode == 2, res.stderr[-3000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("foxdqn: error:")]
    folder = (tmp_path / "s" / "fixed").resolve()
    assert errors == [f"foxdqn: error: jobs #0 and #1 would write into one output folder {folder}: "
                      "give each job a folder of its own (hydra.sweep.subdir; Hydra's default ${hydra.job.num} is one "
                      "per job), or resume each run once"], res.stderr[-3000:]
    assert not (tmp_path / "calls.jsonl").exists()


def test_checkjobs_still_prechecks_every_job(run, tmp_path):
    res = run([*SMOKE, "seed=0,1", "optim.lr=1e-3,-1", "hydra/launcher=population"], tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip().startswith("foxdqn: error: job ") and "optim.lr=-1.0 must be > 0" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists() and not (tmp_path / "calls.jsonl").exists()


def test_deal_balances_members_over_workers():
    from hydra_plugins.foxdqn_population.population_launcher import deal

    groups = [list(range(n)) for n in (3, 8, 2, 5, 5)]
    share = deal(groups, 2)
    assert sorted(sum(len(g) for g in mine) for mine in share) == [11, 12]
    assert sorted(len(g) for mine in share for g in mine) == [2, 3, 5, 5, 8]
    assert deal(groups, 1) == [sorted(groups, key=len, reverse=True)]
    assert [len(mine) for mine in deal(groups[:2], 4)] == [1, 1, 0, 0]


def test_worker_trains_its_populations_and_writes_their_outcomes(tmp_path):
    """foxdqn.population.worker: two populations in turn, their outcomes pickled back, each
    member's log lines in its train.log."""
    import pickle

    from foxdqn.config.compose import load_config
    from foxdqn.population.jobs import Member

    def member(job, seed):
        run_dir = tmp_path / str(job)
        run_dir.mkdir()
        tc = load_config(["+experiment=cartpole_cleanrl", "debug=smoke", "device=cpu", "log.progress=false",
                          "logger=csv", f"seed={seed}", "agent.total_env_steps=600", "eval.episodes=4"])
        return Member(tc, None, run_dir, job, [f"seed={seed}"])

    groups = [[member(0, 0), member(1, 1)], [member(2, 2), member(3, 3)]]
    out = tmp_path / "out.pkl"
    src = tmp_path / "in.pkl"
    src.write_bytes(pickle.dumps(groups))
    from foxdqn.population.worker import main as worker_main

    assert worker_main([str(src), str(out)]) == 0
    results = pickle.loads(out.read_bytes())
    assert len(results) == 2 and all(len(r) == 2 for r in results)
    for group, outcomes in zip(groups, results):
        for m, o in zip(group, outcomes):
            assert o.exit_code == 0 and o.summary["population"]["jobs"] == [g.job_num for g in group]
            assert (m.run_dir / "eval" / "summary.json").is_file()
            assert "population of 2 members" in (m.run_dir / "train.log").read_text()
