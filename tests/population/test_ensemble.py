"""The ensemble policy of a population's members of one setting (foxdqn.population.ensemble)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from foxdqn.population.ensemble import EnsembleGreedy, ensemble_walks, settings
from foxdqn.population.evaluate import member_walks

from test_population import TRADING, configs, market_for, run


class FixedQ(nn.Module):
    """A stand-in for a member network: member p's Q on walk m is ``table[p, m]`` whatever the obs."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table, self.num_members = table, table.shape[0]

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        assert obs.shape[0] == self.num_members
        return self.table[:, : obs.shape[1]]


def test_mean_rule_takes_the_argmax_of_the_mean_q():
    table = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.0, 3.0]],
                          [[0.0, 0.9, 0.0], [0.0, 2.0, 0.0]],
                          [[0.0, 0.9, 0.0], [5.0, 0.0, 0.0]]])  # [P=3, M=2, A=3]
    scores = EnsembleGreedy(FixedQ(table), [0, 1, 2], "mean")(torch.zeros(2, 4))
    assert torch.allclose(scores, table.mean(dim=0))
    assert scores.argmax(dim=1).tolist() == [1, 0]  # walk 0: 0.6 > 0.33; walk 1: 5/3 > 1 > 2/3
    assert EnsembleGreedy(FixedQ(table), [0], "mean")(torch.zeros(2, 4)).argmax(dim=1).tolist() == [0, 2]


def test_vote_rule_takes_the_most_chosen_action_and_breaks_ties_by_mean_q():
    table = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.0, 3.0]],
                          [[0.0, 0.9, 0.0], [0.0, 2.0, 0.0]],
                          [[0.0, 0.9, 0.0], [5.0, 0.0, 0.0]]])
    votes = EnsembleGreedy(FixedQ(table), [0, 1, 2], "vote")(torch.zeros(2, 4)).argmax(dim=1)
    assert votes[0] == 1  # two of three members choose action 1 (mean alone would too)
    assert votes[1] == 0  # one vote each: the tie goes to the highest mean Q (5/3, action 0)
    table[2, 0] = torch.tensor([0.0, 0.0, 9.0])  # walk 0: one vote each for 0, 1, 2; mean Q 3 for action 2
    assert EnsembleGreedy(FixedQ(table), [0, 1, 2], "vote")(torch.zeros(2, 4)).argmax(dim=1)[0] == 2
    table[1, 0] = torch.tensor([0.0, 0.0, 0.5])  # now two votes for action 2, whose mean is not the highest...
    table[0, 0] = torch.tensor([20.0, 0.0, 0.0])  # ...mean Q of action 0 is 20/3: the vote still wins
    assert EnsembleGreedy(FixedQ(table), [0, 1, 2], "vote")(torch.zeros(2, 4)).argmax(dim=1)[0] == 2
    assert EnsembleGreedy(FixedQ(table), [0, 1, 2], "mean")(torch.zeros(2, 4)).argmax(dim=1)[0] == 0


def test_bad_rule_or_no_member_is_refused():
    with pytest.raises(ValueError, match="choose one of mean, vote"):
        EnsembleGreedy(FixedQ(torch.zeros(1, 1, 2)), [0], "median")
    with pytest.raises(ValueError, match="at least one member"):
        EnsembleGreedy(FixedQ(torch.zeros(1, 1, 2)), [], "mean")


def test_settings_group_members_that_differ_in_seed_only():
    cfgs = configs(TRADING, [["seed=0"], ["seed=1", "optim.lr=1e-3"], ["seed=2"], ["seed=3", "optim.lr=1e-3"],
                             ["seed=4", "agent.gamma=0.9"]])
    assert settings(cfgs) == [[0, 2], [1, 3], [4]]


def test_an_ensemble_of_identical_members_walks_as_each_of_them():
    """Two members with the same config (same seed) hold the same weights: their ensemble's walk,
    by either rule, is each one's own walk; a third member of another setting gets no entry."""
    cfgs = configs(TRADING, [["seed=5"], ["seed=5"], ["seed=6", "optim.lr=1e-3"]])
    s = run(cfgs)
    market = market_for(cfgs[0])
    own = member_walks(s, market, "test", ("agent",))
    assert own[0]["metrics"]["agent"] == own[1]["metrics"]["agent"]
    for rule in ("mean", "vote"):
        entries = ensemble_walks(s, market, [10, 11, 12], rule)
        assert set(entries) == {0, 1} and entries[0] is entries[1]
        entry = entries[0]
        assert entry["rule"] == rule and entry["members"] == [10, 11] and entry["split"] == "test"
        assert entry["metrics"] == own[0]["metrics"]["agent"]
        assert entry["val_metrics"] == member_walks(s, market, "val", ("agent",))[0]["metrics"]["agent"]


def test_an_ensemble_of_different_members_is_its_own_policy():
    """Members of different seeds: the mean-Q ensemble acts on every bar with the argmax of the
    members' mean Q, checked against the members' own Q on the walk's observations."""
    cfgs = configs(TRADING, [["seed=0"], ["seed=1"], ["seed=2"]])
    s = run(cfgs)
    width = next(w.shape[1] for w in s.online.parameters() if w.dim() == 3)  # the first layer's [P, in, out]
    obs = torch.randn(7, width, generator=torch.Generator().manual_seed(0))
    member_q = s.online(obs.expand(3, 7, width).contiguous())  # [P, 7, A]: each member on the same rows
    scores = EnsembleGreedy(s.online, [0, 1, 2], "mean")(obs)
    assert torch.allclose(scores, member_q.mean(dim=0), atol=1e-6)
    assert torch.equal(EnsembleGreedy(s.online, [1], "mean")(obs).argmax(dim=1), member_q[1].argmax(dim=1))


def test_a_vote_cannot_price_a_switch():
    from foxdqn.config.compose import load_config
    from foxdqn.errors import ConfigError

    with pytest.raises(ConfigError, match="eval.ensemble=vote counts the members' greedy actions"):
        load_config(["debug=smoke", "device=cpu", "action.switch_margin=1", "eval.ensemble=vote"])
    assert load_config(["debug=smoke", "device=cpu", "action.switch_margin=1"]).eval.ensemble == "mean"


def test_halted_members_have_no_say():
    """A member the guard halted keeps untrained weights: it is left out of its setting's ensemble,
    and a setting left with one member has none."""
    cfgs = configs(TRADING, [["seed=0"], ["seed=1"], ["seed=2"]])
    s = run(cfgs)
    market = market_for(cfgs[0])
    s.guard.reason = lambda p: "non-finite loss" if p == 1 else None
    entries = ensemble_walks(s, market, [10, 11, 12], "mean")
    assert set(entries) == {0, 2} and entries[0]["members"] == [10, 12]
    s.guard.reason = lambda p: "non-finite loss" if p != 0 else None
    assert ensemble_walks(s, market, [10, 11, 12], "mean") == {}
