"""n-step returns and HER relabelling on hand-written trajectories (CPU)."""
import pytest
import torch

from foxdqn.envs.bitflip import BitFlipEnv
from foxdqn.replay import ReplayBuffer
from foxdqn.replay.her import HindsightRelabeler

G = 0.9


def _fill(buf, rewards, terminated, truncated):
    """One env; obs at step t = [t], next_obs = [t + 0.5] (distinct markers)."""
    for t, (r, te, tr) in enumerate(zip(rewards, terminated, truncated)):
        buf.add(torch.tensor([[float(t)]]), torch.tensor([t % 2]), torch.tensor([r]),
                torch.tensor([[t + 0.5]]), torch.tensor([te]), torch.tensor([tr]))


def test_n_step_window_stops_at_episode_end():
    # steps 0..5; the episode terminates at step 2 (terminal), a new one runs 3..5 and is truncated at 5
    buf = ReplayBuffer(capacity=16, num_envs=1, obs_dim=1, device=torch.device("cpu"), n_step=3, gamma=G)
    rewards = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    _fill(buf, rewards, [False, False, True, False, False, False], [False, False, False, False, False, True])
    b = buf.gather(torch.arange(4), torch.ones(4))
    # t=0: r0 + γ r1 + γ² r2, terminal inside the window → discount 0, s' = next_obs of step 2
    # t=1: r1 + γ r2 (window stops at the terminal step 2) → discount 0, s' = 2.5
    # t=2: r2 only (terminal) → discount 0
    # t=3: r3 + γ r4 + γ² r5, truncated at 5: bootstrap with γ³ from next_obs of step 5
    expected_r = [1 + G * 2 + G * G * 4, 2 + G * 4, 4.0, 8 + G * 16 + G * G * 32]
    torch.testing.assert_close(b.reward, torch.tensor(expected_r))
    torch.testing.assert_close(b.discount, torch.tensor([0.0, 0.0, 0.0, G ** 3]))
    torch.testing.assert_close(b.next_obs[:, 0], torch.tensor([2.5, 2.5, 2.5, 5.5]))
    torch.testing.assert_close(b.obs[:, 0], torch.tensor([0.0, 1.0, 2.0, 3.0]))


def test_n_step_truncation_bootstraps_with_gamma_m():
    buf = ReplayBuffer(capacity=16, num_envs=1, obs_dim=1, device=torch.device("cpu"), n_step=3, gamma=G)
    _fill(buf, [1.0, 1.0, 1.0, 1.0], [False] * 4, [False, True, False, False])
    b = buf.gather(torch.tensor([0, 1]), torch.ones(2))
    torch.testing.assert_close(b.reward, torch.tensor([1 + G, 1.0]))  # window of 2 (truncated at 1), then 1
    torch.testing.assert_close(b.discount, torch.tensor([G ** 2, G]))
    torch.testing.assert_close(b.next_obs[:, 0], torch.tensor([1.5, 1.5]))


def test_uniform_sampling_skips_incomplete_windows():
    buf = ReplayBuffer(capacity=8 * 2, num_envs=2, obs_dim=1, device=torch.device("cpu"), n_step=3, gamma=G)
    for t in range(5):
        buf.add(torch.full((2, 1), float(t)), torch.zeros(2, dtype=torch.int64), torch.ones(2), torch.zeros(2, 1),
                torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.bool))
    idx, _ = buf.sample_index(4000, torch.Generator().manual_seed(0))
    t = idx // 2
    assert int(t.max()) == 2 and int(t.min()) == 0  # rows 3, 4 have incomplete 3-step windows


def test_n_step_below_one_is_refused():
    with pytest.raises(ValueError, match=r"\bn_step must be >= 1, got n_step=0"):
        ReplayBuffer(capacity=16, num_envs=1, obs_dim=1, device=torch.device("cpu"), n_step=0)


def test_her_relabels_with_an_achieved_future_goal_and_recomputes_reward():
    # 3 bits, one env; hand-written episode: start 000, goal 111 (never reached), flips bit 0, 1, 0
    env = BitFlipEnv(1, 3, torch.device("cpu"), torch.Generator().manual_seed(0))
    buf = ReplayBuffer(capacity=8, num_envs=1, obs_dim=6, device=torch.device("cpu"), n_step=1, gamma=G)
    goal = torch.tensor([1.0, 1.0, 1.0])
    states = [torch.tensor(s, dtype=torch.float32) for s in ([0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0])]
    for t in range(3):
        obs, nxt = torch.cat([states[t], goal])[None], torch.cat([states[t + 1], goal])[None]
        buf.add(obs, torch.tensor([[0, 1, 0][t]]), torch.tensor([-1.0]), nxt, torch.tensor([False]),
                torch.tensor([t == 2]))
    relabel = HindsightRelabeler(env, k=4, gamma=G)
    relabel.p_relabel = 1.0  # relabel every sample for the test
    batch = buf.gather(torch.zeros(2000, dtype=torch.int64), torch.ones(2000))  # transition 0 (000 → 100)
    out = relabel.relabel(buf, batch, torch.Generator().manual_seed(1))
    new_goals = out.obs[:, 3:]
    # the future achieved goals of transition 0 are the next states of steps 0, 1, 2: 100, 110, 010
    allowed = torch.tensor([[1.0, 0, 0], [1, 1, 0], [0, 1, 0]])
    assert ((new_goals[:, None, :] == allowed[None]).all(-1)).any(-1).all()
    for g in allowed:  # each future step is chosen (uniformly: roughly a third each)
        share = (new_goals == g).all(-1).float().mean()
        assert 0.25 < share < 0.42
    assert torch.equal(out.next_obs[:, 3:], new_goals)
    hit = (new_goals == torch.tensor([1.0, 0, 0])).all(-1)  # achieved right away: reward 0, terminal
    assert torch.equal(out.reward[hit], torch.zeros(int(hit.sum())))
    assert torch.equal(out.discount[hit], torch.zeros(int(hit.sum())))
    assert torch.equal(out.reward[~hit], torch.full((int((~hit).sum()),), -1.0))
    torch.testing.assert_close(out.discount[~hit], torch.full((int((~hit).sum()),), G))


def test_her_never_looks_past_the_episode():
    env = BitFlipEnv(1, 2, torch.device("cpu"), torch.Generator().manual_seed(0))
    buf = ReplayBuffer(capacity=8, num_envs=1, obs_dim=4, device=torch.device("cpu"), n_step=1, gamma=G)
    seq = [([0, 0], [1, 0], True), ([1, 1], [0, 1], False)]  # episode A ends at step 0, B starts at step 1
    for s0, s1, end in seq:
        g = torch.tensor([0.0, 0.0])
        buf.add(torch.cat([torch.tensor(s0, dtype=torch.float32), g])[None], torch.tensor([0]), torch.tensor([-1.0]),
                torch.cat([torch.tensor(s1, dtype=torch.float32), g])[None], torch.tensor([False]), torch.tensor([end]))
    relabel = HindsightRelabeler(env, k=4, gamma=G)
    relabel.p_relabel = 1.0
    out = relabel.relabel(buf, buf.gather(torch.zeros(500, dtype=torch.int64), torch.ones(500)),
                          torch.Generator().manual_seed(2))
    assert (out.obs[:, 2:] == torch.tensor([1.0, 0.0])).all()  # only episode A's own next state


def test_her_needs_a_goal_conditioned_env():
    class NotGoal:
        name = "trading"

    with pytest.raises(ValueError, match=r"\benv must be goal-conditioned .*env='trading' is not"):
        HindsightRelabeler(NotGoal(), k=4, gamma=G)
