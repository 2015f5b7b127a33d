"""docs/configuration.md lists every key of the schema with its default (foxdqn.config.doc)."""
import dataclasses

import pytest

from foxdqn.config.schema import TrainConfig
from foxdqn.config.doc import BEGIN, DOC, END, render, rows


def test_the_key_tables_are_up_to_date():
    text = DOC.read_text()
    assert render(text) == text, "docs/configuration.md is stale: run python -m foxdqn.config.doc"


def test_every_leaf_of_the_schema_has_a_row():
    text = DOC.read_text()
    for key, _, default, _ in rows(TrainConfig()):
        assert f"| `{key}` |" in text and f"| `{default}` |" in text, key


def test_a_changed_default_makes_the_tables_stale(monkeypatch):
    from foxdqn.config import schema as config

    text = DOC.read_text()
    field = {f.name: f for f in dataclasses.fields(config.OptimConfig)}["lr"]
    monkeypatch.setattr(field, "default", 0.123)
    monkeypatch.setattr(config.OptimConfig.__init__, "__defaults__",
                        tuple(0.123 if d == 3e-4 else d for d in config.OptimConfig.__init__.__defaults__))
    assert "| `optim.lr` | float | `0.123` |" in render(text)
    assert render(text) != text


def test_missing_markers_are_refused():
    with pytest.raises(ValueError, match="markers"):
        render(DOC.read_text().replace(BEGIN, "").replace(END, ""))
