"""Hand-computed execution and accounting cases (float64, exact to 1e-12).

Config (HAND_CFG): spread floor 0.5 bp, taker fee 1 bp, maker fee -0.5 bp (rebate),
market slippage (0.5, 1, 2) bp, limit offsets (1, 0.5, 0) half-spreads, IoC offsets (1, 2, 4) bp,
initial equity 1. Urgency index: 0 patient, 1 normal, 2 aggressive.
"""
import math

import pytest
import torch

from foxdqn.execution.orders import compose

TOL = 1e-12
MARKET, LIMIT, IOC = 0, 1, 2
SHORT1, SHORT_HALF, FLAT, LONG_HALF, LONG1 = 0, 1, 2, 3, 4


def act(env, exposure, order_type, urgency):
    return env.step(torch.tensor([compose(exposure, order_type, urgency)]))


def check(env, out, *, fill, price, fee, cost, cash, units, equity, reward, exposure_idx, entry, traded=None):
    """``traded`` defaults to ``units`` (an order from flat) when filled, else 0."""
    info = out.info
    if traded is None:
        traded = units if fill else 0.0
    assert bool(info["fill"][0]) is fill
    assert float(info["fill_price"][0]) == pytest.approx(price, abs=TOL)
    assert float(info["fee"][0]) == pytest.approx(fee, abs=TOL)
    assert float(info["cost"][0]) == pytest.approx(cost, abs=TOL)
    assert float(info["traded_units"][0]) == pytest.approx(traded, abs=TOL)
    assert float(env.cash[0]) == pytest.approx(cash, abs=TOL)
    assert float(env.units[0]) == pytest.approx(units, abs=TOL)
    assert float(env.equity[0]) == pytest.approx(equity, abs=TOL)
    assert float(info["equity"][0]) == pytest.approx(equity, abs=TOL)
    assert float(out.reward[0]) == pytest.approx(reward, abs=TOL)
    assert int(env.exposure_idx[0]) == exposure_idx
    assert float(env.entry_price[0]) == pytest.approx(entry, abs=TOL)


# ----------------------------------------------------------------------------- market


def test_market_buy_then_market_close(make_env):
    env = make_env([
        (100.0, 101.0, 99.0, 100.0, 2e-4),
        (100.5, 102.0, 99.5, 101.0, 4e-4),
        (101.0, 103.0, 100.0, 102.0, 0.0),  # its spread (0) is never used: no order executes after bar 2
    ])
    env.reset_all()
    # t=0: go long 1.0, market, normal. q* = 1.0 * 1 / 100 = 0.01 units, priced with s_0 (the spread
    # known when the order is sent), not s_1 (bar 1's estimate reads bar 1's high and low).
    out = act(env, LONG1, MARKET, 1)
    price1 = 100.5 * (1 + 2e-4 / 2 + 1.0e-4)  # open_1 * (1 + s_0/2 + 1 bp)
    assert price1 == pytest.approx(100.5201, abs=1e-12)
    fee1 = 0.01 * price1 * 1e-4
    cash1 = 1.0 - 0.01 * price1 - fee1
    equity1 = cash1 + 0.01 * 101.0
    check(env, out, fill=True, price=price1, fee=fee1, cost=0.01 * (price1 - 100.5) + fee1, cash=cash1,
          units=0.01, equity=equity1, reward=math.log(equity1) - math.log(1.0), exposure_idx=LONG1, entry=price1)
    assert float(out.info["exposure"][0]) == 1.0
    assert float(out.info["traded_units"][0]) == pytest.approx(0.01, abs=TOL)
    assert not bool(out.truncated[0]) and not bool(out.terminated[0])

    # t=1: close to flat, market, aggressive. dq = -0.01, sells at open_2 * (1 - (s_1/2 + 2 bp)).
    out = act(env, FLAT, MARKET, 2)
    price2 = 101.0 * (1 - (4e-4 / 2 + 2.0e-4))
    fee2 = 0.01 * price2 * 1e-4
    cash2 = cash1 + 0.01 * price2 - fee2
    check(env, out, fill=True, price=price2, fee=fee2, cost=-0.01 * (price2 - 101.0) + fee2, cash=cash2,
          units=0.0, equity=cash2, reward=math.log(cash2) - math.log(equity1), exposure_idx=FLAT, entry=0.0,
          traded=-0.01)
    assert float(out.info["traded_units"][0]) == pytest.approx(-0.01, abs=TOL)
    assert float(out.info["cost"][0]) == pytest.approx(0.01 * 101.0 * (2e-4 + 2e-4) + fee2, abs=TOL)
    # bar 2 is the last bar of the split: the eval episode ends, truncated
    assert bool(out.truncated[0]) and bool(out.info["episode_done"][0])
    assert float(out.info["episode_return"][0]) == pytest.approx(math.log(cash2), abs=TOL)


def test_market_price_ignores_the_next_bars_spread(make_env):
    # same bar 0, two different bar-1 spreads: the fill at the open of bar 1 is the same
    prices = []
    for s1 in (1e-4, 50e-4):
        env = make_env([(100.0, 101.0, 99.0, 100.0, 2e-4), (100.5, 102.0, 99.5, 101.0, s1)])
        env.reset_all()
        prices.append(float(act(env, LONG1, MARKET, 0).info["fill_price"][0]))
    assert prices[0] == prices[1] == pytest.approx(100.5 * (1 + 1e-4 + 0.5e-4), abs=TOL)


# ----------------------------------------------------------------------------- limit maker


def test_limit_maker_buy_fills_when_traded_through(make_env):
    env = make_env([(100.0, 101.0, 99.0, 100.0, 2e-4), (100.2, 100.6, 99.9, 100.4, 2e-4)])
    env.reset_all()
    out = act(env, LONG1, LIMIT, 0)  # patient: L = 100 * (1 - 1.0 * 2e-4/2) = 99.99; low 99.9 < L
    L = 100.0 * (1 - 1.0 * 1e-4)
    fee = 0.01 * L * (-0.5e-4)  # maker rebate: negative fee
    cash = 1.0 - 0.01 * L - fee
    equity = cash + 0.01 * 100.4
    check(env, out, fill=True, price=L, fee=fee, cost=0.01 * (L - 100.0) + fee, cash=cash, units=0.01,
          equity=equity, reward=math.log(equity), exposure_idx=LONG1, entry=L)
    assert fee < 0 and float(out.info["cost"][0]) < 0


def test_limit_maker_sell_fills_when_traded_through(make_env):
    env = make_env([(100.0, 101.0, 99.0, 100.0, 2e-4), (100.2, 100.6, 99.9, 100.4, 2e-4)])
    env.reset_all()
    out = act(env, SHORT_HALF, LIMIT, 0)  # q* = -0.5/100 = -0.005; L = 100*(1 + 1e-4) = 100.01 < high 100.6
    L = 100.0 * (1 + 1e-4)
    fee = 0.005 * L * (-0.5e-4)
    cash = 1.0 + 0.005 * L - fee
    equity = cash - 0.005 * 100.4
    check(env, out, fill=True, price=L, fee=fee, cost=-0.005 * (L - 100.0) + fee, cash=cash, units=-0.005,
          equity=equity, reward=math.log(equity), exposure_idx=SHORT_HALF, entry=L)


@pytest.mark.parametrize("exposure, bar1", [
    (LONG1, (100.2, 100.6, 100.0, 100.4, 2e-4)),  # buy limit at 100.0; low == 100.0 only touches
    (SHORT1, (99.8, 100.0, 99.5, 99.9, 2e-4)),  # sell limit at 100.0; high == 100.0 only touches
])
def test_limit_maker_touched_not_traded_through_is_cancelled(make_env, exposure, bar1):
    env = make_env([(100.0, 101.0, 99.0, 100.0, 2e-4), bar1])
    env.reset_all()
    out = act(env, exposure, LIMIT, 2)  # aggressive: L = close_0 = 100.0 exactly
    check(env, out, fill=False, price=0.0, fee=0.0, cost=0.0, cash=1.0, units=0.0, equity=1.0, reward=0.0,
          exposure_idx=FLAT, entry=0.0)
    assert float(out.info["exposure"][0]) == 0.0
    assert float(out.info["traded_units"][0]) == 0.0


def test_limit_maker_fills_one_tick_through(make_env):
    env = make_env([(100.0, 101.0, 99.0, 100.0, 2e-4), (100.2, 100.6, 99.999, 100.4, 2e-4)])
    env.reset_all()
    out = act(env, LONG1, LIMIT, 2)  # L = 100.0, low 99.999 < L
    fee = 0.01 * 100.0 * (-0.5e-4)
    cash = 1.0 - 0.01 * 100.0 - fee
    check(env, out, fill=True, price=100.0, fee=fee, cost=fee, cash=cash, units=0.01,
          equity=cash + 0.01 * 100.4, reward=math.log(cash + 0.01 * 100.4), exposure_idx=LONG1, entry=100.0)


# ----------------------------------------------------------------------------- IoC


def _ioc_buy(make_env, bar1, urgency=1):
    env = make_env([(100.0, 101.0, 99.0, 100.0, 2e-4), bar1])
    env.reset_all()
    return env, act(env, LONG1, IOC, urgency)  # normal: L = 100 * (1 + 2e-4/2 + 2 bp) = 100.03


@pytest.mark.parametrize("bar1", [
    (100.0, 102.0, 99.5, 101.0, 4e-4),  # the bar trades through L = 100.03 later: irrelevant
    (100.0, 100.02, 99.98, 100.01, 1e-4),  # the whole bar below L (the old "range" rule cancelled it)
])
def test_ioc_buy_marketable_at_the_open_fills_at_the_touch_plus_slippage(make_env, bar1):
    env, out = _ioc_buy(make_env, bar1)
    touch = 100.0 * (1 + 2e-4 / 2)  # ask at the open of bar 1, with s_0
    price = touch * (1 + 1e-4)  # normal urgency's market slippage (1 bp), below L = 100.03
    assert price < 100.0 * (1 + 1e-4 + 2e-4)
    fee = 0.01 * price * 1e-4
    cash = 1.0 - 0.01 * price - fee
    equity = cash + 0.01 * bar1[3]
    check(env, out, fill=True, price=price, fee=fee, cost=0.01 * (price - 100.0) + fee, cash=cash, units=0.01,
          equity=equity, reward=math.log(equity), exposure_idx=LONG1, entry=price)


def test_ioc_buy_slippage_is_capped_at_the_limit(make_env):
    # open 100.025: touch 100.035 > L 100.03 -> not marketable; open 100.015: touch 100.025 <= L, but
    # touch + 1 bp slippage = 100.035 > L -> fills at L
    env, out = _ioc_buy(make_env, (100.015, 102.0, 99.5, 101.0, 2e-4))
    L = 100.0 * (1 + 1e-4 + 2e-4)
    fee = 0.01 * L * 1e-4
    cash = 1.0 - 0.01 * L - fee
    check(env, out, fill=True, price=L, fee=fee, cost=0.01 * (L - 100.015) + fee, cash=cash, units=0.01,
          equity=cash + 0.01 * 101.0, reward=math.log(cash + 0.01 * 101.0), exposure_idx=LONG1, entry=L)


@pytest.mark.parametrize("bar1", [
    (100.025, 102.0, 99.0, 101.0, 2e-4),  # gapped up: ask at the open 100.035 > L 100.03, although the bar trades at L
    (100.5, 101.0, 100.05, 100.8, 2e-4),  # gapped further up
])
def test_ioc_buy_not_marketable_at_the_open_is_cancelled(make_env, bar1):
    env, out = _ioc_buy(make_env, bar1)
    check(env, out, fill=False, price=0.0, fee=0.0, cost=0.0, cash=1.0, units=0.0, equity=1.0, reward=0.0,
          exposure_idx=FLAT, entry=0.0)


def test_ioc_fill_never_reads_the_next_bars_high_low_or_close(make_env):
    # the same open with any high/low/close/spread of bar 1: the same fill decision and price
    seen = set()
    for high, low, close, s1 in [(100.0, 99.0, 99.5, 1e-4), (110.0, 100.0, 109.0, 9e-4), (100.03, 99.97, 100.0, 0.0)]:
        env, out = _ioc_buy(make_env, (100.0, high, low, close, s1), urgency=2)
        seen.add((bool(out.info["fill"][0]), round(float(out.info["fill_price"][0]), 12)))
    assert seen == {(True, round(100.0 * (1 + 1e-4) * (1 + 2e-4), 12))}


def test_ioc_sell_fills_and_cancels(make_env):
    # aggressive sell: L = 100 * (1 - (2e-4/2 + 4 bp)) = 99.95; bid at the open 99.97 * (1 - 1 bp) = 99.960003
    L = 100.0 * (1 - (1e-4 + 4e-4))
    env = make_env([(100.0, 101.0, 99.0, 100.0, 2e-4), (99.97, 100.2, 99.0, 99.5, 2e-4)])
    env.reset_all()
    out = act(env, SHORT1, IOC, 2)
    touch = 99.97 * (1 - 1e-4)
    assert touch >= L
    price = max(L, touch * (1 - 2e-4))  # 2 bp slippage would sell below L: capped at L
    assert price == L
    fee = 0.01 * L * 1e-4
    cash = 1.0 + 0.01 * L - fee
    equity = cash - 0.01 * 99.5
    check(env, out, fill=True, price=L, fee=fee, cost=-0.01 * (L - 99.97) + fee, cash=cash, units=-0.01,
          equity=equity, reward=math.log(equity), exposure_idx=SHORT1, entry=L)

    env = make_env([(100.0, 101.0, 99.0, 100.0, 2e-4), (99.9, 100.2, 99.0, 99.5, 2e-4)])  # bid 99.89 < L
    env.reset_all()
    out = act(env, SHORT1, IOC, 2)
    check(env, out, fill=False, price=0.0, fee=0.0, cost=0.0, cash=1.0, units=0.0, equity=1.0, reward=0.0,
          exposure_idx=FLAT, entry=0.0)


# ----------------------------------------------------------------------------- positions


def test_same_exposure_sends_no_order(make_env):
    env = make_env([
        (100.0, 101.0, 99.0, 100.0, 2e-4),
        (100.0, 101.0, 99.0, 100.0, 2e-4),
        (100.0, 101.0, 99.0, 102.0, 2e-4),
        (102.0, 105.0, 90.0, 104.0, 2e-4),
    ])
    env.reset_all()
    out = act(env, FLAT, IOC, 2)  # already flat
    check(env, out, fill=False, price=0.0, fee=0.0, cost=0.0, cash=1.0, units=0.0, equity=1.0, reward=0.0,
          exposure_idx=FLAT, entry=0.0)
    out = act(env, LONG1, MARKET, 0)
    price = 100.0 * (1 + 1e-4 + 0.5e-4)
    cash = 1.0 - 0.01 * price - 0.01 * price * 1e-4
    equity2 = cash + 0.01 * 102.0
    assert bool(out.info["fill"][0])
    # long 1.0 again with a limit that would fill (low 90) and after a price move (exposure drifted):
    # no order, no rebalancing; only the mark to market changes
    out = act(env, LONG1, LIMIT, 2)
    equity3 = cash + 0.01 * 104.0
    check(env, out, fill=False, price=0.0, fee=0.0, cost=0.0, cash=cash, units=0.01, equity=equity3,
          reward=math.log(equity3) - math.log(equity2), exposure_idx=LONG1, entry=price, traded=0.0)


def test_flip_long_to_short(make_env):
    env = make_env([
        (100.0, 101.0, 99.0, 100.0, 2e-4),
        (100.0, 101.0, 99.0, 101.0, 2e-4),
        (101.5, 102.0, 99.0, 100.0, 2e-4),
    ])
    env.reset_all()
    act(env, LONG1, MARKET, 0)
    p1 = 100.0 * (1 + 1e-4 + 0.5e-4)
    cash1 = 1.0 - 0.01 * p1 - 0.01 * p1 * 1e-4
    equity1 = cash1 + 0.01 * 101.0
    out = act(env, SHORT1, MARKET, 0)
    q_target = -1.0 * equity1 / 101.0
    dq = q_target - 0.01
    p2 = 101.5 * (1 - (1e-4 + 0.5e-4))
    fee2 = -dq * p2 * 1e-4
    cash2 = cash1 - dq * p2 - fee2
    equity2 = cash2 + q_target * 100.0
    check(env, out, fill=True, price=p2, fee=fee2, cost=dq * (p2 - 101.5) + fee2, cash=cash2, units=q_target,
          equity=equity2, reward=math.log(equity2) - math.log(equity1), exposure_idx=SHORT1, entry=p2, traded=dq)
    assert float(out.info["exposure"][0]) == -1.0


def test_entry_price_rules_and_account_observation(make_env):
    """Open, add (weighted average), reduce (unchanged), flat (0), open short, add short."""
    rows = [
        (100.0, 101.0, 99.0, 100.0, 2e-4),
        (100.4, 101.0, 99.0, 100.8, 2e-4),
        (101.0, 102.0, 100.0, 101.6, 3e-4),
        (101.2, 102.0, 100.0, 100.9, 2e-4),
        (100.5, 101.0, 99.0, 99.7, 1e-4),
        (99.5, 100.0, 98.0, 98.9, 2e-4),
        (98.6, 99.0, 97.0, 97.2, 2e-4),
    ]
    env = make_env(rows)
    obs = env.reset_all()
    # reference bookkeeping, written out from the spec (market orders, patient: 0.5 bp slippage)
    cash, units, entry = 1.0, 0.0, 0.0
    expected_entries = []
    for t, e in enumerate([LONG_HALF, LONG1, LONG_HALF, FLAT, SHORT_HALF, SHORT1]):
        close_t = rows[t][3]
        equity_t = cash + units * close_t
        assert float(obs[0, -2]) == pytest.approx(units * close_t / equity_t, abs=TOL)
        assert float(obs[0, -1]) == pytest.approx(units * (close_t - entry) / equity_t, abs=TOL)
        o1, s0, c1 = rows[t + 1][0], max(rows[t][4], 0.5e-4), rows[t + 1][3]  # s_t, floored
        x = (-1.0, -0.5, 0.0, 0.5, 1.0)[e]
        dq = x * equity_t / close_t - units
        sign = 1.0 if dq > 0 else -1.0
        price = o1 * (1 + sign * (s0 / 2 + 0.5e-4))
        fee = abs(dq) * price * 1e-4
        if units + dq == 0:
            new_entry = 0.0
        elif units == 0 or (units > 0) != (units + dq > 0):
            new_entry = price  # open or flip
        elif (dq > 0) == (units > 0):
            new_entry = (units * entry + dq * price) / (units + dq)  # add
        else:
            new_entry = entry  # reduce
        cash, units, entry = cash - dq * price - fee, units + dq, new_entry
        expected_entries.append(entry)
        out = env.step(torch.tensor([compose(e, MARKET, 0)]))
        obs = out.obs
        equity = cash + units * c1
        assert float(env.cash[0]) == pytest.approx(cash, abs=TOL)
        assert float(env.units[0]) == pytest.approx(units, abs=TOL)
        assert float(env.entry_price[0]) == pytest.approx(entry, abs=TOL)
        assert float(env.equity[0]) == pytest.approx(equity, abs=TOL)
        assert float(out.next_obs[0, -1]) == pytest.approx(units * (c1 - entry) / equity, abs=TOL)
    opened, added, reduced, flat, short, short_added = expected_entries
    assert opened == pytest.approx(100.4 * (1 + 1e-4 + 0.5e-4), abs=TOL)
    assert opened < added < 101.0 * 1.00016  # average of the two fills
    assert reduced == added and flat == 0.0
    assert short == pytest.approx(99.5 * (1 - (0.5e-4 + 0.5e-4)), abs=TOL)  # opened at bar 5's open, s_4 = 1 bp
    assert short_added != short


def test_ruin_terminates_with_floored_reward_and_resets(make_env):
    # short 1.0 at ~100, the next bar closes at 300: equity ~ 1 - 0.01 * 200 < 0
    rows = [(100.0, 101.0, 99.0, 100.0, 2e-4), (100.0, 300.0, 99.0, 300.0, 2e-4), (300.0, 301.0, 299.0, 300.0, 2e-4)]
    env = make_env(rows, eval_mode=False, episode_length=10)
    env.reset_all()
    out = act(env, SHORT1, MARKET, 0)
    price = 100.0 * (1 - (1e-4 + 0.5e-4))
    cash = 1.0 + 0.01 * price - 0.01 * price * 1e-4
    equity = cash - 0.01 * 300.0
    assert equity < 0
    assert bool(out.terminated[0]) and not bool(out.truncated[0]) and bool(out.info["episode_done"][0])
    assert float(out.info["equity"][0]) == pytest.approx(equity, abs=TOL)
    assert float(out.reward[0]) == pytest.approx(math.log(1e-6) - math.log(1.0), abs=TOL)
    assert float(out.info["episode_return"][0]) == pytest.approx(math.log(1e-6), abs=TOL)
    # next_obs stays finite: account features divide by 1e-6 and are clipped to +-100
    assert torch.isfinite(out.next_obs).all()
    assert float(out.next_obs[0, -2]) == -100.0
    # auto-reset in the same step: flat, initial equity, back at the (only) start bar 0
    assert int(env.t[0]) == 0 and int(env.steps[0]) == 0
    assert float(env.equity[0]) == 1.0 and float(env.cash[0]) == 1.0 and float(env.units[0]) == 0.0
    assert int(env.exposure_idx[0]) == FLAT
    assert torch.equal(out.obs, env.observe())


def test_spread_floor_and_market_state(make_env):
    env = make_env([(100.0, 101.0, 99.0, 100.0, 0.1e-4), (100.0, 101.0, 99.0, 100.0, 3e-4)],
                   volatility=[0.01, 0.02], median_spread=0.2e-4, median_volatility=0.015)
    env.reset_all()
    spread, vol = env.market_state()
    assert float(spread[0]) == pytest.approx(0.5e-4, abs=1e-15)  # 0.1 bp floored to 0.5 bp
    assert float(vol[0]) == 0.01
    assert env.median_spread == pytest.approx(0.5e-4) and env.median_volatility == 0.015
    out = act(env, LONG1, LIMIT, 0)  # patient limit: close_0 * (1 - floored half spread)
    assert float(out.info["fill_price"][0]) == pytest.approx(100.0 * (1 - 0.25e-4), abs=TOL)
