"""foxdqn.run.loop: the log row of one snapshot reads the guard's and the Q monitor's accumulators by
name and ε as the device computes it (no host recomputation)."""
import math

import pytest
import torch

from foxdqn.run.loop import Snapshotter
from foxdqn.step.iteration import Iteration

from support import experiment_state


def test_snapshot_row_names_accumulators_and_reads_device_epsilon():
    s, _ = experiment_state("cartpole_dqn")
    a = s.cfg.agent
    Iteration(s, False, updates=0)()
    for _ in range(3):
        Iteration(s, False)()
    g = s.monitors.guard.acc.tolist()  # [loss_sum, grad_norm_sum, count, skipped]
    q = s.monitors.qmon.acc.tolist()  # [max_q_sum, samples]
    assert g[2] == 6 and q[1] == 6 * a.batch_size  # 3 iterations x 2 updates
    device_eps = float(s.schedules.epsilon(s.env_steps))
    snapshot = Snapshotter(s)
    row = snapshot()
    assert row["loss"] == pytest.approx(g[0] / g[2]) and row["grad_norm"] == pytest.approx(g[1] / g[2])
    assert row["skipped_updates"] == g[3] == 0 and row["mean_max_q"] == pytest.approx(q[0] / q[1])
    assert snapshot.epsilon == device_eps  # the device value, read back with the accumulators
    env_steps = int(s.env_steps)
    x = s.cfg.explore
    host_eps = x.eps_end + (x.eps_start - x.eps_end) * max(
        0.0, 1.0 - env_steps / max(x.eps_decay_fraction * a.total_env_steps, 1.0))
    assert snapshot.epsilon == pytest.approx(host_eps, rel=1e-6)  # the formula the host used before
    # the snapshot reset the accumulators: an empty interval gives NaN means
    row = snapshot()
    assert math.isnan(row["loss"]) and math.isnan(row["mean_max_q"]) and row["skipped_updates"] == 0
    assert torch.count_nonzero(s.monitors.guard.acc) == 0
