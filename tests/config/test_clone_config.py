"""foxdqn.config.schema.clone_config: a deep copy of a config, equal to copy.deepcopy's."""
from __future__ import annotations

import copy
import dataclasses

import pytest

from foxdqn.config.compose import experiment_names, load_config
from foxdqn.config.schema import clone_config, to_plain


def mutable_ids(obj, out=None) -> set[int]:
    out = set() if out is None else out
    if dataclasses.is_dataclass(obj):
        out.add(id(obj))
        for f in dataclasses.fields(obj):
            mutable_ids(getattr(obj, f.name), out)
    elif isinstance(obj, (list, dict)):
        out.add(id(obj))
        for v in obj.values() if isinstance(obj, dict) else obj:
            mutable_ids(v, out)
    return out


@pytest.mark.parametrize("experiment", [None, *experiment_names()])
def test_a_clone_equals_the_config_and_shares_nothing_mutable(experiment):
    cfg = load_config([] if experiment is None else [f"+experiment={experiment}"])
    clone = clone_config(cfg)
    assert clone == cfg == copy.deepcopy(cfg) and to_plain(clone) == to_plain(cfg)
    assert type(clone) is type(cfg)
    assert not mutable_ids(clone) & mutable_ids(cfg)
    clone.model.hidden.append(7)
    clone.optim.lr = 1.0
    assert cfg.model.hidden != clone.model.hidden and cfg.optim.lr != 1.0


def test_other_objects_are_deep_copied():
    @dataclasses.dataclass
    class Part:
        values: list
        extra: object

    class Thing:
        def __init__(self):
            self.items = [1, 2]

    part = Part([[1], {"a": [2]}], Thing())
    clone = clone_config(part)
    assert clone.values == part.values and clone.values[0] is not part.values[0]
    assert clone.extra is not part.extra and clone.extra.items == [1, 2] and clone.extra.items is not part.extra.items
    assert clone_config((1, [2])) == (1, [2])
