"""The env steps inside a CUDA graph, without syncs, with the same results as eager stepping."""
import pytest
import torch

from foxdqn.envs import NUM_ACTIONS, ExecutionConfig

from support import capture_env_step

pytestmark = pytest.mark.gpu


def test_graph_replay_matches_eager(make_env, make_arrays):
    # deterministic starts (split (0, 8), window 3, L 5): eager and graphed envs stay comparable
    N = 64
    kw = dict(arrays=make_arrays(12, seed=4), window=3, split=(0, 8), num_envs=N, episode_length=5,
              eval_mode=False, dtype=torch.float32, cfg=ExecutionConfig(), device="cuda")
    graphed, eager = make_env(**kw), make_env(**kw)
    gen = torch.Generator(device="cuda").manual_seed(0)
    actions = torch.randint(0, NUM_ACTIONS, (15, N), device="cuda", generator=gen)
    graphed.reset_all()
    eager.reset_all()
    action = torch.zeros(N, dtype=torch.long, device="cuda")
    graph, out = capture_env_step(graphed, action, actions[:3])
    for k in range(3):
        eager.step(actions[k])
    for k in range(3, 15):
        action.copy_(actions[k])
        graph.replay()
        ref = eager.step(actions[k])
        for name in ("next_obs", "reward", "terminated", "truncated", "obs"):
            torch.testing.assert_close(getattr(out, name), getattr(ref, name))
        for name in ref.info:
            torch.testing.assert_close(out.info[name], ref.info[name])
        torch.testing.assert_close(graphed.equity, eager.equity)
        torch.testing.assert_close(graphed.t, eager.t)


def test_graph_replay_with_random_starts(make_env, make_arrays):
    N = 256
    env = make_env(arrays=make_arrays(200), window=8, split=(20, 180), num_envs=N, episode_length=10,
                   eval_mode=False, dtype=torch.float32, cfg=ExecutionConfig(), device="cuda", seed=1)
    env.reset_all()
    action = torch.zeros(N, dtype=torch.long, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    graph, out = capture_env_step(env, action, torch.randint(0, NUM_ACTIONS, (3, N), device="cuda", generator=gen))
    done = torch.zeros(N, dtype=torch.long, device="cuda")
    starts = []
    for _ in range(40):
        action.copy_(torch.randint(0, NUM_ACTIONS, (N,), device="cuda", generator=gen))
        graph.replay()
        done += out.info["episode_done"].long()
        starts.append(torch.where(out.info["episode_done"], env.t, -1))
    torch.cuda.synchronize()
    assert ((env.t >= env.first_valid) & (env.t <= env.last_bar)).all()
    assert (env.steps < 10).all()
    assert torch.isfinite(out.obs).all() and torch.isfinite(out.reward).all()
    assert (done >= 3).all()
    fresh = torch.cat(starts)
    fresh = fresh[fresh >= 0]
    assert ((fresh >= env.first_valid) & (fresh <= env.start_high)).all()
    assert fresh.unique().numel() > 20  # replays draw new random starts
