"""foxdqn.step.target_update.TargetUpdate: Polyak, hard copies on the period, no move when skipped."""
import pytest
import torch

from foxdqn.step.target_update import TargetUpdate


def _pair():
    return [torch.zeros(3)], [torch.ones(3)]


def test_polyak_moves_by_tau_and_not_when_skipped():
    targets, sources = _pair()
    tu = TargetUpdate("polyak", 0.25, 100, targets, sources, torch.device("cpu"))
    tu.apply(torch.tensor(0), torch.tensor(0.0))
    assert torch.allclose(targets[0], torch.full((3,), 0.25)) and tu.weight.item() == 0.25
    tu.apply(torch.tensor(1), torch.tensor(1.0))  # skipped update
    assert torch.allclose(targets[0], torch.full((3,), 0.25)) and tu.weight.item() == 0.0


def test_hard_copies_every_period():
    targets, sources = _pair()
    tu = TargetUpdate("hard", 0.25, 3, targets, sources, torch.device("cpu"))
    weights = []
    for updates in range(6):
        tu.apply(torch.tensor(updates), torch.tensor(0.0))
        weights.append(tu.weight.item())
        assert torch.equal(targets[0], sources[0] if updates >= 2 else torch.zeros(3))
    assert weights == [0.0, 0.0, 1.0, 0.0, 0.0, 1.0]


def test_lengths_must_match():
    with pytest.raises(ValueError, match="2 targets but 1 sources"):
        TargetUpdate("polyak", 0.1, 1, [torch.zeros(1)] * 2, [torch.zeros(1)], torch.device("cpu"))


@pytest.mark.parametrize("mode", ["polyak", "hard"])
def test_apply_advances_the_counter_after_reading_it(mode):
    targets, sources = _pair()
    tu = TargetUpdate(mode, 0.5, 2, targets, sources, torch.device("cpu"))
    updates = torch.tensor(1)
    tu.apply(updates, torch.tensor(0.0), advance=True)  # hard: (1 + 1) % 2 == 0 -> a copy
    assert int(updates) == 2 and tu.weight.item() == (1.0 if mode == "hard" else 0.5)
    tu.apply(updates, torch.tensor(0.0))
    assert int(updates) == 2  # not asked: unchanged
