"""The population path: P members equal P runs of one member, per-member hyperparameters and
faults stay per member (CPU, eager; the GPU tests are in test_population_gpu.py)."""
from __future__ import annotations

import copy

import pytest
import torch

from foxdqn.config.compose import load_config
from foxdqn.data.synthetic import make_synthetic_ohlcv
from foxdqn.data import market_data_from_frame
from foxdqn.population import step as P
from foxdqn.population.state import build_population
from support import iterate

CPU = torch.device("cpu")
CARTPOLE = ["+experiment=cartpole_cleanrl", "debug=smoke", "device=cpu", "log.progress=false", "env.num_envs=4",
            "replay.capacity=512", "agent.batch_size=16", "model.hidden=[16,8]", "agent.learning_starts=32",
            "target.period=3"]
TRADING = ["debug=smoke", "device=cpu", "log.progress=false", "env.num_envs=3", "replay.capacity=300",
           "agent.batch_size=8", "model.hidden=[16]", "env.window=8", "env.episode_length=16", "replay.n_step=3"]


def configs(base, members):
    """One config per member: ``members`` is a list of override lists."""
    return [load_config([*base, *extra]) for extra in members]


def market_for(cfg):
    if cfg.env.name != "trading":
        return None
    frame = make_synthetic_ohlcv(600, drift_per_bar=1e-4, vol=2e-3, seed=3)
    return market_data_from_frame(frame, cfg.data, cfg.env.window, cfg.env.episode_length)


def run(cfgs, iterations=12, collect_first=10):
    """A population of ``cfgs`` after ``collect_first`` collect-only and ``iterations`` full iterations."""
    s = build_population(cfgs, market_for(cfgs[0]), CPU)
    return iterate(s, False, collect_first, iterations).s  # training's steps (step_fns of s)


def member_tensors(s, p):
    """Member p's weights: online, target and (objective.iql) value network."""
    nets = {"online": s.online, "target": s.target, **({"value": s.value} if s.value is not None else {})}
    return {f"{name}.{k}": v for name, net in nets.items() for k, v in net.member_state_dict(p).items()}


def assert_member_equal(a, p, b, q):
    ta, tb = member_tensors(a, p), member_tensors(b, q)
    for k in ta:
        assert torch.equal(ta[k], tb[k]), f"{k} differs"


def assert_members_equal_runs_of_one(base, members):
    """A population of ``members`` (override lists on ``base``) against one population of one per
    member, bit for bit; returns the population."""
    together = run(configs(base, members))
    for p, extra in enumerate(members):
        assert_member_equal(together, p, run(configs(base, [extra])), 0)
    return together

def assert_fused_loss_equals_torch_ops(s, batch, module, name, rewind=None):
    """The population's loss where the fused kernels run (inside cpu_kernels) takes ``module.name``
    (one op, patched to count its calls) and its loss, td_abs, Q and every online parameter's
    gradient equal the torch ops' that run elsewhere (float tolerance); ``rewind``: a tensor
    restored before each loss (a counter the loss draws from). Returns the op's keyword arguments."""
    from foxdqn.ops import backend as B
    from foxdqn.population.step import population_loss

    saved = None if rewind is None else rewind.clone()
    calls = []
    real = getattr(module, name)

    def loss_and_grads():
        if rewind is not None:
            rewind.copy_(saved)
        for t in s.online.parameters():
            t.grad = None
        out = population_loss(s, batch)
        out.loss.sum().backward()
        return out, [t.grad.clone() for t in s.online.parameters()]

    want, want_grads = loss_and_grads()
    setattr(module, name, lambda *a, **k: calls.append(k) or real(*a, **k))
    try:
        with B.cpu_kernels():
            got, got_grads = loss_and_grads()
    finally:
        setattr(module, name, real)
    assert len(calls) == 1
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.td_abs, want.td_abs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.q_values, want.q_values, rtol=1e-5, atol=1e-6)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    return calls[0]



def assert_fault_stays_in_its_member(base, members):
    """Three members (override lists on ``base``), the second with ``debug.inject_nan_at_step=4``:
    it halts, and the other two are bit for bit what they are without the fault."""
    clean = run(configs(base, members))
    faulty_members = copy.deepcopy(members)
    faulty_members[1].append("debug.inject_nan_at_step=4")
    faulty = run(configs(base, faulty_members))
    for p in (0, 2):
        assert_member_equal(faulty, p, clean, p)
    assert faulty.guard.halted.tolist() == [0.0, 1.0, 0.0]


def perturb_target(s, scale=0.05):
    """Move the target network's weights off the online network's (so a loss reads both)."""
    with torch.no_grad():
        for w in s.target.parameters():
            w.add_(scale * torch.randn_like(w))


def member_grads(net, p):
    """Member p's parameter gradients, in its classic network's state_dict layout (any member network
    or encoder with ``member_state_dict``)."""
    grads = copy.deepcopy(net)
    with torch.no_grad():
        for g, w in zip(grads.parameters(), net.parameters()):
            g.copy_(w.grad)
    return grads.member_state_dict(p)


def assert_member_grads_match(net, p, single):
    """Member p's gradients in ``net`` equal those of the classic network ``single`` (float tolerance)."""
    grads = member_grads(net, p)
    for k, w in single.named_parameters():
        torch.testing.assert_close(grads[k], w.grad, rtol=1e-4, atol=1e-6, msg=k)


def test_members_equal_runs_of_one_member_cartpole():
    members = [["seed=0"], ["seed=1", "optim.lr=1e-3"], ["seed=2", "agent.gamma=0.9", "loss.huber_delta=0.5"]]
    together = run(configs(CARTPOLE, members))
    for p, extra in enumerate(members):
        alone = run(configs(CARTPOLE, [extra]))
        assert_member_equal(together, p, alone, 0)
        assert torch.equal(together.obs.view(3, 4, -1)[p], alone.obs)


def test_members_equal_runs_of_one_member_cartpole_in_the_fused_kernels(monkeypatch):
    """Inside cpu_kernels (the CUDA path's kernels in Triton's interpreter) a Double DQN plain-Q
    population trains through member_mlp_chain_split: each member still equals the population of
    one of its seed, bit for bit."""
    import foxdqn.population.network as net_mod
    from foxdqn.ops.backend import cpu_kernels

    calls = []
    real = net_mod.member_mlp_chain_split
    monkeypatch.setattr(net_mod, "member_mlp_chain_split", lambda *a, **k: calls.append(1) or real(*a, **k))
    base = [*CARTPOLE, "head.double=true"]
    members = [["seed=0"], ["seed=1", "optim.lr=1e-3", "agent.gamma=0.9"]]
    with cpu_kernels():
        together = run(configs(base, members), iterations=4, collect_first=10)
        assert calls
        for p, extra in enumerate(members):
            assert_member_equal(together, p, run(configs(base, [extra]), iterations=4, collect_first=10), 0)


def test_members_equal_runs_of_one_member_trading_n_step():
    assert_members_equal_runs_of_one(TRADING, [["seed=5"], ["seed=6", "explore.eps_end=0.3", "loss.reward_scale=10"]])


def test_members_learn_and_differ():
    s0 = build_population(configs(CARTPOLE, [["seed=0"], ["seed=1"]]), None, CPU)
    start = [member_tensors(s0, p) for p in range(2)]
    s = run(configs(CARTPOLE, [["seed=0"], ["seed=1"]]))
    for p in range(2):
        moved = [not torch.equal(v, start[p][k]) for k, v in member_tensors(s, p).items() if k.startswith("online")]
        assert all(moved)
    assert not torch.equal(s.online.weights[0][0], s.online.weights[0][1])


def test_lr_zero_member_does_not_move():
    cfgs = configs(CARTPOLE, [["seed=0"], ["seed=1"]])
    cfgs[1].optim.lr = 0.0  # the config refuses lr 0; the mechanism (a [P] lr) is what is tested
    s0 = build_population(cfgs, None, CPU)
    before = member_tensors(s0, 1)
    s = run(cfgs)
    after = member_tensors(s, 1)
    for k, v in before.items():
        if k.startswith("online"):
            assert torch.equal(after[k], v), k


def test_hard_target_period_per_member():
    cfgs = configs(CARTPOLE, [["seed=0", "target.period=1"], ["seed=1", "target.period=1000"]])
    s = run(cfgs, iterations=5)
    online, target = member_tensors(s, 0), member_tensors(s, 1)
    w = "encoder.net.0.weight"
    assert torch.equal(online[f"online.{w}"], online[f"target.{w}"])  # copied after every update
    assert not torch.equal(target[f"online.{w}"], target[f"target.{w}"])  # never copied yet


def test_fault_in_one_member_leaves_the_others_bit_identical():
    clean = run(configs(CARTPOLE, [["seed=0"], ["seed=1"], ["seed=2"]]))
    faulty_cfgs = configs(CARTPOLE, [["seed=0"], ["seed=1", "debug.inject_nan_at_step=4"], ["seed=2"]])
    faulty = run(faulty_cfgs)
    for p in (0, 2):
        assert_member_equal(faulty, p, clean, p)
    assert faulty.guard.halted.tolist() == [0.0, 1.0, 0.0]
    assert faulty.guard.reason(1).startswith("non-finite") and faulty.guard.reason(1).endswith("update 4")
    assert faulty.guard.reason(0) is None
    # member 1 kept the weights it had before update 4: equal to a run stopped after 4 updates
    four = run(configs(CARTPOLE, [["seed=1"]]), iterations=4)
    assert_member_equal(faulty, 1, four, 0)


def test_loss_clip_halts_only_that_member():
    s = run(configs(CARTPOLE, [["seed=0"], ["seed=1", "guard.loss_clip=1e-12"]]), iterations=3)
    assert s.guard.halted.tolist() == [0.0, 1.0]
    assert "guard.loss_clip" in s.guard.reason(1)


def test_member_hyperparameters_are_the_member_keys():
    from dataclasses import fields

    from foxdqn.population.grouping import MEMBER_KEYS, NETWORK_KEYS, SETUP_KEYS
    from foxdqn.population.hparams import KEYS, MemberParams

    assert set(MEMBER_KEYS) == {"seed", *SETUP_KEYS, *KEYS.values(), *NETWORK_KEYS}
    assert SETUP_KEYS == ("data.augment.block_length",)  # read by population.envs.member_paths
    assert NETWORK_KEYS == ("head.v_min", "head.v_max")  # C51's support: population.distributional
    assert {f.name for f in fields(MemberParams)} == set(KEYS)


def test_switch_margin_members_equal_runs_of_one_member():
    """action.switch_margin in a population: each member's penalty uses its own reward scale, in the
    collect step and in the bootstrap target's argmax; members equal populations of one."""
    base = [*TRADING, "action.switch_margin=3"]
    together = assert_members_equal_runs_of_one(
        base, [["seed=5"], ["seed=6", "loss.reward_scale=10"], ["seed=7", "agent.gamma=0.9"]])
    assert together.switch is not None


def test_switch_margin_changes_what_a_population_learns():
    """The penalty reaches the collect step and the target: with a huge margin the greedy part never
    leaves its position, so the members' weights differ from a run without it."""
    members = [["seed=5"], ["seed=6"]]
    plain = run(configs(TRADING, members))
    priced = run(configs([*TRADING, "action.switch_margin=1000"], members))
    assert any(not torch.equal(a, b) for a, b in zip(member_tensors(plain, 0).values(),
                                                     member_tensors(priced, 0).values()))
    from foxdqn.population.ensemble import ensemble_walks
    from foxdqn.population.evaluate import member_walks

    market = market_for(priced.cfg)
    assert [w["metrics"]["agent"]["num_trades"] for w in member_walks(priced, market, "test", ("agent",))] == [0, 0]
    assert ensemble_walks(priced, market, [0, 1], "mean")[0]["metrics"]["num_trades"] == 0
    assert sum(w["metrics"]["agent"]["num_trades"] for w in member_walks(plain, market, "test", ("agent",))) > 0


def test_cql_members_equal_runs_of_one_member():
    """objective.cql_alpha is a member key: members with different α (0 included) and seeds equal
    populations of one, bit for bit; a member with α = 0 equals a population of one without CQL."""
    members = [["seed=0", "objective.cql_alpha=1.0"], ["seed=1", "objective.cql_alpha=0.3", "optim.lr=1e-3"],
               ["seed=2", "objective.cql_alpha=0"]]
    together = run(configs(CARTPOLE, members))
    assert together.cql and torch.equal(together.params.cql_alpha, torch.tensor([1.0, 0.3, 0.0]))
    for p, extra in enumerate(members):
        alone = run(configs(CARTPOLE, [extra]))
        assert alone.cql == (p < 2)
        assert_member_equal(together, p, alone, 0)


def test_cql_members_equal_runs_of_one_member_trading():
    base = [*TRADING, "objective=cql"]  # eurusd_cql's objective: α = 1
    together = assert_members_equal_runs_of_one(
        base, [["seed=5"], ["seed=6", "objective.cql_alpha=4", "loss.reward_scale=10"]])
    assert together.cql


def test_cql_alpha_changes_what_a_member_learns():
    """The CQL(H) term reaches the update: the same seed with α = 0 and α = 5 ends elsewhere."""
    s = run(configs(CARTPOLE, [["seed=0", "objective.cql_alpha=0"], ["seed=0", "objective.cql_alpha=5"]]))
    a, b = member_tensors(s, 0), member_tensors(s, 1)
    assert all(not torch.equal(a[k], b[k]) for k in a if k.startswith("online"))


@pytest.mark.parametrize("head", ["q", "c51"])
def test_cql_population_loss_takes_its_fused_op_where_the_kernels_run(head):
    """Inside cpu_kernels the CQL(H) term is computed in dqn_td_loss's kernel for a plain Q head and
    by ops/cql_loss.py's kernel (and a multiply in backward) for a C51 head's expected Q: losses,
    |TD| and gradients equal those of cql_regulariser's torch ops to float32 rounding, members with
    their own α (0 included)."""
    import contextlib

    from bench.cpu_kernels import launches, small_overrides
    from bench.harness import make_population
    from foxdqn.ops import backend as B

    extra = ["head.atoms=11"] if head == "c51" else []
    s = make_population(["+experiment=eurusd_cql", *small_overrides("eurusd_cql"), f"head={head}", *extra], 3, "cpu")
    s.params.cql_alpha.copy_(torch.tensor([1.0, 0.0, 3.0]))
    for _ in range(4):
        P.collect_step(s)
    batch = s.replay.sample_members(s.cfg.agent.batch_size)
    outs = []
    for fused in (False, True):
        s.optimizer.zero_grad(set_to_none=True)
        with B.cpu_kernels() if fused else contextlib.nullcontext():
            out = P.population_loss(s, batch)
            out.loss.sum().backward()
        outs.append((out, [w.grad.clone() for w in s.optimizer.params]))
    (plain, g_plain), (fused, g_fused) = outs
    torch.testing.assert_close(fused.loss, plain.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused.td_abs, plain.td_abs, rtol=1e-5, atol=1e-5)
    for a, b in zip(g_fused, g_plain):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    ops = launches(lambda: P.population_loss(s, batch).loss.sum().backward())
    # (a C51 head's expected Q with gradient is its softmax's torch ops: exp there is not CQL's)
    assert ops.count("triton::_cql_loss_kernel") == (head == "c51") and "aten::logsumexp" not in ops, ops
    assert head == "c51" or ("aten::exp" not in ops and ops.count("triton::_dqn_td_loss_kernel") == 1), ops


def value_tensors(s, p):
    return s.value.member_state_dict(p)


def test_iql_members_equal_runs_of_one_member():
    """objective.iql in a population: each member has its own value network (trained with its Q by
    its Adam, clipped with it), objective.iql_expectile is a member key; members with different τ,
    α and seeds equal populations of one, bit for bit, value networks included."""
    together = assert_members_equal_runs_of_one(
        [*CARTPOLE, "objective=iql"],
        [["seed=0"], ["seed=1", "objective.iql_expectile=0.9", "objective.cql_alpha=0.5"],
         ["seed=2", "objective.iql_expectile=0.5", "optim.grad_clip=0.05"]])
    assert any(k.startswith("value.") for k in member_tensors(together, 0))
    assert torch.equal(together.params.iql_expectile, torch.tensor([0.7, 0.9, 0.5])) and together.cql


def test_iql_members_equal_runs_of_one_member_trading():
    assert_members_equal_runs_of_one([*TRADING, "objective=iql"],
                                     [["seed=5"], ["seed=6", "objective.iql_expectile=0.9", "loss.reward_scale=10"]])


def test_iql_value_network_starts_as_a_single_runs_and_trains():
    """A member's V starts from the weights a single run (a population of one) of its seed builds,
    in IQLValueNetwork's layout, moves in training, and its expectile τ changes what it learns."""
    from foxdqn.step.build import build_iql_value

    cfgs = configs([*CARTPOLE, "objective=iql"], [["seed=3"], ["seed=3", "objective.iql_expectile=0.95"]])
    s0 = build_population(cfgs, None, CPU)
    single = value_tensors(build_population(cfgs[:1], None, CPU), 0)
    start = value_tensors(s0, 0)
    assert start.keys() == single.keys() == build_iql_value(cfgs[0], s0.env).state_dict().keys()
    for k, w in single.items():
        assert torch.equal(start[k], w), k
    assert_member_equal(s0, 0, s0, 1)  # one seed: the same Q networks and value networks
    s = run(cfgs)
    trained = [value_tensors(s, p) for p in range(2)]
    assert all(not torch.equal(trained[0][k], start[k]) for k in start)
    assert any(not torch.equal(trained[0][k], trained[1][k]) for k in start)


def test_iql_gradient_norm_covers_the_value_network():
    """Each member's clip norm is over its Q and V gradients together (a single run clips
    online + extra_parameters as one)."""
    from foxdqn.population.stats import GRAD_NORM_SUM

    s = run(configs([*CARTPOLE, "objective=iql"], [["seed=0"], ["seed=1"]]), iterations=1)
    before = s.stats.acc[:, GRAD_NORM_SUM].clone()
    P.update_step(s)
    norm = (s.stats.acc[:, GRAD_NORM_SUM] - before).float()
    squares = {net: sum(w.grad.flatten(1).double().square().sum(1) for w in getattr(s, net).parameters())
               for net in ("online", "value")}
    torch.testing.assert_close(norm, (squares["online"] + squares["value"]).sqrt().float(), rtol=1e-5, atol=0)
    assert (squares["value"] > 0).all()


def test_iql_member_checkpoint_holds_its_value_network(tmp_path):
    from foxdqn.run.checkpoint import load_checkpoint
    from foxdqn.population.train import member_checkpoint

    s = run(configs([*CARTPOLE, "objective=iql"], [["seed=0"], ["seed=1"]]), iterations=2)
    payload = load_checkpoint(member_checkpoint(s, 1, tmp_path / "last.pt"))
    own = value_tensors(s, 1)
    assert payload["iql_value"].keys() == own.keys() and all(torch.equal(payload["iql_value"][k], own[k]) for k in own)
    plain = run(configs(CARTPOLE, [["seed=0"], ["seed=1"]]), iterations=1)
    assert "iql_value" not in load_checkpoint(member_checkpoint(plain, 0, tmp_path / "plain.pt"))


def test_member_layers_do_not_depend_on_the_population_size():
    """A population of one computes every layer as a member of P, forward and backward, also the
    one-column dueling value stream (CPU: torch's baddbmm of one matrix is a GEMV that rounds
    otherwise than the batched GEMM; MemberQNetwork.layer)."""
    from foxdqn.population.network import MemberQNetwork

    g = torch.Generator().manual_seed(0)
    shapes = [(64, 64), (64, 1), (64, 45)]  # encoder, value, advantage (the trading env's 45 actions)
    weights = [torch.randn(3, i, o, generator=g) for i, o in shapes]
    biases = [torch.randn(3, 1, o, generator=g) for _, o in shapes]
    obs, grad_q = torch.randn(3, 35, 64, generator=g), torch.randn(3, 35, 45, generator=g)
    results = []
    for members in (slice(0, 3), slice(2, 3)):
        net = MemberQNetwork([w[members].clone() for w in weights], [b[members].clone() for b in biases], "relu",
                             True, ["encoder.net.0", "head.value", "head.advantage"])
        x = obs[members].clone().requires_grad_(True)
        q = net(x)
        q.backward(grad_q[members])
        results.append([q.detach()[-1], x.grad[-1], *(w.grad[-1] for w in net.parameters())])
    for together, alone in zip(*results):
        assert torch.equal(together, alone)


def test_initial_networks_are_a_single_runs_seeded_init_without_seeding_the_accelerators(monkeypatch):
    """Member p's networks are what ``torch.manual_seed(seed)`` then ``build_network`` (and
    ``build_iql_value``) give, and building them formats no stack trace: ``torch.manual_seed``
    queues a lazy seeding of each accelerator backend not initialised (XPU and MTIA on a CUDA
    machine, CUDA too before its first call), each with ``traceback.format_stack()``, ~1 ms a
    member on the 2-core CPU."""
    import traceback

    from foxdqn.population.state import initial_networks
    from foxdqn.step.build import build_iql_value, build_network

    cfgs = configs([*CARTPOLE, "objective=iql"], [["seed=3"], ["seed=11"], ["seed=3", "optim.lr=1e-3"]])
    s = build_population(cfgs, None, CPU)
    actions = s.action_mode.num_actions
    traces, format_stack = [], traceback.format_stack
    monkeypatch.setattr(traceback, "format_stack", lambda *a, **k: traces.append(1) or format_stack(*a, **k))
    nets, values = initial_networks(cfgs, s.env, actions, CPU)
    assert traces == []
    monkeypatch.undo()
    firsts = []
    for c, net, value in zip(cfgs, nets, values):
        torch.manual_seed(c.seed)
        for got, want in ((net, build_network(c, s.env, actions)), (value, build_iql_value(c, s.env))):
            got, want = got.state_dict(), want.state_dict()
            assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
        firsts.append(next(iter(net.state_dict().values())))
    assert torch.equal(firsts[0], firsts[2]) and not torch.equal(firsts[0], firsts[1])
