"""prune.*: gradual magnitude pruning (Zhu & Gupta 2017 eq. 1) inside the update step."""
import math

import pytest
import torch
from torch import nn

from foxdqn.errors import ConfigError
from foxdqn.step.iteration import Iteration
from foxdqn.step.pruning import MagnitudePruner
from foxdqn.config.compose import load_config

from support import experiment_state, iterate, step_fns

PRUNE = ["prune.enabled=true", "prune.initial_sparsity=0.1", "prune.final_sparsity=0.6",
         "prune.start_update=2", "prune.end_update=8", "prune.frequency=3"]


def _zg(t, s_i=0.1, s_f=0.6, t0=2, t_end=8):
    if t < t0:
        return 0.0
    progress = min(max((t - t0) / (t_end - t0), 0.0), 1.0)
    return s_f + (s_i - s_f) * (1 - progress) ** 3


def _tiny_pruner(**kw):
    torch.manual_seed(0)
    online = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    target = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)).requires_grad_(False)
    target.load_state_dict(online.state_dict())
    args = dict(initial_sparsity=0.1, final_sparsity=0.6, start_update=2, end_update=8, frequency=3)
    args.update(kw)
    return online, target, MagnitudePruner(online, target, device=torch.device("cpu"), **args)


def test_schedule_matches_zhu_gupta_eq1():
    _, _, pr = _tiny_pruner()
    for t in range(0, 12):
        got = float(pr.sparsity_at(torch.tensor(t)))
        assert got == pytest.approx(_zg(t), abs=1e-12), t
    due = [t for t in range(12) if bool(pr.due(torch.tensor(t)))]
    assert due == [2, 5, 8]  # t0, t0 + Δt, and the end (which the frequency would also reach here)
    _, _, pr = _tiny_pruner(end_update=9)
    assert [t for t in range(12) if bool(pr.due(torch.tensor(t)))] == [2, 5, 8, 9]  # the end always


def test_only_weight_matrices_are_pruned_and_masks_are_magnitude_based():
    online, target, pr = _tiny_pruner(start_update=0, end_update=1, initial_sparsity=0.6, frequency=1)
    assert [p.shape for p in pr.params] == [(5, 6), (3, 5)]  # biases are not pruned
    before = [p.detach().clone() for p in pr.params]
    pr.step(torch.tensor(0), torch.tensor(0.0))
    for w, p, mask in zip(before, pr.params, pr.masks):
        k = math.floor(0.6 * w.numel())
        assert int((mask == 0).sum()) == k
        pruned, kept = w.abs()[mask == 0], w.abs()[mask == 1]
        assert pruned.max() <= kept.min()  # the k smallest |w|
        assert torch.equal(p, w * mask)


def test_skipped_update_does_not_recompute_masks():
    _, _, pr = _tiny_pruner(start_update=0)
    pr.step(torch.tensor(0), torch.tensor(1.0))  # due, but the guard skipped the update
    assert all(bool((m == 1).all()) for m in pr.masks)


def _run(extra=(), iters=6):
    s, _ = experiment_state("eurusd_dqn", extra=[*PRUNE, *extra])  # 2 updates per iteration
    return iterate(s, False, 4, iters).s


def test_final_sparsity_reached_and_kept_online_and_target():
    s = _run(iters=6)  # updates 0..11: the end (8) is passed
    assert s.pruner is not None and len(s.pruner.params) >= 3
    for p, tp in zip(s.pruner.params, s.pruner.target_params):
        k = math.floor(0.6 * p.numel())
        assert abs(int((p == 0).sum()) - k) <= 1
        assert bool((tp[p == 0] == 0).all())  # the target carries the online masks
    zeros_before = [(p == 0).clone() for p in s.pruner.params]
    full = Iteration(s, False, **step_fns(s))
    for _ in range(4):  # Adam keeps moving the pruned weights; the mask puts them back
        full()
    for z, p, tp in zip(zeros_before, s.pruner.params, s.pruner.target_params):
        assert torch.equal(p == 0, z)
        assert bool((tp[z] == 0).all())
    sparsity, scheduled = s.pruner.log_values(s.updates)[0].tolist()  # the log row's prune_* columns
    assert scheduled == pytest.approx(0.6)
    assert sparsity == pytest.approx(0.6, abs=0.01)


def test_before_start_nothing_is_pruned():
    s = _run(["prune.start_update=100", "prune.end_update=200"], iters=2)
    assert all(bool((p != 0).all()) for p in s.pruner.params)
    assert s.pruner.log_values(s.updates)[0, 0] == 0.0  # the log row's prune_sparsity


@pytest.mark.parametrize("bad", [
    ["prune.final_sparsity=1.0"],
    ["prune.initial_sparsity=0.5", "prune.final_sparsity=0.2"],
    ["prune.start_update=10", "prune.end_update=10"],
    ["prune.frequency=0"],
])
def test_prune_config_errors(bad):
    with pytest.raises(ConfigError, match="prune."):
        load_config(["prune.enabled=true", *bad])


def test_smoke_caps_shrink_the_pruning_schedule_with_the_run():
    full = load_config(["+experiment=eurusd_controls"])
    smoke = load_config(["+experiment=eurusd_controls", "debug=smoke"])
    r = smoke.agent.total_env_steps / full.agent.total_env_steps
    assert r < 1
    assert smoke.prune.end_update == max(smoke.prune.start_update + 1, int(full.prune.end_update * r))
    assert smoke.prune.frequency == max(1, int(full.prune.frequency * r))
    per_iter = smoke.env.num_envs * smoke.agent.steps_per_iter
    smoke_updates = (smoke.agent.total_env_steps - smoke.agent.learning_starts) // per_iter * smoke.agent.updates_per_iter
    assert smoke.prune.end_update <= smoke_updates  # the smoke run reaches the final sparsity


def test_pruned_entries_get_no_gradient_and_do_not_count_in_the_clipped_norm():
    from foxdqn.population.step import accumulate_member_gradients

    s = _run(iters=6)  # past the end: 60 % of each matrix pruned
    accumulate_member_gradients(s, s.replay.sample_members(s.cfg.agent.batch_size))
    raw = [p.grad.clone() for p in s.pruner.params]
    assert any(bool((g[m == 0] != 0).any()) for g, m in zip(raw, s.pruner.masks))  # the loss does reach them
    s.pruner.mask_grads()
    for p, m, g in zip(s.pruner.params, s.pruner.masks, raw):
        assert bool((p.grad[m == 0] == 0).all())
        torch.testing.assert_close(p.grad[m == 1], g[m == 1])  # the kept entries are untouched


def test_update_step_masks_the_gradients_before_clipping():
    from foxdqn.population.step import update_step

    s = _run(iters=6)
    update_step(s)  # the gradients of this update stay in .grad after the Adam step
    for p, m in zip(s.pruner.params, s.pruner.masks):
        assert bool((p.grad[m == 0] == 0).all())
        assert bool((p.grad[m == 1] != 0).any())
