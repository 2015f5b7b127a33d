"""foxdqn.logger.prometheus_log: gauges of log rows and of population members' guard state, served on loopback;
the port is freed on close; tensors are refused."""
import errno
import math
import socket
import urllib.error
import urllib.request

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from foxdqn.logger.prometheus_log import FLAGS, PrometheusExporter, metric_name, probe

LABELS = {"run": "test_run", "seed": "3"}


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of one scrape."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **extra) -> float:
    return samples[(name, tuple(sorted({**LABELS, **extra}.items())))]


@pytest.fixture
def exporter():
    prom = PrometheusExporter(0, "127.0.0.1", LABELS)
    yield prom
    prom.close()


def test_metric_name_follows_the_csv_column():
    assert metric_name("train/loss") == "foxdqn_train_loss"
    assert metric_name("val/sharpe-ratio.x") == "foxdqn_val_sharpe_ratio_x"


def test_row_gauges_are_served_on_loopback(exporter):
    assert exporter.url == f"http://127.0.0.1:{exporter.port}/metrics" and exporter.port > 0
    exporter.log(512, {"train/loss": 0.25, "train/episode_return": float("nan"), "val/sharpe": 1.5,
                       "train/updates": 12, "note": "text", "missing": None})
    samples = scrape(exporter.url)
    assert value(samples, "foxdqn_train_loss") == 0.25 and value(samples, "foxdqn_val_sharpe") == 1.5
    assert value(samples, "foxdqn_train_updates") == 12 and value(samples, "foxdqn_env_steps") == 512
    assert math.isnan(value(samples, "foxdqn_train_episode_return"))
    assert not any(name in ("foxdqn_note", "foxdqn_missing") for name, _ in samples)
    exporter.log(1024, {"train/loss": 0.5})
    samples = scrape(exporter.url)
    assert value(samples, "foxdqn_train_loss") == 0.5 and value(samples, "foxdqn_env_steps") == 1024


def test_a_population_endpoint_keeps_one_series_per_member():
    """Two members' rows (foxdqn.population.train: one endpoint, labelled per row) never overwrite
    each other; no guard gauge before the trainer gives one."""
    prom = PrometheusExporter(0, "127.0.0.1", {"run": "test_run"}, row_labels=("member", "job", "seed"))
    try:
        first, second = prom.rows({"member": 0, "job": 4, "seed": 0}), prom.rows({"member": 1, "job": 5, "seed": 1})
        first.log(100, {"train/loss": 0.25, "train/epsilon": 0.5})
        second.log(100, {"train/loss": 0.75, "train/epsilon": 0.5})
        first.log(200, {"train/loss": 0.125})  # member 0 goes on; member 1's series keep its row
        samples = scrape(prom.url)
        one = (("job", "4"), ("member", "0"), ("run", "test_run"), ("seed", "0"))
        two = (("job", "5"), ("member", "1"), ("run", "test_run"), ("seed", "1"))
        assert samples[("foxdqn_train_loss", one)] == 0.125 and samples[("foxdqn_env_steps", one)] == 200
        assert samples[("foxdqn_train_loss", two)] == 0.75 and samples[("foxdqn_env_steps", two)] == 100
        assert samples[("foxdqn_train_epsilon", one)] == samples[("foxdqn_train_epsilon", two)] == 0.5
        assert sorted(labels for name, labels in samples if name == "foxdqn_env_steps") == [one, two]
        assert not any(name.startswith(("foxdqn_guard", "foxdqn_q_")) for name, _ in samples)
        with pytest.raises(ValueError, match="row labels"):
            prom.rows({"member": 2})
        with pytest.raises(ValueError, match="row labels"):
            prom.log(300, {"train/loss": 1.0})  # a row of no member
    finally:
        prom.close()


def test_member_guard_gauges_come_from_the_guard_host_copy():
    """A population member's guard gauges (foxdqn.population.member_guard.MemberGuard.gauges, fed at
    each log boundary): a running member, one halted by the kernel (NaN), one stopped early and one
    halted by the Q monitor, each in its own series; only host values, tensors refused."""
    from foxdqn.ops.member_guard import NON_FINITE
    from foxdqn.population.member_guard import MemberGuard

    guard = MemberGuard(torch.full((4,), 1e6), torch.device("cpu"), q_divergence=torch.full((4,), 1e4))
    guard.host[:, 1] = torch.tensor([1, NON_FINITE, 7, 300])  # the kernel halted member 1 at its update 7
    guard.stop(2, "early_stop_val", 40, 900)
    guard.halt_q(3, 40, 900)
    prom = PrometheusExporter(0, "127.0.0.1", {"run": "test_run"}, row_labels=("member", "job", "seed"))
    try:
        rows = [prom.rows({"member": p, "job": p, "seed": 0}) for p in range(4)]
        for p, r in enumerate(rows):
            r.guard(guard.gauges(p, updates=40, collapse_count=p))
        samples = scrape(prom.url)
        with pytest.raises(TypeError, match="never tensors"):
            rows[0].guard({"halted": torch.tensor(1.0)})
    finally:
        prom.close()

    def series(p):
        labels = (("job", str(p)), ("member", str(p)), ("run", "test_run"), ("seed", "0"))
        flags = {f for f in FLAGS if samples[("foxdqn_guard_flag", tuple(sorted((*labels, ("flag", f)))))] == 1}
        return flags, [samples[(f"foxdqn_guard_{k}", labels)] for k in ("step", "collapse_count", "halt_updates",
                                                                        "halt_env_steps")]

    assert series(0) == (set(), [39, 0, -1, -1])
    assert series(1) == ({"halt_nan", "skip", "halted"}, [7, 1, 7, 300])
    assert series(2) == ({"skip"}, [39, 2, 40, 900])  # a stop is not a halt
    assert series(3) == ({"q_divergence", "skip", "halted"}, [39, 3, 40, 900])


def test_tensors_are_refused(exporter):
    with pytest.raises(TypeError, match="never tensors"):
        exporter.log(1, {"train/loss": torch.tensor(0.5)})


def test_close_frees_the_port_and_is_idempotent():
    prom = PrometheusExporter(0)
    port, url = prom.port, prom.url
    scrape(url)
    prom.close()
    prom.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)
    probe(port)  # bindable again
    PrometheusExporter(port).close()  # and servable again: a later run (multirun job) may reuse it


def test_a_port_in_use_raises_oserror():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(OSError) as exc:
            probe(port)
        assert exc.value.errno == errno.EADDRINUSE
        with pytest.raises(OSError) as exc:
            PrometheusExporter(port)
        assert exc.value.errno == errno.EADDRINUSE


def test_two_exporters_in_one_process_keep_their_own_gauges():
    with PrometheusExporter(0, labels=LABELS) as a, PrometheusExporter(0, labels=LABELS) as b:
        a.log(1, {"train/loss": 1.0})
        b.log(2, {"train/loss": 2.0})
        assert value(scrape(a.url), "foxdqn_train_loss") == 1.0
        assert value(scrape(b.url), "foxdqn_train_loss") == 2.0


def test_a_members_rows_reach_the_endpoint_through_its_metrics_logger(tmp_path):
    """A member's rows (:meth:`PrometheusExporter.rows`) are a sink of its MetricsLogger; closing the
    logger leaves the population's endpoint serving (the trainer closes it)."""
    from foxdqn.logger import MetricsLogger

    prom = PrometheusExporter(0, labels={"run": "test_run"}, row_labels=("member",))
    try:
        with MetricsLogger(tmp_path / "run", tensorboard=False, sinks=[prom.rows({"member": 0})]) as logger:
            logger.log(64, {"train/loss": 0.125})
        assert (tmp_path / "run" / "metrics.csv").read_text().splitlines()[1] == "64,0.125"
        samples = scrape(prom.url)
        assert samples[("foxdqn_train_loss", (("member", "0"), ("run", "test_run")))] == 0.125
    finally:
        prom.close()
