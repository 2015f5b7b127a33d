"""Action modes: factored identity, exposure routing (docs/environments.md#routing-rule) on a grid
and through a real TradingEnv, branching sizes, build_action_mode errors, no host sync."""
import numpy as np
import pytest
import torch

from foxdqn.actions import BranchingMode, ExposureRoutedMode, FactoredMode, build_action_mode
from foxdqn.envs import ExecutionConfig, TradingEnv
from foxdqn.execution.orders import compose
from foxdqn.ops.route_exposure_to_factored import route_exposure_to_factored_reference

from support import forbid_syncs, market_from_arrays

M_S, M_V = 2e-4, 1e-2
# multiples of the medians and the order type / urgency the rule gives (written out by hand):
# spread < m_s → limit-maker(1); m_s <= spread <= 2 m_s → IoC(2); spread > 2 m_s → market(0)
SPREAD_FACTORS = [(0.5, 1), (1.0, 2), (1.5, 2), (2.0, 2), (3.0, 0)]
# vol > 1.5 m_v → aggressive(2); vol < 0.5 m_v → patient(0); otherwise normal(1)
VOL_FACTORS = [(0.25, 0), (0.5, 1), (1.0, 1), (1.5, 1), (2.0, 2)]


class FakeMarketEnv:
    """Stands in for TradingEnv: market_state() returns fixed per-env values."""

    def __init__(self, spread, volatility, median_spread=M_S, median_volatility=M_V):
        self.spread, self.volatility = spread, volatility
        self.median_spread, self.median_volatility = median_spread, median_volatility
        self.device = torch.device("cpu")
        self.num_actions = 45

    def market_state(self):
        return self.spread, self.volatility


class NonTradingEnv:
    num_actions = 2
    device = torch.device("cpu")


def grid():
    """Every (exposure, spread multiple, vol multiple): N = 5·5·5 = 125 rows and the hand answer."""
    m_s = torch.tensor(M_S, dtype=torch.float32)
    m_v = torch.tensor(M_V, dtype=torch.float32)
    exp, spread, vol, expected = [], [], [], []
    for e in range(5):
        for fs, order in SPREAD_FACTORS:
            for fv, urg in VOL_FACTORS:
                exp.append(e)
                spread.append(m_s * fs)  # same float32 products as the rule's 2·m_s, 1.5·m_v, 0.5·m_v
                vol.append(m_v * fv)
                expected.append(compose(e, order, urg))
    return (torch.tensor(exp, dtype=torch.int64), torch.stack(spread), torch.stack(vol),
            torch.tensor(expected, dtype=torch.int64), m_s, m_v)


def test_exposure_routed_matches_the_rule_and_the_op_reference_on_a_grid():
    exp, spread, vol, expected, m_s, m_v = grid()
    mode = build_action_mode("exposure_routed", FakeMarketEnv(spread, vol))
    assert isinstance(mode, ExposureRoutedMode) and mode.num_actions == 5
    out = mode.to_env(exp, FakeMarketEnv(spread, vol))
    assert out.dtype == torch.int64 and out.shape == (125,)
    assert torch.equal(out, expected)
    assert torch.equal(out, route_exposure_to_factored_reference(exp, spread, m_s, vol, m_v))


def test_exposure_routed_zero_medians_give_market_normal():
    exp, spread, vol, _, _, _ = grid()
    mode = ExposureRoutedMode(0.0, 0.0)
    out = mode.to_env(exp, FakeMarketEnv(spread, vol))
    assert torch.equal(out, exp * 9 + 0 * 3 + 1)


def test_exposure_routed_float64_market_state_is_cast():
    exp, spread, vol, expected, _, _ = grid()
    mode = ExposureRoutedMode(torch.tensor(M_S), torch.tensor(M_V))
    assert torch.equal(mode.to_env(exp, FakeMarketEnv(spread.double(), vol.double())), expected)


def test_medians_are_validated():
    with pytest.raises(ValueError, match=r"\bmedian_spread must be a finite number >= 0, got -1\.0"):
        ExposureRoutedMode(-1.0, 0.0)
    with pytest.raises(ValueError, match=r"\bmedian_volatility must be a finite number >= 0, got nan"):
        ExposureRoutedMode(0.0, float("nan"))
    with pytest.raises(ValueError, match=r"\bmedian_spread must be a 0-d tensor, got shape \(2,\)"):
        ExposureRoutedMode(torch.zeros(2), 0.0)


def _trading_env(T=40, window=3, num_envs=6):
    rng = np.random.default_rng(0)
    close = 100.0 * np.exp(np.cumsum(rng.normal(0.0, 2e-3, T)))
    open_ = np.concatenate([[100.0], close[:-1]])
    spread = rng.uniform(0.5e-4, 3e-4, T)
    market = market_from_arrays(
        open_, np.maximum(open_, close) * 1.001, np.minimum(open_, close) * 0.999, close, spread,
        rng.normal(size=(T, 2)).astype(np.float32), vol_window=window,
        median_spread=float(np.median(spread)), median_volatility=2e-3)
    return TradingEnv(market, "train", num_envs=num_envs, window=window, episode_length=10,
                      execution=ExecutionConfig(), device=torch.device("cpu"), dtype=torch.float64,
                      generator=torch.Generator().manual_seed(0))


def test_exposure_routed_through_a_trading_env(monkeypatch):
    env = _trading_env()
    env.reset_all()
    mode = build_action_mode("exposure_routed", env)
    assert mode.median_spread.dtype == torch.float32 and mode.median_spread.dim() == 0
    assert mode.median_spread.device == env.device
    s, v = env.market_state()  # float64 [N], the decision bar of each env
    exp = torch.tensor([0, 1, 2, 3, 4, 2])
    with monkeypatch.context() as m:
        forbid_syncs(m)
        out = mode.to_env(exp, env)
        env.step(out)
    ref = route_exposure_to_factored_reference(exp, s.float(), torch.tensor(env.median_spread, dtype=torch.float32),
                                               v.float(), torch.tensor(env.median_volatility, dtype=torch.float32))
    assert torch.equal(out, ref)
    assert torch.equal(torch.div(out, 9, rounding_mode="floor"), exp)
    # the env's spreads straddle the median: both limit-maker and non-limit order types occur
    order_types = torch.div(out % 9, 3, rounding_mode="floor")
    assert (s.float() < mode.median_spread).any() and (order_types == 1).any()


@pytest.mark.parametrize("name", ["factored", "branching", "exposure_routed"])
def test_to_env_never_syncs(monkeypatch, name):
    exp, spread, vol, _, _, _ = grid()
    env = FakeMarketEnv(spread, vol)
    mode = build_action_mode(name, env)
    action = exp if name == "exposure_routed" else torch.arange(125) % 45
    with monkeypatch.context() as m:
        forbid_syncs(m)
        with pytest.raises(AssertionError, match="host sync"):
            torch.ones(()).item()  # the patch is live
        out = mode.to_env(action, env)
    assert out.shape == (125,) and out.dtype == torch.int64


def test_factored_and_branching_are_identity():
    a = torch.tensor([0, 7, 44, 13])
    env = FakeMarketEnv(torch.zeros(4), torch.zeros(4))
    f = build_action_mode("factored", env)
    b = build_action_mode("branching", env)
    assert isinstance(f, FactoredMode) and f.num_actions == 45
    assert isinstance(b, BranchingMode) and b.num_actions == 45 and b.branch_sizes == (5, 3, 3)
    assert torch.equal(f.to_env(a, env), a) and torch.equal(b.to_env(a, env), a)


def test_non_trading_env():
    env = NonTradingEnv()
    mode = build_action_mode("factored", env)
    assert mode.num_actions == 2
    for name in ("exposure_routed", "branching"):
        with pytest.raises(ValueError, match=rf"\bname='{name}' needs an env with market_state\(\).*"
                                             r"env=NonTradingEnv"):
            build_action_mode(name, env)


def test_unknown_mode():
    with pytest.raises(ValueError, match=r"\bname must be one of factored, exposure_routed, branching, got 'routed'"):
        build_action_mode("routed", NonTradingEnv())
