"""Host envs (env=gym) on CUDA: the update-only iteration is one captured CUDA graph that reads only
the device replay and never synchronises; the eager host collection around it does not disturb it."""
import pytest
import torch

from foxdqn.step.iteration import WARMUP_ITERATIONS, HostEnvIteration, make_iteration

from support import experiment_state, forbid_syncs, no_host_sync

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", ["cartpole_gym", "pong_dqn"])
def test_gym_update_step_is_captured_and_sync_free(monkeypatch, name):
    if name == "pong_dqn":
        pytest.importorskip("ale_py")
    s, _ = experiment_state(name, device="cuda")
    collect, full = make_iteration(s, True, updates=0), make_iteration(s, True)
    assert isinstance(full, HostEnvIteration)
    for _ in range(4):
        collect()
    for _ in range(WARMUP_ITERATIONS + 1):
        full()
    assert full.graph is not None  # the K updates are one graph
    torch.cuda.synchronize()
    updates = int(s.updates)
    for _ in range(10):
        full.collect()  # host env step: the one action copy per env step happens here, outside the graph
        with no_host_sync(), monkeypatch.context() as m:
            forbid_syncs(m)
            full.update()  # graph replay: no host read, no synchronising call
            s.monitors.guard.reader.latest()
    torch.cuda.synchronize()
    assert int(s.updates) == updates + 10 * s.cfg.agent.updates_per_iter
    assert s.replay.obs.dtype == (torch.uint8 if name == "pong_dqn" else torch.float32)
    assert all(torch.isfinite(p).all() for p in s.nets.online.parameters())
    s.rollout.env.close()
