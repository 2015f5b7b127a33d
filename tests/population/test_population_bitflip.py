"""Bit flipping (env.name=bitflip) and hindsight experience replay (replay.her) in a population:
P × N goal-conditioned envs, member p's start states and goals drawn from its own seed
(foxdqn.population.envs.MemberBitFlipEnv), each member's sampled rows relabelled with its own
uniforms, γ and reward scale (foxdqn.population.her.MemberHindsightRelabeler). Checked on CPU:
three members with different seeds and hyperparameters equal populations of one bit for bit (weights,
metrics.csv rows, summary metrics with the success rate), with and without HER (uniform and
prioritized replay); a fault stays in its member; a member's env steps as the single run's BitFlipEnv
from the same state, and its goals are uniform over the states other than its start; its greedy
episodes report the success rate; a member's relabelled rows are the single run's relabelling of
the same rows and uniforms."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from foxdqn.envs.bitflip import BitFlipEnv
from foxdqn.population.envs import MemberBitFlipEnv
from foxdqn.population.jobs import FINISHED, Member
from foxdqn.population.random import MemberRandom
from foxdqn.population.train import train_population
from foxdqn.run.checkpoint import load_checkpoint
from test_population import assert_fault_stays_in_its_member, assert_members_equal_runs_of_one, configs

CPU = torch.device("cpu")
SMALL = ["debug=smoke", "device=cpu", "log.progress=false", "env.num_envs=4", "env.n_bits=5", "replay.capacity=512",
         "agent.batch_size=16", "model.hidden=[16]", "agent.learning_starts=32"]
BITFLIP = ["+experiment=bitflip_dqn", *SMALL]
# different seeds and one or more other member keys each
MEMBERS = [["seed=0"], ["seed=1", "optim.lr=3e-3", "loss.reward_scale=2"],
           ["seed=2", "agent.gamma=0.9", "loss.huber_delta=0.5"]]


def test_bitflip_members_equal_runs_of_one_member():
    together = assert_members_equal_runs_of_one(BITFLIP, MEMBERS)
    assert isinstance(together.env, MemberBitFlipEnv) and together.env.num_envs == 12
    assert together.obs.shape == (12, 10)


def test_a_bitflip_fault_stays_in_its_member():
    assert_fault_stays_in_its_member(BITFLIP, [["seed=0"], ["seed=1"], ["seed=2", "optim.lr=3e-3"]])


def train(base, members, folder):
    """Train ``members`` (override lists on ``base``) as one population in ``folder/<job>``; their outcomes."""
    outcomes = train_population([Member(tc, None, folder / str(j), j, list(extra))
                                 for j, (tc, extra) in enumerate(zip(configs(base, members), members))])
    assert all(o.exit_code == FINISHED for o in outcomes), [o.message for o in outcomes]
    return outcomes


def assert_same_member_run(a, b):
    """Two run folders of the same member: metrics.csv (but the rate), the summary's counts and
    metrics, and last.pt's weights and counts, bit for bit."""
    def rows(folder):
        return pd.read_csv(folder / "metrics.csv").drop(columns=["train/env_steps_per_s"])

    pd.testing.assert_frame_equal(rows(a), rows(b), check_exact=True)
    sa, sb = (json.loads((f / "eval" / "summary.json").read_text()) for f in (a, b))
    for key in ("env_steps", "updates", "metrics", "selection"):
        assert sa[key] == sb[key], key
    pa, pb = (load_checkpoint(f / "checkpoints" / "last.pt") for f in (a, b))
    assert (pa["env_steps"], pa["updates"]) == (pb["env_steps"], pb["updates"])
    for net in ("online", "target"):
        for k, w in pa[net].items():
            assert torch.equal(w, pb[net][k]), f"{net}.{k}"
    return sa


def assert_trained_members_equal_populations_of_one(base, members, folder):
    """Each member of a population of ``members`` (override lists on ``base``), trained end to end
    (validation and the final greedy episodes included), equals a population of one of its own."""
    train(base, members, folder / "together")
    summaries = []
    for p, extra in enumerate(members):
        train(base, [extra], folder / f"alone{p}")
        summaries.append(assert_same_member_run(folder / "together" / str(p), folder / f"alone{p}" / "0"))
    return summaries


def test_trained_bitflip_members_equal_populations_of_one(tmp_path):
    base = [*BITFLIP, "logger=csv", "agent.total_env_steps=480", "log.interval_env_steps=96", "eval.episodes=8"]
    summaries = assert_trained_members_equal_populations_of_one(base, MEMBERS, tmp_path)
    for summary in summaries:
        metrics = summary["metrics"]["agent"]
        assert metrics["episodes"] == 8 and 0.0 <= metrics["success_rate"] <= 1.0
        assert summary["population"]["size"] == 3 and summary["updates"] > 0
    losses = [pd.read_csv(tmp_path / "together" / str(p) / "metrics.csv")["train/loss"].dropna() for p in range(3)]
    assert len(losses[0]) > 0 and not losses[0].equals(losses[1])  # the members trained apart


def test_a_member_env_steps_as_the_single_runs_env():
    """A population of one's env from the same state and goals, given the same actions, returns the
    single run's BitFlipEnv's step (all but the draws of the envs that restart); member p's draws in
    a population of three are those of a population of one of its seed."""
    n, envs = 4, 6
    member = MemberBitFlipEnv(MemberRandom([7], CPU), envs, n, CPU)
    single = BitFlipEnv(envs, n, CPU, torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(3)
    state = torch.randint(0, 2, (envs, n), generator=g).bool()
    goal = state ^ torch.eye(n, dtype=torch.bool)[torch.tensor([0, 1, 2, 3, 0, 1])]
    steps = torch.tensor([0, 3, 1, 2, 3, 0])
    for env in (member, single):
        env.set_state(state, goal, steps)
    actions = torch.tensor([0, 2, 1, 0, 1, 0])  # env 0 reaches its goal, env 1 and 4 run out of steps
    a, b = member.step(actions), single.step(actions)
    for name in ("next_obs", "reward", "terminated", "truncated"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    for key, value in b.info.items():
        assert torch.equal(a.info[key], value), key
    done = b.info["episode_done"]
    assert done.tolist() == [True, True, False, False, True, False]
    assert torch.equal(a.obs[~done], b.obs[~done])
    assert torch.equal(member.steps, single.steps)

    three = MemberBitFlipEnv(MemberRandom([5, 7, 9], CPU), envs, n, CPU)
    one = MemberBitFlipEnv(MemberRandom([7], CPU), envs, n, CPU)
    assert torch.equal(three.reset_all()[envs:2 * envs], one.reset_all())
    for _ in range(7):
        assert torch.equal(three.step(actions.repeat(3)).obs[envs:2 * envs], one.step(actions).obs)


@pytest.mark.parametrize("n", [1, 5])
def test_a_member_env_steps_through_its_kernel_as_through_its_reference(n):
    """Where the fused kernels run (cpu_kernels: ops/bitflip_step.py in the interpreter) a member
    env's steps, restarts and goals are bit for bit those of its torch reference, over 3n steps of
    3 members."""
    from foxdqn.ops import backend as B

    fused, plain = (MemberBitFlipEnv(MemberRandom([5, 7, 9], CPU), 5, n, CPU) for _ in range(2))
    assert torch.equal(fused.reset_all(), plain.reset_all())
    g = torch.Generator().manual_seed(n)
    for _ in range(3 * n):
        actions = torch.randint(0, n, (15,), generator=g)
        with B.cpu_kernels():
            a = fused.step(actions)
        b = plain.step(actions)
        for name in ("next_obs", "obs", "reward", "terminated", "truncated"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert all(torch.equal(a.info[k], v) for k, v in b.info.items())
        assert torch.equal(fused.state, plain.state) and torch.equal(fused.goal, plain.goal)
        assert torch.equal(fused.steps, plain.steps)


@pytest.mark.parametrize("n", [1, 2, 3, 30])
def test_member_goals_are_uniform_over_the_other_states(n):
    """Starts uniform, goals uniform over the 2^n − 1 masks other than zero (as the single run's),
    for a width of one bit too (the only mask) and one of more candidate bits than a uniform holds."""
    env = MemberBitFlipEnv(MemberRandom([0, 1], CPU), 4000, n, CPU)
    obs = env.reset_all()
    state, goal = env.achieved_goal(obs) > 0.5, env.desired_goal(obs) > 0.5
    mask = state ^ goal
    assert mask.any(dim=1).all()
    if n <= 3:  # every non-zero mask about equally often
        codes = (mask.long() << torch.arange(n)).sum(dim=1)
        counts = torch.bincount(codes, minlength=2 ** n)[1:].double()
        share = counts / counts.sum()
        assert share.sub(1.0 / (2 ** n - 1)).abs().max() < 0.02, share
    else:  # each bit of the mask is set with probability 2^(n−1) / (2^n − 1) ≈ 1/2
        assert mask.double().mean().sub(0.5).abs() < 0.01
    assert state.double().mean().sub(0.5).abs() < 0.02


def test_member_greedy_episodes_report_the_success_rate():
    """The greedy episodes of bit flipping (validation, evaluation) report each member's success
    rate, as a single run's; member p's do not depend on the other members."""
    from foxdqn.population.evaluate import member_episodes
    from foxdqn.population.state import build_population

    members = configs(BITFLIP, MEMBERS)
    together = member_episodes(build_population(members, None, CPU), 8, seed_offset=1)
    for p, cfg in enumerate(members):
        alone = member_episodes(build_population([cfg], None, CPU), 8, seed_offset=1)
        assert together[p] == alone[0] and "success_rate" in alone[0] and alone[0]["episodes"] == 8


# ---------------------------------------------------------------- hindsight experience replay (replay.her)

HER = ["+experiment=bitflip_her", *SMALL]


@pytest.mark.parametrize("replay", [[], ["replay=per"]], ids=["uniform", "per"])
def test_her_members_equal_runs_of_one_member(replay):
    """replay.her in a population: each member relabels its own rows with its own uniforms, γ and
    reward scale; members equal populations of one bit for bit, with uniform and prioritized replay."""
    from foxdqn.population.her import MemberHindsightRelabeler

    together = assert_members_equal_runs_of_one([*HER, *replay], MEMBERS)
    assert isinstance(together.replay.relabeler, MemberHindsightRelabeler)


def test_a_her_fault_stays_in_its_member():
    assert_fault_stays_in_its_member(HER, [["seed=0"], ["seed=1"], ["seed=2", "loss.reward_scale=2"]])


def test_trained_her_members_equal_populations_of_one(tmp_path):
    base = [*HER, "logger=csv", "agent.total_env_steps=480", "log.interval_env_steps=96", "eval.episodes=8"]
    for summary in assert_trained_members_equal_populations_of_one(base, MEMBERS, tmp_path):
        assert "success_rate" in summary["metrics"]["agent"] and summary["updates"] > 0


def test_her_changes_what_a_member_learns():
    """The relabelled batch reaches the loss: the same seed with and without HER trains other weights."""
    from test_population import member_tensors, run

    plain, her = (member_tensors(run(configs(base, [["seed=0"]])), 0) for base in (BITFLIP, HER))
    assert all(not torch.equal(plain[k], her[k]) for k in plain if k.startswith("online"))


def sample_before_relabelling(s, batch_size):
    """(the batch ``s.replay`` samples without relabelling, the uniforms ``[P, 2, B]`` its relabeler
    then draws, the batch it samples with relabelling): the same draws."""
    start = s.rng.counter.clone()
    relabeler, s.replay.relabeler = s.replay.relabeler, None
    raw = s.replay.sample_members(batch_size)
    u = s.rng.uniform(2 * batch_size).view(s.members, 2, batch_size)
    s.rng.counter.copy_(start)
    s.replay.relabeler = relabeler
    return raw, u, s.replay.sample_members(batch_size)


def test_member_relabelling_is_the_single_runs():
    """Member p's relabelled rows are the single run's HindsightRelabeler.relabel_with of its rows,
    uniforms, γ and reward scale, bit for bit: in a population of three on the population's ring, and
    in a population of one on a single run's ReplayBuffer holding the same transitions."""
    from foxdqn.ops.replay_gather import stacked_pair
    from foxdqn.replay.buffer import ReplayBuffer
    from foxdqn.replay.her import HindsightRelabeler
    from test_population import run

    b, fields = 64, ("obs", "next_obs", "action", "reward", "discount", "weight", "index")
    s = run(configs(HER, MEMBERS), iterations=0, collect_first=12)
    raw, u, got = sample_before_relabelling(s, b)
    # obs and next_obs come as [P, B, D], the halves of one [P, 2, B, D] tensor (a stacked pair)
    assert stacked_pair(raw.obs, raw.next_obs) is not None and stacked_pair(got.obs, got.next_obs) is not None
    relabelled = 0
    for p, cfg in enumerate(s.cfgs):
        single = HindsightRelabeler(BitFlipEnv(1, cfg.env.n_bits, CPU, torch.Generator()), cfg.replay.her_k,
                                    cfg.agent.gamma, cfg.loss.reward_scale)
        rows = slice(p * b, (p + 1) * b)
        mine, theirs = (batch._replace(**{f: getattr(batch, f).reshape(3 * b, *getattr(batch, f).shape[2:])[rows]
                                          if getattr(batch, f).dim() == 3 else getattr(batch, f)[rows]
                                          for f in fields}) for batch in (raw, got))
        expected = single.relabel_with(s.replay, mine, u[p], cfg.agent.gamma, cfg.loss.reward_scale)
        for f in fields:
            assert torch.equal(getattr(theirs, f), getattr(expected, f)), (p, f)
        relabelled += int((theirs.obs != mine.obs).any(dim=1).sum())
    assert relabelled > b and (got.reward == 0).any() and (got.reward == -2).any()  # member 1's scale

    one = run(configs(HER, [MEMBERS[1]]), iterations=0, collect_first=12)
    cfg = one.cfg
    buf = ReplayBuffer(cfg.replay.capacity, cfg.env.num_envs, one.env.obs_dim, CPU, 1, cfg.agent.gamma)
    for name, value in one.replay.state_dict().items():
        getattr(buf, name).copy_(value)
    raw, u, got = sample_before_relabelling(one, b)
    single = HindsightRelabeler(one.env, cfg.replay.her_k, cfg.agent.gamma, cfg.loss.reward_scale)
    expected = single.relabel_with(buf, raw, u[0], single.gamma, single.reward_scale)
    for f in fields:
        assert torch.equal(getattr(got, f), getattr(expected, f)), f


def test_a_bitflip_her_iteration_reads_nothing_back(monkeypatch):
    """The member env's draws and the relabelling are device ops: a collect step and an update of a
    bit-flipping population with HER (and PER) read no tensor value on the host."""
    from foxdqn.population import step as P
    from support import forbid_syncs
    from test_population import run

    s = run(configs([*HER, "replay=per"], MEMBERS[:2]), iterations=1)
    forbid_syncs(monkeypatch)
    P.collect_step(s)
    P.update_step(s)
