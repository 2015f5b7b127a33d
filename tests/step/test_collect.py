"""collect_step with its fused ops as Triton kernels (interpreter on CPU) equals the torch-reference
path: actions, replay rows (PER priorities, the regime column), rollout obs, env-step counter,
generator and monitor sums; on the GPU the same, and the kernel count of an eurusd_dqn step."""
import pytest
import torch

from foxdqn.run.checkpoint import state_tensors
from foxdqn.step.collect import collect_step
from foxdqn.step.stats import EP_COUNT, EP_RETURN_SUM, REWARD_SUM

from support import cuda_kernels, experiment_state

STEPS = 6  # one episode of the trading smoke config is shorter: resets are collected too


def _collect(name, backend, device="cpu", steps=STEPS, extra=()):
    s, _ = experiment_state(name, device=device, extra=("replay.capacity=64", *extra))
    s.replay.written.fill_(s.replay.rows - 2)  # start near the ring's end: the write row wraps around
    s.replay.ptr.fill_(s.replay.rows - 2)
    for _ in range(steps):
        collect_step(s, backend=backend)
    return s


def _assert_same(kern, ref):
    assert torch.equal(kern.generator.get_state(), ref.generator.get_state())
    assert int(kern.env_steps) == int(ref.env_steps)
    tk, tr = state_tensors(kern), state_tensors(ref)
    assert tk.keys() == tr.keys()
    inexact = {"monitors.stats.acc"}  # float64 sums in another order (foxdqn.ops.step_stats)
    for name in tk:
        if name not in inexact:
            torch.testing.assert_close(tk[name], tr[name], rtol=0, atol=0, equal_nan=True, msg=name)
    ak, ar = kern.monitors.stats.acc, ref.monitors.stats.acc
    torch.testing.assert_close(ak, ar, rtol=1e-12, atol=1e-15)
    same = [i for i in range(ak.numel()) if i not in (EP_RETURN_SUM, REWARD_SUM)]
    assert torch.equal(ak[same], ar[same])


@pytest.mark.parametrize("name", ["eurusd_dqn", "eurusd_controls", "cartpole_dqn"])
def test_kernels_equal_reference_path(name):
    kern, ref = _collect(name, "triton"), _collect(name, "torch")
    _assert_same(kern, ref)
    r = kern.replay
    assert int(r.written) == r.rows - 2 + STEPS and int(r.ptr) == (r.rows - 2 + STEPS) % r.rows
    assert int(kern.env_steps) == STEPS * kern.rollout.env.num_envs
    assert float(kern.monitors.stats.actions.sum()) == STEPS * kern.rollout.env.num_envs
    newest = (int(r.ptr) - 1) % r.rows
    assert not torch.equal(r.obs[newest], r.next_obs[newest])  # rows were written (the envs moved)


@pytest.mark.parametrize("name,extra", [("eurusd_dqn", ("env.episode_length=5",)), ("cartpole_dqn", ())])
def test_draws_made_ahead_equal_the_step_drawing_them(name, extra, monkeypatch):
    """The env's draws made ahead (draw_step, beside the action selection) leave the same state as
    an env that draws in its own step: the same random stream, so seeded runs and checkpoints
    follow the same trajectory either way (resets included: episodes end within the steps)."""
    ahead = _collect(name, "torch", steps=3 * STEPS, extra=extra)
    env_type = type(ahead.rollout.env)
    monkeypatch.delattr(env_type, "draw_step")  # the env now draws inside step()
    inside = _collect(name, "torch", steps=3 * STEPS, extra=extra)
    _assert_same(ahead, inside)
    assert float(ahead.monitors.stats.acc[EP_COUNT]) > 0  # episodes ended: the drawn starts were used


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["eurusd_dqn", "eurusd_controls"])
def test_gpu_kernels_equal_reference_path(name):
    _assert_same(_collect(name, "auto", device="cuda"), _collect(name, "torch", device="cuda"))


@pytest.mark.gpu
def test_gpu_collect_step_kernel_count_eurusd_dqn():
    """Issue 17's target: one collect step of eurusd_dqn at 4,096 envs launches at most 12 kernels,
    the MLP forward included."""
    from foxdqn.config.compose import load_config
    from foxdqn.data import load_market_data
    from foxdqn.step.state import build_state

    cfg = load_config(["+experiment=eurusd_dqn", "device=cuda", "log.progress=false", "env.num_envs=4096"])
    s = build_state(cfg, load_market_data(cfg.data, cfg.env.window, cfg.env.episode_length), torch.device("cuda"))
    counts = {}
    for backend in ("torch", "auto"):
        counts[backend], names = cuda_kernels(lambda: collect_step(s, backend=backend))
        print(f"collect step ({backend}):", counts[backend], names)
    with torch.no_grad():
        forward, fnames = cuda_kernels(lambda: s.nets.online(s.rollout.obs))
    print("network forward:", forward, fnames)
    # rand, epsilon_greedy, the env's randint and step kernel, replay_add, step_stats
    assert counts["auto"] - forward <= 6, names
    assert counts["auto"] <= counts["torch"] - 20
    assert counts["auto"] <= 12, names
