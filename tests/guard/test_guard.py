"""TrainingGuard (foxdqn.guard.host): thresholds, config errors, accumulators and their named view
GuardTotals, the skip flag as fused Adam's found_inf."""
import math

import pytest
import torch

from foxdqn.errors import ConfigError
from foxdqn.device import ring_record as R
from foxdqn.guard.host import GuardTotals, TrainingGuard
from foxdqn.device.host_ring import HostRingReader

F32, I64 = torch.float32, torch.int64
NAN, INF = float("nan"), float("inf")


def test_accumulators_over_sequence():
    guard = TrainingGuard("cpu", loss_clip=10.0)
    seq = [(1.0, 2.0), (3.0, 4.0), (NAN, 1.0), (20.0, 1.0), (2.0, INF), (5.0, 6.0)]
    for step, (loss, norm) in enumerate(seq):
        guard.check(torch.tensor(loss), torch.tensor(norm), torch.tensor(step))
    acc = guard.read_accumulators()
    # finite steps: 0, 1, 3 (clipped but finite), 5; skipped: 2 (nan) and everything after (latch)
    assert acc["count"] == 4 and acc["skipped"] == 4
    assert acc["mean_loss"] == pytest.approx((1 + 3 + 20 + 5) / 4)
    assert acc["mean_grad_norm"] == pytest.approx((2 + 4 + 1 + 6) / 4)
    guard.reset_accumulators()
    acc = guard.read_accumulators()
    assert acc["count"] == 0 and acc["skipped"] == 0 and math.isnan(acc["mean_loss"])


def test_thresholds_change_in_place():
    guard = TrainingGuard("cpu", collapse_threshold=0.0)
    guard.check(torch.tensor(1.0), torch.tensor(0.01), torch.tensor(0))
    assert guard.skip.item() == 0.0
    guard.collapse_threshold.fill_(0.1)
    skip = guard.check(torch.tensor(1.0), torch.tensor(0.01), torch.tensor(1))
    assert skip is guard.skip and skip.item() == 1.0
    rec = guard.reader.latest()
    assert rec["halt_grad_collapse"] and rec["step"] == 1
    guard.reset_halt()
    guard.collapse_threshold.fill_(0.0)
    guard.check(torch.tensor(1.0), torch.tensor(0.01), torch.tensor(2))
    assert guard.skip.item() == 0.0


@pytest.mark.parametrize(
    "kwargs", [dict(ring_size=0), dict(patience=-1), dict(warmup_steps=-5), dict(loss_clip=NAN),
               dict(max_weight=-1.0), dict(max_weight=INF), dict(max_weight=NAN)])
def test_guard_config_errors(kwargs):
    with pytest.raises(ConfigError):
        TrainingGuard("cpu", **kwargs)


def test_guard_attributes():
    guard = TrainingGuard("cpu", loss_clip=5.0, collapse_threshold=0.2, warmup_steps=3, patience=4, ring_size=16)
    assert guard.ring.shape == (16, R.RECORD_SIZE) and guard.ring.dtype == torch.float64
    assert guard.loss_clip.dtype == F32 and guard.loss_clip.dim() == 0 and guard.loss_clip.item() == 5.0
    assert guard.warmup_steps.dtype == I64 and guard.patience.item() == 4
    assert guard.skip.dtype == F32 and guard.skip.dim() == 0
    assert isinstance(guard.reader, HostRingReader) and guard.reader.latest() is None


def test_skip_flag_drives_fused_adam_found_inf():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5))
    opt = torch.optim.Adam([p], lr=0.1, fused=True)
    guard = TrainingGuard("cpu", loss_clip=100.0)
    opt.found_inf = guard.skip  # read by Adam.step (as GradScaler does)
    history = []
    for step, loss in enumerate([1.0, 2.0, NAN, 1.0]):
        p.grad = torch.ones(5)
        before = p.detach().clone()
        guard.check(torch.tensor(loss), torch.linalg.vector_norm(p.grad), torch.tensor(step))
        opt.step()
        history.append((not torch.equal(p.detach(), before), opt.state[p]["step"].item()))
    # updates at steps 0, 1; the NaN step and the latched step after it leave p and the step count alone
    assert history == [(True, 1.0), (True, 2.0), (False, 2.0), (False, 2.0)]


def test_guard_totals_name_the_kernel_accumulator():
    # every field of acc gets a different value: a wrong name order fails
    guard = TrainingGuard("cpu", loss_clip=10.0)
    for step, (loss, norm) in enumerate([(1.0, 2.0), (3.0, 5.0), (20.0, 7.0), (NAN, 1.0)]):
        guard.check(torch.tensor(loss), torch.tensor(norm), torch.tensor(step))
    totals = GuardTotals.from_host(guard.acc.tolist())
    assert totals == (24.0, 14.0, 3.0, 2.0)  # loss 1+3+20 (finite), norm 2+5+7, 3 finite steps, 2 skipped
    assert (totals.loss_sum, totals.grad_norm_sum, totals.count, totals.skipped) == (24.0, 14.0, 3.0, 2.0)
    assert totals.mean_loss == pytest.approx(8.0) and totals.mean_grad_norm == pytest.approx(14.0 / 3)
    assert GuardTotals._fields == ("loss_sum", "grad_norm_sum", "count", "skipped")
    assert len(GuardTotals._fields) == guard.acc.numel()


def test_guard_totals_empty_and_wrong_length():
    empty = GuardTotals.from_host([0.0, 0.0, 0.0, 0.0])
    assert math.isnan(empty.mean_loss) and math.isnan(empty.mean_grad_norm)
    with pytest.raises(ValueError, match="expected 4"):
        GuardTotals.from_host([1.0, 2.0, 3.0])


@pytest.mark.parametrize("max_weight", [None, 0, 0.0])
def test_weight_check_off_allocates_nothing(max_weight):
    guard = TrainingGuard("cpu", max_weight=max_weight)
    assert not guard.checks_weights and guard.weight_bits is None and guard.max_weight is None
    guard.check(torch.tensor(1.0), torch.tensor(1.0), torch.tensor(0))
    rec = guard.reader.latest()
    assert rec["max_weight"] is None and not rec["halt_weight"]


def test_weight_check_on_names_the_flag_and_resets():
    guard = TrainingGuard("cpu", max_weight=50.0)
    assert guard.checks_weights and guard.max_weight.item() == 50.0 and guard.weight_bits.dtype == torch.int32
    guard.weight_bits.copy_(torch.tensor(49.5).view(torch.int32))
    guard.check(torch.tensor(1.0), torch.tensor(1.0), torch.tensor(0))
    assert guard.reader.latest()["max_weight"] == 49.5 and guard.skip.item() == 0.0
    guard.weight_bits.copy_(torch.tensor(-INF).view(torch.int32) & 0x7FFFFFFF)
    guard.check(torch.tensor(1.0), torch.tensor(1.0), torch.tensor(1))
    rec = guard.reader.latest()
    assert rec["halt_weight"] and rec["max_weight"] == INF and guard.skip.item() == 1.0
    reason = guard.reader.halt_reason(guard.reader.first_halt())
    assert reason.startswith("halt_weight at step 1") and "max|w| after the step=inf" in reason
    guard.weight_bits.fill_(7)
    guard.reset_halt()
    assert guard.weight_bits.item() == 0 and guard.halted.item() == 0.0
