"""Gymnasium envs (env.name=gym) and the Nature CNN (model.encoder=nature_cnn) in a population.

P × N host envs in one vector env, member p's seeded from its own seed as a CPU single run of that
seed seeds its envs (foxdqn.population.gym_env.MemberGymEnv), and P Nature-CNN encoders in one module
(foxdqn.population.conv.MemberNatureCNN). Checked on CPU: three members with different seeds and
hyperparameters equal populations of one bit for bit (weights and observations; trained end to end:
metrics.csv rows, summaries, checkpoints) for Gymnasium's CartPole-v1 and for ALE Pong at 36×36 with
the Nature CNN; a member's envs start and step as a single run's; the member CNN equals the classic
encoder with the same weights (forward and gradients, odd shapes, grouped and per-member
convolutions); a member's weights load into the single run's network and give its Q."""
from __future__ import annotations

import pytest
import torch

from foxdqn.envs.gym_adapter import GymVectorEnv
from foxdqn.errors import ConfigError
from foxdqn.evaluate import evaluate_checkpoint
from foxdqn.nn.nature_cnn import NatureCNNEncoder
from foxdqn.population.conv import MemberNatureCNN, member_conv2d
from foxdqn.population.gym_env import MemberGymEnv, gym_seed, member_gym_seeds
from foxdqn.population.state import build_population
from foxdqn.step.build import build_env, build_network
from test_population import CPU, assert_member_equal, configs, run
from test_population_bitflip import assert_trained_members_equal_populations_of_one

pytest.importorskip("gymnasium")

GYM = ["+experiment=cartpole_gym", "debug=smoke", "device=cpu", "log.progress=false", "env.num_envs=3",
       "replay.capacity=300", "agent.batch_size=16", "model.hidden=[16,8]", "agent.learning_starts=32",
       "target.period=3"]
# ALE Pong through ale-py's vector env, 36x36 frames (the Nature CNN's smallest), 4 stacked: uint8 [4, 36, 36]
PONG = ["+experiment=pong_dqn", "debug=smoke", "device=cpu", "log.progress=false", "env.num_envs=2",
        "env.screen_size=36", "replay.capacity=200", "agent.batch_size=8", "model.hidden=[16]",
        "agent.learning_starts=16", "target.period=3", "agent.updates_per_iter=1"]
MEMBERS = [["seed=0"], ["seed=1", "optim.lr=1e-3"], ["seed=2", "agent.gamma=0.9", "loss.huber_delta=0.5"]]


def assert_members_equal_populations_of_one(base, envs_per_member, iterations):
    together = run(configs(base, MEMBERS), iterations=iterations)
    obs = together.obs.view(len(MEMBERS), envs_per_member, -1)
    for p, extra in enumerate(MEMBERS):
        alone = run(configs(base, [extra]), iterations=iterations)
        assert_member_equal(together, p, alone, 0)
        assert torch.equal(obs[p], alone.obs)
    assert not torch.equal(obs[0], obs[1])  # the members' envs are seeded apart
    before = build_population(configs(base, MEMBERS[:1]), None, CPU)
    assert not torch.equal(before.online.member_state_dict(0)["head.q.weight"],
                           together.online.member_state_dict(0)["head.q.weight"])  # they trained
    return together


def test_gym_members_equal_populations_of_one():
    together = assert_members_equal_populations_of_one(GYM, 3, iterations=30)
    assert isinstance(together.env, MemberGymEnv) and together.env.num_envs == 9
    assert together.obs.dtype == torch.float32 and together.obs.shape == (9, 4)


def test_nature_cnn_members_equal_populations_of_one():
    pytest.importorskip("ale_py")
    together = assert_members_equal_populations_of_one(PONG, 2, iterations=8)
    assert isinstance(together.online.member_encoder, MemberNatureCNN)
    assert together.obs.dtype == torch.uint8 and together.obs.shape == (6, 4 * 36 * 36)  # frames stay 1 byte


def test_trained_gym_members_equal_populations_of_one(tmp_path):
    base = [*GYM, "logger=csv", "agent.total_env_steps=360", "log.interval_env_steps=90", "eval.episodes=4"]
    for summary in assert_trained_members_equal_populations_of_one(base, MEMBERS, tmp_path):
        assert summary["metrics"]["agent"]["episodes"] == 4 and summary["updates"] > 0
    # an episodic env has no data splits: python -m foxdqn.evaluate refuses a split instead of ignoring it
    with pytest.raises(ConfigError, match="split=val: the gym env of this run has no data splits"):
        evaluate_checkpoint(tmp_path / "together" / "1" / "checkpoints" / "last.pt", split="val",
                            out=tmp_path / "evaluated")
    assert not (tmp_path / "evaluated").exists()


def test_trained_nature_cnn_members_equal_populations_of_one(tmp_path):
    pytest.importorskip("ale_py")
    base = [*PONG, "logger=csv", "agent.total_env_steps=96", "log.interval_env_steps=32", "eval.episodes=1"]
    summaries = assert_trained_members_equal_populations_of_one(base, MEMBERS[:2], tmp_path)
    assert all(summary["updates"] > 0 for summary in summaries)
    # a member's checkpoint is a single run's Nature-CNN network: python -m foxdqn.evaluate plays it
    evaluated, _ = evaluate_checkpoint(tmp_path / "together" / "1" / "checkpoints" / "last.pt",
                                       out=tmp_path / "evaluated")
    assert evaluated["metrics"]["agent"]["episodes"] == 1


def test_member_envs_start_and_step_as_a_cpu_single_runs():
    """Member p's envs are seeded as a single run of its seed seeds its GymVectorEnv on the CPU
    (foxdqn.step.build.build_env), so they start and, given the same actions, step as those."""
    cfgs = configs(GYM, MEMBERS)
    env = MemberGymEnv(cfgs[0].env, [c.seed for c in cfgs], 3, CPU)
    singles = []
    for c in cfgs:
        gen = torch.Generator(device=CPU)
        gen.manual_seed(c.seed)
        singles.append(build_env(c, None, "train", CPU, gen))
    assert [s.seed for s in singles] == [gym_seed(c.seed) for c in cfgs]
    assert env.seed == member_gym_seeds([c.seed for c in cfgs], 3) == [gym_seed(c.seed) + i for c in cfgs for i in range(3)]
    try:
        assert torch.equal(env.reset_all(), torch.cat([s.reset_all() for s in singles]))
        actions = torch.Generator().manual_seed(7)
        for _ in range(40):  # long enough for some episodes to end (auto-reset)
            a = torch.randint(0, 2, (9,), generator=actions)
            out = env.step(a)
            alone = [s.step(a[3 * p:3 * p + 3]) for p, s in enumerate(singles)]
            for field in ("obs", "next_obs", "reward", "terminated", "truncated"):
                assert torch.equal(getattr(out, field), torch.cat([getattr(o, field) for o in alone])), field
            assert torch.equal(out.info["episode_return"], torch.cat([o.info["episode_return"] for o in alone]))
    finally:
        env.close()
        for s in singles:
            s.close()


def test_gym_vector_env_refuses_a_wrong_number_of_seeds():
    cfg = configs(GYM, MEMBERS[:1])[0]
    with pytest.raises(ValueError, match="2 seeds for num_envs=3"):
        GymVectorEnv(cfg.env, 3, CPU, [1, 2])


def classic_encoders(obs_shape, hidden, members):
    encoders = []
    for p in range(members):
        torch.manual_seed(p)
        encoders.append(NatureCNNEncoder(obs_shape, hidden))
    return encoders


@pytest.mark.parametrize("grouped", [False, True], ids=["per-member", "grouped"])
def test_member_cnn_equals_the_classic_encoders(grouped):
    """Odd shapes (3 channels of 37×41, hidden [7, 5], 5 rows, 3 members): member p's features and
    the gradients of its parameters and inputs are the classic encoder's with the same weights."""
    obs_shape, hidden, p, m = (3, 37, 41), [7, 5], 3, 5
    encoders = classic_encoders(obs_shape, hidden, p)
    member = MemberNatureCNN.stack(encoders, grouped=grouped)
    obs = torch.randint(0, 256, (p, m, 3 * 37 * 41), generator=torch.Generator().manual_seed(1)).to(torch.float32)
    obs.requires_grad_(True)
    out = member(obs)
    assert out.shape == (p, m, 5) and member.out_dim == 5
    weights = torch.randn(p, m, 5, generator=torch.Generator().manual_seed(2))
    (out * weights).sum().backward()
    for i, enc in enumerate(encoders):
        x = obs.detach()[i].clone().requires_grad_(True)
        ref = enc(x)
        torch.testing.assert_close(out[i], ref, rtol=1e-5, atol=1e-6)
        (ref * weights[i]).sum().backward()
        torch.testing.assert_close(obs.grad[i], x.grad, rtol=1e-4, atol=1e-7)
        state = member.member_state_dict(i)
        assert state.keys() == enc.state_dict().keys()
        for j, conv in zip(MemberNatureCNN.CONV_INDICES, member.conv_weights):
            torch.testing.assert_close(conv.grad[i], enc.conv[j].weight.grad, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(member.fc[0].weight.grad[i], enc.fc[0].weight.grad.t(), rtol=1e-4, atol=1e-6)


def test_member_cnn_member_is_bit_for_bit_its_population_of_one_on_cpu():
    obs_shape, hidden = (4, 36, 39), [6]
    encoders = classic_encoders(obs_shape, hidden, 3)
    obs = torch.randint(0, 256, (3, 7, 4 * 36 * 39), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    together = MemberNatureCNN.stack(encoders)(obs)
    for p in range(3):
        assert torch.equal(together[p], MemberNatureCNN.stack(encoders[p:p + 1])(obs[p:p + 1])[0])


def test_member_conv2d_names_a_wrong_channel_count():
    with pytest.raises(ValueError, match=r"\[M, 8, H, W\] for 2 members of 4 input channels"):
        member_conv2d(torch.zeros(1, 4, 9, 9), torch.zeros(2, 3, 4, 2, 2), torch.zeros(2, 3), 1)


def test_a_nature_cnn_member_loads_into_the_single_runs_network():
    """member_state_dict is the single run's QNetwork layout (checkpoints, python -m foxdqn.evaluate)."""
    pytest.importorskip("ale_py")
    cfgs = configs(PONG, MEMBERS[:2])
    s = build_population(cfgs, None, CPU)
    try:
        obs = s.obs.view(2, 2, -1)
        q = s.online(obs)
        for p, c in enumerate(cfgs):
            net = build_network(c, s.env, s.action_mode.num_actions)
            net.load_state_dict(s.online.member_state_dict(p), strict=True)
            torch.testing.assert_close(net(obs[p]), q[p], rtol=1e-5, atol=1e-6)
    finally:
        s.env.close()


PRUNE = ["prune.enabled=true", "prune.initial_sparsity=0.2", "prune.final_sparsity=0.6", "prune.start_update=1",
         "prune.end_update=7", "prune.frequency=2", "debug.fit_prune_schedule=false"]


def test_pruned_nature_cnn_members_equal_populations_of_one():
    """prune.enabled prunes a member's convolutions and fully connected layers too (a single run
    prunes every parameter of 2 or more dimensions), each member its own."""
    pytest.importorskip("ale_py")
    together = assert_members_equal_populations_of_one([*PONG, *PRUNE], 2, iterations=8)
    conv = together.online.member_encoder.conv_weights[0]
    for p in range(3):
        assert int((conv[p] == 0).sum()) == int(0.6 * conv[p].numel())


def test_member_cnn_masks_are_the_single_runs_for_the_same_weights():
    """MemberPruner.step and a single network's MagnitudePruner.step on the same weights (rounded:
    many ties, broken by position in the classic layout) give the same masks, convolutions included."""
    pytest.importorskip("ale_py")
    import copy

    from foxdqn.step.build import build_network
    from foxdqn.step.pruning import MagnitudePruner

    cfgs = configs(PONG, [[*m, *PRUNE] for m in MEMBERS[:2]])
    pop = build_population(cfgs, None, CPU)
    try:
        with torch.no_grad():
            for w, _ in pop.online.member_encoder.pruned_matrices():
                w.copy_((w * 10).round() / 10)
        t = torch.tensor(3)
        pop.pruner.step(t, torch.zeros(2))
        for p, c in enumerate(cfgs):
            online = build_network(c, pop.env, pop.action_mode.num_actions)
            online.load_state_dict(pop.online.member_state_dict(p))
            r = c.prune
            pruner = MagnitudePruner(online, copy.deepcopy(online).requires_grad_(False), r.initial_sparsity,
                                     r.final_sparsity, r.start_update, r.end_update, r.frequency, device=CPU)
            pruner.step(t, torch.tensor(0.0))
            names = [n for n, w in online.named_parameters() if w.dim() >= 2]
            assert names[:4] == ["encoder.conv.0.weight", "encoder.conv.2.weight", "encoder.conv.4.weight",
                                 "encoder.fc.0.weight"]
            assert len(names) == len(pop.pruner.masks)
            for name, mask, single_mask in zip(names, pop.pruner.masks, pruner.masks):
                classic = mask[p] if mask.dim() == 5 else mask[p].t()
                assert torch.equal(classic, single_mask), (p, name)
                assert int((mask[p] == 0).sum()) > 0
    finally:
        pop.env.close()


@pytest.mark.parametrize("extra", [["head=c51"], ["head=iqn"], ["objective.iql=true"]], ids=["c51", "iqn", "iql"])
def test_nature_cnn_members_equal_populations_of_one_with_every_network(extra):
    """The distributional heads' member networks and IQL's value networks take the Nature CNN too."""
    pytest.importorskip("ale_py")
    members = [["seed=0", *extra], ["seed=1", "optim.lr=1e-3", *extra]]
    together = run(configs(PONG, members), iterations=4)
    assert isinstance(together.online.member_encoder, MemberNatureCNN)
    for p, m in enumerate(members):
        assert_member_equal(together, p, run(configs(PONG, [m]), iterations=4), 0)
