"""A resolved config as YAML text, each top-level section dumped once per process per value.

A run's ``config.yaml`` start record (:func:`foxdqn.run.folder.record_text`) and a multirun job's
``.hydra/config.yaml`` (the population launcher) are the config's plain values
(:func:`foxdqn.config.schema.to_plain`) in block-style YAML. The jobs of a sweep share all but a
few sections (a seed sweep: all but ``seed``), and PyYAML's representer is Python even with
libyaml's emitter (about 2 ms a config on the H200 machine, twice per job). A block-style mapping is
the concatenation of its entries' own dumps, so :func:`plain_yaml` dumps each top-level entry once
per distinct value (keyed by the value's ``repr``, which tells ``1``, ``1.0``, ``True`` and ``"1"``
apart) and joins them. ``tests/config/test_yaml_text.py`` checks the text equals one whole dump
for every shipped experiment.
"""
from __future__ import annotations

from typing import Any

__all__ = ["config_yaml", "plain_yaml"]

#: (key, repr(value)) → the YAML text of ``{key: value}``; cleared when it outgrows :data:`_LIMIT`.
_SECTIONS: dict[tuple[str, str], str] = {}
_LIMIT = 1 << 16


def plain_yaml(values: dict[str, Any]) -> str:
    """``yaml.dump(values, sort_keys=False)`` with libyaml's safe dumper where PyYAML has it, for a
    mapping of plain values (numbers, strings, booleans, None, lists, dicts) with string keys, no
    list or dict of which appears twice (as in :func:`~foxdqn.config.schema.to_plain`'s; a whole
    dump would write an anchor and an alias for it, these sections a copy each).

    Raises:
        yaml.representer.RepresenterError: a value that is not plain data.
    """
    import yaml

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    if len(_SECTIONS) > _LIMIT:
        _SECTIONS.clear()
    parts = []
    for key, value in values.items():
        cached = (key, repr(value))
        text = _SECTIONS.get(cached)
        if text is None:
            text = _SECTIONS[cached] = yaml.dump({key: value}, Dumper=dumper, sort_keys=False)
        parts.append(text)
    return "".join(parts) if parts else yaml.dump(values, Dumper=dumper, sort_keys=False)


def config_yaml(config) -> str:
    """The YAML text of a resolved config (:class:`foxdqn.config.schema.TrainConfig`): its plain
    values (:func:`foxdqn.config.schema.to_plain`, in the schema's order) through :func:`plain_yaml`."""
    from foxdqn.config.schema import to_plain

    return plain_yaml(to_plain(config))
