import pytest
import torch

from foxdqn.execution.orders import (
    EXPOSURES,
    FLAT,
    NUM_ACTIONS,
    ORDER_TYPES,
    URGENCIES,
    action_name,
    compose,
    factor,
)


def test_factor_compose_round_trip_over_all_actions():
    actions = torch.arange(NUM_ACTIONS)
    e, o, u = factor(actions)
    assert torch.equal(compose(e, o, u), actions)
    # every (exposure, order type, urgency) triple appears exactly once
    triples = {(int(a), int(b), int(c)) for a, b, c in zip(e, o, u)}
    assert triples == {(a, b, c) for a in range(5) for b in range(3) for c in range(3)}
    for a in range(NUM_ACTIONS):
        ea, oa, ua = (int(x) for x in factor(torch.tensor(a)))
        assert a == ea * 9 + oa * 3 + ua
        assert compose(ea, oa, ua) == a


def test_constants():
    assert NUM_ACTIONS == 45
    assert EXPOSURES == (-1.0, -0.5, 0.0, 0.5, 1.0)
    assert EXPOSURES[FLAT] == 0.0
    assert ORDER_TYPES == ("market", "limit_maker", "ioc")
    assert URGENCIES == ("patient", "normal", "aggressive")


def test_action_name():
    assert action_name(compose(3, 2, 2)) == "+0.5 ioc aggressive"
    assert action_name(0) == "-1.0 market patient"
    with pytest.raises(ValueError):
        action_name(45)
