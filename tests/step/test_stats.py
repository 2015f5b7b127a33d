"""foxdqn.step.stats.DeviceStats.add_step: the trades count of an env that trades, and of one that does not."""
import torch

from foxdqn.step.stats import EP_COUNT, REWARD_SUM, TRADES, TRANSITIONS, DeviceStats


def test_add_step_counts_trades_and_none_as_no_trades():
    stats = DeviceStats(4, 3, torch.device("cpu"))
    done = torch.tensor([True, False, False])
    args = (torch.tensor([0, 1, 1]), torch.tensor([1.0, 2.0, 3.0]), done, torch.tensor([5.0, 0.0, 0.0]),
            torch.tensor([7, 0, 0]))
    stats.add_step(*args, torch.tensor([True, False, True]))
    stats.add_step(*args, None)  # an env without trades (its collect hook gives None)
    acc = stats.acc
    assert acc[TRADES] == 2.0 and acc[TRANSITIONS] == 6.0 and acc[EP_COUNT] == 2.0 and acc[REWARD_SUM] == 12.0
    assert stats.actions.tolist() == [2.0, 4.0, 0.0, 0.0]
