"""TradingEnv.run_policies in chunks of K steps (foxdqn.device.chunk_graph) gives exactly the walks of
a per-step loop, whatever K (CPU); captured in a CUDA graph it equals the eager walk bit for bit
and walks the EURUSD val split in milliseconds (GPU)."""
import time

import numpy as np
import pytest
import torch

from foxdqn.execution.orders import compose
from foxdqn.device.chunk_graph import CHUNK_STEPS

FLOATS = ("equity", "exposure", "rewards", "fill_price", "fees", "costs", "traded_units")


def jump_arrays(make_arrays, T=24, jump_at=12):
    """A random walk whose price is 4x from bar ``jump_at`` on (its open still the old price): a
    short of 1.0 held into that bar is ruined there."""
    a = make_arrays(T, seed=5)
    for name in ("open", "high", "low", "close"):
        a[name][jump_at:] *= 4.0
    a["open"][jump_at] = a["close"][jump_at - 1]
    a["low"][jump_at] = min(a["low"][jump_at], a["open"][jump_at])
    return a


def policy(obs, env):
    """Env 0 always short 1.0 (ruined by the jump); the others cycle flat, +0.5 and +1 (they
    survive the jump), order types and urgencies with the bar. Device ops on ``obs`` only (capturable): with window 2 the first
    feature of the window's first row is 10·(t−1) (tests/envs/conftest.py), t the current bar."""
    t = torch.round(obs[:, 0].double() / 10.0).long() + 1
    e = torch.arange(obs.shape[0], device=obs.device)
    exposure = torch.where(e == 0, 0, 2 + (t + e) % 3)
    return compose(exposure, t % 3, (t // 2) % 3)


def per_step_walks(env, policy_fn):
    """The walks of the per-step loop (run_policies before the chunks): one step per bar from
    ``reset_all`` to the split's last bar, env e's walk cut at its first ``episode_done``."""
    obs = env.reset_all()
    steps = []
    with torch.no_grad():
        for _ in range(env.last_bar - env.first_valid):
            action = policy_fn(obs, env)
            out = env.step(action)
            info = out.info
            step = {"equity": info["equity"], "exposure": info["exposure"], "rewards": out.reward,
                    "fill_price": info["fill_price"], "fees": info["fee"], "costs": info["cost"],
                    "traded_units": info["traded_units"], "actions": action, "fills": info["fill"],
                    "done": info["episode_done"], "terminated": out.terminated}
            steps.append({k: v.clone() for k, v in step.items()})
            obs = out.obs
    cols = {k: torch.stack([s[k] for s in steps]).cpu().numpy() for k in steps[0]}
    walks = []
    for e in range(env.num_envs):
        n = int(np.flatnonzero(cols["done"][:, e])[0]) + 1
        c = {k: v[:n, e] for k, v in cols.items()}
        walks.append({
            "index": np.arange(env.first_valid, env.first_valid + n + 1, dtype=np.int64),
            "equity": np.concatenate([[env.initial_equity], c["equity"].astype(np.float64)]),
            **{k: c[k].astype(np.float64) for k in FLOATS if k != "equity"},
            "actions": c["actions"].astype(np.int64), "fills": c["fills"].astype(bool),
            "trades": np.array(int(c["fills"].sum()), dtype=np.int64),
            "terminated": np.array(bool(c["terminated"].any())),
        })
    return walks


def assert_same_walks(got, expected):
    assert len(got) == len(expected)
    for e, (g, x) in enumerate(zip(got, expected)):
        assert g.keys() == x.keys(), e
        for k in x:
            assert g[k].dtype == x[k].dtype, (e, k)
            np.testing.assert_array_equal(g[k], x[k], err_msg=f"env {e}: {k}")


@pytest.fixture
def walk_env(make_env, make_arrays):
    def build(dtype=torch.float64, device="cpu", num_envs=3):
        return make_env(arrays=jump_arrays(make_arrays), window=2, num_envs=num_envs, eval_mode=True, dtype=dtype,
                        device=device)
    return build


@pytest.mark.parametrize("chunk", [1, 3, 4, 7, 22, 23, 64])
def test_chunks_give_the_per_step_walks(walk_env, chunk):
    expected = per_step_walks(walk_env(), policy)
    # the setting: 22 steps (not a multiple of 3, 4 or 7); env 0 ruined at step 11, inside a chunk of 3, 4 and 7
    assert [w["actions"].size for w in expected] == [11, 22, 22]
    assert [bool(w["terminated"]) for w in expected] == [True, False, False]
    assert all(int(w["trades"]) > 0 for w in expected)
    assert_same_walks(walk_env().run_policies(policy, chunk=chunk), expected)


def test_float32_env_and_capturable_flag_on_cpu(walk_env):
    """On CPU ``capturable`` changes nothing (eager); a float32 env keeps its float32 values."""
    expected = per_step_walks(walk_env(torch.float32), policy)
    assert_same_walks(walk_env(torch.float32).run_policies(policy, capturable=True, chunk=5), expected)


def test_bad_chunk(walk_env):
    with pytest.raises(ValueError, match="^chunk: must be an integer >= 1"):
        walk_env().run_policies(policy, chunk=0)


# ------------------------------------------------------------------------------------------- GPU


def _eurusd(experiment, members):
    """eurusd ``experiment`` on CUDA: (cfg, market, greedy policy of a seeded untrained network over
    ``members`` rows, the val env builder)."""
    from foxdqn.config.compose import load_config
    from foxdqn.data import load_market_data
    from foxdqn.step.build import build_action_mode, build_env, build_network

    cuda = torch.device("cuda")
    cfg = load_config([f"+experiment={experiment}", "device=cuda", "log.progress=false"])
    market = load_market_data(cfg.data, cfg.env.window, cfg.env.episode_length)
    gen = torch.Generator(device=cuda).manual_seed(0)
    torch.manual_seed(0)
    train_env = build_env(cfg, market, "train", cuda, gen, num_envs=1)
    mode = build_action_mode(cfg, train_env)
    online = build_network(cfg, train_env, mode.num_actions).to(cuda).eval()

    def greedy(obs, env):
        return mode.to_env(online(obs.to(torch.float32)).argmax(dim=1), env)

    def val_env():
        return build_env(cfg, market, "val", cuda, torch.Generator(device=cuda), num_envs=members, eval_mode=True)

    return cfg, market, online, mode, greedy, val_env


@pytest.mark.gpu
@pytest.mark.parametrize("experiment", ["eurusd_dqn", "eurusd_routed"])
def test_gpu_captured_walk_equals_eager_walk(experiment):
    from foxdqn.analysis.backtest import evaluate

    cfg, market, online, mode, greedy, val_env = _eurusd(experiment, 3)
    eager_env, graph_env = val_env(), val_env()
    eager = eager_env.run_policies(greedy)
    graphed = graph_env.run_policies(greedy, capturable=True)
    assert_same_walks(graphed, eager)
    assert eager[0]["actions"].size == eager_env.last_bar - eager_env.first_valid > 4 * CHUNK_STEPS  # several replays
    assert_same_walks(per_step_walks(val_env(), greedy), eager)
    # the whole evaluation (agent, buy-and-hold, flat): the same walks and metrics
    a = evaluate(cfg, market, online, torch.device("cuda"), "val", mode, graph=True)
    b = evaluate(cfg, market, online, torch.device("cuda"), "val", mode, graph=False)
    assert a["metrics"].keys() == b["metrics"].keys()
    for name, metrics in a["metrics"].items():
        assert metrics.keys() == b["metrics"][name].keys()
        for k, v in metrics.items():
            assert np.array_equal(v, b["metrics"][name][k], equal_nan=True), (name, k)
    for name in a["curves"]:
        assert_same_walks([a["curves"][name]], [b["curves"][name]])


@pytest.mark.gpu
def test_gpu_val_walk_takes_milliseconds():
    """One greedy walk of the EURUSD val split (932 steps), warm-up chunk and capture included,
    after a first walk has compiled the kernels: expected ~50 ms on an H200 (30 chunks of 32
    steps); the per-step loop took ~5 s."""
    *_, greedy, val_env = _eurusd("eurusd_dqn", 1)
    env = val_env()
    env.run_policies(greedy, capturable=True)  # compiles the Triton kernels, initialises cuBLAS
    times = []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        env.run_policies(greedy, capturable=True)
        times.append(time.perf_counter() - t0)
    print(f"val walk of {env.last_bar - env.first_valid} steps: best {min(times) * 1e3:.1f} ms, "
          f"times {[round(t * 1e3, 1) for t in times]} ms")
    assert min(times) < 0.2, times
