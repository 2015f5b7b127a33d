"""foxdqn.logger.prometheus_log: gauges of log rows and of guard ring records, served on loopback;
the port is freed on close; tensors are refused."""
import errno
import math
import socket
import urllib.error
import urllib.request

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from foxdqn.device import ring_record as R
from foxdqn.device.host_ring import HostRingReader
from foxdqn.logger import MetricsLogger
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


def ring_with(step: int, q_step: int, **flags) -> HostRingReader:
    """A host ring holding one complete record of update ``step`` (Q columns of update ``q_step``)."""
    ring = R.new_ring(4, pin_memory=False)
    row = ring[step % 4]
    row[R.Q_STEP], row[R.Q_MIN], row[R.Q_MAX], row[R.Q_MEAN] = q_step, -1.5, 2.5, 0.25
    row[R.STEP], row[R.RAW_LOSS], row[R.CLIPPED_LOSS], row[R.RAW_GRAD_NORM], row[R.COLLAPSE_COUNT] = step, 7.0, 5.0, 0.5, 2
    for name, col in (("halt_nan", R.HALT_NAN), ("halt_loss_clip", R.HALT_LOSS_CLIP), ("skip", R.SKIP),
                      ("halted", R.HALTED), ("q_divergence", R.Q_DIVERGENCE)):
        row[col] = float(flags.get(name, False))
    if "max_weight" in flags:
        row[R.MAX_WEIGHT] = flags["max_weight"]
    row[R.COMMIT] = step
    return HostRingReader(ring)


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
    each other; an endpoint without the ring serves no ring gauge."""
    prom = PrometheusExporter(0, "127.0.0.1", {"run": "test_run"}, row_labels=("member", "job", "seed"), ring=False)
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
    prom = PrometheusExporter(0, "127.0.0.1", {"run": "test_run"}, row_labels=("member", "job", "seed"), ring=False)
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


def test_ring_gauges_show_the_newest_record(exporter):
    samples = scrape(exporter.url)  # before any record: NaN, not a reassuring 0
    assert all(math.isnan(value(samples, "foxdqn_guard_flag", flag=f)) for f in FLAGS)
    assert math.isnan(value(samples, "foxdqn_q_mean")) and math.isnan(value(samples, "foxdqn_guard_step"))
    exporter.observe(None)  # no complete record yet: nothing changes
    exporter.observe(ring_with(9, 9, halt_nan=True, halted=True).latest())
    samples = scrape(exporter.url)
    flags = {f: value(samples, "foxdqn_guard_flag", flag=f) for f in FLAGS}
    assert flags == {"halt_nan": 1, "halt_loss_clip": 0, "halt_grad_collapse": 0, "halt_weight": 0, "q_divergence": 0,
                     "skip": 0, "halted": 1}
    assert math.isnan(value(samples, "foxdqn_guard_max_weight"))  # the weight check is off in this ring
    assert value(samples, "foxdqn_guard_step") == 9 and value(samples, "foxdqn_guard_raw_loss") == 7.0
    assert value(samples, "foxdqn_guard_clipped_loss") == 5.0 and value(samples, "foxdqn_guard_raw_grad_norm") == 0.5
    assert value(samples, "foxdqn_guard_collapse_count") == 2
    assert (value(samples, "foxdqn_q_min"), value(samples, "foxdqn_q_max"), value(samples, "foxdqn_q_mean"),
            value(samples, "foxdqn_q_step")) == (-1.5, 2.5, 0.25, 9)


def test_a_record_without_fresh_q_values_keeps_the_last_ones(exporter):
    exporter.observe(ring_with(9, 9).latest())
    newer = ring_with(10, 4, skip=True).latest()  # Q columns of another update: reported as None
    assert newer["q_mean"] is None
    exporter.observe(newer)
    samples = scrape(exporter.url)
    assert value(samples, "foxdqn_guard_step") == 10 and value(samples, "foxdqn_guard_flag", flag="skip") == 1
    assert value(samples, "foxdqn_q_step") == 9 and value(samples, "foxdqn_q_mean") == 0.25
    exporter.observe(ring_with(11, 11, max_weight=3.5).latest())  # a run with guard.max_weight
    assert value(scrape(exporter.url), "foxdqn_guard_max_weight") == 3.5


def test_tensors_are_refused(exporter):
    with pytest.raises(TypeError, match="never tensors"):
        exporter.log(1, {"train/loss": torch.tensor(0.5)})
    record = ring_with(3, 3).latest()
    with pytest.raises(TypeError, match="never tensors"):
        exporter.observe({**record, "raw_loss": torch.tensor(1.0)})


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


def test_metrics_logger_feeds_and_closes_the_exporter(tmp_path):
    prom = PrometheusExporter(0, labels=LABELS)
    with MetricsLogger(tmp_path / "run", tensorboard=False, prometheus=prom) as logger:
        logger.log(64, {"train/loss": 0.125})
        assert value(scrape(prom.url), "foxdqn_train_loss") == 0.125
    assert (tmp_path / "run" / "metrics.csv").read_text().splitlines()[1] == "64,0.125"
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(prom.url, timeout=2)


def test_metrics_logger_closes_the_exporter_when_it_cannot_start(tmp_path):
    (tmp_path / "file").write_text("")
    prom = PrometheusExporter(0)
    with pytest.raises(OSError):
        MetricsLogger(tmp_path / "file", tensorboard=False, prometheus=prom)
    probe(prom.port)  # the endpoint was stopped
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(prom.url, timeout=2)
