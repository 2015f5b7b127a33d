"""The deployment gate (foxdqn.analysis.gate, eval.gate): its choice from validation curves, its
candidates, the per-walk switch margins it walks with, and what it evaluates on a market with an
edge and on one without."""
import math

import numpy as np
import pytest
import torch

from foxdqn.analysis.backtest import evaluate, evaluate_agents
from foxdqn.analysis.gate import candidate_margins, choose, gated_agents, paired_psr
from foxdqn.config.compose import load_config
from foxdqn.data import load_market_data
from foxdqn.errors import ConfigError
from foxdqn.execution.orders import EXPOSURES, MARKET, NORMAL, compose

CPU = torch.device("cpu")
RNG = np.random.default_rng(7)


def curve(returns):
    return np.concatenate([[1.0], np.cumprod(1.0 + np.asarray(returns, dtype=np.float64))])


FLAT = curve(np.zeros(500))


def test_flat_when_every_policy_loses():
    losing = [curve(-1e-4 + 1e-3 * RNG.standard_normal(500)) for _ in range(3)]
    chosen, psr, over_flat = choose([FLAT, *losing], 0.95)
    assert chosen == 0 and math.isnan(psr[0]) and all(p > 0.95 for p in psr[1:])
    assert math.isnan(over_flat[0]) and all(p < 0.05 for p in over_flat[1:])


def test_flat_when_the_edge_is_not_significant():
    """A policy ahead of flat on validation, but not with 95 % confidence, is passed over."""
    r = 1e-3 * RNG.standard_normal(500)
    weak = curve(r - r.mean() + 2e-5)  # per-bar Sharpe 0.02: z = 0.45
    chosen, psr, _ = choose([FLAT, weak], 0.95)
    assert chosen == 0 and 0.5 < psr[0] < 0.95 and math.isnan(psr[1])


def test_the_simplest_of_those_validation_cannot_tell_from_the_best():
    base = 1e-3 * RNG.standard_normal(500)
    strong = base - base.mean() + 3e-4  # z ≈ 6.7 against flat
    noise = 1e-4 * RNG.standard_normal(500)
    near = strong - 2e-6 - (noise - noise.mean())  # behind the best by a per-bar Sharpe of 0.02: z ≈ 0.45
    chosen, psr, over_flat = choose([FLAT, curve(near), curve(strong)], 0.95)
    assert chosen == 1 and psr[0] > 0.999 and 0.5 < psr[1] < 0.95 and math.isnan(psr[2]) and over_flat[1] > 0.999
    chosen, _, _ = choose([FLAT, curve(near), curve(strong)], 0.5)  # asking for little: the best survives
    assert chosen == 2


def test_a_simpler_candidate_that_does_not_beat_flat_is_never_chosen():
    """A noisy large-margin candidate that validation cannot tell from the best, but that lost on
    validation, is passed over for the best (which beats flat)."""
    rng = np.random.default_rng(0)
    trained = np.full(2000, 1e-4) + rng.normal(0, 5e-4, 2000)
    noisy = rng.normal(0, 4e-3, 2000)
    chosen, psr, over_flat = choose([np.ones(2001), curve(noisy), curve(trained)], 0.95)
    assert psr[1] < 0.95 and over_flat[1] < 0.95  # the one-standard-error rule alone would take it
    assert chosen == 2


def test_an_edge_of_a_few_bars_is_not_significant():
    """The PSR's skewness term passes one winning bar of 933 (0.98); the gate's paired PSR does not,
    and a policy exposed on a few random bars of a market without edge passes about as often as
    the confidence allows."""
    one = np.zeros(932)
    one[400] = 2e-3
    assert paired_psr(one) < 0.9
    rng = np.random.default_rng(1)
    for k in (1, 2, 3, 5, 10, 30):
        passed = 0
        for _ in range(300):
            r = np.zeros(933)
            r[rng.choice(933, k, replace=False)] = rng.normal(0, 2e-3, k)
            passed += choose([np.ones(934), curve(r)], 0.95)[0] == 1
        assert passed / 300 <= 0.08, (k, passed)


def test_the_first_of_equal_bests_is_the_simplest():
    same = curve(3e-4 + 1e-3 * RNG.standard_normal(500))
    assert choose([FLAT, same, same.copy()], 0.95)[0] == 1


@pytest.mark.parametrize("args,match", [(([], 0.95), "no candidate"), (([FLAT], 1.0), "confidence"),
                                        (([FLAT], 0.0), "confidence"), (([FLAT, FLAT[:-1]], 0.9), "length")])
def test_choose_refuses(args, match):
    with pytest.raises(ValueError, match=match):
        choose(*args)


def test_candidate_margins_simplest_first():
    assert candidate_margins(0.0, [1, 2, 4]) == [4.0, 2.0, 1.0, 0.0]
    assert candidate_margins(2.0, [4, 1, 2, 4]) == [4.0, 2.0]  # at or below the trained margin: dropped
    assert candidate_margins(1.0, []) == [1.0]


@pytest.mark.parametrize("key,value,match", [("margins", "[0]", "margins\\[0\\]"), ("margins", "[1,-2]", "margins\\[1\\]"),
                                             ("confidence", "1.0", "confidence"), ("confidence", "0", "confidence")])
def test_config_refuses(key, value, match):
    with pytest.raises(ConfigError, match=f"eval.gate.{match}"):
        load_config([f"eval.gate.{key}={value}"])


def test_by_default_flat_against_the_agent_as_trained():
    cfg = load_config(["eval.gate.enabled=true"])
    assert cfg.eval.gate.margins == [] and cfg.eval.gate.confidence == 0.95
    assert candidate_margins(cfg.action.switch_margin, cfg.eval.gate.margins) == [0.0]


def test_config_refuses_vote_with_gate_margins():
    with pytest.raises(ConfigError, match="eval.ensemble=vote .* eval.gate.margins"):
        load_config(["eval.ensemble=vote", "eval.gate.margins=[2]"])
    assert load_config(["eval.ensemble=vote", "eval.gate.margins=[2]", "eval.gate.enabled=false"])


def test_ignored_gate_settings_are_noted():
    from foxdqn.config.schema import warn_ignored

    notes = warn_ignored(load_config(["action.switch_margin=2", "eval.gate.margins=[1,2,4]"]))
    assert any("[1.0, 2.0] ignored" in n for n in notes)
    assert any("gate is off" in n for n in warn_ignored(load_config(["eval.gate.enabled=false", "eval.gate.margins=[4]"])))
    assert any("not out of sample" in n for n in warn_ignored(load_config(["eval.split=val"])))
    assert not [n for n in warn_ignored(load_config([])) if "gate" in n]


def test_config_refuses_the_gate_off_trading():
    with pytest.raises(ConfigError, match="eval.gate.enabled=true"):
        load_config(["+experiment=cartpole_dqn", "eval.gate.enabled=true"])


class LastReturn(torch.nn.Module):
    """Q of a policy that targets exposure ``sign`` · sign(last bar's return) when that return is
    beyond one training standard deviation and keeps its exposure otherwise (momentum for +1), with
    market orders of normal urgency. The observation's last feature row starts with the return
    (normalised), and the exposure held follows the feature rows."""

    def __init__(self, window: int, features: int, sign: float = 1.0, scale: float = 1.0):
        super().__init__()
        self.col, self.held, self.sign, self.scale = (window - 1) * features, window * features, sign, scale
        a = torch.arange(45)
        self.register_buffer("exposure", torch.tensor(EXPOSURES)[a // 9])
        self.register_buffer("market_normal", (a == compose(a // 9, torch.tensor(MARKET), torch.tensor(NORMAL))).float())

    def forward(self, obs):
        x, held = obs[:, self.col:self.col + 1], obs[:, self.held:self.held + 1]
        move = (x.abs() > 1.0).float()
        target = torch.sign(x) * self.sign * move + held * (1 - move)
        return self.scale * (-(self.exposure - target).abs() + 1e-3 * self.market_normal)


def market_of(*overrides):
    cfg = load_config(["device=cpu", "data.synthetic.bars=8000", "eval.gate.enabled=true", "eval.gate.margins=[1,2,4]",
                       *overrides])
    market = load_market_data(cfg.data, cfg.env.window, cfg.env.episode_length)
    return cfg, market


@pytest.fixture(scope="module")
def ar1():
    return market_of("data.name=ar1_1h", "data.synthetic.phi=0.2")


def test_per_walk_margins_equal_the_configured_margin(ar1):
    """Walks with ``switch_margins`` [0, 2] walk as ``action.switch_margin`` 0 and 2 do."""
    cfg, market = ar1
    net = LastReturn(cfg.env.window, market.features.shape[1], scale=1e-4)  # Q gaps of a switch's cost: margins bite
    both = evaluate_agents(cfg, market, net, CPU, 2, "val", policies=("agent",), switch_margins=[0.0, 2.0])
    for i, margin in enumerate((0, 2)):
        one = evaluate(load_config(["device=cpu", "data.synthetic.bars=8000", "data.name=ar1_1h",
                                    "data.synthetic.phi=0.2", f"action.switch_margin={margin}"]),
                       market, net, CPU, "val", policies=("agent",))
        assert np.array_equal(both[i]["curves"]["agent"]["actions"], one["curves"]["agent"]["actions"])
        assert np.array_equal(both[i]["curves"]["agent"]["equity"], one["curves"]["agent"]["equity"])
    assert both[1]["curves"]["agent"]["trades"] < both[0]["curves"]["agent"]["trades"]  # the margin changed the walk
    with pytest.raises(ValueError, match="switch_margins has 1 values for 2 agents"):
        evaluate_agents(cfg, market, net, CPU, 2, "val", policies=("agent",), switch_margins=[0.0])


def test_the_gate_trades_an_edge_that_validation_shows(ar1):
    cfg, market = ar1
    net = LastReturn(cfg.env.window, market.features.shape[1])
    [result], [gate] = gated_agents(cfg, market, net, CPU, 1, "test", policies=("agent", "flat"))
    assert gate["chosen"] != "flat" and gate["candidates"][0]["policy"] == "flat"
    assert [c["switch_margin"] for c in gate["candidates"]] == [None, 4.0, 2.0, 1.0, 0.0]
    chosen = next(c for c in gate["candidates"] if c["switch_margin"] == gate["switch_margin"])
    assert result["metrics"]["agent"]["total_return"] == pytest.approx(chosen["test"]["total_return"])
    assert result["metrics"]["agent"]["total_return"] > 0.2 and result["metrics"]["agent"]["num_trades"] > 100
    assert set(result["curves"]) == {"agent", "flat"} and "psr_vs_zero" in result["metrics"]["agent"]


def test_the_gate_stays_flat_where_validation_shows_no_edge(ar1):
    """The same policy against the edge (mean reversion on momentum bars) loses on validation: flat."""
    cfg, market = ar1
    net = LastReturn(cfg.env.window, market.features.shape[1], sign=-1.0)
    [result], [gate] = gated_agents(cfg, market, net, CPU, 1, "test", policies=("agent", "flat"))
    assert gate["chosen"] == "flat" and gate["switch_margin"] is None
    assert result["metrics"]["agent"]["num_trades"] == 0 and result["metrics"]["agent"]["total_return"] == 0
    assert all(c["val"]["total_return"] < 0 for c in gate["candidates"][1:])  # every trading candidate lost


def test_the_gate_per_agent(ar1):
    """Two agents at once (rows p·K .. p·K + K − 1 are agent p's): each gets its own choice."""
    cfg, market = ar1
    f = market.features.shape[1]
    follow, against = LastReturn(cfg.env.window, f), LastReturn(cfg.env.window, f, sign=-1.0)
    k = len(candidate_margins(cfg.action.switch_margin, cfg.eval.gate.margins))

    class Two(torch.nn.Module):
        def forward(self, obs):
            return torch.cat([follow(obs[:k]), against(obs[k:])])

    results, gates = gated_agents(cfg, market, Two(), CPU, 2, "test", policies=("agent",))
    assert gates[0]["chosen"] != "flat" and gates[1]["chosen"] == "flat"
    assert results[1]["metrics"]["agent"]["num_trades"] == 0 and results[0]["metrics"]["agent"]["num_trades"] > 100


def test_the_printed_gate_line():
    from foxdqn.analysis.results_table import gate_line

    trained = {"policy": "agent", "switch_margin": 0.0, "val": {"total_return": 0.31, "num_trades": 900},
               "test": {"total_return": 0.42, "num_trades": 950}}
    flat = {"policy": "flat", "switch_margin": None, "val": {"total_return": 0.0, "num_trades": 0},
            "test": {"total_return": 0.0, "num_trades": 0}}
    trading = gate_line({"chosen": "switch_margin=0", "confidence": 0.95, "candidates": [flat, trained]}, "test")
    assert "the agent trades (switch_margin=0" in trading and "+42.00 % with 950 trades on test" in trading
    stays = gate_line({"chosen": "flat", "confidence": 0.95, "candidates": [flat, trained]}, "test")
    assert "flat on the test split" in stays and "confidence ≥ 0.95 (paired PSR)" in stays and "+31.00 % with 900 on val" in stays
    # an evaluation of the validation split gives its figure once (it said "... on val, ... on val")
    on_val = gate_line({"chosen": "flat", "confidence": 0.95, "candidates": [flat, trained]}, "val")
    assert "on val," not in on_val and "the agent as trained: +31.00 % with 900 trades on val (eval.gate" in on_val
