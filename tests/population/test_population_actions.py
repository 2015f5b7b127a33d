"""The trading env's action modes in a population (CPU, eager): action.mode=exposure_routed (a head
over the 5 exposures, order type and urgency routed per env), its members equal populations of
one bit for bit (with a switch margin too), a member routes with its single run's medians and
loads into the classic network with the same Q."""
from __future__ import annotations

import torch

from foxdqn.actions.modes import ExposureRoutedMode
from foxdqn.population.state import build_population
from foxdqn.step.state import build_state
from test_distributional import classic
from test_population import CPU, TRADING, assert_members_equal_runs_of_one, configs, market_for, run

ROUTED = [*TRADING, "action=exposure_routed"]
MEMBERS = [["seed=5"], ["seed=6", "optim.lr=3e-4"], ["seed=7", "agent.gamma=0.9", "loss.reward_scale=10"]]


def test_routed_members_equal_runs_of_one_member():
    together = assert_members_equal_runs_of_one(ROUTED, MEMBERS)
    assert isinstance(together.action_mode, ExposureRoutedMode) and together.online.weights[-1].shape[-1] == 5


def test_routed_members_with_a_switch_margin_equal_runs_of_one_member():
    """The penalty of the 5 exposures themselves (switch.action_exposures), each member's reward scale."""
    together = assert_members_equal_runs_of_one([*ROUTED, "action.switch_margin=3"], MEMBERS)
    assert together.switch is not None


def test_routed_member_routes_and_acts_as_its_single_run():
    """The population routes with the single run's training-split medians, and member p's weights
    load into its single run's network (5 actions) with the same Q."""
    cfgs = configs(ROUTED, MEMBERS)
    single = build_state(cfgs[0], market_for(cfgs[0]), CPU).rollout.action_mode
    mode = build_population(cfgs, market_for(cfgs[0]), CPU).action_mode
    assert torch.equal(mode.median_spread, single.median_spread)
    assert torch.equal(mode.median_volatility, single.median_volatility)
    s = run(cfgs, iterations=3)
    obs = s.obs.view(3, s.cfg.env.num_envs, -1)
    q = s.online(obs)
    assert q.shape[-1] == 5
    for p in range(3):
        torch.testing.assert_close(classic(s, p)(obs[p]), q[p], rtol=1e-5, atol=1e-6)
