"""The JAX peer's training (bench/peers/jax_dqn_cartpole.py) on a short schedule: it runs, times compile
and run apart, and learns. Needs the peers extra (``pip install -e '.[peers]'``); skipped without it,
as in foxdqn's own test venv. The rest of the peer's plumbing: tests/test_bench_population_peer.py."""
import json
import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # collected beside torch's GPU tests: JAX stays off the GPU here
for _module in ("jax", "flax", "optax", "gymnax", "flashbax"):
    pytest.importorskip(_module, reason="the JAX peer needs the peers extra (pip install -e '.[peers]')")

from bench.peers.jax_dqn_cartpole import Settings, main, train  # noqa: E402

#: 2 seeds x 30k env steps with the schedule shortened to fit (about 30 s on 2 CPU cores, most of it compile)
SHORT = Settings(total_env_steps=30_000, learning_starts=1_000, eps_anneal_steps=15_000, eval_episodes=20)


@pytest.mark.slow
def test_two_seeds_learn_and_report_their_times():
    out = train(2, SHORT)
    assert out["seeds"] == 2 and out["env_steps"] == 60_000 and len(out["returns"]) == 2
    assert out["compile_s"] > 0 and out["run_s"] > 0 and out["train_s"] == pytest.approx(
        out["compile_train_s"] + out["run_s"], abs=2e-3)
    assert out["env_steps_per_s"] < out["env_steps_per_s_run"]
    assert len(out["curve"]) == 20 and out["curve"][0] < 40  # ε ≈ 1 at first: random play, about 22 steps
    assert out["return_mean"] > 60 and out["curve"][-1] > 60  # a random policy's greedy return is about 10-25
    assert all(1 <= r <= 500 for r in out["returns"])


@pytest.mark.slow
def test_cli_writes_the_result(tmp_path, capsys):
    path = tmp_path / "peer.json"
    assert main(["--seeds", "1", "--env-steps", "2000", "--settings", json.dumps({"learning_starts": 500}),
                 "--out", str(path)]) == 0
    out = json.loads(path.read_text())
    assert out["settings"]["learning_starts"] == 500 and out["env_steps_per_seed"] == 2000
    assert "JAX peer, 1 seeds x 2000 env steps" in capsys.readouterr().out
