"""foxdqn.envs.gym_adapter: Gymnasium vector envs plugged into training (env=gym env.id=...)."""
import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from foxdqn.config.schema import EnvConfig
from foxdqn.errors import ConfigError
from foxdqn.step.iteration import HostEnvIteration, make_iteration

from support import small_state, step_fns

SHORT_ID = "FoxdqnTest/CartPoleShort-v0"  # CartPole-v1 with a 12-step time limit: both episode ends happen
if SHORT_ID not in gym.registry:
    gym.register(SHORT_ID, entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv", max_episode_steps=12)


def test_cartpole_gym_smoke_training_writes_summary(train_cli, tmp_path):
    run_dir = tmp_path / "run"
    res = train_cli(["+experiment=cartpole_gym", "debug=smoke", "device=cpu", "log.progress=false",
                      "eval.episodes=10", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert summary["env"] == "gym" and summary["env_id"] == "CartPole-v1"
    agent = summary["metrics"]["agent"]
    assert agent["episodes"] == 10 and 8 <= agent["mean_return"] <= 500
    header, *rows = (run_dir / "metrics.csv").read_text().strip().splitlines()
    assert "train/episode_return" in header and "train/loss" in header
    col = header.split(",").index("train/episode_return")
    returns = [float(r.split(",")[col]) for r in rows]
    assert all(8 <= r <= 500 for r in returns if r == r)  # CartPole episodes: 8..500 steps, reward 1 each
    assert summary["updates"] > 0 and (run_dir / "checkpoints" / "last.pt").is_file()


def _reference_check(s, rows: int) -> tuple[int, int]:
    """Replay the stored actions through plain Gymnasium envs (same seeds, reset after every end)
    and compare every stored transition. Returns (terminated, truncated) counts."""
    rep, n = s.replay, s.env.num_envs
    counts = [0, 0]
    for i in range(n):
        env = gym.make(SHORT_ID)
        obs, _ = env.reset(seed=s.env.seed[i])  # the population of one's env i: gym_seed(seed) + i
        for t in range(rows):
            a = int(rep.action[t, i])
            np.testing.assert_array_equal(rep.obs[t, i].numpy(), obs.astype(np.float32), err_msg=f"obs t={t} env={i}")
            nxt, r, term, trunc, _ = env.step(a)
            trunc = trunc and not term
            np.testing.assert_array_equal(rep.next_obs[t, i].numpy(), nxt.astype(np.float32),
                                          err_msg=f"next_obs t={t} env={i}")
            assert float(rep.reward[t, i]) == r
            assert float(rep.terminal[t, i]) == float(term), (t, i)
            assert float(rep.ended[t, i]) == float(term or trunc), (t, i)
            counts[0] += term
            counts[1] += trunc
            obs = env.reset()[0] if (term or trunc) else nxt
        env.close()
    return counts[0], counts[1]


def test_replay_transitions_across_autoreset_match_gymnasium():
    s, _ = small_state(["+experiment=cartpole_gym", f"env.id={SHORT_ID}", "env.num_envs=4", "explore.eps_start=0.5",
                        "explore.eps_end=0.5"])
    it = make_iteration(s, False, updates=0, on_host=s.env.on_host, **step_fns(s))
    assert isinstance(it, HostEnvIteration)
    rows = 60
    for _ in range(rows):
        it()
    terminated, truncated = _reference_check(s, rows)
    assert terminated > 0 and truncated > 0  # both kinds of episode end were stored (and checked)
    # no reset transition: every stored s is the s' of the previous row or an env's reset observation
    assert int(s.replay.written) == rows and int(s.env_steps) == rows * 4
    s.env.close()


def test_adapter_step_outputs_and_episode_stats():
    e = EnvConfig(name="gym", id=SHORT_ID)
    from foxdqn.envs.gym_adapter import GymVectorEnv

    env = GymVectorEnv(e, 2, torch.device("cpu"), seed=3)
    assert (env.obs_dim, env.num_actions, env.obs_dtype, env.max_episode_steps) == (4, 2, torch.float32, 12)
    obs = env.reset_all()
    steps = 0
    while True:  # constant action 0 on env 0 (falls before 12 steps), alternate on env 1 (lasts 12)
        steps += 1
        out = env.step(torch.tensor([0, steps % 2]))
        assert not (out.terminated & out.truncated).any()
        if out.info["episode_done"][1]:
            break
        if out.info["episode_done"][0]:
            assert out.terminated[0] and float(out.info["episode_return"][0]) == steps
            assert int(out.info["episode_length"][0]) == steps
            assert not torch.equal(out.next_obs[0], out.obs[0])  # s' is the final obs, obs the reset one
        else:
            assert torch.equal(out.next_obs, out.obs)
        obs = out.obs
    assert steps == 12 and out.truncated[1] and float(out.info["episode_return"][1]) == 12
    env.close()


@pytest.mark.parametrize("args, needles", [
    (["env=gym", "env.id=NoSuchEnv-v0"], ["env.id=NoSuchEnv-v0", "not a registered"]),
    (["env=gym", "env.id=Pendulum-v1"], ["env.id=Pendulum-v1", "Discrete"]),
    (["env=gym", "env.id=ALE/Pong-v5"], ["model.encoder='mlp'", "env.id=ALE/Pong-v5", "model=nature_cnn"]),
    (["env=gym", "env.id=CartPole-v1", "model=nature_cnn"], ["model.encoder='nature_cnn'", "env.id=CartPole-v1"]),
])
def test_bad_gym_env_exit_2_naming_env_id(train_cli, tmp_path, args, needles):
    res = train_cli([*args, "debug=smoke", "device=cpu", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-2000:]
    line = res.stderr.strip().splitlines()[-1]
    assert all(n in line for n in needles), line
    assert not (tmp_path / "run").exists()


def _missing(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


@pytest.mark.parametrize("args, needles, missing", [
    (["env=gym", "env.id=LunarLander-v3"], ["env.id=LunarLander-v3", "cannot be made"], "Box2D"),
    (["env=gym", "env.id=ALE/Pong-v5", "model=nature_cnn", "env.vectorization=sync"],
     ["env.vectorization=sync", "opencv"], "cv2"),
])
def test_missing_optional_dependency_exit_2_before_any_run_folder(train_cli, tmp_path, args, needles, missing):
    if not _missing(missing):
        pytest.skip(f"{missing} is installed here")
    res = train_cli([*args, "debug=smoke", "device=cpu", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-2000:]
    line = res.stderr.strip().splitlines()[-1]
    assert all(n in line for n in needles), line
    assert not (tmp_path / "run").exists()


def test_nature_cnn_forward_shape_and_scaling():
    from foxdqn.nn.nature_cnn import NatureCNNEncoder

    enc = NatureCNNEncoder((4, 84, 84), [512])
    conv_out = enc.conv(torch.zeros(1, 4, 84, 84)).shape[1]
    assert conv_out == 64 * 7 * 7  # Mnih et al. 2015: 7x7x64 after the third convolution
    obs = torch.randint(0, 256, (3, 4 * 84 * 84), dtype=torch.uint8)
    out = enc(obs)
    assert out.shape == (3, 512) and out.dtype == torch.float32
    torch.testing.assert_close(enc(obs.to(torch.float32)), out)  # ÷255 inside, whatever the input dtype
    with pytest.raises(ValueError, match=r"\bobs_shape must be an image shape \(C, H, W\), got \(4,\)"):
        NatureCNNEncoder((4,), [512])
    with pytest.raises(ValueError, match=r"\bobs_shape must have H and W >= 36 .*got 35x84"):
        NatureCNNEncoder((4, 35, 84), [512])


@pytest.mark.parametrize("obs_shape, needles", [
    ((4,), ["model.encoder='nature_cnn'", "env.id=Small-v0", "obs_shape", "use model=mlp"]),
    ((4, 10, 10), ["model.encoder='nature_cnn'", "env.id=Small-v0", "[4, 10, 10]", ">= 36", "10x10"]),
])
def test_check_encoder_names_config_keys_for_the_encoder_check(obs_shape, needles):
    from foxdqn.step.build import check_encoder

    with pytest.raises(ConfigError) as info:
        check_encoder("nature_cnn", obs_shape, "Small-v0")
    assert all(n in str(info.value) for n in needles), str(info.value)
    check_encoder("nature_cnn", (4, 36, 36), "Small-v0")


def test_atari_preprocessing_shapes_dtype():
    pytest.importorskip("ale_py")
    from foxdqn.envs.gym_adapter import GymVectorEnv, describe

    e = EnvConfig(name="gym", id="ALE/Pong-v5", repeat_action_probability=0.0)
    d = describe(e)
    assert d == {"obs_shape": (4, 84, 84), "obs_dtype": torch.uint8, "num_actions": 6}
    env = GymVectorEnv(e, 2, torch.device("cpu"), seed=0)
    obs = env.reset_all()
    assert obs.shape == (2, 4 * 84 * 84) and obs.dtype == torch.uint8 and env.obs_shape == (4, 84, 84)
    for _ in range(5):
        out = env.step(torch.tensor([2, 3]))
    assert out.obs.dtype == torch.uint8 and out.next_obs.shape == (2, 28224)
    frames = out.obs.reshape(2, 4, 84, 84)
    assert not torch.equal(frames[:, 0], frames[:, 3])  # a stack of different frames
    assert env.max_episode_steps == 108_000 // 4
    env.close()


def test_atari_wrappers_path_needs_opencv():
    pytest.importorskip("ale_py")
    try:
        import cv2  # noqa: F401
        pytest.skip("opencv-python installed: the wrapper path works")
    except ImportError:
        pass
    from foxdqn.envs.gym_adapter import make_vector_env

    with pytest.raises(ConfigError, match="env.vectorization=sync.*opencv"):
        make_vector_env(EnvConfig(name="gym", id="ALE/Pong-v5", vectorization="sync"), 2)


@pytest.mark.slow
def test_pong_dqn_smoke_iterations_on_cpu():
    pytest.importorskip("ale_py")
    s, _ = small_state(["+experiment=pong_dqn", "replay.capacity=256", "agent.batch_size=8", "env.num_envs=4"])
    assert s.replay.obs.dtype == torch.uint8 and s.replay.obs.shape[-1] == 4 * 84 * 84
    assert s.cfg.model.encoder == "nature_cnn" and s.cfg.model.hidden == [64]  # smoke cap
    collect = make_iteration(s, False, updates=0, on_host=True, **step_fns(s))
    full = make_iteration(s, False, on_host=True, **step_fns(s))
    for _ in range(2):
        collect()
    before = [p.detach().clone() for p in s.online.parameters()]
    for _ in range(2):
        full()
    assert int(s.updates) == 2 * s.cfg.agent.updates_per_iter
    assert int(s.env_steps) == 4 * s.cfg.env.num_envs
    assert any(not torch.equal(a, b) for a, b in zip(before, s.online.parameters()))
    assert all(torch.isfinite(p).all() for p in s.online.parameters())
    s.env.close()
