"""Prioritized replay (replay.name=per) in a population: member p's priorities are its own.

Member p samples its own env columns by its own priorities with its own uniforms, weights them by
its own β, applies the weights in its loss and writes its own |TD| back (unless its guard flag is
set). Checked on CPU: P members equal P populations of one bit for bit (weights and priority
sums), with different seeds, α, β₀ and ε; a fault in one member leaves the others bit-identical;
a population of one samples what a single run's PrioritizedReplayBuffer samples given the same
priorities and uniforms (the same distribution and weights; the draws themselves differ: docs/design/population.md).
"""
from __future__ import annotations

import pytest
import torch

from foxdqn.population.random import MemberRandom
from foxdqn.population.replay import MemberPrioritizedReplay, MemberReplay
from foxdqn.replay.prioritized import PrioritizedReplayBuffer

from test_population import CARTPOLE, TRADING, assert_member_equal, configs, member_tensors, run

CPU = torch.device("cpu")
PER = ["replay.name=per"]
# different seeds and PER hyperparameters (α, β₀, ε) per member, and another member key
MEMBERS = [["seed=0"], ["seed=1", "replay.alpha=0.3", "replay.beta_start=0.8"],
           ["seed=2", "replay.eps=0.01", "replay.beta_start=0.1", "optim.lr=1e-3"]]


def assert_priorities_equal(a, p, b, q):
    """Member p's priority sum in population a is member q's in population b, bit for bit."""
    pa, pb = a.replay.per, b.replay.per
    for name in ("leaves", "block_sums", "max_priority", "alpha", "eps"):
        assert torch.equal(getattr(pa, name)[p], getattr(pb, name)[q]), name


def test_per_members_equal_runs_of_one_member_cartpole():
    together = run(configs([*CARTPOLE, *PER], MEMBERS))
    assert isinstance(together.replay, MemberPrioritizedReplay)
    assert together.replay.per.alpha.tolist() == pytest.approx([0.6, 0.3, 0.6])
    for p, extra in enumerate(MEMBERS):
        alone = run(configs([*CARTPOLE, *PER], [extra]))
        assert_member_equal(together, p, alone, 0)
        assert_priorities_equal(together, p, alone, 0)
    # the priorities were written (not only inserted at the max) and differ between members
    leaves = together.replay.per.leaves
    assert len(set(leaves[0, :512].tolist())) > 2 and not torch.equal(leaves[0], leaves[1])


def test_per_members_equal_runs_of_one_member_trading_n_step():
    """Trading (stored state codes, decoded after the gather) with 3-step returns: the young rows'
    move-back, the members' own γ and PER together."""
    members = [["seed=5", "replay.alpha=0.9"], ["seed=6", "agent.gamma=0.9", "replay.beta_start=1.0"]]
    together = run(configs([*TRADING, *PER], members))
    for p, extra in enumerate(members):
        alone = run(configs([*TRADING, *PER], [extra]))
        assert_member_equal(together, p, alone, 0)
        assert_priorities_equal(together, p, alone, 0)


@pytest.mark.parametrize("objective", [
    [["seed=0", "objective.cql_alpha=0.5"], ["seed=1", "objective.cql_alpha=0", "replay.alpha=0.3"]],
    [["seed=0", "objective.iql=true"], ["seed=1", "objective.iql=true", "objective.iql_expectile=0.9",
                                        "replay.beta_start=0.9"]],
], ids=["cql", "iql"])
def test_per_with_cql_or_iql_members_equal_runs_of_one_member(objective):
    """PER's weights reach CQL's term and IQL's losses, and IQL's |TD| its priorities, per member."""
    together = run(configs([*CARTPOLE, *PER], objective), iterations=6)
    for p, extra in enumerate(objective):
        alone = run(configs([*CARTPOLE, *PER], [extra]), iterations=6)
        assert_member_equal(together, p, alone, 0)
        assert_priorities_equal(together, p, alone, 0)


def test_per_changes_what_a_member_learns():
    """The priorities reach the samples and the weights reach the loss: the same seed with PER
    trains other weights than with uniform replay, α = 0 (equal priorities) other weights than
    α = 0.6, and β₀ = 1 other weights than β₀ = 0.4 (β changes only the importance weights, so
    this fails if the loss ignores them)."""
    def weights(base, extra):
        return member_tensors(run(configs(base, [["seed=0", *extra]]), iterations=4), 0)["online.encoder.net.0.weight"]

    per = weights([*CARTPOLE, *PER], [])
    assert not torch.equal(per, weights(CARTPOLE, []))
    assert not torch.equal(per, weights([*CARTPOLE, *PER], ["replay.alpha=0"]))
    assert not torch.equal(per, weights([*CARTPOLE, *PER], ["replay.beta_start=1.0"]))


def test_per_fault_in_one_member_leaves_the_others_and_its_priorities_alone():
    clean = run(configs([*CARTPOLE, *PER], MEMBERS))
    faulty_members = [MEMBERS[0], [*MEMBERS[1], "debug.inject_nan_at_step=4"], MEMBERS[2]]
    faulty = run(configs([*CARTPOLE, *PER], faulty_members))
    assert faulty.guard.halted.tolist() == [0.0, 1.0, 0.0]
    for p in (0, 2):
        assert_member_equal(faulty, p, clean, p)
        assert_priorities_equal(faulty, p, clean, p)
    # the halted member's |TD| is never written again: its max priority is the one before the fault
    four = run(configs([*CARTPOLE, *PER], [faulty_members[1][:-1]]), iterations=4)
    assert torch.equal(faulty.replay.per.max_priority[1], four.replay.per.max_priority[0])


# ------------------------------------------------------------------------------------------------
# the member replay against a single run's PrioritizedReplayBuffer, on a constructed case
# ------------------------------------------------------------------------------------------------
N, D, CAP, B = 3, 2, 60, 17
GAMMA = 0.5  # exact in float32: a population's γ is a float32 member key, a single run's a float


def _transitions(steps, members, seed):
    """``steps`` rows of ``members`` × N transitions (obs, action, reward, next_obs, terminated,
    truncated), with some episode ends."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(steps):
        e = members * N
        rows.append((torch.randn(e, D, generator=g), torch.randint(0, 3, (e,), generator=g),
                     torch.randn(e, generator=g), torch.randn(e, generator=g).view(e, 1).expand(e, D).contiguous(),
                     torch.rand(e, generator=g) < 0.1, torch.rand(e, generator=g) < 0.05))
    return rows


def _member_replay(members, n_step, alpha, beta_start, eps, updates):
    rng = MemberRandom(list(range(members)), CPU)
    f32 = dict(dtype=torch.float32)
    return MemberPrioritizedReplay(CAP, N, D, torch.full((members,), GAMMA), rng, CPU, n_step,
                                   alpha=torch.tensor(alpha, **f32), beta_start=torch.tensor(beta_start, **f32),
                                   beta_updates=50, eps=torch.tensor(eps, **f32), updates=updates)


def _columns(rows, p, members):
    """Member p's columns of transitions written for ``members`` members."""
    cols = slice(p * N, (p + 1) * N)
    return [tuple(x[cols] for x in row) for row in rows]


@pytest.mark.parametrize("n_step", [1, 3])
def test_member_replay_samples_what_a_single_runs_per_samples(n_step, monkeypatch):
    """Member 1 of 3 (its own α, β₀, ε) holds the transitions a single run's
    PrioritizedReplayBuffer holds and gets the same |TD| (members 0 and 2 others); given the same
    uniforms both sample the same slots with the same importance weights and the same n-step
    batch, for several updates as β anneals and the priorities change (the ring wraps)."""
    updates = torch.zeros((), dtype=torch.int64)
    members = 3
    mem = _member_replay(members, n_step, [0.6, 0.3, 1.0], [0.4, 0.7, 0.2], [1e-6, 0.05, 1e-3], updates)
    single = PrioritizedReplayBuffer(CAP, N, D, CPU, n_step, GAMMA, alpha=0.3, beta_start=0.7, beta_updates=50,
                                     eps=0.05, updates=updates)
    assert isinstance(mem, MemberReplay) and mem.per.leaves.shape == (3, single.per.capacity_padded)
    rows = _transitions(27, members, seed=n_step)  # 27 rows > 20 rows of the ring: it wraps
    g = torch.Generator().manual_seed(7)
    for step, row in enumerate(rows):
        mem.add(*row)
        single.add(*_columns([row], 1, members)[0])
        if step < n_step + 2:
            continue
        rand = torch.rand(members, B, generator=g)
        monkeypatch.setattr(mem.rng, "uniform", lambda n, rand=rand: rand)
        got = mem.sample_members(B)
        s_slots, s_weight = single.priorities.sample(rand[1].clone())
        want = single.gather(s_slots, s_weight)
        mine = slice(B, 2 * B)
        t, e = got.index[mine] // (members * N), got.index[mine] % (members * N)
        assert torch.equal(e // N, torch.full_like(e, 1))  # member 1's own columns only
        assert torch.equal(t * N + e % N, want.index)  # the same slots
        assert torch.equal(got.weight[mine], want.weight)  # the same importance weights
        for field in ("action", "reward", "discount"):
            assert torch.equal(getattr(got, field)[mine], getattr(want, field)), field
        assert torch.equal(got.obs[1], want.obs) and torch.equal(got.next_obs[1], want.next_obs)
        for p in range(members):  # every member samples its own columns, weights normalised per member
            assert ((got.index[p * B:(p + 1) * B] % (members * N)) // N == p).all()
            assert got.weight[p * B:(p + 1) * B].max() == 1.0
        td = torch.rand(members * B, generator=g) * 3
        skip = torch.tensor([0.0, float(step % 5 == 0), 0.0])  # member 1 skipped now and then
        mem.update_priorities(got.index, td, skip)
        single.update_priorities(want.index, td[mine], skip[1])
        assert torch.equal(mem.per.leaves[1], single.per.leaves)
        assert torch.equal(mem.per.max_priority[1], single.per.max_priority)
        updates.add_(1)
    k = int(updates)  # β of each member: its own β₀ annealed linearly to 1 over 50 updates
    assert k == len(rows) - (n_step + 2) and torch.equal(mem.priorities.beta(updates)[1], single.beta(updates))
    assert mem.priorities.beta(updates).tolist() == pytest.approx([b + (1 - b) * k / 50 for b in (0.4, 0.7, 0.2)])


def test_member_weights_follow_priorities_and_beta():
    """Hand-computed: member 0 with priorities 1, 2, 4, 8 on its four slots (α = 1), β₀ = 0.5: the
    strata of four uniforms 0 pick slots 0, 2, 3, 3 and the weights are (leaf / min leaf)^-β; member 1
    with equal priorities gets weights 1 whatever its β."""
    updates = torch.zeros((), dtype=torch.int64)
    mem = _member_replay(2, 1, [1.0, 1.0], [0.5, 0.9], [0.0, 0.0], updates)
    for row in _transitions(2, 2, seed=0):
        mem.add(*row)
    slots = torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3]])
    rows = (slots // N) * 2 * N + torch.tensor([[0], [N]]) + slots % N
    mem.update_priorities(rows.view(-1), torch.tensor([1.0, 2.0, 4.0, 8.0, 5.0, 5.0, 5.0, 5.0]), torch.zeros(2))
    mem.per.leaves[:, 4:] = 0.0  # only the four slots have mass
    mem.per.rebuild_block_sums()
    got_slots, weight = mem.priorities.sample(torch.zeros(2, 4))
    assert got_slots[0].tolist() == [0, 2, 3, 3]
    torch.testing.assert_close(weight[0], torch.tensor([1.0, 0.5, 8 ** -0.5, 8 ** -0.5]))
    assert got_slots[1].tolist() == [0, 1, 2, 3] and (weight[1] == 1.0).all()

