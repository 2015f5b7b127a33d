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
#: the ensembles compared with their members' own walks as trained (the gate: test_population_gate.py)
UNGATED = [*TRADING, "eval.gate.enabled=false"]


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


#: 6 actions over 3 exposures: actions 0, 1 target exposure 0; 2, 3 exposure 1; 4, 5 exposure 2
EXPOSURE_OF = torch.tensor([0, 0, 1, 1, 2, 2])


def _consensus(table, held, agreement=0.8, idx=None):
    idx = list(range(table.shape[0])) if idx is None else idx
    rule = EnsembleGreedy(FixedQ(table), idx, "consensus", agreement, EXPOSURE_OF)
    assert rule.needs_held
    return rule(torch.zeros(table.shape[1], 4), torch.tensor(held))


def _greedy_on(exposures):
    """[P, 1, 6] Q whose member p's greedy action targets ``exposures[p]`` (the first action of it)."""
    table = torch.zeros(len(exposures), 1, 6)
    for p, e in enumerate(exposures):
        table[p, 0, 2 * e] = 1.0 + p  # and Q grows with p, so the mean Q's argmax is the last member's choice
    return table


def test_consensus_moves_only_where_enough_members_target_one_new_exposure():
    """4 of 5 members on exposure 2 (need ⌈0.8·5⌉ = 4): the ensemble moves there, taking that
    exposure's action of highest mean Q; 3 of 5: it keeps the exposure held, at that exposure's
    action of highest mean Q (no order), although the mean Q's argmax is elsewhere."""
    scores = _consensus(_greedy_on([2, 2, 2, 2, 0]), [1])
    assert scores.argmax(dim=1).tolist() == [4]
    assert torch.isinf(scores[0, :4]).all() and (scores[0, :4] < 0).all()  # other exposures: -inf
    assert torch.equal(scores[0, 4:], _greedy_on([2, 2, 2, 2, 0]).mean(dim=0)[0, 4:])
    table = _greedy_on([2, 2, 2, 0, 0])
    assert table.mean(dim=0).argmax(dim=1).tolist() == [0]  # the mean rule would move to exposure 0
    table[:, 0, 3] = 0.01  # among the held exposure's actions, action 3 has the higher mean Q
    assert _consensus(table, [1]).argmax(dim=1).tolist() == [3]
    assert _consensus(table, [1], agreement=0.6).argmax(dim=1).tolist() == [4]  # ⌈0.6·5⌉ = 3 agree: move


def test_consensus_needs_no_agreement_to_stay_and_counts_only_the_ensembles_members():
    table = _greedy_on([1, 1, 0, 0, 2])
    assert _consensus(table, [1]).argmax(dim=1).tolist() == [2]  # nobody agrees on a move: stay on 1
    assert _consensus(table, [0], agreement=1.0, idx=[2, 3]).argmax(dim=1).tolist() == [0]  # both on the held one
    assert _consensus(table, [2], agreement=1.0, idx=[2, 3]).argmax(dim=1).tolist() == [0]  # both agree on 0
    assert _consensus(table, [2], agreement=1.0, idx=[1, 2]).argmax(dim=1).tolist() == [4]  # 1 vs 0: stay on 2 (a tie at 0: the first)
    walks = torch.cat([_greedy_on([2, 2, 2, 2, 2]), _greedy_on([0, 0, 1, 1, 2])], dim=1)  # [5, 2, 6]: two walks
    assert _consensus(walks, [0, 0]).argmax(dim=1).tolist() == [4, 0]  # walk 0 moves to 2, walk 1 stays on 0


def test_consensus_arguments_are_checked():
    table = _greedy_on([0, 1])
    with pytest.raises(ValueError, match="agreement must be in \\(0.5, 1\\]"):
        EnsembleGreedy(FixedQ(table), [0, 1], "consensus", 0.5, EXPOSURE_OF)
    with pytest.raises(ValueError, match="needs action_exposure"):
        EnsembleGreedy(FixedQ(table), [0, 1], "consensus", 0.8)
    with pytest.raises(ValueError, match="needs held"):
        EnsembleGreedy(FixedQ(table), [0, 1], "consensus", 0.8, EXPOSURE_OF)(torch.zeros(1, 4))
    assert not EnsembleGreedy(FixedQ(table), [0, 1], "mean").needs_held


def test_consensus_agreement_is_validated_with_one_message():
    from foxdqn.config.compose import load_config
    from foxdqn.errors import ConfigError

    for bad in ("0.5", "1.5"):
        with pytest.raises(ConfigError, match="eval.ensemble_agreement=.* must be in \\(0.5, 1\\]"):
            load_config(["debug=smoke", "device=cpu", "eval.ensemble=consensus", f"eval.ensemble_agreement={bad}"])
    with pytest.raises(ConfigError, match="eval.ensemble_agreement=nan"):
        load_config(["debug=smoke", "device=cpu", "eval.ensemble_agreement=nan"])
    cfg = load_config(["debug=smoke", "device=cpu", "eval.ensemble=consensus", "action.switch_margin=1"])
    assert cfg.eval.ensemble == "consensus" and cfg.eval.ensemble_agreement == 0.8


def _lcb(table, held, kappa=1.0, idx=None):
    idx = list(range(table.shape[0])) if idx is None else idx
    rule = EnsembleGreedy(FixedQ(table), idx, "lcb", action_exposure=EXPOSURE_OF, kappa=kappa)
    assert rule.needs_held
    return rule(torch.zeros(table.shape[1], 4), torch.tensor(held))


def test_lcb_switches_only_where_the_members_advantage_is_confidently_positive():
    """Advantages over keeping exposure 0 (its best action, per member): action 4 gains 1, 2, 3
    (mean 2, std 1), action 2 gains 3, −1, 1 (mean 1, std 2). κ = 1: action 4's bound 1 > 0, the
    switch; κ = 2.5: every bound <= 0, keep exposure 0 at its action of highest mean Q; κ = 0:
    the highest mean advantage (action 4)."""
    table = torch.zeros(3, 1, 6)
    table[:, 0, 0] = torch.tensor([1.0, 0.0, 2.0])  # the held exposure's actions 0 and 1
    table[:, 0, 1] = torch.tensor([0.0, 0.5, 0.0])  # member 1 keeps best with action 1 (Q 0.5)
    keep = table[:, 0, :2].amax(dim=1)  # [1, 0.5, 2]
    table[:, 0, 4] = keep + torch.tensor([1.0, 2.0, 3.0])
    table[:, 0, 2] = keep + torch.tensor([3.0, -1.0, 1.0])
    table[:, 0, 3] = keep - 5.0
    table[:, 0, 5] = keep - 5.0
    scores = _lcb(table, [0], kappa=1.0)
    assert scores.argmax(dim=1).tolist() == [4]
    assert torch.isinf(scores[0, [0, 1, 2, 3, 5]]).all()  # only the chosen switch is allowed
    assert _lcb(table, [0], kappa=2.5).argmax(dim=1).tolist() == [0]  # mean Q of action 0 is 1 > 1/6
    assert _lcb(table, [0], kappa=0.0).argmax(dim=1).tolist() == [4]
    advantages = table[:, 0] - keep[:, None]
    bound = advantages.mean(dim=0) - advantages.std(dim=0)  # the rule, written out (Bessel's std)
    assert bound[4] > 0 and bound[2] < 0 and torch.isclose(bound[4], torch.tensor(1.0))


def test_lcb_of_one_member_is_its_greedy_action_and_kappa_is_checked():
    table = _greedy_on([2, 0, 1])
    for p in range(3):  # one member: no spread, a switch wherever its own greedy action leaves the held exposure
        assert _lcb(table, [0], idx=[p]).argmax(dim=1).tolist() == [2 * [2, 0, 1][p]]
    with pytest.raises(ValueError, match="kappa must be a finite number >= 0"):
        EnsembleGreedy(FixedQ(table), [0, 1], "lcb", action_exposure=EXPOSURE_OF, kappa=-1.0)
    from foxdqn.config.compose import load_config
    from foxdqn.errors import ConfigError

    with pytest.raises(ConfigError, match="eval.ensemble_kappa=-0.5 must be >= 0"):
        load_config(["debug=smoke", "device=cpu", "eval.ensemble=lcb", "eval.ensemble_kappa=-0.5"])


def test_consensus_of_identical_members_walks_as_each_of_them():
    """Two members of one seed always agree: wherever the member moves, both target its exposure,
    and the ensemble takes that exposure's best mean-Q action, the member's own argmax; the
    consensus walk (the held exposure from the eval env's accounts) equals the member's walk."""
    same = configs(UNGATED, [["seed=5", "eval.ensemble=consensus"], ["seed=5", "eval.ensemble=consensus"]])
    twin = run(same)
    market = market_for(same[0])
    own = member_walks(twin, market, "test", ("agent",))[0]["metrics"]["agent"]
    entry = ensemble_walks(twin, market, [0, 1], "consensus")[0]
    assert entry["rule"] == "consensus" and entry["metrics"] == own
    assert own["num_trades"] > 0  # the walk trades: the equality is not that of two flat walks
    # two equal members have no spread: the lcb rule with any κ walks as each of them too
    assert ensemble_walks(twin, market, [0, 1], "lcb")[0]["metrics"] == own


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
    cfgs = configs(UNGATED, [["seed=5"], ["seed=5"], ["seed=6", "optim.lr=1e-3"]])
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
