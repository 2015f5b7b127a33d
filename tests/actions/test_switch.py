"""Cost-aware greedy choice (action.switch_margin, foxdqn.actions.switch): the penalty by hand, the
env's accounts, margin 0 changes nothing, a large margin never switches (walks, collect, target),
and the targets' argmax with the penalty against their plain definitions."""
import numpy as np
import pytest
import torch

from foxdqn.actions.switch import NextStatePenalty, SwitchPenalty, action_exposures, switch_penalty
from foxdqn.envs import EXPOSURES, ExecutionConfig, TradingEnv
from foxdqn.execution.orders import FLAT, compose, factor
from foxdqn.execution.fills import unit_switch_cost
from foxdqn.objectives.dqn import DQNObjective, double_dqn_target
from foxdqn.replay.buffer import Batch

from support import market_from_arrays, member_network, small_state

EXPO = torch.tensor(EXPOSURES, dtype=torch.float64)


def env_of(num_envs=4, eval_mode=False, T=400, seed=0, spread=None):
    rng = np.random.default_rng(seed)
    close = 100.0 * np.exp(np.cumsum(rng.normal(0.0, 2e-3, T)))
    open_ = np.concatenate([[100.0], close[:-1]])
    high, low = np.maximum(open_, close) * 1.001, np.minimum(open_, close) * 0.999
    spread = rng.uniform(0.5e-4, 3e-4, T) if spread is None else np.full(T, spread)
    market = market_from_arrays(open_, high, low, close, spread, rng.normal(size=(T, 2)).astype(np.float32))
    return TradingEnv(market, "train", num_envs=num_envs, window=2, episode_length=50, execution=ExecutionConfig(),
                      device=torch.device("cpu"), dtype=torch.float64,
                      generator=torch.Generator().manual_seed(seed), eval_mode=eval_mode)


# ------------------------------------------------------------------------------------ by hand
def test_unit_switch_cost_by_hand():
    # default costs: s/2 + (0.3 bp normal slippage + 0.3 bp taker fee) = 2 bp + 0.6 bp
    cost = unit_switch_cost(torch.tensor([4e-4], dtype=torch.float64), ExecutionConfig())
    assert cost.item() == pytest.approx(2.6e-4, rel=1e-12)


def test_the_penalty_and_the_choice_by_hand():
    # flat (x = 0, index 2) and short (x = -1.02, index 0 held), c = 2.6e-4, m·k = 2·100
    pen = switch_penalty(torch.tensor([0.0, -1.02]), torch.tensor([FLAT, 0]), torch.tensor([2.6e-4, 2.6e-4]),
                         EXPO, 200.0)
    expected = torch.tensor([[0.052, 0.026, 0.0, 0.026, 0.052],
                             [0.0, 0.52 * 0.052, 1.02 * 0.052, 1.52 * 0.052, 2.02 * 0.052]], dtype=torch.float64)
    assert pen.dtype == torch.float32
    torch.testing.assert_close(pen, expected.float(), rtol=1e-6, atol=0)
    # flat: Q prefers +1 by 0.04 over flat, less than its penalty 0.052 -> keep flat; +0.5 gains 0.01 < 0.026
    q = torch.tensor([[0.10, 0.12, 0.13, 0.14, 0.17],
                      # short held: +1 gains 0.5 over keeping, its penalty is 0.105 -> switch to +1
                      [0.00, 0.01, 0.05, 0.06, 0.50]])
    assert q.argmax(1).tolist() == [4, 4]
    assert (q - pen).argmax(1).tolist() == [FLAT, 4]


def test_action_exposures_of_the_modes():
    fac = action_exposures("factored")
    assert fac.tolist() == [a // 9 for a in range(45)]
    assert torch.equal(action_exposures("branching"), fac) and torch.equal(action_exposures(None), fac)
    assert action_exposures("exposure_routed").tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="mode_name"):
        action_exposures("nope")


@pytest.mark.parametrize("margin", [0.0, -1.0, float("nan")])
def test_switch_penalty_refuses_a_margin_that_is_not_positive(margin):
    with pytest.raises(ValueError, match="margin"):
        SwitchPenalty(margin, 100.0, "factored", "cpu")


# ------------------------------------------------------------------------------------ the env's accounts
def test_the_account_of_the_env_and_of_its_codes():
    env = env_of(num_envs=6)
    env.reset_all()
    a = env.account()
    assert a.exposure.tolist() == [0.0] * 6 and a.held.tolist() == [FLAT] * 6
    torch.testing.assert_close(a.spread, env.market_state()[0], rtol=0, atol=0)
    g = torch.Generator().manual_seed(1)
    for _ in range(30):
        out = env.step(torch.randint(0, 45, (6,), generator=g))
        kept = ~out.info["episode_done"]  # next_state_code is the state the env holds unless it reset
        now, coded = env.account(), env.account(out.info["next_state_code"])
        torch.testing.assert_close(coded.exposure[kept], now.exposure[kept], rtol=1e-12, atol=0)
        assert torch.equal(coded.held[kept], now.held[kept])
        torch.testing.assert_close(coded.spread[kept], now.spread[kept], rtol=0, atol=0)
        held = env.exposure_idx
        assert torch.equal(now.held, held)
        assert ((now.exposure - EXPO[held]).abs() < 0.05).all()  # a fresh position near its nominal exposure


def test_the_held_index_of_a_code_is_the_nearest_exposure():
    env = env_of(num_envs=1)
    # bar 10, units giving exposures -0.8, -0.74, 0.25 (tie: the lower), 0.3, 0.76 at equity 1
    close = float(env._close[10])
    x = torch.tensor([-0.8, -0.74, 0.25, 0.3, 0.76], dtype=torch.float64)
    code = torch.stack([torch.full((5,), 10.0, dtype=torch.float64), x / close, torch.zeros(5, dtype=torch.float64),
                        torch.ones(5, dtype=torch.float64)], dim=1)
    a = env.account(code)
    assert a.held.tolist() == [0, 1, 2, 3, 4]
    torch.testing.assert_close(a.exposure, x, rtol=1e-12, atol=0)


def test_the_penalty_of_the_env_by_hand():
    env = env_of(num_envs=2, spread=4e-4)
    env.reset_all()
    env.step(torch.tensor([compose(4, 0, 1), compose(FLAT, 0, 1)]))  # env 0 goes long 1, env 1 stays flat
    x = env.account().exposure
    pen = SwitchPenalty(2.0, 100.0, "factored", "cpu")(env)
    assert pen.shape == (2, 45)
    c = 2.6e-4  # 4 bp spread / 2 + 0.6 bp
    for e in range(5):
        for a in (9 * e, 9 * e + 4, 9 * e + 8):  # every order type and urgency of one exposure: the same
            held = (4, FLAT)
            want = [0.0 if e == held[i] else 200 * c * abs(EXPOSURES[e] - float(x[i])) for i in range(2)]
            torch.testing.assert_close(pen[:, a], torch.tensor(want, dtype=torch.float32), rtol=1e-6, atol=1e-9)


# ------------------------------------------------------------------------------------ margin 0 is the argmax
def test_margin_zero_leaves_the_argmax_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(257, 45, generator=g).round(decimals=1)  # many ties
    q[3, 7] = float("nan")
    pen = switch_penalty(torch.randn(257, generator=g, dtype=torch.float64), torch.randint(0, 5, (257,), generator=g),
                         torch.rand(257, generator=g, dtype=torch.float64) * 1e-3, EXPO, 0.0)
    assert torch.equal(pen, torch.zeros_like(pen))
    assert torch.equal((q - pen[:, action_exposures("factored")]).argmax(1), q.argmax(1))


def test_margin_zero_builds_no_penalty_anywhere():
    s, _ = small_state()
    assert s.switch is None  # neither in acting nor in the targets (foxdqn.population.switch)


# ------------------------------------------------------------------------------------ a large margin never switches
def test_a_large_margin_keeps_every_position():
    env = env_of(num_envs=64)
    env.reset_all()
    g = torch.Generator().manual_seed(2)
    for _ in range(5):  # positions of every exposure
        env.step(torch.randint(0, 45, (64,), generator=g))
    held = env.exposure_idx.clone()
    assert len(set(held.tolist())) == 5
    for mode, q_cols in (("factored", 45), ("exposure_routed", 5)):
        pen = SwitchPenalty(1e9, 100.0, mode, "cpu")(env)
        q = torch.randn(64, q_cols, generator=g) * 10
        chosen = (q - pen).argmax(1)
        assert torch.equal(action_exposures(mode)[chosen], held)


@pytest.mark.parametrize("action", ["factored", "branching", "exposure_routed"])
def test_a_large_margin_never_trades_in_collect_and_walks(action):
    from foxdqn.analysis.backtest import evaluate
    from foxdqn.population.step import collect_step

    s, market = small_state([f"action={action}", "action.switch_margin=1e9", "explore.eps_start=0",
                             "explore.eps_end=0"])
    assert s.switch is not None
    for _ in range(20):
        collect_step(s)
        assert (s.env.exposure_idx == FLAT).all()  # greedy from flat: never an order
    online, mode = member_network(s)
    result = evaluate(s.cfg, market, online, s.device, split="val", action_mode=mode, policies=("agent",))
    assert result["metrics"]["agent"]["num_trades"] == 0
    s0, _ = small_state([f"action={action}", "explore.eps_start=0", "explore.eps_end=0"])
    for _ in range(20):  # the same run without the margin trades (so the test can fail)
        collect_step(s0)
    assert (s0.env.exposure_idx != FLAT).any()


# ------------------------------------------------------------------------------------ the targets
class Codes:
    """A stand-in NextStatePenalty: a fixed [B, 5] penalty per exposure."""

    def __init__(self, per_exposure, mode="factored"):
        self.table, self.map = per_exposure, action_exposures(mode)

    def per_exposure(self, batch):
        return self.table

    def __call__(self, batch):
        return self.table[:, self.map]


def linear_nets(d, a, seed):
    g = torch.Generator().manual_seed(seed)
    online, target = torch.nn.Linear(d, a), torch.nn.Linear(d, a)
    with torch.no_grad():
        for p in [*online.parameters(), *target.parameters()]:
            p.copy_(torch.randn(p.shape, generator=g))
    return online, target.requires_grad_(False)


def batch_of(b, d, seed):
    g = torch.Generator().manual_seed(seed)
    return Batch(torch.randn(b, d, generator=g), torch.randint(0, 45, (b,), generator=g), torch.randn(b, generator=g),
                 torch.randn(b, d, generator=g), torch.rand(b, generator=g), torch.rand(b, generator=g) + 0.5,
                 torch.arange(b))


def test_double_dqn_target_with_the_penalty_by_hand():
    # one state, 3 "actions" whose exposures are those of columns 0, 2, 4 of EXPOSURES
    online, target = (lambda x: torch.tensor([[1.0, 0.9, 0.5]])), (lambda x: torch.tensor([[10.0, 20.0, 30.0]]))
    pen = torch.tensor([[0.3, 0.0, 0.3]])  # held: the middle action
    r, disc = torch.tensor([1.0]), torch.tensor([0.5])
    # double: argmax [0.7, 0.9, 0.2] = 1 -> y = 1 + 0.5 * 20; plain: argmax [9.7, 20, 29.7] = 2 -> 1 + 0.5 * 30
    assert double_dqn_target(online, target, None, r, disc, True, pen).item() == 11.0
    assert double_dqn_target(online, target, None, r, disc, False, pen).item() == 16.0
    assert double_dqn_target(online, target, None, r, disc, True).item() == 6.0  # without: argmax 0


@pytest.mark.parametrize("double", [True, False])
@pytest.mark.parametrize("stack", [True, False])
def test_dqn_objective_with_the_penalty_equals_its_definition(double, stack):
    online, target = linear_nets(6, 45, 0)
    batch = batch_of(11, 6, 1)
    table = torch.rand(11, 5, generator=torch.Generator().manual_seed(3))
    table[torch.arange(11), torch.randint(0, 5, (11,), generator=torch.Generator().manual_seed(4))] = 0
    switch = Codes(table)
    out = DQNObjective(online, target, double=double, huber_delta=0.7, stack_double=stack, switch=switch)(batch)
    y = double_dqn_target(online, target, batch.next_obs, batch.reward, batch.discount, double, switch(batch))
    q_sa = online(batch.obs).gather(1, batch.action[:, None]).squeeze(1)
    want = (torch.nn.functional.huber_loss(q_sa, y, reduction="none", delta=0.7) * batch.weight).mean()
    torch.testing.assert_close(out.loss, want, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(out.td_abs, (q_sa - y).abs().detach(), rtol=1e-6, atol=1e-6)
    # the penalty changes the target here (the test can fail)
    plain = double_dqn_target(online, target, batch.next_obs, batch.reward, batch.discount, double)
    assert not torch.equal(plain, y)


def test_branching_target_scales_the_exposure_penalty_to_the_joint_q():
    from foxdqn.nn.branching import BranchingHead, BranchingNetwork, combine_branches, factor_branches
    from foxdqn.nn.mlp import MLPEncoder
    from foxdqn.objectives.branching import branching_target

    torch.manual_seed(0)
    online = BranchingNetwork(MLPEncoder(6, [16]), BranchingHead(16)).double()
    target = BranchingNetwork(MLPEncoder(6, [16]), BranchingHead(16)).double()
    g = torch.Generator().manual_seed(5)
    next_obs = torch.randn(64, 6, generator=g, dtype=torch.float64)
    reward, disc = torch.randn(64, dtype=torch.float64, generator=g), torch.rand(64, dtype=torch.float64, generator=g)
    pen = torch.rand(64, 5, generator=g, dtype=torch.float64) * 0.5
    y = branching_target(online, target, next_obs, reward, disc, True, pen)
    with torch.no_grad():  # the definition: the joint argmax of Q − penalty, evaluated branch by branch
        joint = combine_branches(online.branch_q(next_obs)) - pen[:, action_exposures("branching")]
        parts = factor_branches(joint.argmax(1), (5, 3, 3))
        values = [q.gather(1, a[:, None]).squeeze(1) for q, a in zip(target.branch_q(next_obs), parts)]
        want = reward + disc * torch.stack(values).mean(0)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(y, branching_target(online, target, next_obs, reward, disc, True))
    assert factor(torch.tensor(44))[0].item() == 4  # the exposure branch is the first


def test_next_state_penalty_needs_codes():
    env = env_of()
    p = NextStatePenalty(SwitchPenalty(1.0, 100.0, "factored", "cpu"), env)
    with pytest.raises(ValueError, match="next_code"):
        p(batch_of(3, 4, 0))


@pytest.mark.parametrize("action", ["factored", "branching"])
def test_the_options_keep_the_loop_sync_free(monkeypatch, action):
    """With action.switch_margin and data.augment the steady-state iteration and a greedy walk step
    read nothing back (the CUDA graphs capture them; tests/step/test_no_sync.py's check)."""
    from foxdqn.step.build import build_env
    from foxdqn.step.iteration import Iteration

    from support import forbid_syncs, step_fns

    s, market = small_state([f"action={action}", "action.switch_margin=2", "data.augment.method=block_bootstrap",
                             "data.augment.paths=3"])
    collect, full = Iteration(s, use_graph=False, updates=0, **step_fns(s)), Iteration(s, use_graph=False, **step_fns(s))
    for _ in range(4):
        collect()
    full()
    walk = build_env(s.cfg, market, "val", s.device, torch.Generator().manual_seed(0), eval_mode=True)
    online, _ = member_network(s)
    switch = SwitchPenalty(s.cfg.action.switch_margin, s.cfg.loss.reward_scale, action, s.device)
    obs = walk.reset_all()
    with monkeypatch.context() as m:
        forbid_syncs(m)
        for _ in range(3):
            full()
            walk.step((online(obs.float()) - switch(walk)).argmax(1))
    assert int(s.updates) == 4 * s.cfg.agent.updates_per_iter
