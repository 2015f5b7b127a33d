"""logger.mlflow, logger.wandb and logger.prometheus.port in a population (foxdqn.population.train):
each member gets what its single run gets (an MLflow run and an offline W&B run of its own, with its
resolved config, every metrics row and its final metrics; a halted member's runs end as failed),
and the population serves one Prometheus endpoint whose series carry the member, so members never
overwrite each other. CartPole, smoke sizes, CPU; one population of three members for the module
(member 2 halts on an injected NaN), scraped at every log boundary."""
from __future__ import annotations

import json
import logging
import math
import socket
import urllib.error
import urllib.request

import pandas as pd
import pytest

from support import skip_module_without

skip_module_without("mlflow")
skip_module_without("wandb")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from foxdqn.config.compose import load_config  # noqa: E402
from foxdqn.config.schema import to_plain  # noqa: E402
from foxdqn.logger.mlflow_log import RUN_ID_FILE, flat_params  # noqa: E402
from foxdqn.logger.prometheus_log import FLAGS, GUARD_VALUES  # noqa: E402
from foxdqn.logger.wandb_log import RUN_ID_FILE as WANDB_ID_FILE  # noqa: E402
from foxdqn.population import train as population_train  # noqa: E402
from foxdqn.population.jobs import FINISHED, HALTED, Member  # noqa: E402

from support import wandb_history, wandb_offline_runs  # noqa: E402

#: (seed, more overrides) of each member; member 2's update 15 is NaN: it halts (after its row at 600
#: env steps, the first with updates; a halted member logs no row from its halt's iteration on), the others finish
MEMBERS = [(0, []), (1, ["optim.lr=0.0005"]), (2, ["debug.inject_nan_at_step=15"])]
JOB_OFFSET = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of one scrape."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def population(tmp_path_factory):
    """The three members, their outcomes, the scrapes taken right after each log boundary, the
    endpoint's URL and the log records of the population."""
    tmp = tmp_path_factory.mktemp("population_loggers")
    uri, port = f"sqlite:///{tmp / 'mlflow.db'}", free_port()
    members = []
    for p, (seed, more) in enumerate(MEMBERS):
        job = JOB_OFFSET + p  # Hydra's job numbers need not be the member indices
        run_dir = tmp / str(job)
        run_dir.mkdir()
        tc = load_config(["+experiment=cartpole_cleanrl", "debug=smoke", "device=cpu", "log.progress=false",
                          "logger=[csv,mlflow,wandb]", f"logger.mlflow_uri={uri}", f"logger.prometheus.port={port}",
                          "agent.total_env_steps=800", "log.interval_env_steps=100", "eval.episodes=4", f"seed={seed}", *more])
        members.append(Member(tc, None, run_dir, job, [f"seed={seed}", *more]))
    scrapes, urls = [], []
    original = population_train._Population._log_rows

    def log_rows(self, rate, last):
        returns = original(self, rate, last)
        self._write_rows()  # the boundary's rows (the loop writes them during the next iterations)
        urls.append(self.prometheus.url)
        scrapes.append(scrape(self.prometheus.url))
        return returns

    lines, root = _Lines(), logging.getLogger("foxdqn")
    level = root.level
    root.addHandler(lines)
    root.setLevel(logging.INFO)
    try:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(population_train._Population, "_log_rows", log_rows)
            outcomes = population_train.train_population(members)
    finally:
        root.removeHandler(lines)
        root.setLevel(level)
    return members, outcomes, scrapes, urls[0], lines.records, uri


@pytest.mark.slow
def test_the_members_train_with_the_loggers_on(population):
    members, outcomes, *_ = population
    assert [o.exit_code for o in outcomes] == [FINISHED, FINISHED, HALTED], [o.message for o in outcomes]


def test_each_member_has_its_own_mlflow_run_as_its_single_run_would(population):
    from mlflow.tracking import MlflowClient

    members, outcomes, _, _, records, uri = population
    client = MlflowClient(tracking_uri=uri)
    ids = [(m.run_dir / RUN_ID_FILE).read_text().split() for m in members]
    assert len({run_id for run_id, _ in ids}) == 3 and {store for _, store in ids} == {uri}
    for m, outcome, (run_id, _) in zip(members, outcomes, ids):
        run = client.get_run(run_id)
        # params: the member's own resolved config, flattened (its seed, its lr), as a single run logs
        assert run.data.params == flat_params(to_plain(m.tc))
        assert run.data.params["seed"] == str(m.tc.seed) and run.data.params["optim.lr"] == str(m.tc.optim.lr)
        assert run.data.tags["foxdqn.run_dir"] == str(m.run_dir.resolve())
        assert run.data.tags["foxdqn.overrides"] == " ".join(o for o in m.overrides if not o.startswith("seed="))
        rows = pd.read_csv(m.run_dir / "metrics.csv").dropna(subset=["train/loss"])
        history = client.get_metric_history(run_id, "train/loss")
        assert [h.step for h in history] == rows["step"].tolist() and len(history) >= 1  # its own rows only
        assert [h.value for h in history] == pytest.approx(rows["train/loss"].tolist())
        if outcome.exit_code == FINISHED:
            assert run.info.status == "FINISHED"
            assert outcome.summary["mlflow"] == {"tracking_uri": uri, "run_id": run_id}
            for k, v in outcome.summary["metrics"]["agent"].items():
                assert run.data.metrics[f"eval/episodes/{k}"] == pytest.approx(v)
            assert run.data.metrics["eval/val_selection"] == pytest.approx(outcome.summary["selection"]["value"])
        else:  # halted by the guard: failed, as a single run's halt
            assert run.info.status == "FAILED" and not any(k.startswith("eval/") for k in run.data.metrics)
        # the line naming the run: the console and the member's own train.log (foxdqn_job)
        assert any(getattr(r, "foxdqn_job", None) == m.job_num and f"mlflow: run {run_id} in {uri}" in r.getMessage()
                   for r in records)


def test_each_member_has_its_own_offline_wandb_run_in_its_folder(population):
    members, outcomes, _, _, records, _ = population
    for m, outcome in zip(members, outcomes):
        run_id = (m.run_dir / WANDB_ID_FILE).read_text().strip()
        files, (recs,) = wandb_offline_runs(m.run_dir)
        assert files[0].name == f"run-{run_id}.wandb"
        (run,) = [r.run for r in recs if r.WhichOneof("record_type") == "run"]
        config = {u.key: json.loads(u.value_json) for u in run.config.update}
        assert config["seed"] == m.tc.seed and config["optim"]["lr"] == m.tc.optim.lr  # its own, nested
        history = wandb_history(recs)
        rows = pd.read_csv(m.run_dir / "metrics.csv").dropna(subset=["train/loss"])
        losses = [(h["_step"], h["train/loss"]) for h in history if "train/loss" in h]
        assert [s for s, _ in losses] == rows["step"].tolist()
        assert [v for _, v in losses] == pytest.approx(rows["train/loss"].tolist())
        exits = [r.exit.exit_code for r in recs if r.WhichOneof("record_type") == "exit"]
        final = [h for h in history if "eval/val_selection" in h]
        if outcome.exit_code == FINISHED:
            assert exits == [0]
            assert outcome.summary["wandb"] == {"mode": "offline", "run_id": run_id, "folder": str(files[0].parent)}
            assert len(final) == 1 and final[0]["_step"] == outcome.summary["env_steps"]
            for k, v in outcome.summary["metrics"]["agent"].items():
                assert final[0][f"eval/episodes/{k}"] == pytest.approx(v)
        else:
            assert exits == [1] and not final
        assert any(getattr(r, "foxdqn_job", None) == m.job_num and f"wandb: offline run {run_id} in {files[0].parent}"
                   in r.getMessage() for r in records)


def test_one_prometheus_endpoint_with_a_series_per_member(population):
    members, outcomes, scrapes, url, *_ = population
    assert len(scrapes) >= 2
    run = members[0].tc.experiment
    for p, m in enumerate(members):
        rows = pd.read_csv(m.run_dir / "metrics.csv")
        labels = (("job", str(m.job_num)), ("member", str(p)), ("run", run), ("seed", str(m.tc.seed)))
        # each boundary's scrape shows the member's own last row, whatever the others logged after it
        for samples, (_, row) in zip(scrapes, rows.iterrows()):
            assert samples[("foxdqn_env_steps", labels)] == row["step"]
            for column in ("train/loss", "train/epsilon", "train/episodes"):
                got = samples[("foxdqn_" + column.replace("/", "_"), labels)]
                assert (math.isnan(got) and math.isnan(row[column])) or got == pytest.approx(row[column])
    last = scrapes[-1]
    rows = pd.read_csv(members[2].run_dir / "metrics.csv")
    assert len(rows) < len(scrapes)  # the halted member logged no more rows: its series kept its last one
    labels = (("job", str(JOB_OFFSET + 2)), ("member", "2"), ("run", run), ("seed", "2"))
    assert last[("foxdqn_env_steps", labels)] == rows["step"].iloc[-1]
    steps = [v for (name, _), v in last.items() if name == "foxdqn_env_steps"]
    assert len(steps) == 3  # one series per member, no series without the member
    assert not any(name.startswith("foxdqn_q_") for name, _ in last)  # no ring record: no per-update Q gauges
    with pytest.raises(urllib.error.URLError):  # the endpoint closed with the training
        urllib.request.urlopen(url, timeout=2)


def test_each_member_has_its_guard_gauges(population):
    """The old single run's guard-ring gauges, per member from the guard's host copy at each log
    boundary: member 2's NaN at update 15 shows as halt_nan, halted and skip from the boundary after
    it on (its halt point: 15 updates applied), the others' flags stay 0 and their step advances."""
    members, outcomes, scrapes, url, *_ = population
    run = members[0].tc.experiment

    def guard(samples, p):
        labels = (("job", str(JOB_OFFSET + p)), ("member", str(p)), ("run", run), ("seed", str(members[p].tc.seed)))
        flags = {f: samples[("foxdqn_guard_flag", tuple(sorted((*labels, ("flag", f)))))] for f in FLAGS}
        values = {name: samples[("foxdqn_" + name, labels)] for name in GUARD_VALUES}
        return flags, values

    steps = []
    for samples in scrapes:
        for p in (0, 1):
            flags, values = guard(samples, p)
            assert set(flags.values()) == {0.0}, (p, flags)
            assert values["guard_halt_updates"] == values["guard_halt_env_steps"] == -1
            assert values["guard_collapse_count"] == 0  # the collapse check is off in this config
        steps.append(guard(samples, 0)[1]["guard_step"])
    assert steps == sorted(steps) and steps[0] == -1 < steps[-1]  # no update before learning_starts, then counting
    flags, values = guard(scrapes[-1], 2)
    assert flags == {**{f: 0.0 for f in FLAGS}, "halt_nan": 1.0, "skip": 1.0, "halted": 1.0}
    assert values["guard_step"] == values["guard_halt_updates"] == 15 and values["guard_halt_env_steps"] > 0
    assert guard(scrapes[0], 2)[0]["halted"] == 0.0  # before the NaN
