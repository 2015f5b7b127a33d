"""No free lunch: on a martingale market no order type earns before costs, and all lose after costs.

The market is :func:`foxdqn.data.synthetic.make_martingale_ohlcv` (40,000 hourly bars cut from one
fine random walk, 10 bp per bar, 64 steps per bar), run through the data pipeline (spread
estimate, features) into the training env (2,048 envs, random starts, 64 steps each: 131,072
env steps per policy). A policy draws a random target exposure every step, so four steps in five
send an order. The per-step PnL is the simple return of the account, ``equity_{t+1}/equity_t - 1``.

Standard errors are clustered by the bar the order executed in (envs that share a bar share its
price move), so they stay honest when envs overlap.

* Before costs (spread 0, fees 0, slippage 0; the IoC protection band stays: it is a limit, not a
  cost): market and IoC orders earn nothing: ``|mean| <= 3 SE``. A limit-maker order fills only
  when the bar trades through its limit, so on a path that moves in steps it is filled after the
  price has gone past it (adverse selection, about 0.6 bp a fill here): its mean is negative,
  never positive (``mean <= 3 SE``), and so is that of random policies over all 45 actions.
* After costs (the default execution costs and the estimated spread): every policy loses,
  ``mean + 3 SE < 0``.

The look-ahead IoC rule this suite replaces (fill when the limit lies inside the next bar's
[low, high], at that bar's open) fails 8 of these tests: its IoCs earn +41 to +73 SE before
costs and +22 to +50 SE after costs.
"""
import dataclasses

import numpy as np
import pytest
import torch

from foxdqn.data import DataConfig, market_data_from_frame
from foxdqn.data.synthetic import make_martingale_ohlcv
from foxdqn.envs import ExecutionConfig, TradingEnv
from foxdqn.execution.orders import IOC, LIMIT_MAKER, MARKET, NUM_ACTIONS, compose

NUM_ENVS, STEPS = 2048, 64
ORDER_TYPES = {"market": MARKET, "limit_maker": LIMIT_MAKER, "ioc": IOC}
URGENCIES = {"patient": 0, "normal": 1, "aggressive": 2}
NO_COSTS = ExecutionConfig(spread_floor_bps=0.0, taker_fee_bps=0.0, maker_fee_bps=0.0,
                           market_slippage_bps=[0.0, 0.0, 0.0])


@pytest.fixture(scope="module")
def market():
    frame = make_martingale_ohlcv(40_000, vol_per_bar=1e-3, substeps=64, seed=1)
    return market_data_from_frame(frame, DataConfig(name=None, path="martingale"), window=1,
                                  episode_length=STEPS, source="martingale")


def per_step_pnl(market, policy, costs: bool, seed: int = 0) -> tuple[float, float]:
    """Mean per-step simple return of ``policy`` and its standard error clustered by bar."""
    spread = market.spread if costs else np.zeros_like(market.spread)
    whole = dataclasses.replace(market, spread=spread, splits={"all": (0, len(market.close))})
    env = TradingEnv(whole, "all", num_envs=NUM_ENVS, window=1, episode_length=STEPS,
                     execution=ExecutionConfig() if costs else NO_COSTS, device=torch.device("cpu"),
                     dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    env.reset_all()
    draw = torch.Generator().manual_seed(seed + 1)
    returns, bars = [], []
    for _ in range(STEPS):
        before, bar = env.equity.clone(), env.t + 1
        out = env.step(policy(draw, env))
        returns.append(((out.info["equity"] - before) / before).numpy())
        bars.append(bar.numpy())
    r, b = np.concatenate(returns), np.concatenate(bars)
    mean = float(r.mean())
    cluster = np.bincount(b, weights=r - mean)
    return mean, float(np.sqrt((cluster ** 2).sum()) / r.size)


def random_exposure(order_type: int, urgency: int):
    def policy(gen, env):
        exposure = torch.randint(0, 5, (env.num_envs,), generator=gen)
        return compose(exposure, torch.tensor(order_type), torch.tensor(urgency))
    return policy


def random_action(actions: list[int], stay: float = 0.0):
    """Uniform over ``actions``; with ``stay`` > 0 it keeps its previous action with that probability."""
    table = torch.tensor(actions)
    last: dict[str, torch.Tensor] = {}

    def policy(gen, env):
        fresh = table[torch.randint(0, len(actions), (env.num_envs,), generator=gen)]
        if stay and "a" in last:
            keep = torch.rand(env.num_envs, generator=gen) < stay
            fresh = torch.where(keep, last["a"], fresh)
        last["a"] = fresh
        return fresh
    return policy


TAKER_ACTIONS = [a for a in range(NUM_ACTIONS) if (a // 3) % 3 != LIMIT_MAKER]
POLICIES = {
    **{f"{o}-{u}": (random_exposure(ot, ut), ot != LIMIT_MAKER)
       for o, ot in ORDER_TYPES.items() for u, ut in URGENCIES.items()},
    "random-45": (random_action(list(range(NUM_ACTIONS))), False),
    "random-45-sticky": (random_action(list(range(NUM_ACTIONS)), stay=0.9), False),
    "random-taker": (random_action(TAKER_ACTIONS), True),
}


def test_taker_actions_are_market_and_ioc():
    assert len(TAKER_ACTIONS) == 30
    assert {(a // 3) % 3 for a in TAKER_ACTIONS} == {MARKET, IOC}


@pytest.mark.parametrize("name", list(POLICIES))
def test_no_edge_before_costs(market, name):
    policy, two_sided = POLICIES[name]
    mean, se = per_step_pnl(market, policy, costs=False)
    assert se > 0
    assert mean <= 3 * se, f"{name}: earns {mean / se:+.1f} SE before costs on a martingale (look-ahead?)"
    if two_sided:
        assert mean >= -3 * se, f"{name}: loses {mean / se:+.1f} SE before costs with no cost charged"


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_policy_loses_after_costs(market, name):
    policy, _ = POLICIES[name]
    mean, se = per_step_pnl(market, policy, costs=True)
    assert mean + 3 * se < 0, f"{name}: mean per-step return {mean:.3g} ({mean / se:+.1f} SE) after costs"


def test_the_martingale_has_no_drift(market):
    r = np.diff(market.close) / market.close[:-1]
    assert abs(r.mean()) < 3 * r.std() / np.sqrt(r.size)
    assert (market.open[1:] == market.close[:-1]).all()
