"""Training controls, fault injection and guard checks in a population, per member: gradient
accumulation (``optim.accumulate``), the learning-rate spike (``debug.inject_lr_spike_at_step``),
the post-step weight check (``guard.max_weight``), the gradient-collapse check
(``guard.collapse_multiplier``), early stopping on the Q monitor's divergence flag
(``early_stop.on_q_divergence``), regime weights (``regime.enabled``), gradual magnitude pruning (``prune.enabled``).
Member p of P equals a population of one of its settings (a single run) bit for bit on CPU."""
from __future__ import annotations

import pytest
import torch

from foxdqn.population import step as P
from foxdqn.population.state import build_population
from foxdqn.step.iteration import Iteration
from test_population import (CARTPOLE, TRADING, assert_member_equal, assert_members_equal_runs_of_one, configs,
                             market_for, member_tensors, run)

CPU = torch.device("cpu")
MEMBERS = [["seed=0"], ["seed=1", "optim.lr=3e-3"], ["seed=2", "optim.lr=1e-4"]]


def collected(cfgs, iterations=10):
    """A population of ``cfgs`` after ``iterations`` collect-only iterations."""
    s = build_population(cfgs, market_for(cfgs[0]), CPU)
    collect = Iteration(s, False, updates=0, collect=P.collect_step, update=P.update_step,
                        after_updates=P.publish_guard)
    for _ in range(iterations):
        collect()
    return s


def one_update(extra, base=CARTPOLE):
    """A population of one of ``base`` + ``extra`` (seed 3) after 10 collect-only iterations and one
    update, its guard's state published."""
    cfgs = configs(base, [["seed=3", *extra]])
    pop = collected(cfgs)
    P.update_step(pop)
    P.publish_guard(pop)
    return pop


def consecutive(batch, m):
    """``batch``'s rows in ``m`` consecutive micro-batches (a single run's B rows: micro-batch k holds
    rows k·B/m .. (k + 1)·B/m − 1)."""
    n = batch.obs.shape[0] // m
    return [type(batch)(*(None if f is None else f[k * n:(k + 1) * n] for f in batch)) for k in range(m)]


# --- optim.accumulate ---------------------------------------------------------------------------


@pytest.mark.parametrize("base", [CARTPOLE, [*TRADING, "replay=per"]], ids=["cartpole", "trading-per-3step"])
def test_accumulating_members_equal_runs_of_one_member(base):
    assert_members_equal_runs_of_one([*base, "optim.accumulate=2"], MEMBERS)


def test_accumulating_iqn_members_equal_runs_of_one_member():
    """IQN draws its τ per micro-batch, each member from its own generator."""
    assert_members_equal_runs_of_one([*CARTPOLE, "head=iqn", "optim.accumulate=4"], MEMBERS[:2])


def test_member_micro_batches_are_each_members_single_run_micro_batches():
    s = collected(configs(CARTPOLE, MEMBERS))
    batch = s.replay.sample_members(16)
    parts = P.member_micro_batches(batch, 3, 4)
    assert len(parts) == 4 and P.member_micro_batches(batch, 3, 1) == [batch]
    for p in range(3):
        rows = slice(16 * p, 16 * (p + 1))
        mine = type(batch)(*(None if f is None else (f[p] if f.dim() == 3 else f[rows]) for f in batch))
        for k, single in enumerate(consecutive(mine, 4)):
            for f, name in enumerate(batch._fields):
                got = parts[k][f]
                if got is None:
                    assert single[f] is None, name
                    continue
                got = got[p] if got.dim() == 3 else got[4 * p:4 * (p + 1)]
                assert torch.equal(got, single[f]), (p, k, name)
    # no copy per field and micro-batch: the [P·B] fields are views of one micro-batch-major copy,
    # and obs, next_obs the halves of one stacked pair per micro-batch (no concatenation in the forward)
    from foxdqn.ops.replay_gather import stacked_pair

    for k, part in enumerate(parts):
        assert stacked_pair(part.obs, part.next_obs) is not None, k
        assert part.reward.is_contiguous() and part.reward._base is parts[0].reward._base is not None


# --- debug.inject_lr_spike_at_step ---------------------------------------------------------------


def test_lr_spike_hits_only_its_member():
    """Member 1's lr x 2**100 at update 4: it equals a population of one of its setting, the others
    are bit-identical to a population without the spike, and every lr is restored exactly."""
    spiked = [MEMBERS[0], [*MEMBERS[1], "debug.inject_lr_spike_at_step=4"], MEMBERS[2]]
    together = assert_members_equal_runs_of_one(CARTPOLE, spiked)
    clean = run(configs(CARTPOLE, MEMBERS))
    for p in (0, 2):
        assert_member_equal(together, p, clean, p)
    assert torch.equal(together.optimizer.lr, together.params.lr)
    big = max(v.abs().max() for k, v in member_tensors(together, 1).items() if k.startswith("online"))
    assert big > 1e20  # the spike's step (the guard halts it at a later update: loss clip or NaN)
    assert together.params.lr_spike_at.tolist() == [-1, 4, -1]


def test_lr_spike_in_a_population_of_one_takes_its_step_and_restores_the_lr():
    pop = one_update(["debug.inject_lr_spike_at_step=0"])
    assert max(w.abs().max() for w in pop.online.weights) > 1e20
    assert torch.equal(pop.optimizer.lr, pop.params.lr)


# --- guard.max_weight --------------------------------------------------------------------------


def test_weight_check_halts_only_its_member():
    """Member 1 (bound 10, lr spike at update 4) halts at update 4 with its weights from before it;
    member 2's check (bound 1e4) never fires and changes nothing; member 0 has none."""
    members = [MEMBERS[0], [*MEMBERS[1], "guard.max_weight=10", "debug.inject_lr_spike_at_step=4"],
               [*MEMBERS[2], "guard.max_weight=1e4"]]
    together = assert_members_equal_runs_of_one(CARTPOLE, members)
    assert together.guard.halted.tolist() == [0.0, 1.0, 0.0]
    assert together.guard.reason(1) == "weights non-finite or above guard.max_weight after the step at update 4"
    assert together.params.max_weight.tolist() == [0.0, 10.0, 1e4]
    clean = run(configs(CARTPOLE, MEMBERS))
    for p in (0, 2):
        assert_member_equal(together, p, clean, p)
    assert_member_equal(together, 1, run(configs(CARTPOLE, [MEMBERS[1]]), iterations=4), 0)
    assert max(v.abs().max() for v in member_tensors(together, 1).values()) < 10


def test_weight_check_without_a_bound_in_the_population_is_absent():
    s = build_population(configs(CARTPOLE, MEMBERS), None, CPU)
    assert s.weight_check is None and s.guard.max_weight is None


@pytest.mark.parametrize("extra,halts", [(["guard.max_weight=10", "debug.inject_lr_spike_at_step=0"], True),
                                         (["guard.max_weight=1e4"], False)], ids=["fires", "passes"])
def test_weight_check_in_a_population_of_one(extra, halts):
    """The trial step's max |w| against the bound halts (or not) the single run before its step:
    halted, its weights are those from before the update."""
    cfgs = configs(CARTPOLE, [["seed=3", *extra]])
    before = {k: v.clone() for k, v in collected(cfgs).online.member_state_dict(0).items()}
    pop = one_update(extra)
    assert float(pop.guard.halted[0]) == float(halts)
    assert (pop.guard.reason(0) is not None) == halts
    after = pop.online.member_state_dict(0)
    assert all(torch.equal(after[k], v) for k, v in before.items()) == halts
    if halts:
        assert pop.guard.reason(0) == "weights non-finite or above guard.max_weight after the step at update 0"


# --- guard.collapse_multiplier -------------------------------------------------------------------

COLLAPSING = ["guard.collapse_multiplier=1e6", "guard.warmup_updates=2", "guard.collapse_patience=1"]


def test_collapse_check_halts_only_its_member():
    """Member 1's threshold (lr x 1e6) is above every gradient norm: collapsed from update 2 (its
    warm-up) on, it halts at update 3 (count 2 > patience 1); member 2's (lr x 1e-6) never fires and
    changes nothing; member 0 has none."""
    members = [MEMBERS[0], [*MEMBERS[1], *COLLAPSING],
               [*MEMBERS[2], "guard.collapse_multiplier=1e-6", "guard.warmup_updates=0", "guard.collapse_patience=3"]]
    together = assert_members_equal_runs_of_one(CARTPOLE, members)
    assert together.guard.halted.tolist() == [0.0, 1.0, 0.0]
    assert together.guard.reason(1).startswith("gradient collapse") and together.guard.reason(1).endswith("update 3")
    assert together.guard.collapse[0].tolist() == torch.tensor([0.0, 3e-3 * 1e6, 1e-4 * 1e-6]).tolist()
    clean = run(configs(CARTPOLE, MEMBERS))
    for p in (0, 2):
        assert_member_equal(together, p, clean, p)
    assert_member_equal(together, 1, run(configs(CARTPOLE, [MEMBERS[1]]), iterations=3), 0)


def test_member_collapse_check_on_a_scripted_sequence():
    """A scripted sequence of losses and gradient norms: each member's halt, its update and its count
    of collapsed updates follow the collapse rule of its settings (docs/design/guard.md; the values
    the single-run loop's guard gave), NaN and loss-clip halts included."""
    from foxdqn.population.member_guard import MemberGuard

    # (threshold, warm-up, patience, loss clip) per member
    settings = [(0.5, 0, 0, 1e6), (0.5, 2, 1, 1e6), (0.0, 0, 0, 1e6), (0.045, 1, 2, 1e6), (0.5, 0, 5, 0.9)]
    norms = [0.1, 0.7, 0.2, 0.3, 0.1, 0.6, 0.05, 0.4, 0.01, 0.02, 0.03, float("nan")]
    losses = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 1.0, 0.1, 0.2, 0.3, 0.4]
    f32, i64 = torch.float32, torch.int64
    col = lambda i, dtype: torch.tensor([s[i] for s in settings], dtype=dtype)  # noqa: E731
    guard = MemberGuard(col(3, f32), CPU, collapse=(col(0, f32), col(1, i64), col(2, i64)))
    halted_at, counts = [None] * len(settings), []
    for u, (norm, loss) in enumerate(zip(norms, losses)):
        step = torch.tensor(u, dtype=i64)
        guard.check(torch.full((len(settings),), loss), torch.full((len(settings),), norm), step, step * 4)
        counts.append(int(guard.collapse_count[1]))
        for p in range(len(settings)):
            if guard.halted[p] and halted_at[p] is None:
                halted_at[p] = u
                assert int(guard.at_update[p]) == u
    # member 1 (threshold 0.5, warm-up 2, patience 1): 0.2 and 0.3 collapse after the warm-up, the second halts
    assert counts[:4] == [0, 0, 1, 2], counts
    # at once; after warm-up and patience; threshold 0: only the NaN; a norm above resets; the loss clip first
    assert halted_at == [0, 3, 11, 10, 7], halted_at
    guard.publish()
    assert [guard.reason(p).split(" (")[0] for p in range(5)] == [
        "gradient collapse", "gradient collapse", "non-finite loss or gradient norm", "gradient collapse",
        "loss above guard.loss_clip at update 7"]


def test_collapse_in_a_population_of_one_halts_at_its_first_update():
    pop = one_update(["guard.collapse_multiplier=1e6", "guard.warmup_updates=0", "guard.collapse_patience=0"])
    assert float(pop.guard.halted[0]) == 1.0
    assert pop.guard.reason(0).startswith("gradient collapse") and pop.guard.reason(0).endswith("at update 0")


# --- early_stop.on_q_divergence -----------------------------------------------------------------


def test_member_q_divergence_flag():
    """Per member, the Q flag MemberGuard.check writes (ops.member_guard, in the guard's launch) for
    its Q and threshold: NaN, ±Inf, above the bound set it; at and below the bound, or a NaN bound,
    do not."""
    from foxdqn.population.member_guard import MemberGuard

    q = torch.randn(6, 4, 3)
    q[1, 2, 0] = float("nan")
    q[2, 0, 1] = float("inf")
    q[3, 3, 2] = -5.0  # above 4, at 5
    q[4, 1, 1] = 5.0
    thresholds = torch.tensor([4.0, 4.0, float("inf"), 4.0, 5.0, float("nan")])
    guard = MemberGuard(torch.full((6,), 1e6), CPU, q_divergence=thresholds)
    stats = torch.zeros(6, 5, dtype=torch.float64)
    guard.check(torch.zeros(6), torch.zeros(6), torch.tensor(0), torch.tensor(0), stats, q)
    guard.publish()
    assert [guard.q_diverged_now(p) for p in range(6)] == [q[0].abs().max() > 4, True, True, True, False, False]


def test_q_divergence_stops_a_member_as_a_population_of_one(tmp_path):
    """Member 1's bound 1e-3 is below its first update's |Q|: it stops as early_stop_q after the
    first iteration with updates; member 0 (the default bound) stops on its validation. Each equals a
    population of one (metrics.csv, summary entries, checkpoints)."""
    from test_population_early_stop import EARLY, assert_same_run, train

    base = [*EARLY, "early_stop.on_q_divergence=true"]
    members = [["seed=0"], ["seed=1", "optim.lr=3e-3", "guard.q_divergence=1e-3"]]
    outcomes = train(base, members, tmp_path / "pop")
    stop = outcomes[1].summary["stop"]
    assert stop["reason"] == "early_stop_q" and stop["detail"].startswith("Q monitor: q_divergence at update ")
    assert stop["at_env_steps"] < outcomes[0].summary["stop"]["at_env_steps"]
    assert outcomes[0].summary["stop"]["reason"] == "early_stop_val"
    for p, extra in enumerate(members):
        train(base, [extra], tmp_path / f"alone{p}", jobs=[p])
        assert_same_run(tmp_path / "pop" / str(p), tmp_path / f"alone{p}" / str(p))


# --- run folders -------------------------------------------------------------------------------


def test_guard_halts_in_run_folders_equal_populations_of_one(tmp_path):
    """train_population with accumulation and pruning: member 1 halts on its weight bound (lr spike),
    member 2 on a gradient collapse, member 0 finishes; each folder (metrics.csv rows, the pruning
    columns included, HALTED or the summary's metrics, last.pt) equals a population of one of its
    job's, and HALTED says why."""
    import json

    from foxdqn.population.jobs import FINISHED, HALTED, Member
    from foxdqn.population.train import train_population
    from test_population_early_stop import metrics, weights

    base = [*TRADING, "logger=csv", "agent.total_env_steps=360", "agent.learning_starts=96",
            "log.interval_env_steps=48", "optim.accumulate=2", *PRUNE]
    members = [["seed=0"], ["seed=1", "optim.lr=3e-3", "guard.max_weight=50", "debug.inject_lr_spike_at_step=5"],
               ["seed=2", "optim.lr=1e-4", "guard.collapse_multiplier=1e9", "guard.warmup_updates=3",
                "guard.collapse_patience=2"]]

    def train(extras, folder, jobs):
        tcs = configs(base, extras)
        return train_population([Member(tc, market_for(tcs[0]), folder / str(j), j, list(extra))
                                 for j, tc, extra in zip(jobs, tcs, extras)])

    outcomes = train(members, tmp_path / "pop", [0, 1, 2])
    assert [o.exit_code for o in outcomes] == [FINISHED, HALTED, HALTED], [o.message for o in outcomes]
    halted = [(tmp_path / "pop" / str(p) / "HALTED").read_text() for p in (1, 2)]
    assert halted == ["weights non-finite or above guard.max_weight after the step at update 5\n",
                      "gradient collapse (norm below optim.lr x guard.collapse_multiplier for more than "
                      "guard.collapse_patience updates) at update 5\n"]
    for p, extra in enumerate(members):
        alone = train([extra], tmp_path / "alone", [p])[0]
        assert alone.exit_code == outcomes[p].exit_code and alone.message.replace("alone", "pop") == outcomes[p].message
        a, b = tmp_path / "pop" / str(p), tmp_path / "alone" / str(p)
        pd_a, pd_b = metrics(a), metrics(b)
        assert pd_a.equals(pd_b), p
        assert pd_a["train/prune_target_sparsity"].max() > 0
        (wa, pa), (wb, pb) = weights(a / "checkpoints" / "last.pt"), weights(b / "checkpoints" / "last.pt")
        assert (pa["env_steps"], pa["updates"]) == (pb["env_steps"], pb["updates"])
        assert all(torch.equal(wa[k], wb[k]) for k in wa), p
        if p == 0:
            sa, sb = (json.loads((f / "eval" / "summary.json").read_text()) for f in (a, b))
            assert sa["metrics"] == sb["metrics"]
        else:
            assert (a / "HALTED").read_text() == (b / "HALTED").read_text()


# --- regime.enabled ----------------------------------------------------------------------------

#: thresholds near 1 so that the synthetic market's bars fall in all three regimes
REGIME = ["regime.enabled=true", "regime.low_threshold=0.95", "regime.high_threshold=1.05", "regime.weights=[3,1,0.25]"]


@pytest.mark.parametrize("replay", ["uniform", "per"])
def test_regime_weighted_members_equal_runs_of_one_member(replay):
    assert_members_equal_runs_of_one([*TRADING, *REGIME, f"replay={replay}"], MEMBERS)


def test_regime_weights_are_the_single_runs_for_the_sampled_rows():
    """Each stored transition carries its state's volatility ratio (the env's collect hook), and a
    sample's weight is its regime's (times PER's)."""
    from foxdqn.replay.regime import volatility_ratio

    cfgs = configs([*TRADING, *REGIME], MEMBERS)
    s = collected(cfgs)
    row, expected = int(s.replay.ptr), volatility_ratio(s.env.market_state()[1], s.env.median_volatility)
    P.collect_step(s)
    assert torch.equal(s.replay.vol_ratio[row], expected)  # every member's envs' ratios, written with the row
    batch = s.replay.sample_members(cfgs[0].agent.batch_size)
    ratio = s.replay.vol_ratio.view(-1)[batch.index]
    regime = s.replay.regime
    assert torch.equal(batch.weight, regime(ratio))
    assert set(regime.index(ratio).tolist()) == {0, 1, 2}  # all three regimes sampled


def test_memory_cap_counts_the_regime_column():
    """The population's memory cap (job.memory.members_that_fit) counts each member's float32
    volatility ratios, as the single run's precheck counts its own (job.check)."""
    from foxdqn.job.memory import members_that_fit

    plain, regime = configs(TRADING, [[], REGIME])
    market = market_for(plain)
    free = 10 ** 9
    assert members_that_fit(regime, market, free) < members_that_fit(plain, market, free)


# --- prune.enabled -----------------------------------------------------------------------------

PRUNE = ["prune.enabled=true", "prune.initial_sparsity=0.2", "prune.final_sparsity=0.6", "prune.start_update=1",
         "prune.end_update=7", "prune.frequency=2", "debug.fit_prune_schedule=false"]  # (smoke would shrink it)


def test_pruned_members_equal_runs_of_one_member():
    together = assert_members_equal_runs_of_one([*CARTPOLE, *PRUNE], MEMBERS)
    masks = together.pruner.masks
    for p in range(3):  # the schedule's final sparsity reached in each member's matrices, its own entries
        for w, mask in zip(together.online.weights, masks):
            assert int((mask[p] == 0).sum()) == int(0.6 * mask[p].numel())
            assert bool((w[p][mask[p] == 0] == 0).all())
    assert not torch.equal(masks[0][0], masks[0][1])
    values = together.pruner.log_values(together.updates)
    assert values[:, 1].tolist() == [pytest.approx(0.6)] * 3 and bool((values[:, 0] >= 0.6 - 0.01).all())


def single_masks(pop, p, cfg):
    """Member ``p``'s weights of ``pop`` in a single run's network with a
    :class:`~foxdqn.step.pruning.MagnitudePruner` of ``cfg``'s schedule: (pruner, its masks by
    parameter name)."""
    import copy

    from foxdqn.step.build import build_network
    from foxdqn.step.pruning import MagnitudePruner

    online = build_network(cfg, pop.env, pop.action_mode.num_actions)
    online.load_state_dict(pop.online.member_state_dict(p))
    target = copy.deepcopy(online).requires_grad_(False)
    r = cfg.prune
    pruner = MagnitudePruner(online, target, r.initial_sparsity, r.final_sparsity, r.start_update, r.end_update,
                             r.frequency, device=CPU)
    names = [n for n, w in online.named_parameters() if w.dim() >= 2]
    return pruner, dict(zip(names, pruner.masks))


def test_member_masks_are_the_single_runs_for_the_same_weights():
    """MemberPruner.step and the single run's MagnitudePruner.step on the same weights (rounded to
    one decimal: many ties, broken by position in the classic [out, in] layout) give the same masks,
    and a skipped member keeps its masks."""
    cfgs = configs(CARTPOLE, [[*m, *PRUNE] for m in MEMBERS])
    pop = build_population(cfgs, None, CPU)
    with torch.no_grad():
        for w in pop.online.weights:
            w.copy_((w * 10).round() / 10)
    singles = [single_masks(pop, p, c) for p, c in enumerate(cfgs)]
    t, skip = torch.tensor(3), torch.tensor([0.0, 1.0, 0.0])
    pop.pruner.step(t, skip)
    for p, (pruner, masks) in enumerate(singles):
        pruner.step(t, torch.tensor(0.0))
        for prefix, mask in zip(pop.online.prefixes, pop.pruner.masks):
            if p == 1:  # skipped: nothing pruned yet
                assert bool((mask[p] == 1).all())
            else:
                assert torch.equal(mask[p].t(), masks[f"{prefix}.weight"]), (p, prefix)
                assert int((mask[p] == 0).sum()) > 0


def test_pruning_in_a_population_of_one_prunes_at_its_first_update():
    pop = one_update([*PRUNE, "prune.start_update=0"])
    for w, mask in zip(pop.online.weights, pop.pruner.masks):
        assert int((mask == 0).sum()) == int(0.2 * mask.numel())
        assert bool((w[mask == 0] == 0).all())


@pytest.mark.parametrize("extra", [["head=c51", "action.switch_margin=0.5", "optim.accumulate=2", *REGIME, "replay=per"],
                                   ["objective.iql=true", "objective.cql_alpha=0.5", "optim.accumulate=4", *PRUNE,
                                    "guard.max_weight=1e4", "guard.collapse_multiplier=1e-9"]],
                         ids=["c51-switch-accumulate-regime-per", "iql-cql-accumulate-prune-guards"])
def test_controls_together_equal_runs_of_one_member(extra):
    """The lifted settings with each other and with the population's other features (trading)."""
    assert_members_equal_runs_of_one([*TRADING, *extra], MEMBERS)
