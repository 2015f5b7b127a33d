"""Early stopping: validation patience / min-delta, best checkpoint evaluated, Q-bound and Q-divergence
stops, summary.json stop fields, config validation (a single run: a population of one)."""
import json
from types import SimpleNamespace

import pytest
import torch

import foxdqn.population.evaluate as member_eval
from foxdqn.run.checkpoint import load_checkpoint
from foxdqn.run.early_stop import EarlyStopper, resolve_metric
from foxdqn.errors import ConfigError, HaltError
from foxdqn.config.compose import load_config

from support import small_state, train_run

BASE = ["logger=csv", "early_stop.enabled=true"]  # debug=smoke: 4096 env steps, 64 per iteration


def _cfg(**kw):
    return SimpleNamespace(**{"metric": "sharpe", "patience": 2, "min_delta": 0.0, "q_bound": None,
                              "q_patience": 2, **kw})


def test_min_delta_is_strict_and_patience_counts_evaluations_in_a_row():
    es = EarlyStopper(_cfg(min_delta=0.5, patience=2), "trading")
    assert [es.update_val(i, {"sharpe": v}) for i, v in enumerate([1.0, 1.25, 2.0, 2.25, 2.5])] == \
        [True, False, True, False, False]  # 2.5 - 2.0 == min_delta: not an improvement
    assert es.best == 2.0 and es.best_env_steps == 2 and es.bad_evals == 2 and es.val_exhausted
    es = EarlyStopper(_cfg(patience=3), "trading")
    for v in (float("nan"), 1.0, 1.0, 0.5):  # NaN never improves; equal is no improvement
        es.update_val(0, {"sharpe": v})
    assert es.best == 1.0 and es.bad_evals == 2 and not es.val_exhausted


def test_max_drawdown_lower_is_better_and_auto_metric():
    es = EarlyStopper(_cfg(metric="max_drawdown"), "trading")
    assert [es.update_val(0, {"max_drawdown": v}) for v in (0.3, 0.2, 0.25)] == [True, True, False]
    assert es.best == 0.2
    assert resolve_metric("auto", "trading") == "sharpe" and resolve_metric("auto", "cartpole") == "mean_return"


def test_q_bound_streak_resets_and_ignores_intervals_without_updates():
    es = EarlyStopper(_cfg(q_bound=10.0, q_patience=3), "trading")
    assert [es.update_q(q) for q in (11, -12, 5, 11, float("nan"), 20, 30)] == \
        [False, False, False, False, False, False, True]
    assert not EarlyStopper(_cfg(), "trading").update_q(1e30)  # q_bound None: off


def _train(tmp_path, overrides):
    s, market = small_state([*BASE, *overrides])
    return train_run(s.cfg, market, tmp_path)


def fake_validation(monkeypatch, values) -> None:
    """Every validation of the run (during training and of the kept weights at the end) returns the
    next of ``values`` as its sharpe."""
    values = iter(values)
    monkeypatch.setattr(member_eval, "member_validation", lambda s, market: [{"sharpe": next(values)}])


def test_val_stop_after_patience_and_best_checkpoint_is_evaluated(tmp_path, monkeypatch):
    # evaluations at 512, 1024, 1536, 2048 env steps, then the kept weights' at the end
    fake_validation(monkeypatch, [1.0, 3.0, 2.0, 2.5, 9.0, 9.0])
    summary = _train(tmp_path, ["eval.interval_env_steps=512", "early_stop.patience=2"])
    assert summary["stop"] == {"reason": "early_stop_val", "at_env_steps": 2048, "metric": "sharpe",
                               "best_env_steps": 1024, "best_metric": 3.0, "detail": summary["stop"]["detail"]}
    assert summary["env_steps"] == 2048
    assert summary["evaluated"] == {"checkpoint": "best", "env_steps": 1024, "metric": "sharpe", "value": 3.0}
    on_disk = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert on_disk["stop"]["reason"] == "early_stop_val" and on_disk["evaluated"]["checkpoint"] == "best"
    best = load_checkpoint(tmp_path / "checkpoints" / "best.pt")
    last = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert best["env_steps"] == 1024
    assert not all(torch.equal(last["online"][k], v) for k, v in best["online"].items())
    # best.pt carries its run's id, so its evaluations go to the run's evaluations/ (not checkpoints/evaluations)
    from foxdqn.evaluate import evaluations_folder

    assert best["run_id"] is not None and best["run_id"] == last["run_id"]
    assert evaluations_folder(tmp_path / "checkpoints" / "best.pt", best) == (tmp_path / "evaluations").resolve()


def test_q_bound_stop_after_consecutive_log_intervals(tmp_path):
    # log every 1024 env steps (smoke), updates from 512: |mean max-Q| > 1e-9 at 1024 and 2048
    summary = _train(tmp_path, ["eval.interval_env_steps=4096", "early_stop.q_bound=1e-9", "early_stop.q_patience=2",
                                "diversity.min_entropy=1.0", "diversity.patience=1"])
    assert summary["stop"]["reason"] == "early_stop_q" and summary["stop"]["at_env_steps"] == 2048
    assert summary["env_steps"] == 2048 and summary["evaluated"]["checkpoint"] == "last"
    assert summary["stop"]["best_env_steps"] is None and not (tmp_path / "checkpoints" / "best.pt").exists()
    # diversity: always below a normalised entropy of 1 -> one collapse episode, warned once
    assert summary["diversity"]["collapse_warnings"] == 1 and summary["diversity"]["collapsed_at_end"]
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
    for name in ("action", "exposure", "order_type", "urgency"):
        assert f"train/{name}_entropy" in header and f"train/{name}_entropy_norm" in header


def test_q_divergence_halts_unless_on_q_divergence(tmp_path):
    over = ["eval.interval_env_steps=4096", "guard.q_divergence=1e-9"]
    with pytest.raises(HaltError, match="q_divergence"):
        _train(tmp_path / "halt", over)
    assert (tmp_path / "halt" / "HALTED").is_file()
    summary = _train(tmp_path / "stop", [*over, "early_stop.on_q_divergence=true"])
    assert summary["stop"]["reason"] == "early_stop_q" and "q_divergence" in summary["stop"]["detail"]
    assert summary["env_steps"] < 4096 and not (tmp_path / "stop" / "HALTED").exists()


def test_completed_run_without_early_stop_reports_last(tmp_path):
    s, market = small_state(["logger=csv", "agent.total_env_steps=1024", "diversity.enabled=false"])
    summary = train_run(s.cfg, market, tmp_path)
    assert summary["stop"]["reason"] == "completed" and summary["stop"]["at_env_steps"] == 1024
    assert summary["evaluated"]["checkpoint"] == "last" and "diversity" not in summary


@pytest.mark.parametrize("overrides, needle", [
    (["early_stop.enabled=true"], "eval.interval_env_steps"),
    (["early_stop.metric=calmar"], "early_stop.metric"),
    (["early_stop.enabled=true", "eval.interval_env_steps=100", "early_stop.metric=mean_return"], "early_stop.metric"),
    (["+experiment=cartpole_dqn", "early_stop.enabled=true", "eval.interval_env_steps=100"], None),
    (["+experiment=cartpole_dqn", "early_stop.enabled=true", "eval.interval_env_steps=100",
      "early_stop.metric=sharpe"], "early_stop.metric"),
    (["early_stop.patience=0"], "early_stop.patience"),
    (["early_stop.q_bound=-1"], "early_stop.q_bound"),
    (["early_stop.q_patience=0"], "early_stop.q_patience"),
    (["early_stop.min_delta=-0.1"], "early_stop.min_delta"),
    (["diversity.min_entropy=1.5"], "diversity.min_entropy"),
    (["diversity.patience=0"], "diversity.patience"),
    (["diversity.top_k=0"], "diversity.top_k"),
])
def test_config_errors_name_the_field(overrides, needle):
    if needle is None:  # valid: auto resolves to mean_return on cartpole
        assert load_config(overrides).early_stop.enabled
        return
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        load_config(overrides)


def test_no_validation_stop_before_the_first_update(tmp_path, monkeypatch):
    """Before agent.learning_starts the weights never change: those evaluations do not count."""
    monkeypatch.setattr(member_eval, "member_validation", lambda s, market: [{"sharpe": 1.0}])
    summary = _train(tmp_path, ["agent.learning_starts=3000", "debug.max_learning_starts=3000",
                                "eval.interval_env_steps=256", "early_stop.patience=2"])
    assert summary["updates"] > 0
    assert summary["stop"]["reason"] == "early_stop_val"
    assert summary["stop"]["best_env_steps"] > 3000  # the first evaluation after updates began


def test_the_metric_is_a_plain_string_that_a_checkpoint_can_hold():
    from foxdqn.run.checkpoint import encode
    from foxdqn.config.schema import EarlyStopConfig, EarlyStopMetric

    es = EarlyStopper(EarlyStopConfig(enabled=True, metric=EarlyStopMetric.sortino), "trading")
    assert type(es.metric) is str and es.metric == "sortino"
    encode({"best": {"metric": es.metric, "value": 1.0}, "loop": {"stopper": es.state_dict()}})
