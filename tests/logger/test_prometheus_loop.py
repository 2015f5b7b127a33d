"""The training loop's guard poll feeds the Prometheus ring gauges without reading the device: under
the sync traps (Tensor host-copy methods patched to raise; on CUDA also sync debug mode "error")
the iterations and polls run, and the gauges then show the newest ring record."""
import contextlib
import socket
import urllib.request

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from foxdqn.config.compose import load_config
from foxdqn.run.loop import _Training
from foxdqn.step.iteration import WARMUP_ITERATIONS

from support import forbid_syncs, no_host_sync


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gauges(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {(s.name, s.labels.get("flag")): s.value for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_ring_poll_feeds_the_gauges_without_a_sync(monkeypatch, tmp_path, device):
    cfg = load_config(["+experiment=cartpole_dqn", "debug=smoke", f"device={device}", "log.progress=false",
                       "agent.updates_per_iter=2", f"logger.prometheus.port={free_port()}"])
    run = _Training(cfg, None, tmp_path / "run", None)
    try:
        for _ in range(run.warm_iters):
            run.collect_only()
        for _ in range(WARMUP_ITERATIONS + 2):  # Adam state, and on CUDA the graph's capture
            run.full()
        with monkeypatch.context() as m:
            forbid_syncs(m)
            with no_host_sync() if device == "cuda" else contextlib.nullcontext():
                for _ in range(5):
                    run.full()
                    assert not run._guard_fired()
        if device == "cuda":
            torch.cuda.synchronize()
        assert not run._guard_fired()  # every record written by now: the poll shows the newest
        newest = run.s.monitors.guard.reader.latest()
        seen = gauges(run.prometheus.url)
        assert seen[("foxdqn_guard_step", None)] == newest["step"] == int(run.s.updates) - 1
        assert seen[("foxdqn_guard_raw_loss", None)] == pytest.approx(newest["raw_loss"])
        assert seen[("foxdqn_q_step", None)] == newest["step"]
        assert seen[("foxdqn_q_min", None)] <= seen[("foxdqn_q_mean", None)] <= seen[("foxdqn_q_max", None)]
        assert seen[("foxdqn_guard_flag", "halted")] == 0 and seen[("foxdqn_guard_flag", "halt_nan")] == 0
    finally:
        run.close()
