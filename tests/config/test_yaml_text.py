"""foxdqn.config.yaml_text: a config's YAML from per-section dumps equals one whole dump."""
from __future__ import annotations

import copy

import pytest
import yaml

from foxdqn.config import yaml_text
from foxdqn.config.compose import experiment_names, load_config
from foxdqn.config.schema import to_plain
from foxdqn.config.yaml_text import config_yaml, plain_yaml

DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def whole(values) -> str:
    return yaml.dump(values, Dumper=DUMPER, sort_keys=False)


@pytest.mark.parametrize("experiment", [None, *experiment_names()])
def test_every_shipped_config_dumps_as_one_whole_dump(experiment):
    cfg = load_config([] if experiment is None else [f"+experiment={experiment}"])
    text = config_yaml(cfg)
    assert text == whole(to_plain(cfg))
    assert config_yaml(cfg) == text  # from the cache


def test_values_that_look_alike_are_dumped_as_themselves():
    """The cache tells 1, 1.0, True, "1", None, "null", -0.0, NaN, nested lists and an empty
    mapping apart; the order of the keys is kept; an empty mapping dumps as {}."""
    values = [1, 1.0, True, "1", None, "null", -0.0, 0.0, float("nan"), [1, [2.5, "x"]], {}, {"a": {"b": []}}]
    for value in values:
        for other in values:
            fresh = copy.deepcopy  # each entry its own objects (as to_plain's): no anchors
            doc = {"z": fresh(value), "a": fresh(other), "m": {"k": fresh(value)}}
            assert plain_yaml(doc) == whole(doc), (value, other)
            loaded = yaml.safe_load(plain_yaml(doc))
            assert repr(loaded) == repr(doc)
    assert plain_yaml({}) == whole({}) == "{}\n"


def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(yaml_text, "_LIMIT", 4)
    yaml_text._SECTIONS.clear()
    for i in range(20):
        assert plain_yaml({"seed": i, "x": [i]}) == whole({"seed": i, "x": [i]})
    assert len(yaml_text._SECTIONS) <= 6
