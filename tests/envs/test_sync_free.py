"""reset_all / observe / step / market_state never read a device value back to the host."""
import pytest
import torch

from foxdqn.envs import NUM_ACTIONS

from support import forbid_syncs


@pytest.mark.parametrize("eval_mode", [False, True])
def test_env_never_syncs(make_env, make_arrays, monkeypatch, eval_mode):
    num_envs = 1 if eval_mode else 32
    # short split and episodes so that truncations and auto-resets happen within the 20 steps
    env = make_env(arrays=make_arrays(60), window=4, split=(5, 20), num_envs=num_envs, episode_length=6,
                   eval_mode=eval_mode, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    actions = torch.randint(0, NUM_ACTIONS, (20, num_envs), generator=gen)

    forbid_syncs(monkeypatch)
    # the patch is live: each of these would sync
    for probe in (lambda t: t.item(), lambda t: t.tolist(), lambda t: bool(t), lambda t: float(t),
                  lambda t: t.cpu(), lambda t: t.numpy(), lambda t: int(t), lambda t: [0, 1][t]):
        with pytest.raises(AssertionError, match="host sync"):
            probe(torch.tensor(1))

    obs = env.reset_all()
    done = torch.zeros(num_envs, dtype=torch.long)
    for k in range(20):
        env.observe()
        env.market_state()
        out = env.step(actions[k])
        done += out.info["episode_done"].long()
        obs = out.obs
    env.reset_all()
    monkeypatch.undo()

    assert obs.shape == (num_envs, env.obs_dim)
    # the run went through episode ends: auto-resets, or the eval walk ending at bar 19 and freezing
    assert int(done.min()) >= (1 if eval_mode else 2)
