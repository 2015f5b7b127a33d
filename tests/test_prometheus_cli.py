"""``logger.prometheus.port``: the endpoint answers on loopback during a smoke run with the expected
metric names and is gone (port free) when the run ends; a port in use is refused before training."""
import csv
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from foxdqn.config.compose import load_config
from foxdqn.errors import ConfigError
from foxdqn.logger.prometheus_log import FLAGS, GUARD_VALUES, probe

ROOT = Path(__file__).resolve().parents[1]
ROW_GAUGES = {"foxdqn_train_loss", "foxdqn_train_grad_norm", "foxdqn_train_episode_return", "foxdqn_train_epsilon",
              "foxdqn_train_env_steps_per_s", "foxdqn_train_mean_max_q", "foxdqn_env_steps"}
#: the guard's gauges of a member (a single run is a population of one: foxdqn.population.train)
GUARD_GAUGES = {"foxdqn_" + name for name in GUARD_VALUES}
# never NaN once fed (a row's loss or episode return may be NaN: an interval without updates / finished episodes)
FINITE_ONCE_FED = {"foxdqn_env_steps", "foxdqn_train_epsilon", "foxdqn_train_env_steps_per_s"} | GUARD_GAUGES


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args, cwd) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "foxdqn.train", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def scrape(port: int) -> dict[str, dict[tuple, float]] | None:
    """{metric name: {labels: value}} of http://127.0.0.1:port/metrics, or None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def fed(metrics: dict | None) -> bool:
    """Every expected gauge is there and has a value: a log row and the guard's state were seen."""
    if metrics is None or not (ROW_GAUGES | GUARD_GAUGES) <= set(metrics):
        return False
    return all(not math.isnan(v) for name in FINITE_ONCE_FED for v in metrics[name].values())


@pytest.mark.slow
def test_endpoint_serves_the_metric_names_during_a_smoke_run(tmp_path):
    port = free_port()
    # a smoke run made long enough (a few seconds of training) to be scraped while it trains
    proc = start(["debug=smoke", "debug.max_env_steps=32768", "device=cpu", "log.progress=false",
                  "log.interval_env_steps=1024", f"logger.prometheus.port={port}", f"hydra.run.dir={tmp_path / 'run'}"],
                 cwd=tmp_path)
    try:
        seen, deadline = None, time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            metrics = scrape(port)
            if fed(metrics):
                seen = metrics
                proc.send_signal(signal.SIGINT)  # seen: the rest of the run would only take time; a stop closes the endpoint too
                break
            time.sleep(0.05)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (0, 130), stderr[-2000:]  # 130: stopped by the SIGINT above (0: it had just finished)
    assert seen is not None, f"the endpoint never showed every gauge with a value while the run trained:\n{stderr[-2000:]}"
    labels = (("job", "0"), ("member", "0"), ("run", "eurusd_dqn"), ("seed", "0"))
    assert set(seen["foxdqn_guard_flag"]) == {tuple(sorted((*labels, ("flag", f)))) for f in FLAGS}
    assert all(v in (0.0, 1.0) for v in seen["foxdqn_guard_flag"].values())
    assert all(set(seen[name]) == {labels} for name in ROW_GAUGES | GUARD_GAUGES)
    assert seen["foxdqn_guard_halt_updates"][labels] == seen["foxdqn_guard_halt_env_steps"][labels] == -1  # running
    assert seen["foxdqn_guard_flag"][tuple(sorted((*labels, ("flag", "halted"))))] == 0
    with open(tmp_path / "run" / "metrics.csv", newline="") as f:
        columns = next(csv.reader(f))[1:]
    assert all(name in seen for name in (f"foxdqn_{c.replace('/', '_')}" for c in columns if c.startswith("train/")))
    assert f"http://127.0.0.1:{port}/metrics" in stdout + stderr  # the log line that says where to scrape
    assert scrape(port) is None  # the run stopped its server: the port is free for the next run
    probe(port)


@pytest.mark.slow
def test_multirun_jobs_reuse_a_fixed_port(train_cli, tmp_path):
    """The basic launcher runs jobs one after another; each closes its endpoint, so the next binds the port."""
    port = free_port()
    res = train_cli(["--multirun", "debug=smoke", "debug.max_env_steps=1024", "device=cpu", "log.progress=false",
                     f"logger.prometheus.port={port}", "seed=0,1", f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (res.stdout + res.stderr).count(f"http://127.0.0.1:{port}/metrics") == 2  # both jobs served on it
    assert all((tmp_path / "sweep" / job / "eval" / "summary.json").is_file() for job in ("0", "1"))
    probe(port)


def test_a_port_in_use_is_refused_before_training(train_cli, tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        res = train_cli(["debug=smoke", "device=cpu", f"logger.prometheus.port={port}",
                         f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"foxdqn: error: logger.prometheus.port={port}: ")
    assert "already in use" in lines[0]
    assert not (tmp_path / "run").exists()  # refused before any folder was made


def test_the_trainer_names_the_key_when_the_port_is_taken_after_the_check():
    from foxdqn.run.trackers import open_prometheus

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        cfg = load_config(["debug=smoke", "device=cpu", f"logger.prometheus.port={port}"])
        with pytest.raises(ConfigError, match=f"^logger.prometheus.port={port}: .*already in use"):
            open_prometheus(cfg)
    assert open_prometheus(load_config(["debug=smoke", "device=cpu"])) is None
