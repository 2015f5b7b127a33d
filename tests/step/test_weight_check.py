"""guard.max_weight, the post-step weight check (foxdqn.step.weight_check; docs/design/guard.md#after-the-step):
a step that would blow the weights up (debug.inject_lr_spike_at_step) is skipped, the weights, targets
and Adam's state stay those before it, the ring names halt_weight and the run halts with them saved.
The trial step on the copy is the real step, bit for bit; with the check off nothing of it exists."""
import pytest
import torch

from foxdqn.run.checkpoint import state_tensors
from foxdqn.errors import ConfigError, HaltError
from foxdqn.step.iteration import Iteration
from foxdqn.step.weight_check import ALIGN, WeightCheck

from support import adam_state, all_equal, clone_all, small_state

BAD = 5  # the update whose learning rate is multiplied by 2**100
BOUND = 100.0


def _state(extra=()):
    s, market = small_state([f"debug.inject_lr_spike_at_step={BAD}", *extra])
    collect = Iteration(s, False, updates=0)
    for _ in range(4):
        collect()
    return s, Iteration(s, False, updates=1), market


def _run_to_bad(s, one):
    for _ in range(BAD):  # updates 0 .. BAD-1 (good)
        one()
    return clone_all(s.nets.online.parameters()), clone_all(s.nets.target.parameters()), adam_state(s)


def test_spike_is_skipped_and_the_weights_stay_those_before_it():
    s, one, _ = _state([f"guard.max_weight={BOUND}"])
    online, target, adam = _run_to_bad(s, one)
    reader = s.monitors.guard.reader
    assert reader.halt_reason(reader.latest()) is None
    one()  # update BAD: the trial step's max |w| is ~1e26
    assert all_equal(clone_all(s.nets.online.parameters()), online)
    assert all_equal(clone_all(s.nets.target.parameters()), target)
    assert all_equal(adam_state(s), adam)  # moments and step count untouched (fused Adam's found_inf)
    first = reader.first_halt()
    assert first["step"] == BAD and first["halt_weight"] and first["skip"] and first["halted"]
    assert not (first["halt_nan"] or first["halt_loss_clip"] or first["halt_grad_collapse"])
    assert first["max_weight"] > 1e20
    assert "halt_weight at step 5" in reader.halt_reason(first)
    assert s.monitors.guard.read_accumulators()["skipped"] == 1
    one()  # the latch: later updates are skipped too (the existing halt policy)
    assert all_equal(clone_all(s.nets.online.parameters()), online)
    assert reader.latest()["halted"] and not reader.latest()["halt_weight"]
    assert torch.equal(s.optim.lr, torch.tensor(s.cfg.optim.lr, dtype=torch.float32))  # lr restored exactly


def test_without_the_check_the_same_spike_blows_the_weights_up():
    """The counterfactual: the injected step really is bad (so the test above can fail)."""
    s, one, _ = _state()
    online, _, _ = _run_to_bad(s, one)
    assert s.optim.weight_check is None
    one()
    assert max(p.abs().max().item() for p in s.nets.online.parameters()) > 1e20
    assert not all_equal(clone_all(s.nets.online.parameters()), online)


def test_good_steps_pass_and_the_trial_is_the_real_step_bit_for_bit():
    s, _ = small_state([f"guard.max_weight={BOUND}"])
    collect, one = Iteration(s, False, updates=0), Iteration(s, False, updates=1)
    for _ in range(4):
        collect()
    wc = s.optim.weight_check
    assert isinstance(wc, WeightCheck) and not s.optim.optimizer.state  # Adam has no state before its 1st step
    for _ in range(6):
        one()
        assert all_equal(clone_all(wc.weights), clone_all(s.nets.trainable))
        assert all_equal(clone_all(wc.exp_avgs) + clone_all(wc.exp_avg_sqs) + clone_all(wc.steps),
                      [s.optim.optimizer.state[p][k] for k in ("exp_avg", "exp_avg_sq", "step") for p in s.nets.trainable])
    rec = s.monitors.guard.reader.latest()
    assert not rec["halted"] and rec["max_weight"] == max(p.abs().max().item() for p in s.nets.trainable)
    assert int(s.monitors.guard.weight_bits) == 0  # reset by the guard after reading it


def test_check_off_adds_nothing():
    s, _ = small_state([])
    assert s.cfg.guard.max_weight is None and s.optim.weight_check is None
    assert s.monitors.guard.weight_bits is None and s.lr_spike_at is None
    s0, _ = small_state(["guard.max_weight=0"])
    assert s0.optim.weight_check is None and s0.monitors.guard.weight_bits is None
    assert set(state_tensors(s)) == set(state_tensors(s0))


def test_scratch_is_not_checkpointed():
    s, _ = small_state([f"guard.max_weight={BOUND}"])
    keys = set(state_tensors(s))
    assert "monitors.guard.max_weight" in keys and "monitors.guard.weight_bits" in keys
    assert not any("weight_check" in k for k in keys)


def test_scratch_views_are_aligned_and_padding_is_zero():
    params = [torch.nn.Parameter(torch.randn(n) * 1000) for n in (1, 65, 3, 64)]
    opt = torch.optim.Adam(params, lr=0.1, fused=True)
    wc = WeightCheck(opt, torch.zeros((), dtype=torch.int32))
    assert [w.data_ptr() - wc.flat.data_ptr() for w in wc.weights] == [0, ALIGN * 4, 3 * ALIGN * 4, 4 * ALIGN * 4]
    for p in params:
        p.grad = torch.ones_like(p)
    before = clone_all(params)
    wc.run()
    used = torch.zeros_like(wc.flat, dtype=torch.bool)
    for w in wc.weights:
        used[(w.data_ptr() - wc.flat.data_ptr()) // 4:][:w.numel()] = True
    assert torch.all(wc.flat[~used] == 0)
    expect = max((p.detach() - 0.1).abs().max().item() for p in params)  # Adam's first step moves each by ~lr
    assert abs(float(wc.weight_bits.view(torch.float32)) - expect) < 1e-3
    assert all_equal(clone_all(params), before)  # the real parameters were not touched
    # nor the real optimizer's state: at most created as Adam's first step creates it (zeros)
    assert all(float(st["step"]) == 0 and not st["exp_avg"].any() and not st["exp_avg_sq"].any()
               for st in opt.state.values())


def test_parameters_without_gradient_and_empty_ones():
    a, b, c = torch.nn.Parameter(torch.full((3,), 2.0)), torch.nn.Parameter(torch.full((2,), 500.0)), \
        torch.nn.Parameter(torch.zeros(0))
    opt = torch.optim.Adam([a, b, c], lr=0.5, fused=True)
    wc = WeightCheck(opt, torch.zeros((), dtype=torch.int32))
    a.grad = torch.ones(3)  # b, c have no gradient: Adam leaves them alone, the check still sees them
    wc.run()
    assert float(wc.weight_bits.view(torch.float32)) == 500.0
    assert torch.equal(wc.weights[0], torch.full((3,), 1.5))


def test_weight_check_refuses_what_it_cannot_mirror():
    p = torch.nn.Parameter(torch.zeros(3))
    bits = torch.zeros((), dtype=torch.int32)
    with pytest.raises(ValueError, match="torch.optim.Adam"):
        WeightCheck(torch.optim.SGD([p], lr=0.1), bits)
    with pytest.raises(ValueError, match="one parameter group"):
        WeightCheck(torch.optim.Adam([{"params": [p]}, {"params": [torch.nn.Parameter(torch.zeros(2))]}], lr=0.1),
                    bits)
    with pytest.raises(ValueError, match="amsgrad"):
        WeightCheck(torch.optim.Adam([p], lr=0.1, fused=True, amsgrad=True), bits)
    q = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="float32"):
        WeightCheck(torch.optim.Adam([p, q], lr=0.1, fused=True), bits)


@pytest.mark.parametrize("value", ["-1", "inf", "nan"])
def test_config_refuses_a_bad_bound(value):
    with pytest.raises(ConfigError, match="guard.max_weight"):
        small_state([f"guard.max_weight={value}"])


def test_train_halts_with_the_weights_before_the_bad_step(tmp_path):
    from foxdqn.run.checkpoint import load_checkpoint
    from foxdqn.run.loop import train

    s, market = small_state([f"debug.inject_lr_spike_at_step={BAD}", f"guard.max_weight={BOUND}"])
    with pytest.raises(HaltError) as info:
        train(s.cfg, market, tmp_path)
    assert "halt_weight" in str(info.value) and f"step {BAD}" in str(info.value)
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert ckpt["updates"] > BAD
    weights = list(ckpt["online"].values())
    assert all(torch.isfinite(v).all() for v in weights)
    assert max(v.abs().max().item() for v in weights) < 10.0  # not the ~1e26 of the rejected step
    assert (tmp_path / "HALTED").is_file() and "halt_weight" in (tmp_path / "HALTED").read_text()


def test_a_16_column_ring_of_an_older_checkpoint_resumes():
    from foxdqn.run.checkpoint import _upgrade_ring
    from foxdqn.device import ring_record as R

    old = torch.arange(4 * 16, dtype=torch.float64).reshape(4, 16)
    new = _upgrade_ring(old, R.new_ring(4, pin_memory=False))
    assert new.shape == (4, R.RECORD_SIZE) and torch.equal(new[:, :16], old)
    assert new[:, R.HALT_WEIGHT].tolist() == [0.0] * 4 and new[:, R.MAX_WEIGHT].tolist() == [-1.0] * 4
    other = torch.zeros(3, 16, dtype=torch.float64)
    assert _upgrade_ring(other, R.new_ring(4, pin_memory=False)) is other  # another shape: left to the check
